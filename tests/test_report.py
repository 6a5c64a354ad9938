"""`python -m eagle3lab.pipeline.report --compare`: another run's headline figures beside the reference run's."""

import json
import shutil

from eagle3lab import paths
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


def test_scaling_section_says_beyond_the_data_and_sets_drafts_trained_elsewhere_beside_the_fit(tmp_path):
    metrics = tmp_path / "metrics"
    shutil.copytree(paths.METRICS, metrics)
    scaling = json.loads((metrics / "scaling.json").read_text())
    # the reference run: no set's ceiling identified, its fit "needs" 8.3e+15 conversations for 2x on gsm8k
    assert not scaling["fits"]["gsm8k"]["ceiling_identified"] and scaling["fits"]["gsm8k"]["records_for_2x"] > 1e15
    scaling.pop("third_party")  # first without the labelled points (a run from before they were committed)
    (metrics / "scaling.json").write_text(json.dumps(scaling))
    text = report.render(metrics)
    gsm8k = next(line for line in text.splitlines() if line.startswith("| gsm8k | +"))
    assert gsm8k.endswith("| beyond the data | beyond the data |") and "e+" not in text
    assert "past the largest size measured (180 conversations)" in text
    assert "Drafts trained elsewhere" not in text

    scaling["fits"]["gsm8k"]["ceiling_identified"] = True  # a pinned-down ceiling: its readings are printed
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
    assert "| 6.00 |" in gsm8k and "beyond the data" not in gsm8k and "e+" in gsm8k  # 2x read off the fit
    row = "| smollm2-original-6960 | one NVIDIA H200 GPU | original | 6960 | 3790000 | mtbench | 1.57 | 1.41 |"
    assert row in text and "| accept length, 1,5,1,6 | the fit there |" in text


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


def test_engines_table_sets_each_engine_at_its_fastest_config_or_says_do_not_speculate():
    from eagle3lab.pipeline.report_engines import engines_table

    metrics = {
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
    rows = {(r["draft"], r["engine"]): r for r in engines_table(metrics)}
    assert set(rows) == {("final", "local"), ("final", "llamacpp"), ("big", "local"), ("big", "llamacpp")}
    local = rows["final", "local"]
    assert (local["config"], local["vs_own_baseline"], local["vs_fastest_baseline"]) == ("1,2,4,10", 1.2, 0.3)
    assert (local["tuned"], local["tuned_vs_own_baseline"]) == ("1,3,1,4", 22.0 / 20.0)
    losing = rows["final", "llamacpp"]  # slower than llama.cpp alone: the row is its baseline
    assert (losing["config"], losing["tokens_per_s"], losing["accept_length"]) == ("do not speculate", 80.0, None)
    assert (losing["tuned"], losing["tuned_vs_own_baseline"]) == ("do not speculate", None)
    assert rows["big", "llamacpp"]["tuned_vs_own_baseline"] == 84.0 / 80.0
    assert rows["big", "local"]["tuned"] is None  # stage 04 tunes only the final draft locally
