"""The grid's draft cells (python -m eagle3lab.pipeline.drafts): which draft a cell names, what it reads, and the
errors that name the params file, the section and the cell before any kernel starts. A real cell (plan, train, score,
record) runs in the smoke pipeline (tests/test_smoke.py)."""

import json
from types import SimpleNamespace

import pytest
import yaml

from eagle3lab import paths
from eagle3lab.io import InputError, write_jsonl
from eagle3lab.pipeline import drafts

REFERENCE = yaml.safe_load(paths.PARAMS.read_text())


@pytest.fixture
def root(tmp_path, monkeypatch):
    for name, value in (("ROOT", tmp_path), ("PARAMS", tmp_path / "params.yaml"), ("ARTIFACTS", tmp_path / "a")):
        monkeypatch.setattr(paths, name, value)
    (tmp_path / "notebooks").symlink_to(paths.NOTEBOOKS)
    monkeypatch.setattr(paths, "NOTEBOOKS", tmp_path / "notebooks")
    return tmp_path


def write_params(root, **section):
    params = {k: v for k, v in REFERENCE.items() if k != "drafts"} | {"drafts": REFERENCE["drafts"] | section}
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def planned(t: dict) -> list[str]:
    """The names of the drafts a plan (train_draft's keys) places, as train.plan names them."""
    base = [f"scale-{n:05d}" for n in t["scales"]] + [f"original-{n:05d}" for n in t["original_scales"]]
    base += [
        f"{kind}-{t[key]:05d}" for kind, key in (("sampled", "sampled_scale"), ("dflash", "dflash_scale")) if t[key]
    ]
    return base + [f"{name}-seed{k}" for k in range(1, t["seeds"]) for name in base]


def test_params_yaml_names_every_draft_of_the_grid_plan_and_each_cell_is_a_draft_of_its_own_plan():
    cells, plan = REFERENCE["drafts"]["cells"], REFERENCE["train_draft"] | REFERENCE["drafts"]["plan"]
    assert set(planned(plan)) <= set(cells)  # the plan's own drafts (the curve), every one a cell
    for name, own in cells.items():
        assert name in planned(plan | own), f"{name}: no draft of its plan"
        assert not own or name not in planned(plan), f"{name}: its own keys place what the plan already does"


def test_a_cells_own_keys_place_its_draft_and_change_no_other_cells_plan(root):
    write_params(root, cells={"scale-00022": {}, "original-00140": {"original_scales": [140]}})
    assert drafts.cell_of("scale-00022").training == REFERENCE["train_draft"] | REFERENCE["drafts"]["plan"]
    assert drafts.cell_of("original-00140").training["original_scales"] == [140]
    write_params(root, cells={"original-00140": {"original_scale": [140]}})
    with pytest.raises(InputError, match=r"`cells.original-00140`: \['original_scale'\] are no keys of section"):
        drafts.cell_of("original-00140")
    write_params(root, cells={"original-00140": [140]})
    with pytest.raises(InputError, match=r"`cells.original-00140`: expected a mapping of train_draft's keys"):
        drafts.cell_of("original-00140")


def test_the_grid_plan_changes_train_drafts_keys_for_the_cells_only(root):
    write_params(root, plan={"seeds": 5, "epochs": 9})
    cell = drafts.cell_of("scale-00022")
    assert cell.training == REFERENCE["train_draft"] | {"seeds": 5, "epochs": 9}
    write_params(root, plan={"epoch": 9})
    with pytest.raises(InputError, match=r"params.yaml: section 'drafts': `plan`: \['epoch'\] are no keys of section"):
        drafts.cell_of("scale-00022")


def test_a_cell_reads_its_sections_and_the_evaluation_keys(root):
    write_params(root)
    cell = drafts.cell_of("scale-00022")
    assert (
        cell.training == REFERENCE["train_draft"] | REFERENCE["drafts"]["plan"] and cell.common == REFERENCE["common"]
    )
    assert cell.evaluation == {key: REFERENCE["benchmark"][key] for key in drafts.EVALUATION}
    assert cell.answers["val_answers"] == "val" and cell.record == root / "metrics" / "drafts" / "scale-00022.json"


