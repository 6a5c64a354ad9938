import json

import pytest

from eagle3lab.data import sources as data
from eagle3lab.io import InputError


def test_sharegpt_salvages_every_complete_conversation():
    records, report = data.load_sharegpt()
    assert report.complete == len(records) == 17671
    assert 0 < report.dropped_bytes < 100_000
    assert all(r.source == "sharegpt" and r.id.startswith("sharegpt/") for r in records)
    assert {t["role"] for r in records[:500] for t in r.conversations} <= {"user", "assistant", "system"}


def test_salvage_of_a_truncated_array(tmp_path):
    rows = [
        {"id": f"r{i}", "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]}
        for i in range(3)
    ]
    text = json.dumps(rows, indent=2)
    cut = text[: text.rindex('"value": "a"')]  # inside the last record
    path = tmp_path / "cut.json"
    path.write_text(cut)
    items, report = data.salvage_json_array(path)
    assert [i["id"] for i in items] == ["r0", "r1"]
    end_of_r1 = cut.rindex("}", 0, cut.index('"r2"')) + 1
    assert report.dropped_bytes == len(cut) - end_of_r1
    # a complete file drops nothing
    path.write_text(text)
    items, report = data.salvage_json_array(path)
    assert len(items) == 3 and report.dropped_bytes == 0


def test_bad_turn_names_file_record_and_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"id": "x1", "conversations": [{"from": "robot", "value": "hi"}]}]))
    with pytest.raises(
        InputError, match=r"bad.json: record 0 \(id 'x1'\): turn 0: unknown role 'robot' in field 'from'"
    ):
        data.load_sharegpt(path)


def test_evaluation_sets_load_with_their_known_sizes():
    sizes = {name: len(load()) for name, load in data.EVALUATION_SETS.items()}
    assert sizes == {"mtbench": 80, "humaneval": 164, "gsm8k": 1319}
    mt = data.load_mtbench()
    assert all(len(r.conversations) == 2 for r in mt)
    assert data.load_gsm8k()[0].reference.strip().endswith("#### 18")


def test_evaluation_sets_are_not_training_sources():
    assert not set(data.EVALUATION_SETS) & set(data.TRAINING_SOURCES)


def test_missing_data_says_how_to_fetch(tmp_path):
    with pytest.raises(FileNotFoundError, match="make data"):
        data.load_mtbench(tmp_path / "nope.jsonl")
