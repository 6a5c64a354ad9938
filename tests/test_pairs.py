"""The grid's controlled pairs (benchmark.pairs): each original-answer and T=0.7 cell against its regenerated partner,
all seeds of both, the verdict read under every bootstrap seed, and each side's steps kept."""

import numpy as np
import pytest

from eagle3lab.benchmark import pairs
from eagle3lab.pipeline import report_forecast

PROMPTS = [("mtbench", f"m{i}") for i in range(16)] + [("gsm8k", f"g{i}") for i in range(16)]


def record(name, responses, level, *, seed=0, matched_to=None, steps=100, noise=0.03):
    """A draft cell's record as the grid writes it: accept length per prompt around `level`."""
    rng = np.random.default_rng([ord(c) for c in name])  # its own noise, the same in every process
    hardness = np.random.default_rng(0).normal(0, 0.2, len(PROMPTS))  # shared by every draft: what pairing cancels
    rows = [
        {"set": s, "id": i, "accept_length": float(level + h + rng.normal(0, noise))}
        for (s, i), h in zip(PROMPTS, hardness)
    ]
    base = name.rsplit("-seed", 1)[0]
    return {
        "name": name,
        "responses": responses,
        "drafter": "eagle3",
        "records": 140,
        "answer_tokens": 13000,
        "matched_to": matched_to,
        "replicate_of": base if base != name else None,
        "seed": seed,
        "training": {"steps": steps + seed, "stopped_by": "patience"},
        "acceptance": {"per_prompt": rows},
    }


def cells(kind, responses, level, seeds=3, **extra):
    names = [f"{kind}-00140" + (f"-seed{k}" if k else "") for k in range(seeds)]
    return [record(name, responses, level, seed=k, **extra) for k, name in enumerate(names)]


def test_a_pair_is_read_over_both_sides_seeds_with_its_steps_and_what_it_controls():
    records = cells("scale", "regenerated", 1.40, steps=300)
    records += cells("original", "original", 1.30, matched_to="scale-00140", steps=200)
    records += cells("sampled", "sampled", 1.40, seeds=2, matched_to="scale-00140")
    said = pairs.controlled_pairs(records, boot=500, seeds=[0, 1, 2])
    rows = {(r["draft"], r["set"]): r for r in said["rows"]}
    original, sampled = rows[("original-00140", "all sets")], rows[("sampled-00140", "all sets")]
    assert original["difference"] == pytest.approx(-0.10, abs=0.02) and original["high"] < 0
    assert original["verdict"] == "shown" and original["seeds"] == [3, 3]
    assert sampled["verdict"] == "not shown" and sampled["seeds"] == [2, 3] and sampled["low"] < 0 < sampled["high"]
    assert original["steps"] == [200, 201, 202] and original["partner_steps"] == [300, 301, 302]
    assert original["controlled"] == pairs.CONTROLLED
    assert {s for d, s in rows if d == "original-00140"} == {"all sets", "gsm8k", "mtbench"}
    assert said["waiting"] == []


def test_a_pair_whose_partner_has_not_run_waits_and_says_so():
    said = pairs.controlled_pairs(cells("original", "original", 1.3, matched_to="scale-00140"), boot=100, seeds=[0])
    assert said["rows"] == [] and said["waiting"] == [
        "original-00140: its partner scale-00140 is not among the trained drafts"
    ]
    text = "\n".join(report_forecast._pair_lines(said))
    assert "No controlled pair yet: original-00140: its partner scale-00140 is not among" in text


def test_a_verdict_that_changes_with_the_bootstrap_seed_is_borderline(monkeypatch):
    said_by_seed = {0: "shown", 1: "not shown"}

    def compared(per_prompt, drafts, *, boot, seed):
        row = {"draft": "original-00140", "partner": "scale-00140", "set": "all sets", "verdict": said_by_seed[seed]}
        return [row], []

    monkeypatch.setattr(pairs, "paired_comparisons", compared)
    records = cells("scale", "regenerated", 1.4, seeds=1) + cells("original", "original", 1.3, seeds=1)
    assert pairs.controlled_pairs(records, boot=10, seeds=[0, 1])["rows"][0]["verdict"] == "borderline"
    assert pairs.controlled_pairs(records, boot=10, seeds=[0, 0])["rows"][0]["verdict"] == "shown"


def test_the_results_page_shows_each_pair_with_its_interval_and_steps():
    records = cells("scale", "regenerated", 1.40, steps=300) + cells(
        "original", "original", 1.30, matched_to="scale-00140"
    )
    said = pairs.controlled_pairs(records, boot=200, seeds=[0])
    row = next(r for r in said["rows"] if r["set"] == "all sets")
    text = "\n".join(report_forecast._pair_lines(said))
    assert (
        f"| all sets | original-00140 | scale-00140 | 3 / 3 | 13,000 / 13,000 | 100, 101, 102 / 300, 301, 302 | "
        f"{row['draft_accept']:.3f} | {row['partner_accept']:.3f} | "
        f"{row['difference']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}] | {row['verdict']} |"
    ) in text
