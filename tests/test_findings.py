"""The findings table: one row per question, its interval's units and a verdict that follows the interval."""

from types import SimpleNamespace

import pytest

from eagle3lab.benchmark.comparisons import ALL_SETS, verdict
from eagle3lab.benchmark.findings import (
    OUT_OF_DATA,
    beside_findings,
    curve_findings,
    paired_findings,
    source_finding,
)
from eagle3lab.benchmark.scaling import BEYOND, OUT_OF_REACH


def test_verdict_needs_an_interval_clear_of_zero_beyond_float_noise():
    assert verdict(0.01, 0.2) == "shown" and verdict(-0.3, -0.1) == "shown"
    assert verdict(-0.01, 0.2) == "not shown" and verdict(None, None) == "not shown"
    assert verdict(1.7e-16, 1.7e-16) == "not shown"  # a flat fit's slope: zero, whatever its rounding


def paired_row(responses, difference, low, high, seeds=(2, 2), set_name=ALL_SETS):
    return {
        "responses": responses,
        "scale": 350,
        "set": set_name,
        "difference": difference,
        "low": low,
        "high": high,
        "prompts": 444,
        "seeds": list(seeds),
    }


def test_paired_findings_ask_whether_regenerating_beats_the_originals():
    rows = paired_findings(
        [
            paired_row("original", -0.05, -0.08, -0.02),  # the original-answer draft accepts less
            paired_row("sampled", 0.01, -0.02, 0.04, seeds=(1, 1)),
            paired_row("original", -0.05, -0.08, -0.02, set_name="mtbench"),  # per-set rows are not findings
        ]
    )
    assert len(rows) == 2
    regenerated, sampled = rows
    assert regenerated["figure"] == pytest.approx(0.05) and (regenerated["low"], regenerated["high"]) == (0.02, 0.08)
    assert regenerated["verdict"] == "shown" and regenerated["unit"] == "prompts x seeds"
    assert sampled["verdict"] == "not shown" and "one seed" in sampled["unit"]


def test_an_ablation_is_asked_against_the_shared_recipe_at_its_scale():
    row = paired_row("ablation", 0.06, 0.02, 0.10) | {"draft": "ablation-draftvocabsize16384-00350"}
    (finding,) = paired_findings([row | {"partner": "scale-00350"}])
    assert finding["question"] == "ablation-draftvocabsize16384-00350 minus the shared recipe (scale-00350)"
    assert finding["figure"] == 0.06 and finding["verdict"] == "shown"


def test_beside_findings_keep_the_all_sets_row_and_unpaired_set_means():
    paired = {"draft": "gpu", "pipeline_draft": "scale-02200", "paired": True, "difference": 0.2, "low": 0.1}
    paired |= {"high": 0.3, "prompts": 444, "seeds": [1, 2], "verdict": "shown"}
    rows = beside_findings([paired | {"set": ALL_SETS}, paired | {"set": "gsm8k"}])
    assert [r["verdict"] for r in rows] == ["shown"] and rows[0]["question"] == "gpu minus the pipeline's scale-02200"


def test_source_finding_is_shown_only_by_a_significant_negative_rank_correlation():
    sources = [{"prompts": 444, "seeds": 2}]
    three = source_finding({"rho": -1.0, "p_value": 0.33, "points": 3}, sources)
    assert three[0]["verdict"] == "not shown" and "p = 0.33" in three[0]["unit"]
    eight = source_finding({"rho": -0.9, "p_value": 0.002, "points": 8}, sources)
    assert eight[0]["verdict"] == "shown"
    assert source_finding(None, sources) == []


def test_curve_findings_report_nothing_past_the_largest_scale():
    fits = {
        "mtbench": SimpleNamespace(gain_per_doubling=0.03, gain_per_doubling_interval=(0.01, 0.05), sizes=[22, 2200])
    }
    needed = [
        {"engine": "local", "shape": "1,5,1,6", "set": "mtbench", "speedup": 1.0, "accept_length": 1.3}
        | {"records": 600.0, "interval": [300.0, 1500.0]},
        {"engine": "local", "shape": "1,5,1,6", "set": "mtbench", "speedup": 1.5, "accept_length": 1.9}
        | {"records": 600.0, "interval": [300.0, BEYOND]},
        {"engine": "local", "shape": "1,5,1,6", "set": "mtbench", "speedup": 2.0, "accept_length": 2.6}
        | {"records": BEYOND, "interval": [BEYOND, BEYOND]},
        {"engine": "llamacpp", "shape": "1,2,1,3", "set": "mtbench", "speedup": 2.0, "accept_length": 3.5}
        | {"records": OUT_OF_REACH, "interval": None},
    ]
    rows = curve_findings(fits, needed, {"mtbench": 160}, 2)
    assert [r["verdict"] for r in rows] == ["shown", "shown", "not shown", OUT_OF_DATA, OUT_OF_DATA]
    assert rows[0]["prompts"] == 160 and "not resampled" in rows[0]["unit"]


def test_the_recipe_table_pairs_each_lever_with_the_shared_recipe_over_prompts_and_seeds():
    import numpy as np
    import pandas as pd

    from eagle3lab.benchmark import comparisons, recipe

    def result(name, overrides=None, of=None):
        place = {"responses": "ablation", "matched_to": "scale-00350"} if overrides else {"responses": "regenerated"}
        vocab = {"held_out_coverage": 0.9 if overrides else 0.8}
        return place | {"data": {"records": 350}, "overrides": overrides or {}, "replicate_of": of, "steps": 93,
                        "tokens_per_s": 1000.0, "vocab": vocab}  # fmt: skip

    lever = "ablation-lr0.005-00350"
    results = {
        "scale-00350": result("scale-00350"),
        lever: result(lever, {"lr": 0.005}),
        "scale-00350-seed1": result("scale-00350-seed1", of="scale-00350"),
        f"{lever}-seed1": result(lever, {"lr": 0.005}, of=lever),
    }
    rng = np.random.default_rng(0)
    base = 1.3 + 0.2 * rng.random(40)
    per_prompt = pd.DataFrame(
        {"system": name, "set": ("mtbench", "gsm8k")[i % 2], "id": str(i), "accept_length": base[i] + gain}
        for name, gain in (("scale-00350", 0), ("scale-00350-seed1", 0.01), (lever, 0.1), (f"{lever}-seed1", 0.12))
        for i in range(40)
    )
    paired, unmatched = comparisons.paired_comparisons(per_prompt, recipe.places(results), boot=200, seed=0)
    (row,) = recipe.recipe_table(results, paired)
    assert not unmatched and row["lever"] == "lr=0.005" and row["verdict"] == "shown"
    assert row["difference"] == pytest.approx(0.105, abs=1e-3) and row["low"] > 0 and row["unit"] == "prompts x seeds"
    drafts = {n: recipe.places(results)[n] | {"steps": 93, "tokens_per_s": 1000.0, "held_out_vocab_coverage": 0.8}
              for n in results}  # fmt: skip
    payload = {"scale": 350, "depth": 5, "shared_recipe": {"lr": 0.002}, "drafts": drafts, "levers": [row]}
    page = recipe.page(payload | {"paired": paired})
    assert "| lr=0.005 | " in page and "+0.105" in page and "| lever | gsm8k | mtbench |" in page
    assert "Shown to help: lr=0.005." in page and "Shown to hurt: none." in page and "2 training seeds" in page
