"""The cost cells (benchmark.timed_costs, pipeline.costs): timings from each engine's results, break-even from them with
an interval over prompts and timing repeats, and the errors that name a record's file and field or a params key."""

import numpy as np
import pytest
import yaml

from eagle3lab import paths
from eagle3lab.benchmark import timed_costs
from eagle3lab.benchmark.timed_costs import TimedCosts
from eagle3lab.io import InputError
from eagle3lab.pipeline import costs as cell

STEP, ROUND = 0.04, 0.07  # seconds: tau* = 1.75


def timings(prompts=8, repeats=3, noise=0.0, seed=0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        tokens, rounds = 100 + p, 60 + p
        for r in range(repeats):
            for system, seconds, drafted in (("baseline", STEP * tokens, None), ("draft", ROUND * rounds, rounds)):
                seconds *= 1 + rng.uniform(-noise, noise)
                rows.append(
                    {"set": "gsm8k", "id": f"g{p}", "system": system, "repeat": r, "tokens": tokens}
                    | {"seconds": seconds, "rounds": drafted}
                )
    return rows


def test_break_even_is_the_round_over_the_step_and_its_interval_carries_timing_noise():
    exact = TimedCosts.from_timings("local", "first", timings(), "here")
    assert (exact.prompts, exact.repeats) == (8, 3)
    assert exact.step_s() == pytest.approx(STEP) and exact.round_s() == pytest.approx(ROUND)
    assert exact.break_even() == pytest.approx(ROUND / STEP)
    assert np.ptp(exact.draws(np.random.default_rng(0), 200)) < 1e-9  # no timing noise: every draw the same
    noisy = TimedCosts.from_timings("local", "first", timings(prompts=24, noise=0.3), "here")
    draws = noisy.draws(np.random.default_rng(0), 2000)
    low, high = np.quantile(draws, [0.05, 0.95])
    assert low < ROUND / STEP < high and high - low > 0.02
    fewer = TimedCosts.from_timings("local", "first", timings(prompts=24, repeats=1, noise=0.3), "here")
    assert fewer.repeats == 1 and np.isfinite(fewer.draws(np.random.default_rng(0), 10)).all()


def test_engine_results_become_one_timing_per_prompt_system_and_repeat():
    local = {
        "per_prompt": [
            {"set": "s", "id": "a", "system": "baseline", "completion_tokens": 10, "times": [1.0, 1.2]}
            | {"verify_count": 10},
            {"set": "s", "id": "a", "system": "d", "completion_tokens": 10, "times": [0.8, 0.9], "verify_count": 6},
            {
                "set": "s",
                "id": "a",
                "system": "hf-generate",
                "completion_tokens": 10,
                "times": [1.1],
                "verify_count": 0,
            },
        ]
    }
    rows = timed_costs.local_timings(local, "d")
    assert [(r["system"], r["repeat"], r["seconds"], r["rounds"]) for r in rows] == [
        ("baseline", 0, 1.0, None),
        ("baseline", 1, 1.2, None),
        ("draft", 0, 0.8, 6),
        ("draft", 1, 0.9, 6),
    ]
    served = {
        "per_prompt": [
            {"set": "s", "id": "a", "system": "baseline", "completion_tokens": 10, "seconds": 1.0, "drafts": None},
            {"set": "s", "id": "a", "system": "d", "completion_tokens": 10, "seconds": 0.7, "drafts": 5},
        ]
    }
    rows = timed_costs.served_timings(served, "d", repeat=2)
    assert [(r["system"], r["repeat"], r["rounds"]) for r in rows] == [("baseline", 2, None), ("draft", 2, 5)]
    costs = TimedCosts.from_timings("vllm", "x", rows, "here")
    assert costs.break_even() == pytest.approx((0.7 / 5) / (1.0 / 10))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda rows: rows[0].pop("seconds"), r"cell.json: timings\[0\]: missing field 'seconds'"),
        (
            lambda rows: [r.update(system="baseline") for r in rows if r["id"] == "g1"],
            r"g1 has no timing of \(system, r",
        ),
        (lambda rows: rows[1].update(rounds=0), r"timings\[1\]: field 'rounds' must be 1 or more for the draft"),
        (lambda rows: rows[0].update(system="peer"), r"timings\[0\]: field 'system' must be 'baseline' or 'draft'"),
        (lambda rows: rows[2].update(tokens=0), r"timings\[2\]: fields 'tokens' and 'seconds' must be positive"),
        (lambda rows: rows.pop(5), r"timings: prompt gsm8k/g0 has no timing of \(system, repeat\) \[\('draft', 2\)\]"),
        (lambda rows: rows.clear(), r"cell.json: timings: no timing recorded"),
    ],
)
def test_bad_timings_are_named(change, message):
    rows = timings(prompts=2)
    change(rows)
    with pytest.raises(InputError, match=message):
        TimedCosts.from_timings("local", "first", rows, "cell.json")


