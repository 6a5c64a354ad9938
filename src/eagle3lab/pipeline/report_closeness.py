"""The results page's section on the survey tested (issue 65), read from committed records only: each point
(metrics/points/: its slice, its training slice and its signals), how many of its drafts have run, their accept
length and where they ran (metrics/point_drafts/), and the finding (metrics/closeness.json). Where the finding cannot
yet say something (too few points with drafts), the section says what it waits for."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from eagle3lab.benchmark.comparisons import ALL_SETS
from eagle3lab.pipeline.report_tables import figure, load_folder, load_metrics, table

POINT_HEADER = ["point", "source", "slice", "drawn", "training records", "answer tokens", "scored records"]
SIGNALS = {
    "answer_nll": "answers' NLL",
    "prompt_nll": "prompts' NLL",
    "answer_length": "answer tokens",
    "prompt_duplicate_rate": "prompt duplicates",
}
CORRELATION_HEADER = ["signal", "set", "points", "rho", "exact p", "p, Holm-adjusted over the searched signals"]
CORRELATION_HEADER += ["90% interval of rho, each bootstrap seed"]
CORRELATION_HEADER += ["noise alone", "verdict"]


def _slice(record: dict) -> str:
    said = record["slice"]
    return ", ".join([*said["sets"], *([said["topic"]] if said["topic"] else [])]) or "whole source"


def _interval(said: dict, digits: int) -> str:
    if said["estimate"] is None:
        return "-"
    return f"{said['estimate']:.{digits}f} [{said['low']:.{digits}f}, {said['high']:.{digits}f}]"


def _point_row(record: dict, drafts: int, accept: dict | None) -> list:
    estimates = record["estimates"]  # the point cell's own reading: the page never redraws a bootstrap
    accept = (accept or {}).get(ALL_SETS)
    return [
        record["name"],
        record["source"],
        _slice(record),
        record["draw"]["selected"],
        record["training"]["records"],
        record["training"]["answer_tokens"],
        record["scored"]["records"],
        *(_interval(estimates[name], 3) if name in estimates else "-" for name in SIGNALS),
        drafts,
        _interval({"estimate": accept["mean"]} | accept, 3) if accept else "-",
    ]


def _machines(drafts: list[dict]) -> str:
    """Where the point drafts ran: a finding over drafts of several CPU kinds or dtypes says that it mixes them."""
    kinds = Counter(f"{d['ran']['cpu']} ({d['ran']['auto_dtype']})" for d in drafts)
    said = "; ".join(f"{kind}: {count}" for kind, count in sorted(kinds.items()))
    mixed = len({d["ran"]["auto_dtype"] for d in drafts}) > 1
    return f"The point drafts ran on {said}" + (": the finding mixes dtypes." if mixed else ".")


def _correlation_row(row: dict) -> list:
    rho = None if row["rho"] is None else f"{row['rho']:+.2f}"
    p_value, adjusted = (None if row.get(key) is None else f"{row[key]:.3f}" for key in ("p_value", "p_adjusted"))
    adjusted = "the bet: alone" if row["expected_sign"] is not None and adjusted else adjusted
    intervals = "; ".join(f"[{i['low']:+.2f}, {i['high']:+.2f}]" for i in row["intervals"]) or row.get("why")
    said = [row["signal"], row["set"], row["points"], rho, p_value, adjusted, intervals]
    return said + [row.get("noise_verdict"), row["verdict"]]


def section(metrics: Path) -> str:
    points = load_folder(metrics / "points")
    if not points:
        return "### The survey tested (issue 65)\n\n_(no point cell has run yet: `make carry ONLY=points`)_\n"
    drafts = load_folder(metrics / "point_drafts")
    found = load_metrics(metrics, "closeness")
    accept = {row["name"]: row["accept_length"] for row in (found or {}).get("points", [])}
    header = POINT_HEADER + [f"{label} [90% interval]" for label in SIGNALS.values()]
    header += ["drafts", f"drafts' accept length, {ALL_SETS} [90% interval]"]
    rows = [_point_row(r, sum(d["source"] == r["name"] for d in drafts), accept.get(r["name"])) for r in points]
    text = (
        "### The survey tested (issue 65)\n\nEach point is a source or a slice of one, drawn as the mixture draws a "
        "source; its drafts train on its own answers at equal answer tokens, and its signals are measured per record "
        "on its scored slice (`metrics/points/`, `metrics/point_drafts/`).\n\n" + table(header, rows) + "\n"
    )
    if drafts:
        text += "\n" + _machines(drafts) + "\n"
    if not found or not any(row["rho"] is not None for row in found["correlations"]):
        waiting = ", ".join(found["waiting"]) if found else "every point"
        return text + f"\nNo rank correlation yet: it needs 3 points with drafts (waiting: {waiting}).\n"
    return (
        text
        + "\n"
        + table(CORRELATION_HEADER, [_correlation_row(row) for row in found["correlations"]])
        + f"\n\nBest predictor, per set: {found['best_predictor']}; "
        + f"waiting for drafts: {found['waiting'] or 'none'}.\n\n"
        + figure("closeness score against accept length", "closeness.png")
        + "\n"
    )
