"""The grid's regeneration cells (python -m eagle3lab.pipeline.answers): which prompts a cell answers, how, and the
record it leaves; bad cells are errors naming the params file, the cell and the field. The real target answering
real cells runs in the smoke pipeline (tests/test_smoke.py)."""

import json
from pathlib import Path

import pytest
import yaml

from eagle3lab import paths
from eagle3lab.io import InputError, RunFailed
from eagle3lab.pipeline import answers, more_answers, repro_log
from eagle3lab.pipeline.more_answers import MORE
from eagle3lab.regen.files import Accounting
from eagle3lab.regen.run import RunResult

PARAMS = Path("params.yaml")
REFERENCE = yaml.safe_load(paths.PARAMS.read_text())


def params(**cells) -> dict:
    return {
        "common": REFERENCE["common"],
        "regenerate": REFERENCE["regenerate"] | {"sampled_limit": 5, "sampled_temperature": 0.7},
        "answers": {"chunk_size": 4, "cells": cells},
    }


def test_a_cell_is_a_slice_of_a_split_of_chunk_size_prompts_unless_it_says_otherwise():
    given = params(
        a={"split": "train", "start": 8},
        b={"split": "val", "count": None},
        c={"split": "train", "sampled": True},
        d={"split": "train", "start": 0, "count": 2, "sampled": True},
    )
    assert answers.cell_of(given, "a", PARAMS) == answers.Cell("a", "train", 8, 4, False)
    assert answers.cell_of(given, "b", PARAMS) == answers.Cell("b", "val", 0, None, False)  # to the split's end
    assert answers.cell_of(given, "c", PARAMS).count == 5  # regenerate.sampled_limit, that key's one home
    assert answers.cell_of(given, "d", PARAMS) == answers.Cell("d", "train", 0, 2, True)


@pytest.mark.parametrize(
    "cell, says",
    [
        ({"split": "test"}, "cell 'x': field 'split' must be one of ['train', 'val'], got 'test'"),
        ({"split": "train", "start": -1}, "cell 'x': field 'start' must be a whole number of 0 or more, got -1"),
        ({"split": "train", "count": 0}, "cell 'x': field 'count' (or the section's chunk_size) must be 1 or more"),
        ({"split": "train", "stop": 3}, "cell 'x': unknown field(s) ['stop']"),
    ],
)
def test_a_bad_cell_names_the_file_the_cell_and_the_field(cell, says):
    with pytest.raises(InputError, match=rf"^params\.yaml: section 'answers': {__import__('re').escape(says)}"):
        answers.cell_of(params(x=cell), "x", PARAMS)


def test_an_unknown_cell_lists_the_cells():
    with pytest.raises(InputError, match=r"no cell 'z' \(cells: a, b\)"):
        answers.cell_of(params(a={"split": "train"}, b={"split": "val"}), "z", PARAMS)


