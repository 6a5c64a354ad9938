"""`tune` for a DFlash draft: the engine's costs with the exact offline acceptance at each k in the prediction, the
held-out half's measurement in the decision, and the CLI's dispatch on a DFlash folder (the round split's DFlash
server: tests/test_dflash_engines.py)."""

import json

import pytest

from eagle3lab.benchmark.table import DO_NOT_SPECULATE
from eagle3lab.benchmark.tune import TuneSettings
from eagle3lab.benchmark.tune_engine import chain, format_engine_result, predict, tune_from_benchmark
from eagle3lab.drafters.dflash.tune import shapes
from eagle3lab.drafters.kinds import DEFAULT, kind_of
from eagle3lab.io import InputError

STEP_S = 0.020  # the baseline: 50 tokens/s
ROUND_S = {1: 0.030, 2: 0.032, 3: 0.034}  # the engine's round at k: one verify of k + 1 and one block forward


ROUNDS = 26  # 40 tokens, the prefill's first and 39 in 26 rounds: the engine's accept length 1.5


def _prompt(i: int, system: str, config: str, seconds: float) -> dict:
    """One prompt's row as `bench --engine` (or `dflash.serve.local`) writes it: 40 tokens in `seconds`."""
    k = int(config.split(",")[1])
    return {
        "set": "mtbench",
        "id": f"p{i}",
        "system": system,
        "config": config,
        "engine": "local",
        "completion_tokens": 40,
        "seconds": seconds,
        "per_position": [ROUNDS // 2] * k,
        "drafts": ROUNDS if k else None,
        "accepted": 39 - ROUNDS if k else None,
    }


def _bench(measured: dict[int, float]) -> dict:
    """The baseline and the draft `block` at k = 1..3 on 4 prompts: calibration (p0, p2) at ROUND_S a round,
    held-out (p1, p3) at `measured` x the baseline."""
    rows = []
    for i in range(4):
        rows.append(_prompt(i, "baseline", "1,0,0,0", 40 * STEP_S))
        for k, round_s in ROUND_S.items():
            seconds = ROUNDS * round_s if i % 2 == 0 else 40 * STEP_S / measured[k]
            rows.append(_prompt(i, "block", chain(k), seconds))
    meta = {"engine": "local", "engine_settings": {"dtype": "float32"}, "servers": []}
    return {"meta": meta, "rows": [], "per_prompt": rows}


def test_the_prediction_is_the_offline_accept_length_at_the_engines_round_cost():
    bench = _bench({1: 0.9, 2: 0.9, 3: 0.9})
    offline = {1: 1.3, 2: 1.9, 3: 2.0}
    result = tune_from_benchmark(bench, None, "runs/block", offline=offline)
    cal = result["calibration"]
    assert cal["step_s"] == pytest.approx(STEP_S) and cal["round_s"]["1,2,1,3"] == pytest.approx(0.032, rel=1e-3)
    by_label = {r["label"]: r for r in result["ranked"]}
    for k in ROUND_S:
        row = by_label[chain(k)]
        assert row["offline_accept_length"] == offline[k]
        assert row["speedup"] == pytest.approx(offline[k] * STEP_S / cal["round_s"][chain(k)])
    # 1.9 * 20 / 32 = 1.19 beats 2.0 * 20 / 34 = 1.18 and 1.3 * 20 / 30 = 0.87
    assert result["predicted_best"] == "1,2,1,3"
    # nothing beats the baseline on the held-out half: the prediction is not confirmed
    assert result["decision"] == DO_NOT_SPECULATE and result["winner"] is None
    assert "predicted best: 1,2,1,3" in format_engine_result(result)


def test_the_held_out_measurement_decides_and_the_local_engine_has_no_launch_line():
    result = tune_from_benchmark(
        _bench({1: 1.05, 2: 1.20, 3: 1.10}), None, "runs/block", offline={1: 1.3, 2: 1.9, 3: 2}
    )
    assert result["decision"] == "1,2,1,3" and result["winner"]["measured_speedup"] == pytest.approx(1.2)
    assert [r["label"] for r in result["ranked"]] == ["1,2,1,3", "1,3,1,4", "1,1,1,2"]
    assert result["launch"] is None  # our own engine is not launched
    assert "decision: 1,2,1,3 (k=2" in format_engine_result(result)


def test_a_k_without_offline_acceptance_is_refused():
    with pytest.raises(InputError, match="no offline accept length at k=2"):
        predict(tune_from_benchmark(_bench({1: 1, 2: 1, 3: 1}), None, "block", offline=None)["calibration"], {1: 1.2})


def _dflash_folder(tmp_path, block_size: int):
    config = {"architectures": ["DFlashDraftModel"], "block_size": block_size}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_dflash_folder_is_told_from_an_eagle3_one_and_its_shapes_are_its_block(tmp_path, monkeypatch):
    from eagle3lab.drafters.dflash import tune

    folder = _dflash_folder(tmp_path, 4)
    assert kind_of(folder) == "dflash" and kind_of(tmp_path / "missing") == kind_of(tmp_path / "x.gguf") == DEFAULT
    monkeypatch.setattr(tune, "drafted_by", lambda draft: 3)  # the config's own reading is tested in test_dflash.py
    assert shapes(TuneSettings(draft=str(folder), max_steps=6)) == [1, 2, 3]
    assert shapes(TuneSettings(draft=str(folder), max_steps=2)) == [1, 2]
    with pytest.raises(InputError, match="at least 1"):
        shapes(TuneSettings(draft=str(folder), max_steps=0))


def test_eagle3lab_tune_runs_the_dflash_tune_for_a_dflash_folder(tmp_path, monkeypatch):
    from eagle3lab.benchmark import commands
    from eagle3lab.drafters.dflash import tune as dflash_tune

    seen = {}

    def fake(settings):
        seen["draft"], seen["offline"] = settings.draft, settings.offline
        return tune_from_benchmark(_bench({1: 1.05, 2: 1.2, 3: 1.1}), settings, "block", offline={1: 1.3, 2: 1.9, 3: 2})

    monkeypatch.setattr(dflash_tune, "tune_dflash", fake)
    (tmp_path / "draft").mkdir()
    folder = _dflash_folder(tmp_path / "draft", 4)
    out = tmp_path / "tune.json"
    offline = str(tmp_path / "offline.json")  # the DFlash tune's own option, read by tune_dflash (tested below)
    assert commands.tune(["--draft", str(folder), "--offline", offline, "--output", str(out)]) == 0
    assert seen == {"draft": str(folder), "offline": offline} and json.loads(out.read_text())["decision"] == "1,2,1,3"


def test_the_offline_part_is_read_from_an_acceptance_result_and_bad_ones_are_named(tmp_path):
    from eagle3lab.drafters.dflash.tune import read_offline

    rows = [
        {"system": "d", "set": s, "depth": k, "accept_length": 1 + k / 10} for s in ("all", "mtbench") for k in (1, 2)
    ]
    path = tmp_path / "offline.json"
    path.write_text(json.dumps({"table": rows}))
    assert {k: r["accept_length"] for k, r in read_offline(path, [1, 2], "mtbench").items()} == {1: 1.1, 2: 1.2}
    with pytest.raises(InputError, match=r"no 'all' accept length at k = \[3\]"):
        read_offline(path, [1, 2, 3])
    path.write_text(json.dumps({"table": rows + [{"system": "e", "set": "all", "depth": 1, "accept_length": 1.0}]}))
    with pytest.raises(InputError, match="score the tuned draft alone"):
        read_offline(path, [1])
    path.write_text(json.dumps({"table": [{"system": "d", "set": "all", "depth": "1", "accept_length": 1.0}]}))
    with pytest.raises(InputError, match="table record 1: field 'depth' should be int"):
        read_offline(path, [1])
    path.write_text("[]")
    with pytest.raises(InputError, match="not an acceptance result"):
        read_offline(path, [1])


def test_the_offline_options_are_the_dflash_kind_s_own(tmp_path):
    """`tune` parses the options of the draft's kind: an EAGLE-3 folder's tune has no --offline (its settings, and
    so metrics/tune.json, stay EAGLE-3's own), a DFlash folder's has."""
    from dataclasses import fields

    from eagle3lab.benchmark import commands

    eagle3 = tmp_path / "eagle3"
    eagle3.mkdir()
    (eagle3 / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    with pytest.raises(SystemExit) as refused:
        commands.tune(["--draft", str(eagle3), "--offline", "o.json"])
    assert refused.value.code == 2
    dflash = commands.tune_kind(["--draft", str(_dflash_folder(tmp_path, 4))]).tune_settings()
    added = {f.name for f in fields(dflash)} - {f.name for f in fields(TuneSettings)}
    assert added == {"offline", "eval_cache"}
