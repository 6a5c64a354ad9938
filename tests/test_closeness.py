"""Issue 65's finding (benchmark.closeness): each point's signals against its drafts' accept length, the rank
correlation's bootstrap over prompts, seeds and scored records read under several bootstrap seeds, and the errors
that name the point, draft and field."""

import json

import numpy as np
import pytest

from eagle3lab.benchmark import closeness as finding
from eagle3lab.benchmark.comparisons import ALL_SETS
from eagle3lab.io import InputError

PROMPTS = [("mtbench", f"mtbench/{k}#1") for k in range(15)] + [("gsm8k", f"gsm8k/{k}") for k in range(15)]
LEVELS = [1.0, 1.2, 1.4, 1.6, 1.8, 2.0]  # each point's true answer NLL, nats per token
BOOT, SEEDS = 200, [0, 1, 2]


def columns(values, weights) -> dict:
    return {"per_record_value": [float(v) for v in values], "per_record_weight": [float(w) for w in weights]}


def point(level: float, *, records: int = 200, noise: float = 0.3, seed: int = 0) -> dict:
    """A point record: its answers' NLL around `level`; prompt NLL and answer length the same at every point (what
    differs between points there is the records' noise alone)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(50, 150, records)
    prompt_tokens = rng.integers(10, 40, records)
    return {
        "signals": {
            "answer_nll": columns(tokens * (level + rng.normal(0, noise, records)), tokens),
            "prompt_nll": columns(prompt_tokens * (2.0 + rng.normal(0, 1.0, records)), prompt_tokens),
            "answer_length": columns(tokens, np.ones(records)),
        }
    }


def draft(name: str, source: str, accept: float, *, replicate_of=None, noise: float = 0.05) -> dict:
    """A draft record: accept length per prompt around `accept`, the prompts' shared hardness on top."""
    rng = np.random.default_rng([ord(c) for c in name])
    hardness = np.random.default_rng(99).normal(0, 0.3, len(PROMPTS))
    rows = [
        {"system": name, "set": s, "id": i, "depth": 5, "accept_length": float(accept + h + rng.normal(0, noise))}
        for (s, i), h in zip(PROMPTS, hardness)
    ]
    for row in rows:
        row |= {"tokens": 100, "rounds": round(100 / row["accept_length"])}
    return {"name": name, "source": source, "replicate_of": replicate_of, "acceptance": {"per_prompt": rows}}


def grid(levels=LEVELS, *, slope=-0.5, seeds=3, **options) -> tuple[dict, list]:
    """Points p0.. at `levels`, each with `seeds` drafts whose accept length moves by `slope` per nat of NLL."""
    points = {f"p{k}": point(level, seed=k, **options) for k, level in enumerate(levels)}
    drafts = [
        draft(
            f"p{k}-draft" + (f"-seed{s}" if s else ""), f"p{k}", 3.0 + slope * level, replicate_of=s and f"p{k}-draft"
        )
        for k, level in enumerate(levels)
        for s in range(seeds)
    ]
    return points, drafts


def row(result: dict, signal: str, set_name: str = ALL_SETS) -> dict:
    return next(r for r in result["correlations"] if r["signal"] == signal and r["set"] == set_name)


def width(correlation: dict) -> float:
    return max(i["high"] - i["low"] for i in correlation["intervals"])


def test_a_strong_monotone_relation_is_shown_with_the_sign_bet_on_and_an_unrelated_signal_is_not():
    points, drafts = grid()
    said = finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)
    for set_name in ("mtbench", ALL_SETS):
        nll = row(said, "answer_nll", set_name)
        assert nll["rho"] == pytest.approx(-1) and nll["p_value"] < 0.01 and nll["points"] == 6
        assert nll["verdict"] == "shown" and nll["agrees"] is True and nll["expected_sign"] == -1
        assert [i["seed"] for i in nll["intervals"]] == SEEDS and all(i["high"] < 0 for i in nll["intervals"])
        assert said["best_predictor"][set_name] == "answer_nll"
    unrelated = row(said, "prompt_nll")
    assert unrelated["verdict"] == "not shown" and unrelated["agrees"] is None and unrelated["expected_sign"] is None
    assert all(i["low"] < 0 < i["high"] for i in unrelated["intervals"])
    assert said["signals"] == ["answer_length", "answer_nll", "prompt_nll"] and said["waiting"] == []
    json.dumps(said)  # the stage writes it as JSON


