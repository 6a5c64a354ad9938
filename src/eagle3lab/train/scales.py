"""Stage train_draft's experiment, run: train each planned draft (`train.plan`), the pick of the final draft, and
metrics/train.json, the record the benchmark, scaling and report stages read."""

from __future__ import annotations

import shutil
from pathlib import Path

from eagle3lab.drafters import drafter
from eagle3lab.io import InputError, atomic_path, read_jsonl, write_jsonl
from eagle3lab.train.plan import DraftRun


def in_input_order(root: Path, regenerated: str, inputs: str, artifacts: Path) -> str:
    """The regenerated conversations rewritten in the order of the prompts they answer (`inputs`, the mixture's
    train split, shuffled), as a path relative to `root`. Regeneration writes in completion order, longest prompts
    first (the batching engine admits them so), so the regenerated file's prefixes, the data scales, would be its
    longest prompts rather than samples of the mixture. The same files give the same bytes, so a rerun resumes."""
    position = {rid: i for i, rid in enumerate(str(row.get("id")) for row in read_jsonl(root / inputs))}
    rows = list(read_jsonl(root / regenerated))
    for i, row in enumerate(rows):
        if str(row.get("id")) not in position:
            raise InputError(f"{root / regenerated}: record {i + 1}: id {row.get('id')!r} is not a prompt of {inputs}")
    ordered = artifacts / "train" / "subsets" / "regenerated.jsonl"
    write_jsonl(ordered, sorted(rows, key=lambda row: position[str(row["id"])]))
    return str(ordered.relative_to(root))


def training_file(run: DraftRun, root: Path, artifacts: Path) -> tuple[Path, int | None]:
    """(data file, max_records) a draft trains on: a prefix of its data, or its rows written to a file of their own
    (the same rows give the same bytes, so a rerun resumes)."""
    if run.rows is None:
        return root / run.data, run.records
    picked = set(run.rows)
    subset = artifacts / "train" / "subsets" / f"{run.name}.jsonl"
    write_jsonl(subset, (row for i, row in enumerate(read_jsonl(root / run.data)) if i in picked))
    return subset, None


def train_runs(
    runs: list[DraftRun],
    settings: dict,
    root: Path,
    artifacts: Path,
    val_data: str,
    report=print,
    drafter_settings: dict[str, dict] | None = None,
) -> dict:
    """Train (or resume) each draft and copy its folder (SGLang's format, DFlash's z-lab one) to artifacts/drafts/NAME.
    `settings` holds the shared TrainConfig fields, `drafter_settings` each drafter kind's own (e.g. {"dflash":
    {"block_size": 6}}). Returns name -> the trainer's result plus the run's place in the experiment."""
    results = {}
    for run in runs:
        data, max_records = training_file(run, root, artifacts)
        kind = drafter(run.drafter)
        config, train = kind.train_config(), kind.train
        own = (drafter_settings or {}).get(run.drafter, {})
        cfg = config(
            data=str(data),
            val=str(root / val_data),
            output=str(artifacts / "train" / run.name),
            features_cache=str(artifacts / "features"),
            max_records=max_records,
            resume=True,
            progress=False,
            **{**settings, **own, **run.overrides, **({} if run.seed is None else {"seed": run.seed})},
        )
        result = train(cfg)
        with atomic_path(artifacts / "drafts" / run.name) as tmp:  # the folder the benchmark names
            shutil.copytree(result["draft"], tmp)
        place = {key: getattr(run, key) for key in ("responses", "records", "overrides", "source", "matched_to")}
        place |= {"replicate_of": run.replicate_of, "seed": cfg.seed, "drafter": run.drafter}
        results[run.name] = result | place
        acc = (result["final_val"] or {}).get("acc_pos")
        report(f"{run.name}: {result['steps']} steps, {result['tokens_per_s']:.0f} tok/s, held-out acc {acc}")
    return results


def export_final(results: dict, artifacts: Path) -> str:
    """Copy the largest regenerated-data draft to artifacts/drafts/final; returns its name."""
    regenerated = {n: r for n, r in results.items() if r["responses"] == "regenerated" and not r.get("replicate_of")}
    if not regenerated:
        raise InputError("no regenerated-data draft was trained: every scale exceeds the regenerated data")
    name = max(regenerated, key=lambda n: regenerated[n]["records"])
    with atomic_path(artifacts / "drafts" / "final") as tmp:
        shutil.copytree(artifacts / "drafts" / name, tmp)
    return name


def summary_rows(results: dict) -> list[dict]:
    """One row per draft: data, steps against the budget and whether the patience rule stopped it (with the step of
    its pick), training throughput, vocab coverage, the best held-out accept length and held-out accuracy per TTT
    step."""
    return [
        {
            "draft": name,
            "responses": r["responses"],
            "source": r["source"],
            "matched to": r["matched_to"],
            "changed": ", ".join(f"{k}={v}" for k, v in r["overrides"].items()),
            "conversations": r["data"]["records"],
            "answer tokens": r["data"]["loss_tokens"],
            "train tokens": r["tokens_seen"],
            "answer tokens trained": r["answer_tokens_seen"],
            "steps": r["steps"],
            "step budget": r["budget_steps"],
            "plateaued": r["plateaued"],  # stopped by train_draft.patience before its budget
            "pick step": (r.get("best") or {}).get("step"),
            "train tok/s": r["tokens_per_s"],
            "vocab coverage (held-out)": (r.get("vocab") or {}).get("held_out_coverage"),
            "best accept length (held-out)": (r.get("best") or {}).get("accept_length"),
            **{f"held-out acc step {i}": a for i, a in enumerate((r["final_val"] or {}).get("acc_pos", []))},
        }
        for name, r in results.items()
    ]


def train_metrics(results: dict, artifacts: Path, root: Path) -> dict:
    """metrics/train.json: the final draft and every trained draft (ablations carry the settings they change;
    `answer_tokens` are the target tokens of the assistant turns it trained on, one pass; `best` the held-out pick)."""
    drafts = []
    for name, r in results.items():
        entry = {
            "name": name,
            "path": str((artifacts / "drafts" / name).relative_to(root)),
            "responses": r["responses"],
            "source": r["source"],
            "answer_tokens": r["data"]["loss_tokens"],
            "matched_to": r["matched_to"],
            "replicate_of": r.get("replicate_of"),  # the draft this one repeats with another training seed
            "seed": r.get("seed"),
            "best": r.get("best"),  # train_draft's held-out selection
            "records": r["data"]["records"],
            "tokens": r["tokens_seen"],
            "answer_tokens_seen": r["answer_tokens_seen"],
            "steps": r["steps"],
            "budget_steps": r["budget_steps"],
            "plateaued": r["plateaued"],  # stopped by train_draft.patience before its budget
            "tokens_per_s": r["tokens_per_s"],
            "final_val": r["final_val"],
            "vocab": r.get("vocab"),  # EAGLE-3's draft vocabulary (a DFlash draft drafts with the target's head)
            "drafter": r["drafter"],
        }
        if r["overrides"]:
            entry["ablation"] = r["overrides"]
        drafts.append(entry)
    return {"final": str((artifacts / "drafts" / "final").relative_to(root)), "drafts": drafts}