def test_the_target_answers_as_the_regenerate_section_says_sampled_cells_at_its_sampled_temperature():
    given = params(g={"split": "train"}, s={"split": "train", "sampled": True})
    greedy = answers.generation_settings(given, answers.cell_of(given, "g", PARAMS), PARAMS)
    sampled = answers.generation_settings(given, answers.cell_of(given, "s", PARAMS), PARAMS)
    section = given["regenerate"]
    assert greedy.temperature == section["temperature"] == 0 and sampled.temperature == 0.7
    assert greedy.max_new_tokens == section["max_new_tokens"] and greedy.max_context == section["max_context"]
    assert greedy.resume and sampled.resume  # a killed cell continues where it stopped
    assert greedy.backend in ("local", "llamacpp") and greedy.dtype in ("bfloat16", "float32")  # auto, resolved
    del given["regenerate"]["weights"]
    with pytest.raises(InputError, match=r"section 'regenerate': missing \['weights'\], which the answers cells read"):
        answers.generation_settings(given, answers.cell_of(given, "g", PARAMS), PARAMS)


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    (tmp_path / "notebooks").symlink_to(paths.NOTEBOOKS)
    monkeypatch.setattr(paths, "NOTEBOOKS", tmp_path / "notebooks")
    monkeypatch.setattr(paths, "PARAMS", tmp_path / "params.yaml")
    mixture = tmp_path / "artifacts" / "mixture"
    mixture.mkdir(parents=True)
    rows = [{"id": f"p{i}", "conversations": [{"role": "user", "content": f"q{i}"}]} for i in range(10)]
    (mixture / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_a_slice_holds_the_cells_prompts_and_one_past_the_split_is_an_error(root, tmp_path):
    out = tmp_path / "slice.jsonl"
    assert answers.write_slice(answers.Cell("a", "train", 8, 4, False), out) == 2  # the split's last two
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["p8", "p9"]
    with pytest.raises(InputError, match=r"mixture/train.jsonl: cell 'b' starts at prompt 10, past the split's 10"):
        answers.write_slice(answers.Cell("b", "train", 10, 4, False), out)
    with pytest.raises(InputError, match=r"mixture/val.jsonl: no such file: stage 01 \(dataset_survey\) writes"):
        answers.write_slice(answers.Cell("c", "val", 0, None, False), out)


def test_a_cell_answers_its_slice_and_records_what_it_did_and_where(root, monkeypatch, capsys):
    (root / "params.yaml").write_text(yaml.safe_dump(params(**{"train-001": {"split": "train", "start": 4}})))
    seen = {}

    def fake_regenerate(inp, out, settings):
        seen["ids"] = [json.loads(line)["id"] for line in Path(inp).read_text().splitlines()]
        seen["settings"] = settings
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("".join(json.dumps({"id": i}) + "\n" for i in seen["ids"][:3]))
        return RunResult(Accounting(input=4, success=3, errors=0, skipped=1), tokens=30, seconds=2.0)

    monkeypatch.setattr(answers, "regenerate", fake_regenerate)
    log = root / "repro.log"
    repro_log.begin(log)
    monkeypatch.setenv(repro_log.ENV, str(log))
    assert answers.main(["train-001"]) == 0
    assert seen["ids"] == ["p4", "p5", "p6", "p7"] and seen["settings"].resume
    record = json.loads((root / "metrics" / "answers" / "train-001.json").read_text())
    assert record["start"] == 4 and record["prompts"] == 4 and (record["success"], record["skipped"]) == (3, 1)
    assert record["tokens_per_s"] == 15 and record["settings"]["max_new_tokens"] == 128
    assert record["ran"]["cpu"] and record["ran"]["auto_dtype"] in ("bfloat16", "float32") and record["ran"]["at"]
    assert "answers train-001: 3 answered, 1 skipped of 4 prompts" in capsys.readouterr().out
    assert "answers@train-001  " in log.read_text()  # make repro's log holds the cell's minutes


def test_a_cell_whose_accounting_does_not_close_fails_and_writes_no_record(root, monkeypatch):
    (root / "params.yaml").write_text(yaml.safe_dump(params(c={"split": "train"})))
    monkeypatch.setattr(
        answers, "regenerate", lambda *a: RunResult(Accounting(input=4, success=2, errors=0, skipped=0), 9, 1.0)
    )
    with pytest.raises(RunFailed, match=r"answers/c.jsonl: accounting: input 4 = success 2 .* pending 2 .*resumes"):
        answers.run_cell("c")
    assert not (root / "metrics" / "answers" / "c.json").exists()


def more_params(**cells) -> dict:
    given = params(a={"split": "train"})
    given["answers"]["more"] = {"mixture_total": 9000, "cells": cells}
    return given


def test_the_more_cells_slice_the_grown_prompts_into_a_folder_of_their_own_at_the_same_chunk_size():
    cell = answers.cell_of(more_params(m={"split": "train", "start": 8}), "m", PARAMS, MORE)
    assert (cell.start, cell.count) == (8, 4)  # answers.chunk_size: one home for both families
    assert cell.input == paths.ROOT / "artifacts" / "more_mixture" / "train.jsonl"
    assert cell.output == paths.ROOT / "answers_more" / "m.jsonl"  # not answers/, which every draft cell reads whole
    assert cell.record == paths.ROOT / "metrics" / "answers_more" / "m.json"
    with pytest.raises(InputError, match=r"section 'answers.more': cell 'v': field 'split' must be one of \['train'\]"):
        answers.cell_of(more_params(v={"split": "val"}), "v", PARAMS, MORE)  # the first mixture's val split picks
    with pytest.raises(InputError, match=r"section 'answers.more': no cell 'a' \(cells: m\)"):
        answers.cell_of(more_params(m={"split": "train"}), "a", PARAMS, MORE)  # a first-mixture cell is not one


def test_a_more_cell_answers_its_slice_and_records_it_beside_its_answers(root, monkeypatch, capsys):
    more = root / "artifacts" / "more_mixture"
    more.mkdir(parents=True)
    rows = [{"id": f"n{i}", "conversations": [{"role": "user", "content": f"new {i}"}]} for i in range(6)]
    (more / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "params.yaml").write_text(yaml.safe_dump(more_params(**{"more-001": {"split": "train", "start": 4}})))

    def fake_regenerate(inp, out, settings):
        ids = [json.loads(line)["id"] for line in Path(inp).read_text().splitlines()]
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
        return RunResult(Accounting(input=len(ids), success=len(ids), errors=0, skipped=0), tokens=8, seconds=1.0)

    monkeypatch.setattr(answers, "regenerate", fake_regenerate)
    assert more_answers.main(["more-001"]) == 0
    answered = (root / "answers_more" / "more-001.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in answered] == ["n4", "n5"]  # the slice's end is the file's
    assert json.loads((root / "metrics" / "answers_more" / "more-001.json").read_text())["prompts"] == 2
    assert not (root / "answers").exists() and not (root / "metrics" / "answers").exists()
    assert "more_answers more-001: 2 answered, 0 skipped of 2 prompts" in capsys.readouterr().out