def test_a_shown_rho_against_the_bet_does_not_agree():
    points, drafts = grid(slope=+0.5)
    nll = row(finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS), "answer_nll")
    assert nll["rho"] == pytest.approx(1) and nll["verdict"] == "shown" and nll["agrees"] is False


def test_each_point_row_holds_its_seeds_means_and_estimates_with_intervals():
    points, drafts = grid()
    said = finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)
    first = said["points"][0]
    mine = [r for d in drafts if d["source"] == "p0" for r in d["acceptance"]["per_prompt"]]
    assert first["name"] == "p0" and first["seeds"] == 3
    for set_name in ("mtbench", ALL_SETS):
        accept = first["accept_length"][set_name]
        wanted = [r["accept_length"] for r in mine if set_name in (ALL_SETS, r["set"])]
        assert accept["mean"] == pytest.approx(np.mean(wanted)) and accept["prompts"] == len(wanted) // 3
        assert accept["low"] < accept["mean"] < accept["high"]
    nll, signal = first["signals"]["answer_nll"], points["p0"]["signals"]["answer_nll"]
    assert nll["estimate"] == pytest.approx(sum(signal["per_record_value"]) / sum(signal["per_record_weight"]))
    assert nll["low"] < nll["estimate"] < nll["high"] and nll["records"] == len(signal["per_record_value"])


def test_fewer_or_noisier_scored_records_widen_the_interval():
    close = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25]  # points as near in NLL as the noisy score blurs
    precise = finding.closeness(*grid(close, records=400, noise=0.2), boot=BOOT, seeds=SEEDS)
    blurred = finding.closeness(*grid(close, records=10, noise=1.0), boot=BOOT, seeds=SEEDS)
    assert width(row(blurred, "answer_nll")) > width(row(precise, "answer_nll")) + 0.2
    spread = [
        [p["signals"]["answer_nll"]["high"] - p["signals"]["answer_nll"]["low"] for p in said["points"]]
        for said in (precise, blurred)
    ]
    assert all(b > a for a, b in zip(*spread))


def test_fewer_than_three_points_with_drafts_give_no_rho_and_the_rest_wait():
    points, drafts = grid()
    said = finding.closeness(points, [d for d in drafts if d["source"] in ("p0", "p1")], boot=BOOT, seeds=SEEDS)
    nll = row(said, "answer_nll")
    assert nll["rho"] is None and nll["verdict"] == "not shown" and nll["points"] == 2 and "at least 3" in nll["why"]
    assert said["waiting"] == ["p2", "p3", "p4", "p5"] and said["best_predictor"] == {"mtbench": None, ALL_SETS: None}
    assert said["points"][2]["seeds"] == 0 and said["points"][2]["accept_length"] == {"mtbench": None, ALL_SETS: None}


def test_points_without_drafts_wait_outside_the_correlation():
    points, drafts = grid()
    said = finding.closeness(points, [d for d in drafts if d["source"] != "p3"], boot=BOOT, seeds=SEEDS)
    assert said["waiting"] == ["p3"] and row(said, "answer_nll")["points"] == 5
    assert row(said, "answer_nll")["verdict"] == "shown"


