"""`eagle3lab tune`: the closed-form predictions on synthetic profiles and costs, the search space, the costs file
and draft folder errors, the doctor on the chosen flags, and a whole run on a tiny target."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TINY_WIDTH
from eagle3lab.benchmark import commands
from eagle3lab.benchmark import tune as tune_module
from eagle3lab.benchmark.costs import prefill_cost, read_costs, verify_cost
from eagle3lab.benchmark.predict import accept_length, predict, predict_adaptive, rank_predictions, request_speedup
from eagle3lab.benchmark.profile import AcceptanceProfile, depth_acceptance, rank_acceptance
from eagle3lab.benchmark.systems import load_bench_draft
from eagle3lab.benchmark.table import DO_NOT_SPECULATE
from eagle3lab.decoding.config import SpecConfig, max_draft_tokens, valid_configs
from eagle3lab.io import InputError
from eagle3lab.models.draft import DraftConfig, Eagle3Draft, save_draft
from tiny import save_tiny_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")

COSTS = {"target_step": 0.040, "verify": {1: 0.040, 2: 0.042, 4: 0.046, 8: 0.054}, "draft_step": 0.002, "other": 0.001}


def profile(depth=(0.5, 0.4, 0.2), rank=(1.0, 0.5), rounds=()):
    return AcceptanceProfile(depth=list(depth), rank=list(rank), chain_rounds=list(rounds), other=0.003, prompts=1)


# ---- the closed form ---------------------------------------------------------------------------------------------


def test_chain_accept_length_and_speedup_are_the_closed_form():
    p = profile()
    for steps, expected in ((1, 1.5), (2, 1.5 + 0.2), (3, 1.5 + 0.2 + 0.04)):
        config = SpecConfig(1, steps, 1, steps + 1)
        assert accept_length(p.depth, p.rank, config) == pytest.approx(expected)
        round_cost = verify_cost(COSTS, steps + 1) + steps * 0.002 + 0.001
        got = predict(config, p, COSTS)
        assert got.speedup == pytest.approx(expected * 0.040 / round_cost)
        assert got.tokens_per_s == pytest.approx(expected / round_cost)
    assert verify_cost(COSTS, 3) == pytest.approx(0.044)  # interpolated between measured ks


def test_tree_accept_length_is_the_sum_of_the_most_probable_nodes():
    # depth 1: 0.5, 0.25; depth 2 (both expanded): 0.5*0.4 = 0.2, 0.1, 0.25*0.4 = 0.1, 0.05
    p = profile(depth=(0.5, 0.4), rank=(1.0, 0.5))
    assert accept_length(p.depth, p.rank, SpecConfig(1, 2, 2, 7)) == pytest.approx(1 + 1.2)
    assert accept_length(p.depth, p.rank, SpecConfig(1, 2, 2, 4)) == pytest.approx(1 + 0.5 + 0.25 + 0.2)
    assert accept_length(p.depth, p.rank, SpecConfig(1, 1, 2, 2)) == pytest.approx(1.5)
    # a rank the profile never measured is never accepted; a depth beyond it neither
    assert accept_length(p.depth, p.rank, SpecConfig(1, 1, 3, 4)) == pytest.approx(1.75)
    assert accept_length(p.depth, p.rank, SpecConfig(1, 4, 1, 5)) == pytest.approx(1 + 0.5 + 0.2)


def test_adaptive_chain_replays_the_traced_rounds():
    rounds = [([0.9, 0.5, 0.2], 3), ([0.8, 0.3, 0.1], 1), ([0.4, 0.1, 0.05], 0)]
    p = profile(rounds=rounds)
    # threshold 0.45, up to 3 steps: rounds cut to 2, 1, 0 tokens; accepted 2, 1, 0; draft forwards 3, 2, 1
    got = predict_adaptive(3, 0.45, p, COSTS)
    seconds = (0.044 + 3 * 0.002 + 0.001) + (0.042 + 2 * 0.002 + 0.001) + (0.040 + 1 * 0.002 + 0.001)
    assert got.accept_length == pytest.approx((3 + 2 + 1) / 3)
    assert got.tokens_per_s == pytest.approx(6 / seconds)
    assert got.speedup == pytest.approx(6 / seconds * 0.040)
    assert got.label == "1,3,1,4@0.45"
    # threshold 0: the whole chain, as traced
    full = predict_adaptive(3, 0.0, p, COSTS)
    assert full.accept_length == pytest.approx((4 + 2 + 1) / 3)


# ---- whole requests: prefill ------------------------------------------------------------------------------------

PREFILL = {"target": {50: 0.05, 100: 0.09}, "draft": {50: 0.01, 100: 0.02}}


def test_prefill_cost_interpolates_and_extends_the_measured_lengths():
    costs = COSTS | {"prefill": PREFILL}
    assert prefill_cost(costs, "target", 50) == pytest.approx(0.05)
    assert prefill_cost(costs, "target", 75) == pytest.approx(0.07)  # between the measured lengths
    assert prefill_cost(costs, "target", 150) == pytest.approx(0.13)  # the last segment extended
    assert prefill_cost(costs, "target", 25) == pytest.approx(0.03)  # the first one, backwards
    assert prefill_cost(costs | {"prefill": {"target": {100: 0.09}}}, "target", 50) == pytest.approx(0.045)
    assert prefill_cost(costs | {"prefill": {"target": {100: 0.09}}}, "draft", 50) == 0.0  # not measured: none
    assert prefill_cost(COSTS, "target", 50) == 0.0  # costs from before prefill was measured


def test_prefill_pulls_the_predicted_speedup_toward_one():
    config = SpecConfig(1, 3, 1, 4)
    tau = 1.74
    round_cost = verify_cost(COSTS, 4) + 3 * 0.002 + 0.001
    decode = tau * 0.040 / round_cost
    requests = [(50, 65), (100, 33)]
    # costs without prefill: the old closed form, whatever the requests
    old = predict(config, profile(), COSTS, requests)
    assert old.speedup == pytest.approx(decode) and old.decode_speedup == pytest.approx(decode)
    # with prefill: baseline and speculative seconds of the two requests, exactly
    costs = COSTS | {"prefill": PREFILL}
    got = predict(config, profile(), costs, requests)
    baseline = 0.05 + 64 * 0.040 + 0.09 + 32 * 0.040
    speculative = 0.05 + 0.01 + 64 / tau * round_cost + 0.09 + 0.02 + 32 / tau * round_cost
    assert got.speedup == pytest.approx(baseline / speculative) and 1.0 < got.speedup < decode
    assert got.decode_speedup == pytest.approx(decode) and got.tokens_per_s == pytest.approx(tau / round_cost)
    # the longer the generation, the closer to decoding alone; a prefill that dwarfs decoding drives it to 1
    longer = predict(config, profile(), costs, [(50, 1025), (100, 1025)])
    assert got.speedup < longer.speedup < decode
    huge = {"target": {50: 1000.0}}
    assert predict(config, profile(), COSTS | {"prefill": huge}, requests).speedup == pytest.approx(1.0, abs=1e-3)
    # the draft's own prefill can sink a shape that pays while decoding
    dear = {"target": {50: 0.05}, "draft": {50: 2.0}}
    assert predict(config, profile(), COSTS | {"prefill": dear}, requests).speedup < 1.0 < decode
    # a request that stops at EOS on its first token is all prefill; with no decoding at all, decoding alone
    assert request_speedup(costs, [(50, 1)], tau, round_cost) is None
    assert predict(config, profile(), costs, [(50, 1)]).speedup == pytest.approx(decode)


def test_predictions_use_the_profiles_requests_and_adaptive_ones_too():
    rounds = [([0.9, 0.5, 0.2], 3), ([0.8, 0.3, 0.1], 1), ([0.4, 0.1, 0.05], 0)]
    p = profile(rounds=rounds)
    costs = COSTS | {"prefill": PREFILL}
    no_requests = predict_adaptive(3, 0.45, p, costs)  # an old profile keeps no lengths: decoding alone
    assert no_requests.speedup == pytest.approx(no_requests.decode_speedup)
    p.prompt_tokens, p.generated_tokens = [50, 100], [65, 33]
    assert p.requests() == [(50, 65), (100, 33)]
    got = predict_adaptive(3, 0.45, p, costs)
    seconds = (0.044 + 3 * 0.002 + 0.001) + (0.042 + 2 * 0.002 + 0.001) + (0.040 + 1 * 0.002 + 0.001)
    assert got.decode_speedup == pytest.approx(6 / seconds * 0.040) and got.tokens_per_s == pytest.approx(6 / seconds)
    assert got.speedup == pytest.approx(request_speedup(costs, p.requests(), 6 / 3, seconds / 3))
    assert got.speedup < got.decode_speedup
    config = SpecConfig(1, 2, 1, 3)
    assert predict(config, p, costs).speedup == pytest.approx(predict(config, p, costs, p.requests()).speedup)
    ranked = rank_predictions(p, costs, max_steps=2, max_topk=2, max_ndraft=4, thresholds=(0.3,))
    assert all(r.speedup < r.decode_speedup for r in ranked if r.decode_speedup > 1)
    # a profile written before lengths were kept reads back without them
    old = p.to_json()
    del old["prompt_tokens"], old["generated_tokens"]
    assert AcceptanceProfile.from_json(old).requests() == []


def test_profile_statistics():
    assert depth_acceptance([0, 1, 2, 3, 1, 0], 3) == pytest.approx([4 / 6, 2 / 4, 1 / 2])
    assert depth_acceptance([0, 0], 2) == [0.0, 0.0]
    assert rank_acceptance([[0, 1], [0], [2], []], 4) == pytest.approx([1.0, 0.5, 0.5, 0.0])


def test_search_space_is_every_valid_shape_and_ranked():
    configs = list(valid_configs(3, 3, 8))
    for c in configs:
        c.validate()
        assert c.num_draft_tokens <= min(8, max_draft_tokens(c.steps, c.topk))
    assert SpecConfig(1, 3, 1, 4) in configs and SpecConfig(1, 2, 3, 8) in configs
    assert SpecConfig(1, 1, 3, 5) not in configs  # over the tree's bound: 1 + topk
    assert (
        len(set(configs))
        == len(configs)
        == 3 + sum(min(8, max_draft_tokens(s, k)) - 1 for s in (1, 2, 3) for k in (2, 3))
    )
    rounds = [([0.9, 0.5, 0.2], 2)] * 4
    ranked = rank_predictions(profile(rounds=rounds), COSTS, max_steps=3, max_topk=3, max_ndraft=8, thresholds=(0.3,))
    assert len(ranked) == len(configs) + 3
    assert [p.speedup for p in ranked] == sorted((p.speedup for p in ranked), reverse=True)


# ---- costs file and draft folder errors --------------------------------------------------------------------------


def test_costs_with_prefill_round_trip_through_a_tune_result(tmp_path):
    from eagle3lab.io import write_json

    costs = COSTS | {"prefill": PREFILL, "context": 90, "source": "measured"}
    write_json(tmp_path / "tune.json", {"decision": "1,2,1,3", "costs": costs})  # JSON keys are strings there
    back = read_costs(tmp_path / "tune.json")
    assert back["prefill"] == PREFILL and back["verify"] == COSTS["verify"] and back["other"] == COSTS["other"]
    assert predict(SpecConfig(1, 2, 1, 3), profile(), back, [(60, 64)]) == predict(
        SpecConfig(1, 2, 1, 3), profile(), costs, [(60, 64)]
    )


def test_costs_file_round_trip_and_errors(tmp_path):
    good = tmp_path / "costs.json"
    good.write_text(json.dumps({"target_step": 0.04, "verify": {"1": 0.04, "4": 0.05}, "draft_step": 0.002}))
    costs = read_costs(good)
    assert costs["verify"] == {1: 0.04, 4: 0.05} and "other" not in costs  # tune measures it then
    assert "prefill" not in costs  # a costs file from before prefill was measured: decoding alone
    result = tmp_path / "tune-on-gpu.json"  # a tune result from another machine carries its measured costs
    result.write_text(json.dumps({"decision": "1,2,1,3", "costs": {**json.loads(good.read_text()), "other": 0.001}}))
    assert read_costs(result)["verify"] == costs["verify"] and read_costs(result)["other"] == 0.001
    cases = {
        "missing field 'draft_step'": {"target_step": 0.04, "verify": {"1": 0.04}},
        "field 'target_step'": {"target_step": -1, "verify": {"1": 0.04}, "draft_step": 0.002},
        "field 'verify' has key 'two'": {"target_step": 0.04, "verify": {"two": 0.04}, "draft_step": 0.002},
        "field 'verify.4'": {"target_step": 0.04, "verify": {"4": "fast"}, "draft_step": 0.002},
        "field 'other'": {"target_step": 0.04, "verify": {"1": 0.04}, "draft_step": 0.002, "other": -0.1},
    }
    for message, content in cases.items():
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(content))
        with pytest.raises(InputError, match=f"bad.json: {message}"):
            read_costs(bad)
    for message, prefill in {
        "field 'prefill' should be an object with": {"verify": {"8": 0.1}},
        "field 'prefill.target' should be an object": {"target": []},
        "field 'prefill.draft' has key 'long'": {"draft": {"long": 0.1}},
        "field 'prefill.target.64'": {"target": {"64": 0}},
    }.items():
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(json.loads(good.read_text()) | {"prefill": prefill}))
        with pytest.raises(InputError, match=f"bad.json: {message}"):
            read_costs(bad)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(InputError, match="broken.json: not JSON"):
        read_costs(tmp_path / "broken.json")
    with pytest.raises(InputError, match="nowhere.json: costs file not found"):
        read_costs(tmp_path / "nowhere.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny chat target folder and a random SGLang-format draft for it."""
    from transformers import AutoConfig

    root = tmp_path_factory.mktemp("tune")
    target = save_tiny_chat_model(
        root / "target",
        **TINY_WIDTH,
        vocab_size=49152,
        num_hidden_layers=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    draft = Eagle3Draft(DraftConfig.from_target(AutoConfig.from_pretrained(target), draft_vocab_size=512))
    draft.set_vocab(torch.randperm(49152)[:512])
    save_draft(draft, root / "draft")
    (root / "prompts.jsonl").write_text(
        json.dumps({"id": "a", "set": "chat", "prompt": "Write a haiku about caches."})
        + "\n"
        + json.dumps({"id": "b", "set": "chat", "prompt": "Count to five."})
        + "\n"
    )
    return root


def test_a_draft_folder_that_does_not_load_is_named(tiny, tmp_path):
    from eagle3lab.models.target import load_target

    target = load_target(str(tiny / "target"))
    broken = tmp_path / "broken-draft"
    broken.mkdir()
    (broken / "config.json").write_text((tiny / "draft" / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(InputError, match="broken-draft: the draft does not load"):
        load_bench_draft(broken, target, torch.float32)
    with pytest.raises(InputError, match="--draft .*missing-draft: nothing there"):
        load_bench_draft(tmp_path / "missing-draft", target, torch.float32)


# ---- the chosen flags and a whole run ----------------------------------------------------------------------------


def test_chosen_flags_pass_the_doctor(tiny):
    for label in ("1,2,1,3", "1,3,2,8@0.2"):
        command, report = tune_module.launch_flags(str(tiny / "target"), str(tiny / "draft"), label)
        config = SpecConfig.parse(label.split("@")[0])
        flags = " ".join(command)
        assert f"--speculative-num-steps {config.steps}" in flags and "--speculative-algorithm EAGLE3" in flags
        assert report["exit_code"] == 0 and report["summary"]["error"] == 0, report["findings"]


def test_cli_defaults_come_from_the_settings_dataclass():
    parser = commands.tune_parser()
    args = vars(parser.parse_args(["--draft", "d"]))
    defaults = tune_module.TuneSettings(draft="d")
    for name, value in vars(defaults).items():
        assert args[name] == value, name


def _run(tiny, tmp_path, costs: dict, capsys, top: int = 2) -> tuple[int, dict, str]:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    out = tmp_path / "tune.json"
    argv = ["--draft", str(tiny / "draft"), "--target", str(tiny / "target"), "--prompts", str(tiny / "prompts.jsonl")]
    argv += ["--costs", str(path), "--max-new-tokens", "12", "--top", str(top), "--output", str(out), "--quiet"]
    argv += ["--max-steps", "3", "--max-ndraft", "8", "--device", "cpu"]
    rc = commands.tune(argv)
    printed = capsys.readouterr()
    return rc, json.loads(out.read_text()) if out.exists() else {}, printed.out + printed.err


def test_tune_end_to_end_and_do_not_speculate(tiny, tmp_path, capsys):
    # a verify costs half a target step and the draft nothing: every shape is predicted above 1 even with the random
    # draft never accepted, and the top two are benchmarked
    free = {"target_step": 1.0, "verify": {"1": 0.5, "32": 0.5}, "draft_step": 1e-9, "other": 0.0}
    rc, result, printed = _run(tiny, tmp_path, free, capsys)
    assert rc == 0 and "predicted" in printed and "measured" in printed
    assert len(result["ranked"]) == 2 and result["benchmark"]["rows"][0]["system"] == "baseline"
    assert all(r["measured_speedup"] > 0 and r["speedup"] > 1 for r in result["ranked"])
    assert result["profile"]["prompts"] == 2 and len(result["profile"]["depth"]) == 3  # --max-steps deep
    # the requests predicted are the profile's: each prompt's length and what the greedy chain generated for it
    assert result["requests"]["count"] == 2 and 1 <= result["requests"]["generated_tokens_mean"] <= 12
    baseline = [r for r in result["benchmark"]["per_prompt"] if r["system"] == "baseline"]
    assert result["profile"]["prompt_tokens"] == [r["prompt_tokens"] for r in baseline]
    assert result["profile"]["generated_tokens"] == [r["completion_tokens"] for r in baseline]  # greedy: the same
    # this costs file has no prefill: said so, and the predictions are decoding alone
    assert not result["requests"]["prefill"] and "has no prefill costs: prefill ignored" in printed
    assert all(p["speedup"] == p["decode_speedup"] for p in result["predictions"])
    if result["winner"]:
        assert result["decision"] == result["winner"]["label"] and result["doctor"]["exit_code"] == 0
    else:
        assert result["decision"] == DO_NOT_SPECULATE
    # predict only: the best prediction wins, with its launch flags checked by the doctor
    rc, result, printed = _run(tiny, tmp_path, free, capsys, top=0)
    assert rc == 0 and result["benchmark"] is None and result["decision"] == result["predictions"][0]["label"]
    assert result["doctor"]["exit_code"] == 0 and "--speculative-num-draft-tokens" in printed
    # drafting is dear: nothing is predicted to pay, nothing is benchmarked, the answer is no speculation
    dear = free | {"draft_step": 10.0}
    rc, result, printed = _run(tiny, tmp_path, dear, capsys)
    assert rc == 0 and result["decision"] == DO_NOT_SPECULATE and result["benchmark"] is None
    assert "do not speculate" in printed
    rc, result, printed = _run(tiny, tmp_path, {"target_step": 1.0}, capsys)
    assert rc == 2
    # with prefill costs the predictions are whole requests: below decoding alone, and said so
    rc, result, printed = _run(tiny, tmp_path, free | {"prefill": {"target": {"10": 2.0}}}, capsys, top=0)
    assert rc == 0 and result["requests"]["prefill"] and "whole requests, prefill included" in printed
    assert all(p["speedup"] < p["decode_speedup"] for p in result["predictions"] if p["decode_speedup"] > 1)