@pytest.mark.parametrize(
    "section, says",
    [
        ({}, r"no cell 'nope' \(cells: .*scale-00022, scale-00022-seed1"),
        ({"cells": ["nope"]}, r"expected the answers cells it trains on and a mapping `cells` of draft names"),
        (
            {"cells": {"nope": {}}, "val_answers": None},
            r"`train_answers` \(a list of answers cells\) and `val_answers`",
        ),
        ({"cells": {"nope": {}}, "plan": ["seeds"]}, r"`plan`: expected a mapping of train_draft's keys"),
    ],
)
def test_a_bad_cell_is_named_with_its_file_and_section(root, section, says):
    write_params(root, **section)
    with pytest.raises(InputError, match=rf"params.yaml: section 'drafts': {says}"):
        drafts.cell_of("nope")


def test_the_committed_answers_are_joined_in_their_cells_order_and_a_missing_cell_is_named(root):
    write_params(root, train_answers=["train-000", "train-001"], sampled_answers=[])
    answers = root / "answers"
    for name, ids in (("train-000", ["b", "a"]), ("train-001", ["c"]), ("val", ["v"])):
        write_jsonl(answers / f"{name}.jsonl", [{"id": i} for i in ids])
    files = drafts.cell_of("scale-00022").data()
    joined = [json.loads(line)["id"] for line in (root / files["train"]).read_text().splitlines()]
    assert joined == ["b", "a", "c"] and files["val"] == "answers/val.jsonl"
    assert (root / files["sampled"]).read_text() == ""  # no sampled cells: an empty file, no sampled draft
    (answers / "train-001.jsonl").unlink()
    with pytest.raises(InputError, match=r"answers/train-001.jsonl: no such file: the answers cell 'train-001' has"):
        drafts.cell_of("scale-00022").data()


def test_a_name_the_plan_does_not_hold_lists_the_plans_drafts(root):
    write_params(root, cells={"scale-00023": {}}, train_answers=["train-000"], sampled_answers=[])
    mixture = [{"id": f"p{i}", "source": "sharegpt", "conversations": []} for i in range(3)]
    write_jsonl(root / "artifacts" / "mixture" / "train.jsonl", mixture)
    rows = [
        {"id": f"p{i}", "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b"}]}
        for i in range(3)
    ]
    write_jsonl(root / "answers" / "train-000.jsonl", rows)
    write_jsonl(root / "answers" / "val.jsonl", rows[:1])
    cell = drafts.cell_of("scale-00023")
    cell.training = cell.training | {"scales": [2], "original_scales": [], "sampled_scale": None, "dflash_scale": None}
    with pytest.raises(InputError, match=r"cell 'scale-00023' is no draft of the grid's plan \(scale-00002, scale"):
        cell.run(cell.data())


def test_a_cell_resumes_its_own_run_and_starts_over_on_another_runs_folder(root, capsys):
    write_params(root)
    cell, run = drafts.cell_of("scale-00022"), SimpleNamespace(name="scale-00022")
    write_jsonl(root / "answers" / "val.jsonl", [{"id": "v"}])
    folder = cell.artifacts / "train" / "scale-00022"
    folder.mkdir(parents=True)
    (folder / "checkpoint.pt").write_text("a run of before the fingerprint")
    cell._resumable(run, [{"epochs": 20}], ["answers/val.jsonl"])
    assert not folder.exists() and "trained on other inputs than this cell's: starting over" in capsys.readouterr().out
    folder.mkdir()
    (folder / "checkpoint.pt").write_text("this cell's killed run")
    cell._resumable(run, [{"epochs": 20}], ["answers/val.jsonl"])
    assert (folder / "checkpoint.pt").exists()  # the same inputs: it resumes
    write_jsonl(root / "answers" / "val.jsonl", [{"id": "w"}])
    cell._resumable(run, [{"epochs": 20}], ["answers/val.jsonl"])
    assert not folder.exists()  # the same settings on other bytes: starts over
