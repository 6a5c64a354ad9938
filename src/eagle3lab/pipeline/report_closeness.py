"""The results page's section on the survey tested (issue 65), read from committed records only: each point
(metrics/points/: its slice, its training slice and its signals), how many of its drafts have run
(metrics/point_drafts/), and the finding (metrics/closeness.json). Where the finding cannot yet say something (too
few points with drafts), the section says what it waits for."""

from __future__ import annotations

import json
from pathlib import Path

from eagle3lab.pipeline.report_tables import figure, load_metrics, table

POINT_HEADER = ["point", "source", "slice", "drawn", "training records", "answer tokens", "scored records"]
SIGNALS = {
    "answer_nll": "answers' NLL",
    "prompt_nll": "prompts' NLL",
    "answer_length": "answer tokens",
    "prompt_duplicate_rate": "prompt duplicates",
}
CORRELATION_HEADER = ["signal", "set", "points", "rho", "exact p", "90% interval of rho, each bootstrap seed"]
CORRELATION_HEADER += ["noise alone", "verdict"]


def _slice(record: dict) -> str:
    said = record["slice"]
    return ", ".join([*said["sets"], *([said["topic"]] if said["topic"] else [])]) or "whole source"


def _interval(said: dict, digits: int) -> str:
    if said["estimate"] is None:
        return "-"
    return f"{said['estimate']:.{digits}f} [{said['low']:.{digits}f}, {said['high']:.{digits}f}]"


def _point_row(record: dict, drafts: int) -> list:
    estimates = record["estimates"]  # the point cell's own reading: the page never redraws a bootstrap
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
    ]


def _correlation_row(row: dict) -> list:
    rho = None if row["rho"] is None else f"{row['rho']:+.2f}"
    p_value = None if row["p_value"] is None else f"{row['p_value']:.3f}"
    intervals = "; ".join(f"[{i['low']:+.2f}, {i['high']:+.2f}]" for i in row["intervals"]) or row.get("why")
    return [row["signal"], row["set"], row["points"], rho, p_value, intervals, row.get("noise_verdict"), row["verdict"]]


def section(metrics: Path) -> str:
    points = [json.loads(p.read_text()) for p in sorted((metrics / "points").glob("*.json"))]
    if not points:
        return "### The survey tested (issue 65)\n\n_(no point cell has run yet: `make carry ONLY=points`)_\n"
    drafts = [json.loads(p.read_text()) for p in sorted((metrics / "point_drafts").glob("*.json"))]
    header = POINT_HEADER + [f"{label} [90% interval]" for label in SIGNALS.values()] + ["drafts"]
    rows = [_point_row(r, sum(d["source"] == r["name"] for d in drafts)) for r in points]
    text = (
        "### The survey tested (issue 65)\n\nEach point is a source or a slice of one, drawn as the mixture draws a "
        "source; its drafts train on its own answers at equal answer tokens, and its signals are measured per record "
        "on its scored slice (`metrics/points/`, `metrics/point_drafts/`).\n\n" + table(header, rows) + "\n"
    )
    found = load_metrics(metrics, "closeness")
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
