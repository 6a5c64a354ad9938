"""`python -m eagle3lab.pipeline.grown_drafts NAME`: one cell of dvc.yaml's `grown_drafts` stage (one per entry of
params.yaml's `drafts.grown.cells`): issue 66's draft on all the regenerated answers, the first mixture's
(`drafts.train_answers`, answers/) and those of the prompts that grow it (`answers.more.cells`, answers_more/),
notebooks/cells/grown_draft.ipynb through papermill into reports/grown_drafts/NAME.ipynb. Two routes: from scratch,
or fine-tuning a committed draft (`start`: the GPU draft of drafts/ stands in for the public draft a user starts from),
under the route's own training keys (`drafts.grown.fine_tune`: a lower learning rate).

It is a draft cell of the grid in all but its data (`pipeline.drafts.DraftCell`): the grid's plan trains it to its
plateau (`drafts.plan` over `train_draft`), it resumes after a kill from its run folder's last checkpoint (on the
machine that holds the folder: checkpoints are a cache, not committed), it is scored by exact offline acceptance on the
evaluation set, and its record (metrics/grown_drafts/NAME.json, apart from the curve's so the forecast fitted on the
curve never reads it) says where it ran. A draft from scratch is a draft of the curve at a scale it never measured:
it trains only once `grown_forecast` has predicted it at its own scale, and its record keeps that prediction as it
stood before it trained (a fine-tuned draft is no draft of the curve: none). An entry is {start: DRAFT_FOLDER,
replicate: K}: no start trains from scratch; K > 0 repeats its route's first cell with training seed
`common.seed` + K.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from eagle3lab import paths
from eagle3lab.io import InputError, command, read_jsonl, write_json, write_jsonl
from eagle3lab.pipeline.cell_command import run_cell
from eagle3lab.pipeline.drafts import SECTION, _answers, evaluation_of
from eagle3lab.pipeline.more_answers import MORE
from eagle3lab.pipeline.point_drafts import PointDraftCell
from eagle3lab.pipeline.stages import SHARED_SECTION, check_params, load_params, section_at

NOTEBOOK = "cells/grown_draft.ipynb"  # under notebooks/
RECORDS = "metrics/grown_drafts"
CELL_FIELDS = {"start", "replicate"}
# the curve's prediction a draft from scratch trains after (written by pipeline.grown_forecast, which is not imported
# here: a change to the forecast's code must not rerun hours of training)
PREDICTION = "metrics/grown_forecast.json"


@dataclass
class GrownDraftCell(PointDraftCell):
    """A point draft's machinery (one committed file, whole, and its replicates) on every regenerated answer."""

    more_answers: list[str] | None = None  # answers.more.cells, in their order
    start: str | None = None  # the committed draft folder the fine-tune route starts from; None: from scratch
    predicted: dict | None = None  # metrics/grown_forecast.json as it stood before a draft from scratch trained

    @property
    def record(self) -> Path:
        return paths.ROOT / RECORDS / f"{self.name}.json"

    def data(self) -> dict[str, str]:
        """Every committed training answer, the first mixture's cells then the more cells, each in its file's order
        (the same committed bytes give the same file, so a killed cell resumes), and the grid's held-out answers."""
        files = [_answers(cell) for cell in self.answers["train_answers"]]
        for cell in self.more_answers:
            path = paths.ROOT / MORE.output / f"{cell}.jsonl"
            if not path.exists():
                raise InputError(
                    f"{path}: no such file: the more_answers cell '{cell}' has not run (make carry runs it)"
                )
            files.append(path)
        train = self.artifacts / "answers" / "grown.jsonl"
        write_jsonl(train, (row for path in files for row in read_jsonl(path)))
        val = _answers(self.answers["val_answers"])
        return {"train": str(train.relative_to(paths.ROOT)), "val": str(val.relative_to(paths.ROOT))}

    def read_prediction(self, run) -> dict | None:
        """The curve's prediction of a draft from scratch, at this draft's scale, read before it trains: an
        InputError where there is none or it is of another scale (`grown_forecast` runs first)."""
        if self.start:
            return None
        path = paths.ROOT / PREDICTION
        if not path.exists():
            raise InputError(f"{path}: no such file: `grown_forecast` predicts a draft from scratch before it trains")
        record = json.loads(path.read_text())
        if record.get("scale") != run.records:
            raise InputError(
                f"{path}: field 'scale' is {record.get('scale')!r}, but this draft trains on {run.records} "
                "conversations: rerun `grown_forecast` on the committed answers"
            )
        self.predicted = record
        return record

    def train(self, run, data: dict[str, str]) -> dict:
        """A draft cell's training, a draft from scratch only after its prediction is read."""
        if not self.start and self.predicted is None:
            self.read_prediction(run)
        return super().train(run, data)

    def write_record(self, result: dict, scored: tuple) -> dict:
        """A draft cell's record, with the prediction made before the draft trained."""
        record = super().write_record(result, scored) | {"predicted_before": self.predicted}
        write_json(self.record, record)
        return record

    def run(self, data: dict[str, str]):
        """The draft of all of it: every record of the joined file, regenerated answers of no one source; the fine-tune
        route's starting draft is its one override."""
        overrides = {"init_draft": self.start} if self.start else {}
        return dataclasses.replace(super().run(data), responses="regenerated", source=None, overrides=overrides)


