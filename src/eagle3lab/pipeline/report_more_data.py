"""The results page's section on ten times the data (issue 66), read from committed records only: the prompts that grow
the mixture (metrics/more_mixture.json: new prompts per source), how many of them the more_answers cells have answered
(metrics/answers_more/: each cell's accounting), the training answers in all beside the first mixture's
(metrics/answers/), the curve's prediction of the grown scale (metrics/grown_forecast.json), and each grown draft
(metrics/grown_drafts/: its route, data, stop, compute and accept length, and a draft from scratch against the
prediction it trained after)."""

from __future__ import annotations

from pathlib import Path
from statistics import fmean

from eagle3lab.pipeline.report_tables import load_folder, load_metrics, table

SOURCE_HEADER = ["source", "drawn at the grown total", "its quota", "new prompts"]
ALL = "all"  # the pooled row of a draft record's acceptance: every prompt
CELL_HEADER = ["cell", "prompts", "answered", "over-length", "errors", "tokens/s", "minutes", "CPU", "dtype"]
DRAFT_HEADER = ["draft", "route", "conversations", "answer tokens", "stopped by", "steps", "passes", "tokens trained",
                "minutes", "accept length"]  # fmt: skip


def _answered(records: list[dict]) -> int:
    """Training conversations answered: greedy answers to train prompts (not the held-out pick's, not T=0.7's)."""
    return sum(r["success"] for r in records if r["split"] == "train" and r["settings"]["temperature"] == 0)


def _draft_row(record: dict) -> list:
    training, minutes = record["training"], record["ran"]["minutes"]
    pooled = {row["set"]: row["accept_length"] for row in record["acceptance"]["pooled"]}
    passes = training["answer_tokens_seen"] / record["answer_tokens"]
    start = record["overrides"].get("init_draft")
    route = f"fine-tune of {Path(start).name}" if start else "from scratch"
    return [record["cell"], route, record["records"], record["answer_tokens"], training["stopped_by"],
            training["steps"], round(passes, 2), training["tokens"], round(minutes["train"] + minutes["score"], 1),
            round(pooled[ALL], 3)]  # fmt: skip


def _prediction(record: dict) -> str:
    """A grown_forecast record in words: the prediction on all sets with its interval under each bootstrap seed."""
    said = record["sets"][ALL]
    if said["predicted"] is None:
        return f"no prediction at {record['scale']:,} conversations ({said['why']})"
    intervals = ", ".join(f"[{i['interval'][0]:.3f}, {i['interval'][1]:.3f}]" for i in said["intervals"])
    projection = ", a projection" if record["projection"] else ""
    fitted = f"{said['chosen']}, fitted on the curve to {record['largest_measured']:,}{projection}"
    return (
        f"{said['predicted']:.3f} on all sets at {record['scale']:,} conversations ({fitted}; bootstrap seeds "
        f"{record['bootstrap_seeds']}: {intervals})"
    )


def _against_prediction(draft: dict) -> str | None:
    """A draft from scratch's mean accept length per prompt (the curve's measure) against the prediction made before
    it trained: inside or outside its interval under every bootstrap seed, or borderline."""
    before = draft.get("predicted_before")
    if not before:
        return None
    if before["sets"][ALL]["predicted"] is None:
        return f"`{draft['cell']}` trained after {_prediction(before)}."
    measured = fmean(row["accept_length"] for row in draft["acceptance"]["per_prompt"])
    inside = [low <= measured <= high for low, high in (i["interval"] for i in before["sets"][ALL]["intervals"])]
    verdict = "inside" if all(inside) else "outside" if not any(inside) else "borderline"
    said = f"`{draft['cell']}` measured {measured:.3f}, {verdict} the interval predicted before it trained"
    return f"{said}: {_prediction(before)}."


def section(metrics: Path) -> str:
    """The section's markdown; where nothing has run yet, what it waits for."""
    lines = ["### Ten times the data (issue 66)", ""]
    grown = load_metrics(metrics, "more_mixture")
    if grown is None:
        return "\n".join(lines + ["The prompts that grow the mixture are not drawn yet (`more_mixture`)."]) + "\n"
    lines.append(
        f"Stage 01's draw at {grown['mixture_total']:,} holds {grown['grown_prompts']:,} prompts: the first mixture's "
        f"{grown['first_prompts']:,} ({grown['first_missing_from_grown']} missing) and {grown['new_prompts']:,} new, "
        "answered by the `more_answers` cells into `answers_more/`:"
    )
    rows = [[name, s["selected"], s["quota"], s["new"]] for name, s in grown["sources"].items()]
    lines += ["", table(SOURCE_HEADER, rows)]
    cells = load_folder(metrics / "answers_more")
    first, answered = _answered(load_folder(metrics / "answers")), _answered(cells)
    rows = [[c["cell"], c["prompts"], c["success"], c["skipped"], c["errors"], round(c["tokens_per_s"]),
             c["minutes"], c["ran"]["cpu"], c["settings"]["dtype"]] for c in cells]  # fmt: skip
    lines += [
        "",
        f"{len(cells)} `more_answers` cells have run: {answered:,} of the {grown['new_prompts']:,} new prompts "
        f"answered, so {first + answered:,} training conversations in all (the first mixture's train cells: "
        f"{first:,}).",
    ]
    if rows:
        lines += ["", table(CELL_HEADER, rows)]
    predicted = load_metrics(metrics, "grown_forecast")
    if predicted is not None:
        said = "The curve's prediction of a draft from scratch on all of it (`grown_forecast`)"
        lines += ["", f"{said}: {_prediction(predicted)}."]
    drafts = load_folder(metrics / "grown_drafts")
    if drafts:
        rows = [_draft_row(d) for d in drafts]
        lines += ["", "The drafts on all of it (`grown_drafts`), by route (the minutes are CPU minutes, training "
                  "and scoring):", "", table(DRAFT_HEADER, rows)]  # fmt: skip
        lines += [item for line in map(_against_prediction, drafts) if line for item in ("", line)]
    else:
        lines += ["", "No draft on all of it has trained yet (`grown_drafts`)."]
    return "\n".join(lines) + "\n"
