import json

import pytest

from eagle3lab.data.formats import normalize_text
from eagle3lab.data.mixture import HeldOutIndex, allocate, build_mixture, plan, stable_id, write_mixture
from eagle3lab.data.packaged import held_out_records, load_alpaca_eval, load_nq_open, load_xsum
from eagle3lab.data.sources import Record, load_gsm8k, load_humaneval, load_mtbench
from eagle3lab.io import InputError


@pytest.fixture(scope="module")
def eval_records():
    """Every held-out record: the evaluation sets' and the reserved sets'."""
    return held_out_records()


def _quotas(**shares):
    """One category per source, named after it: {name: share} -> category quotas without caps."""
    return {name: {"share": share, "sources": {name: None}} for name, share in shares.items()}


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


def test_plan_splits_categories_evenly_under_caps():
    quotas = {
        "chat": {"share": 0.6, "sources": {"sharegpt": None, "evals": 40}},
        "qa": {"share": 0.4, "sources": {"small": 5, "big": None}},
    }
    assert plan(quotas, 264) == {"sharegpt": 118, "evals": 40, "small": 5, "big": 101}
    assert plan({"code": {"share": 1, "sources": {"a": None, "b": None, "c": None}}}, 10) == {"a": 4, "b": 3, "c": 3}
    # every source at its cap: the category comes out short rather than over a cap
    assert plan({"code": {"share": 1, "sources": {"p": 3, "q": 4}}}, 20) == {"p": 3, "q": 4}


def test_quotas_split_determinism_and_stable_ids(eval_records):
    sources = {"chat": _src("chat", 50), "code": _src("code", 50, "code")}
    quotas = _quotas(chat=0.75, code=0.25)
    m = build_mixture(sources, quotas, 40, held_out=eval_records, val_fraction=0.1, seed=3)
    rows = m.train + m.val
    assert len(rows) == 40 and len(m.val) == 4
    assert sum(r["source"] == "chat" for r in rows) == 30 and sum(r["source"] == "code" for r in rows) == 10
    assert not {r["id"] for r in m.train} & {r["id"] for r in m.val}
    assert len({r["id"] for r in rows}) == 40
    again = build_mixture(sources, _quotas(code=0.25, chat=0.75), 40, held_out=eval_records, val_fraction=0.1, seed=3)
    assert again.train == m.train and again.val == m.val  # deterministic, independent of quota order
    other = build_mixture(sources, quotas, 40, held_out=eval_records, seed=4)
    assert {r["source_id"] for r in other.train + other.val} != {r["source_id"] for r in rows}
    # a record keeps its id whatever the seed or total
    by_src = {r["source_id"]: r["id"] for r in rows}
    for r in other.train + other.val:
        if r["source_id"] in by_src:
            assert r["id"] == by_src[r["source_id"]]
    assert rows[0]["id"] == stable_id(rows[0]["source"], normalize_text(rows[0]["conversations"][0]["content"]))
    s = m.summary["sources"]["chat"]
    assert (s["quota"], s["selected"], s["shortfall"], s["category"], s["cap"]) == (30, 30, 0, "chat", None)
    assert m.summary["categories"] == {"chat": {"share": 0.75, "planned": 30}, "code": {"share": 0.25, "planned": 10}}


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
    quotas = {"chat": {"share": 1.0, "sources": {"a": 6, "b": 6}}}
    m = build_mixture({"a": recs, "b": cross}, quotas, 12, held_out=eval_records, val_fraction=0)
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
    alpaca, xsum, nq = load_alpaca_eval()[11], load_xsum()[4], load_nq_open()[9]
    planted += [  # the reserved sets: used neither for training nor for evaluation
        Record(id="p/alpaca", source="p", category="chat", conversations=[{"role": "user", "content": alpaca.prompt}]),
        Record(
            id="p/xsum",
            source="p",
            category="chat",
            conversations=[{"role": "user", "content": "Summarize this article:\n\n" + xsum.prompt}],
        ),
        Record(id="p/nq", source="p", category="chat", conversations=[{"role": "user", "content": nq.prompt.upper()}]),
    ]
    quotas = {"chat": {"share": 1.0, "sources": {"p": None}}}
    m = build_mixture({"p": planted + _src("p", 20)}, quotas, 26, held_out=eval_records)
    got = {r["source_id"] for r in m.train + m.val}
    assert not got & {r.id for r in planted}
    stats = m.summary["sources"]["p"]
    assert (stats["eval_excluded"], stats["reserved_excluded"], stats["selected"]) == (3, 3, 20)
    assert m.summary["held_out_sets"] == ["alpaca_eval", "gsm8k", "humaneval", "mtbench", "nq_open", "xsum"]
    index = HeldOutIndex(eval_records)
    assert index.checked["evaluation"] >= 80 + 164 + 1319 and index.checked["reserved"] >= 805 + 1000 + 3500
    for r in m.train + m.val:
        assert all(index.match(t["content"]) is None for t in r["conversations"] if t["role"] == "user")


@pytest.mark.parametrize(
    "quotas, message",
    [
        (_quotas(gsm8k=1.0), "source 'gsm8k' is an evaluation set"),
        (_quotas(xsum=1.0), "source 'xsum' is a reserved set"),
        (_quotas(heldout=1.0), "source 'heldout' holds reserved records"),
        (_quotas(nope=1.0), "unknown; available"),
        (_quotas(chat=-1), "field 'share' must be a positive fraction"),
        ({"chat": {"share": 1.0}}, "expected {share: fraction, sources"),
        ({"chat": {"share": 1.0, "sources": {"chat": 0}}}, "cap must be a positive integer or null"),
        ({"code": {"share": 1.0, "sources": {"chat": None}}}, "its records are 'chat', not 'code'"),
        ({"chat": {"share": 1, "sources": {"chat": None}}, "qa": {"share": 1, "sources": {"chat": None}}}, "already"),
    ],
)
def test_bad_quotas(eval_records, quotas, message):
    sources = {"chat": _src("chat", 5), "gsm8k": load_gsm8k(), "heldout": load_xsum()[:3], "xsum": _src("xsum", 3)}
    with pytest.raises(InputError, match=message):
        build_mixture(sources, quotas, 5, held_out=eval_records)


def test_a_mixture_is_never_built_unchecked_against_a_reserved_set():
    sources = {"chat": _src("chat", 5)}
    evaluation_only = load_mtbench() + load_humaneval() + load_gsm8k()
    with pytest.raises(InputError, match=r"lack \['alpaca_eval', 'nq_open', 'xsum'\]"):
        build_mixture(sources, _quotas(chat=1.0), 5, held_out=evaluation_only)
    with pytest.raises(InputError, match="every evaluation and reserved set"):
        build_mixture(sources, _quotas(chat=1.0), 5, held_out=[])


def test_write_mixture_jsonl(tmp_path, eval_records):
    m = build_mixture({"chat": _src("chat", 10)}, _quotas(chat=1.0), 10, held_out=eval_records, val_fraction=0.2)
    paths = write_mixture(m, tmp_path / "mix")
    rows = [json.loads(x) for x in paths["train"].read_text().splitlines()]
    assert len(rows) == 8 and len(paths["val"].read_text().splitlines()) == 2
    assert set(rows[0]) == {"id", "source", "category", "source_id", "conversations"}
    assert set(rows[0]["conversations"][0]) == {"role", "content"}
    assert sorted(p.name for p in (tmp_path / "mix").iterdir()) == ["train.jsonl", "val.jsonl"]  # no temp left