def cell_of(name: str, params_file: Path | None = None) -> GrownDraftCell:
    """The cell NAME of drafts.grown.cells, with the sections it reads; errors name the file, key and field."""
    params_file = Path(params_file or paths.PARAMS)
    params = load_params(params_file)
    check_params(params, params_file)
    where = f"{params_file}: section '{SECTION}.grown'"
    cells = ((params.get(SECTION) or {}).get("grown") or {}).get("cells")
    if not isinstance(cells, dict) or name not in cells:
        raise InputError(f"{where}: no cell '{name}' in `cells` ({', '.join(map(str, cells or {}))})")
    entry = cells[name] or {}
    replicate = entry.get("replicate", 0) if isinstance(entry, dict) else None
    start = entry.get("start") if isinstance(entry, dict) else None
    route = [other for other, e in cells.items() if (e or {}).get("start") == start]
    firsts = [other for other in route if not (cells[other] or {}).get("replicate")]
    if not isinstance(replicate, int) or set(entry) - CELL_FIELDS or replicate < 0 or len(firsts) != 1:
        raise InputError(
            f"{where}: cells.{name}: expected {{start: DRAFT_FOLDER, replicate: K >= 0}} and one first cell (replicate "
            f"0) per start, got {entry!r}"
        )
    if start is not None and not (paths.ROOT / str(start) / "config.json").exists():
        raise InputError(f"{where}: cells.{name}: start {start!r} is no draft folder (no config.json under the root)")
    more = list((section_at(params, MORE.keys) or {}).get("cells") or {})
    if not more:
        raise InputError(f"{params_file}: section '{MORE.where}': no `cells`: a grown draft trains on their answers")
    section = params[SECTION]
    answers = {key: section.get(key) for key in ("train_answers", "val_answers")} | {"sampled_answers": []}
    if not answers["train_answers"] or not answers["val_answers"]:
        raise InputError(f"{params_file}: section '{SECTION}': `train_answers` and `val_answers` are needed")
    evaluation = evaluation_of(params, params_file)
    training = (params.get("train_draft") or {}) | (section.get("plan") or {})
    if start is not None:  # the fine-tune route's own keys over the plan's
        training |= section["grown"].get("fine_tune") or {}
    return GrownDraftCell(name, params.get(SHARED_SECTION) or {}, training, evaluation, answers, more_answers=more,
                          start=start, replicate=replicate, first=firsts[0])  # fmt: skip


@command("python -m eagle3lab.pipeline.grown_drafts")
def main(argv: list[str] | None = None) -> int:
    return run_cell(
        "grown_drafts", __doc__, argv, "a name of params.yaml's drafts.grown.cells", cell_of, NOTEBOOK, "draft"
    )


if __name__ == "__main__":
    sys.exit(main())