def test_cost_records_are_read_per_engine_and_a_broken_one_is_named(tmp_path):
    import json

    for name, engine in (("local-second", "local"), ("local-first", "local"), ("vllm-first", "vllm")):
        (tmp_path / f"{name}.json").write_text(json.dumps({"cell": name, "engine": engine, "timings": timings()}))
    read = timed_costs.read_cost_cells(tmp_path)
    assert {e: [c.cell for c in cells] for e, cells in read.items()} == {
        "local": ["local-first", "local-second"],
        "vllm": ["vllm-first"],
    }
    (tmp_path / "vllm-first.json").write_text(json.dumps({"cell": "vllm-first", "timings": []}))
    with pytest.raises(InputError, match=r"vllm-first.json: missing field 'engine'"):
        timed_costs.read_cost_cells(tmp_path)
    (tmp_path / "vllm-first.json").write_text("{")
    with pytest.raises(InputError, match=r"vllm-first.json: not valid JSON"):
        timed_costs.read_cost_cells(tmp_path)


def reference_params() -> dict:
    return yaml.safe_load(paths.PARAMS.read_text())


def test_the_plan_times_every_engine_twice_at_the_sweeps_chain():
    params = reference_params()
    engines = [spec["engine"] for spec in params["costs"]["cells"].values()]
    assert sorted(engines) == sorted(2 * ["local", "vllm", "llamacpp"])
    s = cell.cost_settings(params, "vllm-first", paths.PARAMS)
    assert s.chain == params["benchmark"]["sweep_config"] and s.engine == "vllm"
    assert s.dtype == params["benchmark"]["vllm_dtype"] and s.eager is not params["benchmark"]["vllm_compile"]
    assert s.limit * len(s.sets) >= 24 and s.max_new_tokens >= 128 and s.repeats >= 3  # issue 64's floor
    assert s.record == paths.ROOT / "metrics" / "costs" / "vllm-first.json"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["costs"]["cells"].update({"vllm-first": {"engine": "sglang"}}), r"field 'engine' must be one"),
        (lambda p: p["costs"]["cells"].update({"vllm-first": {"engine": "vllm", "k": 2}}), r"unknown field\(s\) \['k'"),
        (lambda p: p["costs"]["cells"].pop("vllm-first"), r"section 'costs': no cell 'vllm-first' \(cells: local-fi"),
        (lambda p: p["costs"].update(draft="drafts/nope"), r"section 'costs': field 'draft': .*drafts/nope holds no"),
        (lambda p: p["costs"].update(repeats=0), r"section 'costs': field 'repeats' must be a whole number of 1"),
        (lambda p: p["costs"].pop("limit"), r"section 'costs': missing field 'limit'"),
        (lambda p: p["costs"].update(sets=[]), r"section 'costs': field 'sets' must be a list of evaluation set"),
        (lambda p: p["benchmark"].update(sweep_config="1,4,2,8"), r"section 'benchmark': field 'sweep_config': the se"),
        (lambda p: p.pop("costs"), r"section 'costs': expected a mapping `cells`"),
    ],
)
def test_bad_cost_settings_name_the_file_section_and_field(change, message):
    params = reference_params()
    change(params)
    with pytest.raises(InputError, match=message):
        cell.cost_settings(params, "vllm-first", paths.PARAMS)