def test_a_draw_with_an_undefined_rho_is_skipped_and_counted():
    points, drafts = grid()
    for name, of_point in points.items():  # one duplicate among p0's three scanned records, none elsewhere
        of_point["signals"]["duplicate_rate"] = columns([name == "p0", 0, 0], [1, 1, 1])
    said = finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)
    duplicates = row(said, "duplicate_rate")
    assert all(0 < i["undefined_draws"] < BOOT for i in duplicates["intervals"])  # p0 drew no duplicate: all equal
    assert all(i["low"] is not None for i in duplicates["intervals"])
    assert row(said, "answer_nll")["intervals"][0]["undefined_draws"] == 0


def test_a_signal_missing_at_a_point_is_not_tested():
    points, drafts = grid()
    del points["p4"]["signals"]["answer_length"]
    said = finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)
    assert said["signals"] == ["answer_nll", "prompt_nll"] and said["untested"] == ["answer_length"]


def test_the_same_inputs_and_bootstrap_seeds_give_the_same_result():
    points, drafts = grid()
    once = finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)
    assert finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS) == once
    other = finding.closeness(points, drafts, boot=BOOT, seeds=[7, 8, 9])
    assert row(other, "prompt_nll")["intervals"] != row(once, "prompt_nll")["intervals"]


def test_a_draft_of_no_point_names_the_draft_and_field():
    points, drafts = grid()
    drafts.append(draft("stray-draft", "nowhere", 2.0))
    with pytest.raises(InputError, match=r"draft stray-draft: field 'source': 'nowhere'"):
        finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)


def test_a_replicate_of_another_points_draft_names_it():
    points, drafts = grid()
    drafts.append(draft("p0-draft-seed9", "p1", 2.0, replicate_of="p0-draft"))
    with pytest.raises(InputError, match=r"draft p0-draft-seed9: field 'source': 'p1', but p0-draft's is 'p0'"):
        finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)


@pytest.mark.parametrize("empty", [columns([], []), columns([3.0, 1.0], [0, 0])])
def test_a_signal_with_no_records_names_the_point_and_signal(empty):
    points, drafts = grid()
    points["p2"]["signals"]["prompt_nll"] = empty
    with pytest.raises(InputError, match=r"point p2: signals.prompt_nll: no records"):
        finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)


def test_drafts_scored_on_different_prompts_cannot_be_paired():
    points, drafts = grid()
    drafts[4]["acceptance"]["per_prompt"].pop()
    with pytest.raises(InputError, match=rf"draft {drafts[4]['name']}: acceptance.per_prompt: its prompts differ"):
        finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)


def test_a_malformed_or_repeated_prompt_row_names_the_draft_row_and_field():
    points, drafts = grid()
    del drafts[1]["acceptance"]["per_prompt"][3]["accept_length"]
    with pytest.raises(
        InputError, match=r"draft p0-draft-seed1: acceptance.per_prompt\[3\]: missing field 'accept_length'"
    ):
        finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)
    points, drafts = grid()
    drafts[2]["acceptance"]["per_prompt"].append(drafts[2]["acceptance"]["per_prompt"][0])
    with pytest.raises(
        InputError, match=r"draft p0-draft-seed2: acceptance.per_prompt\[30\]: prompt .* more than once"
    ):
        finding.closeness(points, drafts, boot=BOOT, seeds=SEEDS)


def test_a_set_no_draft_was_scored_on_is_named():
    with pytest.raises(InputError, match=r"sets: 'humaneval': no draft was scored on a prompt of it"):
        finding.closeness(*grid(), boot=BOOT, seeds=SEEDS, sets=("humaneval",))


