"""`python -m eagle3lab.pipeline.point_drafts NAME`: one cell of dvc.yaml's `point_drafts` stage (one cell per entry of
params.yaml's `drafts.closeness.cells`): a draft trained on one point's committed training slice (points/POINT.jsonl,
the source's own answers, every point at equal answer tokens), notebooks/cells/point_draft.ipynb through papermill
into reports/point_drafts/NAME.ipynb.

It is a draft cell of the grid in all but its data (`pipeline.drafts.DraftCell`): the grid's plan trains it (its plateau
rule, `drafts.plan` over `train_draft`, under the points' own ceiling `drafts.closeness.plan`), it resumes after a kill,
it is scored by exact offline acceptance on the evaluation set, and its record (metrics/point_drafts/NAME.json, beside
the curve's metrics/drafts so the forecast never reads it) says where it ran. An entry is {point: POINT, replicate: K}:
replicate K > 0 repeats the point's draft with training seed `common.seed` + K, so the finding resamples training noise.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from eagle3lab import paths
from eagle3lab.io import InputError, command
from eagle3lab.pipeline.cell_command import run_cell
from eagle3lab.pipeline.drafts import SECTION, DraftCell, _answers, evaluation_of
from eagle3lab.pipeline.points import OUTPUT, closeness_params
from eagle3lab.pipeline.stages import SHARED_SECTION

NOTEBOOK = "cells/point_draft.ipynb"  # under notebooks/
RECORDS = "metrics/point_drafts"
CELL_FIELDS = {"point", "replicate"}


@dataclass
class PointDraftCell(DraftCell):
    point: str = ""  # the point (drafts.closeness.points) whose training slice it trains on
    replicate: int = 0  # 0: the point's first draft; K: its repeat with training seed common.seed + K
    first: str = ""  # the cell of the point's first draft, which a replicate repeats

    @property
    def record(self) -> Path:
        return paths.ROOT / RECORDS / f"{self.name}.json"

    def data(self) -> dict[str, str]:
        """The point's committed training slice and the grid's held-out answers (every draft's pick)."""
        train = paths.ROOT / OUTPUT / f"{self.point}.jsonl"
        if not train.exists():
            raise InputError(f"{train}: no such file: the point '{self.point}' has not run (make carry runs it)")
        val = _answers(self.answers["val_answers"])
        return {"train": str(train.relative_to(paths.ROOT)), "val": str(val.relative_to(paths.ROOT))}

    def run(self, data: dict[str, str]):
        """The draft of the point's whole slice: the point cell cut it at the shared answer tokens."""
        from eagle3lab.train.answer_tokens import AnswerTokens
        from eagle3lab.train.plan import DraftRun

        counts = AnswerTokens(self.common["target"], self.training["max_len"])(paths.ROOT / data["train"])
        seed = self.common["seed"] + self.replicate if self.replicate else None
        replicate_of = self.first if self.replicate else None
        return DraftRun(self.name, data["train"], len(counts), "original", sum(counts), source=self.point,
                        replicate_of=replicate_of, seed=seed)  # fmt: skip


def cell_of(name: str, params_file: Path | None = None) -> PointDraftCell:
    """The cell NAME of drafts.closeness.cells, with the sections it reads; errors name the file, key and field."""
    params_file, params, section, where = closeness_params(params_file)
    cells = section.get("cells")
    if not isinstance(cells, dict) or name not in cells:
        raise InputError(f"{where}: no cell '{name}' in `cells` ({', '.join(map(str, cells or {}))})")
    entry = cells[name]
    if not isinstance(entry, dict) or set(entry) - CELL_FIELDS or entry.get("point") not in section["points"]:
        raise InputError(f"{where}: cells.{name}: expected {{point: one of `points`, replicate: K}}, got {entry!r}")
    replicate = entry.get("replicate", 0)
    firsts = [other for other, e in cells.items() if e.get("point") == entry["point"] and not e.get("replicate")]
    if not isinstance(replicate, int) or replicate < 0 or len(firsts) != 1:
        raise InputError(f"{where}: cells.{name}: a replicate K >= 0, and one first cell (replicate 0) per point")
    # the grid's plan over stage 03's (the plateau rule every draft of the grid trains to), then the points' own
    # ceiling: a point's slice is smaller than the curve's scales, so the plan's floor of answer tokens can end it early
    training = (params.get("train_draft") or {}) | (params[SECTION].get("plan") or {}) | (section.get("plan") or {})
    evaluation = evaluation_of(params, params_file)
    answers = {"train_answers": [], "val_answers": params[SECTION].get("val_answers"), "sampled_answers": []}
    common = params.get(SHARED_SECTION) or {}
    return PointDraftCell(name, common, training, evaluation, answers, point=entry["point"], replicate=replicate,
                          first=firsts[0])  # fmt: skip


@command("python -m eagle3lab.pipeline.point_drafts")
def main(argv: list[str] | None = None) -> int:
    return run_cell(
        "point_drafts", __doc__, argv, "a name of params.yaml's drafts.closeness.cells", cell_of, NOTEBOOK, "draft"
    )


if __name__ == "__main__":
    sys.exit(main())
