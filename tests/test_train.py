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
from eagle3lab.train.loop import STEP_DECAY, TrainConfig, TrainingError, main, make_batches, train_draft, ttt_loss
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
    assert torch.load(setup["root"] / "killed" / "checkpoint.pt", weights_only=False)["step"] == 4
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
    ckpt = torch.load(setup["root"] / "nan" / "checkpoint.pt", weights_only=False)
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
        "eagle3lab.train.loop",
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
