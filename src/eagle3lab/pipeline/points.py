"""`python -m eagle3lab.pipeline.points NAME`: one cell of dvc.yaml's `points` stage (one cell per entry of
params.yaml's `drafts.closeness.points`): notebooks/cells/point.ipynb through papermill, executed into
reports/points/NAME.ipynb.

A point is a source, or a slice of one, as a draft trains on its own answers (`data.points`: which records, which
signals). The cell draws the point's records, commits the training slice (points/NAME.jsonl: every point holds
`answer_tokens` answer tokens, counted as training counts them, so the point drafts compare data, not amounts), and
measures each signal per record on the scored slice (the first records of the same order reaching
`score_answer_tokens`, at most `score_records` of them: the target's forward over a prompt-heavy source's records, not
its answers, is what scoring costs): metrics/points/NAME.json, with where it ran. The point draft
cells (`pipeline.point_drafts`) train on the committed slice, and `pipeline.closeness` asks which signal predicts
their acceptance.

Its settings are `drafts.closeness` (the grid's section: the points are drafts of the grid), the survey's per-set caps
(`dataset_survey.set_caps`: a point is its source as the survey sees it) and dtype, and the training's `max_len`.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3lab import paths
from eagle3lab.data import points
from eagle3lab.io import InputError, command, read_jsonl, require, write_json, write_jsonl
from eagle3lab.pipeline import machine
from eagle3lab.pipeline.cell_command import run_cell
from eagle3lab.pipeline.drafts import SECTION
from eagle3lab.pipeline.stages import SHARED_SECTION, check_params, load_params

CLOSENESS = "closeness"  # the key of drafts' section that holds the points, their drafts and the finding's settings
NOTEBOOK = "cells/point.ipynb"  # under notebooks/
OUTPUT = "points"  # points/NAME.jsonl: the training slice, committed
RECORDS = "metrics/points"
MIXTURE_VAL = "artifacts/mixture/val.jsonl"  # the held-out prompts every draft is picked on: no point trains on them


@dataclass
class PointCell:
    point: points.Point
    common: dict
    answer_tokens: int  # every point's training slice
    score_answer_tokens: int  # the scored slice: the first records reaching these answer tokens,
    score_records: int  # at most these many
    set_caps: dict
    dtype: str
    max_len: int

    @property
    def data(self) -> Path:
        return paths.ROOT / OUTPUT / f"{self.point.name}.jsonl"

    @property
    def record(self) -> Path:
        return paths.ROOT / RECORDS / f"{self.point.name}.json"


def closeness_params(params_file: Path | None) -> tuple[Path, dict, dict, str]:
    """The params file (default params.yaml), read and checked as a stage's; its drafts.closeness, checked (an
    InputError names the file, section and key); and where that section is, for the errors of the cells reading it."""
    params_file = Path(params_file or paths.PARAMS)
    params = load_params(params_file)
    check_params(params, params_file)
    where = f"{params_file}: section '{SECTION}': {CLOSENESS}"
    section = require(params.get(SECTION) or {}, CLOSENESS, f"{params_file}: section '{SECTION}'", dict)
    for key in ("answer_tokens", "score_answer_tokens", "score_records"):
        if not isinstance(section.get(key), int) or section[key] < 1:
            raise InputError(f"{where}: `{key}`: expected a positive integer")
    require(section, "points", where, dict)
    return params_file, params, section, where


def cell_of(name: str, params_file: Path | None = None) -> PointCell:
    """The point NAME of drafts.closeness.points, with the settings its cell reads."""
    params_file, params, section, where = closeness_params(params_file)
    if name not in section["points"]:
        raise InputError(f"{where}: no point '{name}' (points: {', '.join(map(str, section['points']))})")
    survey = params.get("dataset_survey") or {}
    return PointCell(
        points.point_of(name, section["points"][name], where),
        params.get(SHARED_SECTION) or {},
        section["answer_tokens"],
        section["score_answer_tokens"],
        section["score_records"],
        survey.get("set_caps") or {},
        survey.get("dtype", "auto"),
        require(params.get("train_draft") or {}, "max_len", f"{params_file}: section 'train_draft'", int),
    )


def _answer_counts(rows: list[dict], tokenizer, max_len: int, budget: int, scratch: Path) -> list[int]:
    """Answer tokens of the leading records, counted as training counts them (`train.answer_tokens`), until they
    reach `budget` or the records end: a doubling prefix, so a large source is tokenized only as far as needed."""
    from eagle3lab.train.answer_tokens import answer_token_counts

    n = 256
    while True:
        write_jsonl(scratch, rows[:n])
        counts = answer_token_counts(scratch, tokenizer, max_len)
        if sum(counts) >= budget or n >= len(rows):
            return counts
        n *= 2


def run(cell: PointCell) -> dict:
    """Draw the point, commit its training slice, measure its signals: the record written to metrics/points."""
    from eagle3lab.data.mixture import HeldOutIndex
    from eagle3lab.data.packaged import held_out_records
    from eagle3lab.data.survey import prompt_key_of
    from eagle3lab.devices import resolve_dtype
    from eagle3lab.models.target import load_target
    from eagle3lab.train.answer_tokens import prefix_reaching

    started, seed = time.monotonic(), cell.common["seed"]
    val = {prompt_key_of(row["conversations"]) for row in read_jsonl(paths.ROOT / MIXTURE_VAL)}
    drawn = points.draw(cell.point, cell.set_caps, HeldOutIndex(held_out_records()), val, seed)
    device = cell.common["device"]
    target = load_target(cell.common["target"], dtype=resolve_dtype(cell.dtype, device), device=device)
    scratch = paths.ARTIFACTS / OUTPUT / f"{cell.point.name}.counting.jsonl"
    counts = _answer_counts(drawn.rows, target.tokenizer, cell.max_len, cell.score_answer_tokens, scratch)
    scratch.unlink()
    trained = prefix_reaching(counts, cell.answer_tokens)
    if trained is None:
        raise InputError(
            f"point {cell.point.name}: {sum(counts)} answer tokens, short of `answer_tokens` {cell.answer_tokens}"
        )
    scored = min(prefix_reaching(counts, cell.score_answer_tokens) or len(counts), cell.score_records)
    write_jsonl(cell.data, drawn.rows[:trained])
    signals = points.signals(
        target.model, target.tokenizer, drawn.rows[:scored], counts[:scored], drawn.duplicate_flags, cell.max_len
    )
    record = {
        "name": cell.point.name,
        "source": cell.point.source,
        "slice": {"sets": list(cell.point.sets), "topic": cell.point.topic},
        "draw": drawn.stats,
        "training": {
            "file": str(cell.data.relative_to(paths.ROOT)),
            "records": trained,
            "answer_tokens": sum(counts[:trained]),
        },  # fmt: skip
        "scored": {"records": scored, "answer_tokens": sum(counts[:scored]), "whole_point": scored == len(drawn.rows)},
        "estimates": {name: points.estimate(signal, seed=seed) for name, signal in signals.items()},
        "signals": signals,
        "dtype": str(target.model.dtype).removeprefix("torch."),
        "ran": machine.where_ran(paths.ROOT, minutes=round((time.monotonic() - started) / 60, 2)),
    }
    write_json(cell.record, record)
    return record


@command("python -m eagle3lab.pipeline.points")
def main(argv: list[str] | None = None) -> int:
    return run_cell(
        "points",
        __doc__,
        argv,
        "a name of params.yaml's drafts.closeness.points, e.g. sharegpt",
        cell_of,
        NOTEBOOK,
        "point",
    )


if __name__ == "__main__":
    sys.exit(main())
