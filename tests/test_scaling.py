import math

import numpy as np
import pytest

from eagle3lab.benchmark.scaling import (
    BEYOND,
    CostModel,
    cost_model_from_throughput,
    fit_scaling,
    fit_sets,
    fitted_size,
    labelled_points,
    projected_tau_after_more_data,
    saturating,
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
    fit = fit_scaling(sizes, log_law, ceiling=6.0, boot=100)
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
    # the fit's own rows follow the rule: a log-law over one decade leaves the ceiling unidentified
    rng = np.random.default_rng(2)
    log_law = [1.1 + 0.05 * np.log2(n / 22) + rng.normal(0, 0.02, 30) for n in sizes]
    fit = fit_scaling(sizes, log_law, ceiling=6.0, boot=50)
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