def test_the_stage_reads_the_committed_records_writes_its_finding_and_figure(tmp_path, monkeypatch):
    import yaml

    from eagle3lab import paths
    from eagle3lab.pipeline import closeness as stage

    monkeypatch.setattr(paths, "ROOT", tmp_path)
    points, drafts = grid(LEVELS[:4])
    params = yaml.safe_load(paths.PARAMS.read_text())
    params["drafts"]["closeness"] |= {"boot": 50, "points": {name: {"source": "sharegpt"} for name in [*points, "p9"]}}
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(params))
    for folder, records in (("points", points), ("point_drafts", {d["name"]: d for d in drafts})):
        for name, record in records.items():
            (tmp_path / "metrics" / folder).mkdir(parents=True, exist_ok=True)
            (tmp_path / "metrics" / folder / f"{name}.json").write_text(json.dumps(record))
    result = stage.run(params_file)
    assert json.loads((tmp_path / stage.RECORD).read_text())["correlations"] == result["correlations"]
    assert result["unmeasured_points"] == ["p9"] and [row["name"] for row in result["points"]] == list(points)
    assert row(result, "answer_nll")["rho"] == pytest.approx(-1)
    assert stage.figure(result, tmp_path / stage.FIGURE).stat().st_size > 10_000
    (tmp_path / "metrics" / "points" / "p0.json").write_text("{")
    with pytest.raises(InputError, match=r"metrics/points/p0.json: not JSON"):
        stage.run(params_file)


def test_the_results_section_shows_each_points_accept_length_and_says_when_its_drafts_mix_dtypes(tmp_path):
    from eagle3lab.pipeline import report_closeness

    said = {"estimate": 1.5, "low": 1.4, "high": 1.6}
    for name in ("near", "far"):
        record = {"name": name, "source": "sharegpt", "slice": {"sets": [], "topic": None}, "draw": {"selected": 9},
                  "training": {"records": 3, "answer_tokens": 80}, "scored": {"records": 5},
                  "estimates": {"answer_nll": said}}  # fmt: skip
        (tmp_path / "points").mkdir(exist_ok=True)
        (tmp_path / "points" / f"{name}.json").write_text(json.dumps(record))
    (tmp_path / "point_drafts").mkdir()
    for name, dtype in (("near-draft", "bfloat16"), ("near-draft-seed1", "float32")):
        record = {"source": "near", "ran": {"cpu": "Xeon A", "auto_dtype": dtype}}
        (tmp_path / "point_drafts" / f"{name}.json").write_text(json.dumps(record))
    accept = {ALL_SETS: {"mean": 1.234, "low": 1.2, "high": 1.25}}
    found = {"points": [{"name": "near", "accept_length": accept}], "correlations": [], "waiting": ["far"]}
    (tmp_path / "closeness.json").write_text(json.dumps(found))
    text = report_closeness.section(tmp_path)
    near, far = (next(line for line in text.splitlines() if line.startswith(f"| {name} |")) for name in ("near", "far"))
    assert near.endswith("| 2 | 1.234 [1.200, 1.250] |") and far.endswith("| 0 | - |")
    assert "Xeon A (bfloat16): 1; Xeon A (float32): 1: the finding mixes dtypes." in text
    (tmp_path / "point_drafts" / "near-draft-seed1.json").unlink()
    assert "ran on Xeon A (bfloat16): 1." in report_closeness.section(tmp_path)


def test_the_searched_signals_p_values_are_holm_adjusted_and_the_bets_stands_alone():
    rows = [{"p_value": p, "noise_verdict": "shown", "expected_sign": None, "rho": 0.9} for p in (0.01, 0.04, 0.03)]
    finding._holm(rows)
    assert [row["p_adjusted"] for row in rows] == pytest.approx([0.03, 0.06, 0.06])
    rows = [finding._judged(row) for row in rows]
    assert [row["verdict"] for row in rows] == ["shown", "not shown", "not shown"]
    result = finding.closeness(*grid(), boot=200, seeds=[0])
    bet = row(result, "answer_nll")
    assert bet["p_adjusted"] == bet["p_value"] and bet["verdict"] == "shown"
    searched = [r for r in result["correlations"] if r["signal"] != "answer_nll" and r["set"] == ALL_SETS]
    assert all(r["p_adjusted"] >= r["p_value"] for r in searched) and len(searched) == 2
