"""TTT training: loss masking, batching, resume equivalence, NaN stop, export, CLI, 2-process DDP."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from eagle3lab.io import read_jsonl
from eagle3lab.models.draft import load_draft
from eagle3lab.train.batches import make_batches
from eagle3lab.train.cli import main
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.loop import TrainingError, train_draft
from eagle3lab.train.loss import STEP_DECAY, ttt_loss
from test_draft import make_draft
from test_features import save_tiny_target, write_conversations

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    target = save_tiny_target(root / "tiny")
    return {
        "root": root,
        "target": str(target),
        "train": str(write_conversations(root / "train.jsonl", 24, seed=1)),
        "val": str(write_conversations(root / "val.jsonl", 4, seed=2)),
        "cache": str(root / "features"),
    }


def config(setup, name, **kw):
    base = dict(
        data=setup["train"],
        val=setup["val"],
        target=setup["target"],
        output=str(setup["root"] / name),
        features_cache=setup["cache"],
        draft_vocab_size=128,
        ttt_length=3,
        max_steps=6,
        batch_tokens=600,
        max_len=160,
        eval_every=3,
        checkpoint_every=2,
        lr=1e-3,
        epochs=3,
        progress=False,
    )
    return TrainConfig(**{**base, **kw})


def synthetic_batch(draft, b=2, t=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    in_vocab = draft.draft_ids
    return {
        "input_ids": in_vocab[torch.randint(0, in_vocab.numel(), (b, t), generator=g)],
        "loss_mask": torch.ones(b, t, dtype=torch.bool),
        "aux": torch.randn(b, t, 3 * draft.config.target_hidden_size, generator=g),
        "final": torch.randn(b, t, draft.config.hidden_size, generator=g),
        "argmax": in_vocab[torch.randint(0, in_vocab.numel(), (b, t), generator=g)],
        "lengths": torch.full((b,), t),
    }


def test_loss_masks_non_assistant_and_out_of_vocab_positions():
    draft = make_draft()
    head = torch.randn(draft.config.draft_vocab_size, draft.config.hidden_size)
    batch = synthetic_batch(draft)
    full = ttt_loss(draft, batch, head, 3, autocast=False)
    t = batch["input_ids"].shape[1]
    # step i at draft position p scores token p+2+i: of 9 tokens, 7-i positions per row carry loss
    assert full["count"].tolist() == [2 * (t - 2 - i) for i in range(3)]
    weighted = sum(STEP_DECAY**i * full["loss_sum"][i] / full["count"][i] for i in range(3))
    torch.testing.assert_close(full["loss"], weighted)

    # a user token (mask False) at index 5: one scored position fewer at every step; its target state is then unused
    masked = {**batch, "loss_mask": batch["loss_mask"].clone()}
    masked["loss_mask"][0, 5] = False
    out = ttt_loss(draft, masked, head, 3, autocast=False)
    assert (full["count"] - out["count"]).tolist() == [1, 1, 1]
    changed = {**masked, "final": masked["final"].clone()}
    changed["final"][0, 4] += 10.0  # the target state at index 4 predicts token 5, which is not learned
    torch.testing.assert_close(ttt_loss(draft, changed, head, 3, autocast=False)["loss"], out["loss"])

    # target argmax outside the draft vocab: that position is dropped too
    oov = int((~draft.t2d).nonzero()[0])
    outside = {**batch, "argmax": batch["argmax"].clone()}
    outside["argmax"][1, 3] = oov
    assert (full["count"] - ttt_loss(draft, outside, head, 3, autocast=False)["count"]).tolist() == [1, 1, 1]


def test_loss_gradient_reaches_every_trainable_weight():
    draft = make_draft().train()
    head = torch.randn(draft.config.draft_vocab_size, draft.config.hidden_size)
    ttt_loss(draft, synthetic_batch(draft), head, 2, autocast=True)["loss"].backward()
    for name, p in draft.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert draft.embed_tokens.weight.grad is None


def test_token_budget_batches():
    lengths = [5, 50, 20, 7, 33, 12, 40, 9, 18, 26]
    a = make_batches(lengths, 64, seed=3, epoch=0)
    assert a == make_batches(lengths, 64, seed=3, epoch=0)
    assert a != make_batches(lengths, 64, seed=3, epoch=1)
    assert sorted(i for b in a for i in b) == list(range(10))
    assert all(len(b) * max(lengths[i] for i in b) <= 64 or len(b) == 1 for b in a)


def test_train_resume_equals_uninterrupted_and_exports(setup):
    full = train_draft(config(setup, "full"))
    assert full["steps"] == 6 and full["tokens_per_s"] > 0 and full["vocab"]["draft_vocab_size"] == 128

    class Killed(Exception):
        pass

    def kill_at_5(step, row):
        if step == 5:
            raise Killed

    with pytest.raises(Killed):
        train_draft(config(setup, "killed"), on_step=kill_at_5)
    assert torch.load(setup["root"] / "killed" / "checkpoint.pt", weights_only=True)["step"] == 4
    with pytest.raises(Exception, match="--resume"):
        train_draft(config(setup, "killed"))
    resumed = train_draft(config(setup, "killed", resume=True))
    assert resumed["param_checksums"] == full["param_checksums"]

    def rows(name):
        return [
            {k: v for k, v in r.items() if k != "tokens_per_s"}
            for r in read_jsonl(setup["root"] / name / "metrics.jsonl")
        ]

    assert rows("killed") == rows("full")
    assert [r["step"] for r in rows("full") if r["split"] == "val"] == [3, 6]
    assert len(rows("full")[-1]["acc_pos"]) == 3

    # the exported draft is the trained one, in SGLang format
    draft = load_draft(setup["root"] / "full" / "draft")
    ids = torch.randint(0, 49152, (1, 6))
    aux = torch.randn(1, 6, 3 * 64)
    with torch.no_grad():
        a = draft(ids, draft.project(aux), torch.arange(6)[None])[0]
        b = load_draft(setup["root"] / "killed" / "draft")(ids, draft.project(aux), torch.arange(6)[None])[0]
    assert torch.equal(a, b)
    with pytest.raises(Exception, match="different settings"):
        train_draft(config(setup, "killed", resume=True, lr=2e-3))


def test_head_starts_fresh_unless_copied_from_the_target(setup):
    from eagle3lab.models.target import load_target

    target_head = load_target(setup["target"]).model.get_output_embeddings().weight
    one_step = dict(max_steps=1, eval_every=10, lr=1e-12)  # the exported head is the initial one
    fresh = train_draft(config(setup, "fresh-head", **one_step))
    first = next(read_jsonl(setup["root"] / "fresh-head" / "metrics.jsonl"))
    # soft cross-entropy against near-uniform draft logits is ln(draft vocab) whatever the target's distribution
    assert first["loss_pos"] == pytest.approx([math.log(128)] * 3, abs=0.2)
    draft = load_draft(fresh["draft"])
    assert not torch.allclose(draft.lm_head.weight, target_head[draft.draft_ids], atol=1e-3)

    copied = load_draft(train_draft(config(setup, "target-head", init_head_from_target=True, **one_step))["draft"])
    torch.testing.assert_close(copied.lm_head.weight, target_head[copied.draft_ids], rtol=0, atol=1e-6)


def test_non_finite_loss_stops_with_step_and_batch(setup):
    with pytest.raises(TrainingError, match=r"non-finite .* step \d+, epoch 0, batch \d+") as e:
        train_draft(config(setup, "nan", lr=1e30, checkpoint_every=1, max_steps=20, val=None))
    bad_step = int(str(e.value).split("step ")[1].split(",")[0])
    ckpt = torch.load(setup["root"] / "nan" / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == bad_step - 1  # nothing saved from the bad step
    assert not (setup["root"] / "nan" / "draft").exists()


def test_cli_online_mode_and_bad_input(setup, capsys):
    out = setup["root"] / "online"
    rc = main(
        [
            "--data",
            setup["train"],
            "--target",
            setup["target"],
            "--output",
            str(out),
            "--online",
            "--draft-vocab-size",
            "128",
            "--ttt-length",
            "2",
            "--max-steps",
            "2",
            "--batch-tokens",
            "600",
            "--max-len",
            "160",
            "--epochs",
            "2",
            "--no-progress",
        ]
    )
    assert rc == 0
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 2 and result["features_cache"] == {} and result["config"]["online"]
    assert not any(out.glob("*.safetensors"))
    assert main(["--data", str(setup["root"] / "missing.jsonl"), "--output", str(out / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_ddp_two_processes_agree(setup):
    out = setup["root"] / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "eagle3lab.train.cli",
        "--data",
        setup["train"],
        "--target",
        setup["target"],
        "--output",
        str(out),
        "--features-cache",
        setup["cache"],
        "--draft-vocab-size",
        "128",
        "--ttt-length",
        "2",
        "--max-steps",
        "3",
        "--batch-tokens",
        "400",
        "--max-len",
        "160",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 3
    assert len(result["param_checksums"]) == 2 and result["ranks_agree"]
    assert result["param_checksums"][0] == result["param_checksums"][1]


# ---- one home for defaults, devices, safe checkpoints ---------------------------------------------------------------


def test_cli_is_generated_from_the_config_and_agrees_with_it():
    from dataclasses import fields

    from eagle3lab.train.cli import build_parser, parse_args

    parsed = parse_args(["--data", "d.jsonl", "--output", "out"])
    assert parsed == TrainConfig(data="d.jsonl", output="out")  # every default comes from the dataclass
    options = {a.dest for a in build_parser()._actions} - {"help"}
    assert options == {f.name for f in fields(TrainConfig)}
    flipped = parse_args(
        ["--data", "d", "--output", "o", "--online", "--no-progress", "--aux-layer-ids", "1,14,26", "--max-steps", "7"]
    )
    assert (flipped.online, flipped.progress, flipped.aux_layer_ids, flipped.max_steps) == (True, False, [1, 14, 26], 7)
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--output", "o", "--dtype", "fp16"])


def test_notebook_and_params_agree_with_the_config():
    """The stage's defaults live in params.yaml; the notebook's parameters cell repeats them (to run alone)."""
    import yaml

    from eagle3lab.paths import ROOT
    from eagle3lab.pipeline.stages import declared_parameters

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    declared = declared_parameters(ROOT / "notebooks" / "03_train_draft.ipynb")
    section = params["train_draft"]
    assert {k: declared[k] for k in section} == section
    assert {k: declared[k] for k in ("target", "seed", "device")} == {
        k: params["common"][k] for k in ("target", "seed", "device")
    }
    assert (ROOT / section["val_data"]).parts[-2:] == ("mixture", "val.jsonl")  # a file stage 01 writes


def test_explicit_cpu_and_auto_devices_train_the_same_draft(setup):
    one = dict(max_steps=2, val=None)
    reference = train_draft(config(setup, "dev-default", **one))
    for device in ("cpu", "auto"):
        result = train_draft(config(setup, f"dev-{device}", device=device, **one))
        assert result["config"]["device"] == device
        if device == "cpu" or not torch.cuda.is_available():  # auto is the CPU here: the very same weights
            assert result["param_checksums"] == reference["param_checksums"]
    with pytest.raises(Exception, match="expected auto"):
        train_draft(config(setup, "dev-bad", device="tpu", **one))


def test_checkpoint_is_plain_data_and_foreign_pickles_are_refused(setup, tmp_path):
    from eagle3lab.train.loop import read_checkpoint

    train_draft(config(setup, "plain", max_steps=2, val=None))
    state = torch.load(setup["root"] / "plain" / "checkpoint.pt", weights_only=True)
    assert isinstance(state["rng"]["torch"], torch.Tensor) and isinstance(state["rng"]["python"], torch.Tensor)

    class Payload:
        def __reduce__(self):
            return (print, ("ran code",))

    torch.save({"identity": {}, "x": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match="evil.pt: not a training checkpoint"):
        read_checkpoint(tmp_path / "evil.pt", {})


def test_scales_plan_ablations_and_train_json(setup, tmp_path):
    from eagle3lab.io import InputError
    from eagle3lab.train.scales import plan_runs, summary_rows, train_metrics

    runs, skipped = plan_runs(
        "r.jsonl", "o.jsonl", [8, 4, 64], 4, 20, [{"scale": 8, "epochs": 10}, {"scale": 99, "ttt_length": 7}]
    )
    assert [r.name for r in runs] == ["scale-00004", "scale-00008", "original-00004", "ablation-epochs10-00008"]
    assert skipped == [64, 99] and runs[-1].overrides == {"epochs": 10} and runs[-1].responses == "ablation"
    every, _ = plan_runs("r", "o", [4, "all"], 4, 20)
    assert [r.records for r in every] == [4, 20, 4] and every[1].name == "scale-00020"
    with pytest.raises(InputError, match=r"scales: \['most'\]"):
        plan_runs("r", "o", [4, "most"], 4, 20)
    with pytest.raises(InputError, match=r"ablations\[0\]: fields \['output'\]"):
        plan_runs("r", "o", [4], 4, 20, [{"scale": 4, "output": "x"}])
    with pytest.raises(InputError, match=r"ablations\[0\]: expected a mapping"):
        plan_runs("r", "o", [4], 4, 20, [{"epochs": 3}])
    result = {
        "data": {"records": 8},
        "tokens_seen": 100,
        "steps": 3,
        "tokens_per_s": 9.0,
        "final_val": None,
        "vocab": {"held_out_coverage": 0.9},
        "responses": "ablation",
        "records": 8,
        "overrides": {"epochs": 10},
    }
    metrics = train_metrics({"ablation-epochs10-00008": result}, tmp_path / "artifacts", tmp_path)
    assert metrics["final"] == "artifacts/drafts/final"
    assert metrics["drafts"][0]["ablation"] == {"epochs": 10} and metrics["drafts"][0]["responses"] == "ablation"
    assert summary_rows({"a": result})[0]["changed"] == "epochs=10"


@pytest.mark.cuda
def test_a_few_bf16_training_steps_on_cuda(setup):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cached = train_draft(config(setup, "cuda", device="cuda", max_steps=4, dtype="bf16"))
    online = train_draft(config(setup, "cuda-online", device="cuda", max_steps=2, online=True, val=None))
    for result in (cached, online):
        assert result["steps"] in (2, 4) and result["ranks_agree"]
    rows = list(read_jsonl(setup["root"] / "cuda" / "metrics.jsonl"))
    assert all(math.isfinite(r["loss"]) for r in rows) and [r["step"] for r in rows if r["split"] == "val"] == [3, 4]

    class Killed(Exception):
        pass

    def kill_at_3(step, row):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        train_draft(config(setup, "cuda-killed", device="cuda", max_steps=4, checkpoint_every=2), on_step=kill_at_3)
    resumed = train_draft(config(setup, "cuda-killed", device="cuda", max_steps=4, checkpoint_every=2, resume=True))
    assert resumed["steps"] == 4 and resumed["final_val"]["positions"] == cached["final_val"]["positions"]
    assert load_draft(cached["draft"]).fc.weight.dtype == torch.float32


def test_train_runs_exports_drafts_and_the_final_one(setup):
    from eagle3lab.train.scales import export_final, plan_runs, train_metrics, train_runs

    root, artifacts = setup["root"], setup["root"] / "artifacts"
    runs, _ = plan_runs("train.jsonl", "train.jsonl", [6, 12], 6, 24, [{"scale": 6, "ttt_length": 2}])
    settings = dict(
        target=setup["target"], device="cpu", draft_vocab_size=128, max_steps=1, batch_tokens=600, max_len=160
    )
    lines = []
    results = train_runs(runs, settings, root, artifacts, "val.jsonl", report=lines.append)
    assert [line.split(":")[0] for line in lines] == [r.name for r in runs]
    assert results["ablation-tttlength2-00006"]["config"]["ttt_length"] == 2
    assert results["scale-00012"]["config"]["ttt_length"] == 3 and results["scale-00012"]["data"]["records"] == 12
    assert export_final(results, artifacts) == "scale-00012"
    assert (artifacts / "drafts" / "final" / "config.json").exists()
    names = [d["name"] for d in train_metrics(results, artifacts, root)["drafts"]]
    assert names == [r.name for r in runs] and all((artifacts / "drafts" / n).is_dir() for n in names)


def test_gpu_smollm2_profile_has_the_reference_keys_and_a_valid_experiment():
    import yaml

    from eagle3lab.paths import ROOT
    from eagle3lab.train.scales import plan_runs

    reference = yaml.safe_load((ROOT / "params.yaml").read_text())
    gpu = yaml.safe_load((ROOT / "params" / "gpu-smollm2.yaml").read_text())
    assert {k: sorted(v) for k, v in gpu.items()} == {k: sorted(v) for k, v in reference.items()}
    t = gpu["train_draft"]
    runs, skipped = plan_runs(
        t["train_data"], t["original_data"], t["scales"], t["original_scale"], 15_000, t["ablations"]
    )
    assert skipped == [] and runs[0].records * 100 <= runs[len(t["scales"]) - 1].records == 15_000  # two decades
    changed = {k for r in runs if r.responses == "ablation" for k in r.overrides}
    assert changed == {"epochs", "draft_vocab_size", "ttt_length"}
    assert {r.records for r in runs if r.responses == "ablation"} == {1500} and 1500 in t["scales"]
    for profile in ("params.yaml", "params/smoke.yaml"):  # the CPU runs train no ablation: their numbers stand
        assert yaml.safe_load((ROOT / profile).read_text())["train_draft"]["ablations"] == []
