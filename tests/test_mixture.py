import json

import pytest

from eagle3lab.data.formats import normalize_text
from eagle3lab.data.mixture import EvalIndex, allocate, build_mixture, stable_id, write_mixture
from eagle3lab.data.sources import Record, load_gsm8k, load_humaneval, load_mtbench
from eagle3lab.io import InputError


@pytest.fixture(scope="module")
def eval_records():
    return load_mtbench() + load_humaneval() + load_gsm8k()


def _src(name, n, category="chat", offset=0):
    return [
        Record(
            id=f"{name}/{i}",
            source=name,
            category=category,
            conversations=[
                {"role": "user", "content": f"{name} question number {i + offset}"},
                {"role": "assistant", "content": f"answer {i}"},
            ],
        )
        for i in range(n)
    ]


def test_allocate_sums_exactly():
    assert allocate({"a": 0.75, "b": 0.25}, 8) == {"a": 6, "b": 2}
    counts = allocate({"a": 1, "b": 1, "c": 1}, 10)
    assert sum(counts.values()) == 10 and sorted(counts.values()) == [3, 3, 4]


def test_quotas_split_determinism_and_stable_ids(eval_records):
    sources = {"chat": _src("chat", 50), "code": _src("code", 50, "code-instruction")}
    m = build_mixture(sources, {"chat": 0.75, "code": 0.25}, 40, eval_records=eval_records, val_fraction=0.1, seed=3)
    rows = m.train + m.val
    assert len(rows) == 40 and len(m.val) == 4
    assert sum(r["source"] == "chat" for r in rows) == 30 and sum(r["source"] == "code" for r in rows) == 10
    assert not {r["id"] for r in m.train} & {r["id"] for r in m.val}
    assert len({r["id"] for r in rows}) == 40
    again = build_mixture(
        sources, {"code": 0.25, "chat": 0.75}, 40, eval_records=eval_records, val_fraction=0.1, seed=3
    )
    assert again.train == m.train and again.val == m.val  # deterministic, independent of quota order
    other = build_mixture(sources, {"chat": 0.75, "code": 0.25}, 40, eval_records=eval_records, seed=4)
    assert {r["source_id"] for r in other.train + other.val} != {r["source_id"] for r in rows}
    # a record keeps its id whatever the seed or total
    by_src = {r["source_id"]: r["id"] for r in rows}
    for r in other.train + other.val:
        if r["source_id"] in by_src:
            assert r["id"] == by_src[r["source_id"]]
    assert rows[0]["id"] == stable_id(rows[0]["source"], normalize_text(rows[0]["conversations"][0]["content"]))
    s = m.summary["sources"]["chat"]
    assert (s["quota"], s["selected"], s["shortfall"]) == (30, 30, 0)


def test_dedup_cleaning_and_shortfall(eval_records):
    recs = _src("a", 3) + [
        Record(
            id="a/dup",
            source="a",
            category="chat",
            conversations=[
                {"role": "user", "content": "  A QUESTION number 0 "},
                {"role": "assistant", "content": "x"},
            ],
        ),
        Record(
            id="a/lead",
            source="a",
            category="chat",
            conversations=[
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "real prompt"},
                {"role": "assistant", "content": ""},
            ],
        ),
        Record(id="a/none", source="a", category="chat", conversations=[{"role": "assistant", "content": "only"}]),
    ]
    cross = [
        Record(
            id="b/0", source="b", category="chat", conversations=[{"role": "user", "content": "a question number 1"}]
        )
    ]
    m = build_mixture({"a": recs, "b": cross}, {"a": 0.5, "b": 0.5}, 12, eval_records=eval_records, val_fraction=0)
    a, b = m.summary["sources"]["a"], m.summary["sources"]["b"]
    assert (a["selected"], a["duplicates"], a["no_prompt"], a["shortfall"]) == (4, 1, 1, 2)
    assert (a["leading_assistant_turns_dropped"], a["empty_turns_dropped"]) == (2, 1)
    assert (b["selected"], b["duplicates"]) == (0, 1)  # same prompt as a/1, across sources
    lead = next(r for r in m.train if r["source_id"] == "a/lead")
    assert lead["conversations"] == [{"role": "user", "content": "real prompt"}]
    assert m.summary["total_selected"] == 4 and m.val == []


def test_evaluation_prompts_never_enter(eval_records):
    gsm, he, mt = load_gsm8k()[5], load_humaneval()[7], load_mtbench()[3]
    planted = [
        Record(
            id="p/exact",
            source="p",
            category="chat",
            conversations=[{"role": "user", "content": "  " + gsm.prompt.upper() + "\n"}],
        ),
        Record(
            id="p/wrapped",
            source="p",
            category="chat",
            conversations=[{"role": "user", "content": "Please help me:\n" + he.prompt[40:] + "\nThanks"}],
        ),
        Record(
            id="p/second-turn",
            source="p",
            category="chat",
            conversations=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": mt.conversations[1]["content"]},
            ],
        ),
    ]
    m = build_mixture({"p": planted + _src("p", 20)}, {"p": 1.0}, 23, eval_records=eval_records)
    got = {r["source_id"] for r in m.train + m.val}
    assert not got & {"p/exact", "p/wrapped", "p/second-turn"}
    assert m.summary["sources"]["p"]["eval_excluded"] == 3
    index = EvalIndex(eval_records)
    assert index.size >= 80 + 164 + 1319
    for r in m.train + m.val:
        assert all(index.match(t["content"]) is None for t in r["conversations"] if t["role"] == "user")


def test_bad_quotas(eval_records):
    sources = {"chat": _src("chat", 5), "gsm8k": load_gsm8k()}
    with pytest.raises(InputError, match="evaluation set 'gsm8k'"):
        build_mixture(sources, {"gsm8k": 1.0}, 5, eval_records=eval_records)
    with pytest.raises(InputError, match="unknown source 'nope'.*available"):
        build_mixture(sources, {"nope": 1.0}, 5, eval_records=eval_records)
    with pytest.raises(InputError, match="positive fraction"):
        build_mixture(sources, {"chat": -1}, 5, eval_records=eval_records)
    with pytest.raises(InputError, match="evaluation records"):
        build_mixture(sources, {"chat": 1.0}, 5, eval_records=[])


def test_write_mixture_jsonl(tmp_path, eval_records):
    m = build_mixture({"chat": _src("chat", 10)}, {"chat": 1.0}, 10, eval_records=eval_records, val_fraction=0.2)
    paths = write_mixture(m, tmp_path / "mix")
    rows = [json.loads(x) for x in paths["train"].read_text().splitlines()]
    assert len(rows) == 8 and len(paths["val"].read_text().splitlines()) == 2
    assert set(rows[0]) == {"id", "source", "category", "source_id", "conversations"}
    assert set(rows[0]["conversations"][0]) == {"role", "content"}
    assert sorted(p.name for p in (tmp_path / "mix").iterdir()) == ["train.jsonl", "val.jsonl"]  # no temp left
