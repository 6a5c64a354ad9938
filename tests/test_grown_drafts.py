"""`python -m eagle3lab.pipeline.grown_drafts`: issue 66's drafts train on every committed training answer, the first
mixture's cells then the more cells, under the grid's plan, from scratch or fine-tuning a committed draft; bad cells and
missing answers are named. The drafts themselves train and are scored in the smoke pipeline (tests/test_smoke.py)."""

import json
from pathlib import Path

import pytest
import yaml

from eagle3lab import paths
from eagle3lab.io import InputError
from eagle3lab.pipeline import grown_drafts


def _params(tmp_path: Path, **grown) -> Path:
    params = yaml.safe_load(Path("params/smoke.yaml").read_text())
    params["drafts"]["grown"] = grown or params["drafts"]["grown"]
    params["drafts"]["plan"] = {"patience": 2}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_a_grown_cell_is_the_grid_plans_draft_and_a_replicate_repeats_the_first(tmp_path):
    path = _params(tmp_path, cells={"grown": {}, "grown-seed1": {"replicate": 1}})
    first, again = grown_drafts.cell_of("grown", path), grown_drafts.cell_of("grown-seed1", path)
    assert (first.replicate, again.replicate, again.first) == (0, 1, "grown")
    assert first.training["patience"] == 2  # drafts.plan over train_draft, as every draft of the grid
    assert first.more_answers == ["more-000"] and first.answers["train_answers"] == ["train-000", "train-001"]
    assert again.record.name == "grown-seed1.json" and again.record.parent.name == "grown_drafts"


GPU_DRAFT = "drafts/smollm2-original-6960"


def test_the_fine_tune_route_starts_from_its_draft_under_its_own_keys(tmp_path):
    cells = {"grown": {}, "finetuned": {"start": GPU_DRAFT}, "finetuned-seed1": {"start": GPU_DRAFT, "replicate": 1}}
    path = _params(tmp_path, fine_tune={"lr": 0.0005, "draft_vocab_size": 4096}, cells=cells)
    scratch, tuned, again = (grown_drafts.cell_of(name, path) for name in cells)
    assert (scratch.start, tuned.start, again.start, again.first) == (None, GPU_DRAFT, GPU_DRAFT, "finetuned")
    assert (tuned.training["lr"], tuned.training["draft_vocab_size"]) == (0.0005, 4096)
    assert scratch.training["lr"] != 0.0005 and tuned.training["patience"] == 2  # the plan's rule on both routes
    train = tmp_path / "train.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    train.write_text(json.dumps({"id": "a", "conversations": turns}) + "\n")
    routes = [cell.run({"train": str(train), "val": str(train)}) for cell in (scratch, tuned)]
    assert [run.overrides for run in routes] == [{}, {"init_draft": GPU_DRAFT}]
    assert [(run.responses, run.source) for run in routes] == [("regenerated", None)] * 2


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ({"b": {}}, r"no cell 'a' in `cells` \(b\)"),
        ({"a": {"seed": 3}}, "cells.a: expected"),
        ({"a": {"replicate": -1}}, "cells.a: expected"),
        ({"a": {}, "b": {}}, "cells.a: expected .* and one first cell"),
        ({"a": {"start": GPU_DRAFT}, "b": {"start": GPU_DRAFT}}, "cells.a: expected .* one first cell .* per start"),
        ({"a": {"start": "drafts/none"}}, "cells.a: start 'drafts/none' is no draft folder"),
    ],
)
def test_a_bad_grown_cell_is_named(tmp_path, cells, message):
    with pytest.raises(InputError, match=rf"params.yaml: section 'drafts.grown': {message}"):
        grown_drafts.cell_of("a", _params(tmp_path, cells=cells))


def test_its_data_is_the_train_cells_then_the_more_cells_and_a_missing_cell_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    monkeypatch.setattr(paths, "ARTIFACTS", tmp_path / "artifacts")
    cell = grown_drafts.cell_of("grown", _params(tmp_path))
    for folder, name in (("answers", "train-001"), ("answers", "train-000"), ("answers", "val")):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / f"{name}.jsonl").write_text(json.dumps({"id": name}) + "\n")
    with pytest.raises(InputError, match=r"answers_more/more-000.jsonl: no such file: the more_answers cell"):
        cell.data()
    (tmp_path / "answers_more").mkdir()
    (tmp_path / "answers_more" / "more-000.jsonl").write_text(json.dumps({"id": "more-000"}) + "\n")
    data = cell.data()
    joined = [json.loads(line)["id"] for line in (tmp_path / data["train"]).read_text().splitlines()]
    assert joined == ["train-000", "train-001", "more-000"] and data["val"] == "answers/val.jsonl"
