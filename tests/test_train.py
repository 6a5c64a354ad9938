"""TTT training: loss masking, batching, resume equivalence, NaN stop, export, CLI, 2-process DDP."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle3lab.drafters.eagle3.loss import STEP_DECAY, ttt_loss
from eagle3lab.drafters.eagle3.train import Eagle3TrainConfig, train_draft
from eagle3lab.io import read_jsonl
from eagle3lab.models.checkpoint import open_checkpoint
from eagle3lab.models.draft import load_draft
from eagle3lab.train.batches import make_batches
from eagle3lab.train.cli import main
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.loop import TrainingError
from test_draft import make_draft
from test_features import save_tiny_target, write_conversations

pytestmark = pytest.mark.usefixtures("one_thread")


class Killed(Exception):
    """A kill -9 stand-in raised from the on_step hook: the run stops where a killed process would."""


def kill_at(stop: int):
    def on_step(step, row):
        if step == stop:
            raise Killed

    return on_step


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
    return Eagle3TrainConfig(**{**base, **kw})


def as_exported(weights: torch.Tensor) -> torch.Tensor:
    """A float32 weight as a bf16-trained draft exports it (rounded to bf16) and load_draft reads it back."""
    return weights.to(torch.bfloat16).to(weights.dtype) if weights.is_floating_point() else weights


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


def test_acceptance_loss_adds_its_weight_times_the_total_variation_and_reports_the_cross_entropy():
    draft = make_draft()
    head = torch.randn(draft.config.draft_vocab_size, draft.config.hidden_size)
    batch = synthetic_batch(draft)
    plain = ttt_loss(draft, batch, head, 3, autocast=False)
    mixed = ttt_loss(draft, batch, head, 3, autocast=False, acceptance_weight=0.5)
    torch.testing.assert_close(mixed["loss_sum"], plain["loss_sum"])  # the held-out figures stay comparable
    # by hand at step 0: draft position j against the target's distribution at j + 1, scored for j < t - 2
    with torch.no_grad():
        hidden = draft.project(batch["aux"])
        inputs = torch.nn.functional.pad(batch["input_ids"][:, 1:], (0, 1))
        positions = torch.arange(batch["input_ids"].shape[1]).expand_as(inputs)
        q = torch.softmax(draft.ttt_forward(inputs, hidden, positions, 1)[0].float(), -1)[:, :-2]
        p = torch.softmax(batch["final"] @ head.T, -1)[:, 1:-1]
    rejected = (1 - torch.minimum(p, q).sum(-1)).mean()
    assert 0 < rejected < 1
    one = ttt_loss(draft, batch, head, 1, autocast=False, acceptance_weight=0.5)
    torch.testing.assert_close(one["loss"], ttt_loss(draft, batch, head, 1, autocast=False)["loss"] + 0.5 * rejected)
    assert mixed["loss"] > plain["loss"]


def test_the_drafts_layer_can_start_from_a_target_layer(setup):
    from eagle3lab.models.target import load_target

    layer = load_target(setup["target"]).model.model.layers[-1]
    one_step = dict(max_steps=1, eval_every=10, lr=1e-12)  # the exported layer is the initial one
    fresh = load_draft(train_draft(config(setup, "fresh-layer", **one_step))["draft"]).midlayer
    copied = load_draft(train_draft(config(setup, "target-layer", init_layer_from_target=-1, **one_step))["draft"])
    mid, hidden = copied.midlayer, layer.self_attn.q_proj.weight.shape[1]
    for name in ("q_proj", "k_proj", "v_proj"):
        own = getattr(mid.self_attn, name).weight
        copied_from = as_exported(getattr(layer.self_attn, name).weight)
        torch.testing.assert_close(own[:, hidden:], copied_from, rtol=0, atol=1e-6)
        torch.testing.assert_close(own[:, :hidden], getattr(fresh.self_attn, name).weight[:, :hidden])  # same seed
    torch.testing.assert_close(mid.mlp.down_proj.weight, as_exported(layer.mlp.down_proj.weight), rtol=0, atol=1e-6)
    torch.testing.assert_close(mid.hidden_norm.weight, as_exported(layer.input_layernorm.weight), rtol=0, atol=1e-6)
    assert not torch.allclose(fresh.mlp.down_proj.weight, mid.mlp.down_proj.weight)


def test_settings_added_later_keep_older_checkpoints_resumable(setup):
    from eagle3lab.train.loop import ADDED_LATER, run_identity

    plain = run_identity(config(setup, "identity"))
    assert not set(ADDED_LATER) & set(plain)  # a checkpoint written before these settings existed still matches
    assert run_identity(config(setup, "identity", acceptance_loss_weight=1.0))["acceptance_loss_weight"] == 1.0
    assert run_identity(config(setup, "identity", init_layer_from_target=-1))["init_layer_from_target"] == -1


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

    with pytest.raises(Killed):
        train_draft(config(setup, "killed"), on_step=kill_at(5))
    checkpoint = torch.load(setup["root"] / "killed" / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 4 and checkpoint["best"]["step"] <= 4  # the best so far travels with the checkpoint
    with pytest.raises(Exception, match="--resume"):
        train_draft(config(setup, "killed"))
    resumed = train_draft(config(setup, "killed", resume=True))
    assert resumed["param_checksums"] == full["param_checksums"]
    assert resumed["best"] == full["best"] and full["best"] is not None

    def rows(name):
        return [
            {k: v for k, v in r.items() if k != "tokens_per_s"}
            for r in read_jsonl(setup["root"] / name / "metrics.jsonl")
        ]

    assert rows("killed") == rows("full")
    # held-out evaluations: every eval_every (3) steps, at each epoch's end, and at the last step
    train_rows = [r for r in rows("full") if r["split"] == "train"]
    epoch_ends = {a["step"] for a, b in zip(train_rows, train_rows[1:]) if a["epoch"] != b["epoch"]}
    val = [r for r in rows("full") if r["split"] == "val"]
    assert [r["step"] for r in val] == sorted({3, 6} | epoch_ends) and len(val[-1]["acc_pos"]) == 3
    assert all(1.0 <= r["accept_length"] <= 4.0 for r in val)  # exact, a chain of ttt_length 3: 1 to 4 a round
    first_best = max(val, key=lambda r: r["accept_length"])  # max() keeps the first of equals, as the pick does
    assert full["best"] == {k: first_best[k] for k in ("step", "epoch", "accept_length")}

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
    with pytest.raises(Exception, match=r"different settings \(eval_every\)"):  # it picks the exported draft
        train_draft(config(setup, "killed", resume=True, eval_every=2))


def test_the_exported_draft_is_the_best_held_out_one(setup, monkeypatch):
    """Held-out accuracies scripted to peak at step 2 of 5 (step 4 only ties it) while training goes on: the run
    exports step 2's weights, which a second, identical run killed right after step 2 left in its checkpoint."""
    from eagle3lab.drafters.eagle3 import train as loop

    real_evaluate = loop.evaluate

    def scripted(lengths):
        return lambda *args: {**real_evaluate(*args), "accept_length": next(lengths)}

    run = dict(max_steps=5, eval_every=1, checkpoint_every=1)
    monkeypatch.setattr(loop, "evaluate", scripted(iter([1.2, 1.6, 1.4, 1.6, 1.1])))
    result = train_draft(config(setup, "peak", **run))
    epoch_of_step_2 = next(r["epoch"] for r in read_jsonl(setup["root"] / "peak" / "metrics.jsonl") if r["step"] == 2)
    assert result["best"] == {"step": 2, "epoch": epoch_of_step_2, "accept_length": 1.6}
    assert result["final_val"]["step"] == 5

    monkeypatch.setattr(loop, "evaluate", scripted(iter([1.2, 1.6])))
    with pytest.raises(Killed):
        train_draft(config(setup, "peak-at-2", **run), on_step=kill_at(2))
    at_2 = torch.load(setup["root"] / "peak-at-2" / "checkpoint.pt", weights_only=True)["draft"]
    last = torch.load(setup["root"] / "peak" / "checkpoint.pt", weights_only=True)["draft"]
    exported = load_draft(result["draft"]).state_dict()
    assert all(torch.equal(exported[k], as_exported(v)) for k, v in at_2.items())
    assert not all(torch.equal(exported[k], as_exported(v)) for k, v in last.items())


def test_patience_stops_at_the_plateau_and_a_resumed_run_stops_there_too(setup, monkeypatch):
    """Scripted held-out accept lengths peak at step 2; with patience 2 the run stops after step 4 (two evaluations
    in a row without a better one), exports step 2's draft, says it plateaued, and a run killed at step 3 and resumed
    ends identically."""
    from eagle3lab.drafters.eagle3 import train as loop

    real_evaluate = loop.evaluate

    def scripted():
        lengths = iter([1.2, 1.6, 1.5, 1.6, 1.9, 2.0])
        return lambda *args: {**real_evaluate(*args), "accept_length": next(lengths)}

    run = dict(max_steps=6, eval_every=1, checkpoint_every=1, patience=2)
    monkeypatch.setattr(loop, "evaluate", scripted())
    result = train_draft(config(setup, "patient", **run))
    assert (result["steps"], result["budget_steps"], result["plateaued"]) == (4, 6, True)
    assert result["best"]["step"] == 2 and result["best"]["accept_length"] == 1.6
    monkeypatch.setattr(loop, "evaluate", scripted())
    with pytest.raises(Killed):
        train_draft(config(setup, "patient-killed", **run), on_step=kill_at(3))
    resumed = train_draft(config(setup, "patient-killed", resume=True, **run))  # the script goes on at step 4
    assert resumed["steps"] == 4 and resumed["best"] == result["best"] and resumed["plateaued"]
    monkeypatch.setattr(loop, "evaluate", scripted())
    again = train_draft(config(setup, "patient", resume=True, **run))  # a finished, plateaued run stays stopped
    assert again["steps"] == 4 and again["param_checksums"] == result["param_checksums"]
    monkeypatch.setattr(loop, "evaluate", scripted())
    assert train_draft(config(setup, "impatient", max_steps=6, eval_every=1))["plateaued"] is False


def test_without_held_out_data_the_last_draft_is_exported(setup):
    result = train_draft(config(setup, "no-val", max_steps=2, val=None))
    last = torch.load(setup["root"] / "no-val" / "checkpoint.pt", weights_only=True)["draft"]
    exported = load_draft(result["draft"]).state_dict()
    assert result["best"] is None and all(torch.equal(exported[k], as_exported(v)) for k, v in last.items())


@pytest.fixture(scope="module")
def start_draft(setup) -> str:
    """A draft folder fine-tuning starts from."""
    return train_draft(config(setup, "start", max_steps=2, val=None))["draft"]


def test_fine_tuning_starts_from_the_drafts_weights_and_keeps_its_vocabulary(setup, start_draft, tmp_path):
    start = start_draft
    other = str(write_conversations(tmp_path / "other.jsonl", 24, seed=7))
    fresh = train_draft(config(setup, "fresh-on-other", data=other, max_steps=1, val=None))
    # at learning rate 0 the fine-tuned draft is the one it started from, weight for weight
    tuned = train_draft(config(setup, "tuned", data=other, init_draft=start, max_steps=1, lr=0.0, val=None))
    vocab = {name: json.loads((Path(path) / ".." / "vocab.json").read_text())["ids"]
             for name, path in (("start", start), ("fresh", fresh["draft"]), ("tuned", tuned["draft"]))}  # fmt: skip
    assert vocab["tuned"] == vocab["start"] != vocab["fresh"]  # the other data's own vocabulary differs
    assert tuned["config"]["init_draft"] == start and "init_draft" not in fresh["config"]  # recorded where used
    assert tuned["vocab"]["coverage"] < fresh["vocab"]["coverage"] == 1.0  # reported on the data it trained on
    started, ended = load_draft(start).state_dict(), load_draft(tuned["draft"]).state_dict()
    assert started.keys() == ended.keys() and all(torch.equal(ended[k], v) for k, v in started.items())


def test_fine_tuning_refuses_a_draft_these_settings_would_not_train(setup, start_draft):
    from eagle3lab.io import InputError

    start = start_draft
    with pytest.raises(InputError, match=r"start/draft/config.json: field draft_vocab_size is 128, the training "):
        train_draft(config(setup, "refused", init_draft=start, draft_vocab_size=64))
    with pytest.raises(InputError, match=r"init_head_from_target and init_layer_from_target start a fresh draft"):
        train_draft(config(setup, "refused", init_draft=start, init_head_from_target=True))
    with pytest.raises(InputError, match=r"init_draft: .*nowhere/config.json"):
        train_draft(config(setup, "refused", init_draft=str(setup["root"] / "nowhere")))


def test_token_cap_bounds_tokens_and_steps_and_the_schedule_spans_it(setup):
    from eagle3lab.io import InputError
    from eagle3lab.train.loop import lr_factor

    uncapped = train_draft(config(setup, "uncapped", max_steps=None, epochs=2, val=None))
    rows = list(read_jsonl(setup["root"] / "uncapped" / "metrics.jsonl"))
    first_pass = sum(r["epoch"] == 0 for r in rows)
    assert uncapped["steps"] == len(rows) > first_pass + 1
    # a cap halfway through the second pass's second step: the run stops after that pass's first step
    cap = (rows[first_pass]["answer_tokens"] + rows[first_pass + 1]["answer_tokens"]) // 2
    capped = train_draft(config(setup, "capped", max_steps=None, epochs=2, val=None, max_answer_tokens=cap))
    capped_rows = list(read_jsonl(setup["root"] / "capped" / "metrics.jsonl"))
    assert capped["steps"] == first_pass + 1 and capped_rows[-1]["epoch"] == 1
    # the budget counts answer tokens (the loss's), not the prompts': those are more, and the run still goes on
    assert (
        capped["answer_tokens_seen"] == rows[first_pass]["answer_tokens"] <= cap < rows[first_pass + 1]["answer_tokens"]
    )
    assert capped["tokens_seen"] > cap
    # the cosine schedule ends at the capped run's last step, not the uncapped one's
    lrs = [1e-3 * lr_factor(s, capped["steps"], 1, 0.1) for s in range(capped["steps"])]
    assert [r["lr"] for r in capped_rows] == pytest.approx(lrs)
    with pytest.raises(InputError, match="max_answer_tokens 10: the first step alone trains on"):
        train_draft(config(setup, "cap-too-small", val=None, max_answer_tokens=10))


def test_answer_token_floor_adds_whole_passes_until_reached(setup):
    from eagle3lab.io import InputError

    two = train_draft(config(setup, "two-passes", max_steps=None, epochs=2, val=None))
    rows = list(read_jsonl(setup["root"] / "two-passes" / "metrics.jsonl"))
    one_pass = sum(r["epoch"] == 0 for r in rows)
    first_pass_tokens = rows[one_pass - 1]["answer_tokens"]
    reached = train_draft(
        config(setup, "floor-met", max_steps=None, epochs=1, val=None, min_answer_tokens=first_pass_tokens)
    )
    assert reached["steps"] == one_pass  # one pass already holds the floor: no more passes
    short = config(setup, "floor-short", max_steps=None, epochs=1, val=None, min_answer_tokens=first_pass_tokens + 1)
    assert train_draft(short)["steps"] == two["steps"]  # one token short: a whole second pass, the same data order
    with pytest.raises(InputError, match="min_answer_tokens 9 exceeds max_answer_tokens 8"):
        config(setup, "floor-over-cap", val=None, min_answer_tokens=9, max_answer_tokens=8).check()


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
    torch.testing.assert_close(copied.lm_head.weight, as_exported(target_head[copied.draft_ids]), rtol=0, atol=1e-6)


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


def test_one_train_command_for_every_drafter_kind():
    """`eagle3lab train --drafter dflash` takes the shared options and the block drafter's own."""
    from dataclasses import fields

    from eagle3lab.drafters.dflash.train import DFlashTrainConfig
    from eagle3lab.train.cli import build_parser, parse_args

    kind, parsed = parse_args(["--drafter", "dflash", "--data", "d.jsonl", "--output", "out", "--block-size", "6"])
    assert kind.name == "dflash" and parsed == DFlashTrainConfig(data="d.jsonl", output="out", block_size=6)
    assert {a.dest for a in build_parser("dflash")._actions} - {"help", "drafter"} == {
        f.name for f in fields(DFlashTrainConfig)
    }
    with pytest.raises(SystemExit):  # a block drafter's option is not EAGLE-3's
        parse_args(["--data", "d", "--output", "o", "--block-size", "6"])


def test_cli_is_generated_from_the_config_and_agrees_with_it():
    from dataclasses import fields

    from eagle3lab.train.cli import build_parser, parse_args

    kind, parsed = parse_args(["--data", "d.jsonl", "--output", "out"])
    assert kind.name == "eagle3"
    assert parsed == Eagle3TrainConfig(data="d.jsonl", output="out")  # every default comes from the dataclass
    options = {a.dest for a in build_parser()._actions} - {"help", "drafter"}
    assert (
        options == {f.name for f in fields(Eagle3TrainConfig)} == {f.name for f in fields(TrainConfig)} | {"init_draft"}
    )
    _, flipped = parse_args(
        ["--data", "d", "--output", "o", "--online", "--no-progress", "--aux-layer-ids", "1,14,26", "--max-steps", "7"]
    )
    assert (flipped.online, flipped.progress, flipped.aux_layer_ids, flipped.max_steps) == (True, False, [1, 14, 26], 7)
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--output", "o", "--dtype", "fp16"])


def test_drafts_are_picked_on_the_targets_own_held_out_answers():
    """train_draft's held-out file is the one stage 02 writes from the held-out prompts (the notebooks' parameters
    equal params.yaml: tests/test_stages.py)."""
    import yaml

    from eagle3lab.paths import ROOT

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["train_draft"]["val_data"] == params["regenerate"]["val_output"]
    assert params["regenerate"]["val_input"] == "artifacts/mixture/val.jsonl"  # a file stage 01 writes


def test_dvc_exp_run_set_param_reaches_the_notebook(tmp_path, monkeypatch):
    """`dvc exp run -S train_draft.scales=[6,12]` rewrites params.yaml, then runs the stage runner, which reads
    params.yaml when it runs: DVC's own rewrite (of a copy here) reaches the notebook, and an unknown key is refused."""
    import shutil

    from dvc.utils.hydra import apply_overrides

    from eagle3lab import paths
    from eagle3lab.pipeline.stages import StageError, load_params, notebook_for, stage_parameters

    notebook = notebook_for("train_draft")
    before = stage_parameters("train_draft", notebook, load_params(), paths.PARAMS)
    copy = shutil.copy(paths.PARAMS, tmp_path / "params.yaml")
    apply_overrides(
        copy, ["train_draft.scales=[6,12]", "train_draft.max_answer_tokens=50000", "train_draft.live_dir=null"]
    )
    monkeypatch.setattr(paths, "PARAMS", copy)  # the file the runner finds at run time (run_stage's default)
    after = stage_parameters("train_draft", notebook, load_params(), copy)
    assert after == {**before, "scales": [6, 12], "max_answer_tokens": 50000, "live_dir": None}
    apply_overrides(copy, ["+train_draft.bogus=1"])
    with pytest.raises(StageError, match=r"\['bogus'\]"):
        stage_parameters("train_draft", notebook, load_params(), copy)


def test_live_curves_follow_the_metrics_through_a_resume_and_dvc_plots_reads_them(setup, tmp_path, monkeypatch):
    """dvclive is refused in a git repository without DVC (it would `dvc init` it). Two drafts log into the stage's
    dvclive folder (a DVC repo laid out like this one); one is killed after its checkpoint and resumed. Each curve
    holds every step once, with metrics.jsonl's values, and `dvc plots show` with this repo's dvc.yaml plots entry
    finds every curve and parses it; `dvc exp show`'s metrics entry finds each run's held-out pick."""
    import csv

    import yaml
    from dvc.repo import Repo

    from eagle3lab.io import InputError
    from eagle3lab.paths import ROOT
    from eagle3lab.train.live import LiveCurves

    git_only = tmp_path / "git"
    subprocess.run(["git", "init", "-q", str(git_only)], check=True)
    monkeypatch.chdir(git_only)
    with pytest.raises(InputError, match="has no DVC and which dvclive would `dvc init`"):
        LiveCurves(git_only / "live", "run", [])
    assert not (git_only / ".dvc").exists()
    repo = tmp_path / "repo"
    repo.mkdir()
    monkeypatch.chdir(repo)
    Repo.init(repo, no_scm=True)
    ours = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    (repo / "dvc.yaml").write_text(yaml.safe_dump({k: ours[k] for k in ("plots", "metrics")}))
    live = repo / yaml.safe_load((ROOT / "params.yaml").read_text())["train_draft"]["live_dir"]
    run = dict(live_dir=str(live), max_steps=4, eval_every=2, checkpoint_every=2, epochs=1)
    train_draft(config(setup, "live-other", **run))

    with pytest.raises(Killed):
        train_draft(config(setup, "live-run", **run), on_step=kill_at(3))
    resumed = train_draft(config(setup, "live-run", resume=True, **run))

    def curve(*parts):
        with open(live / "plots" / "metrics" / Path(*parts).with_suffix(".tsv")) as f:
            return [(int(r["step"]), float(r[parts[-1]])) for r in csv.DictReader(f, delimiter="\t")]

    for name in ("live-run", "live-other"):
        rows = list(read_jsonl(setup["root"] / name / "metrics.jsonl"))
        train, val = ([r for r in rows if r["split"] == split] for split in ("train", "val"))
        assert curve(name, "train", "loss") == [(r["step"], r["loss"]) for r in train] and len(train) == 4
        assert curve(name, "val", "accept_length") == [(r["step"], r["accept_length"]) for r in val]
        assert curve(name, "val", "acc1") == [(r["step"], r["acc_pos"][1]) for r in val]
    shown = Repo(repo).plots.show()["workspace"]
    sources = shown["sources"]["data"]
    tsvs = sorted(str(p.relative_to(repo)) for p in live.rglob("*.tsv"))
    assert len(tsvs) == 2 * (2 + 2 + 3) and sorted(sources) == tsvs
    assert all("error" not in s and s["data"] for s in sources.values())
    summary = Repo(repo).metrics.show()[""]["data"][str(live.relative_to(repo) / "metrics.json")]["data"]
    assert summary["live-run"]["best"] == resumed["best"] and set(summary) >= {"live-run", "live-other"}


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
    from eagle3lab.train.resume import read_checkpoint

    train_draft(config(setup, "plain", max_steps=2, val=None))
    state = torch.load(setup["root"] / "plain" / "checkpoint.pt", weights_only=True)
    assert isinstance(state["rng"]["torch"], torch.Tensor) and isinstance(state["rng"]["python"], torch.Tensor)

    class Payload:
        def __reduce__(self):
            return (print, ("ran code",))

    torch.save({"identity": {}, "x": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(Exception, match="evil.pt: not a training checkpoint"):
        read_checkpoint(tmp_path / "evil.pt", {})


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

    with pytest.raises(Killed):
        train_draft(config(setup, "cuda-killed", device="cuda", max_steps=4, checkpoint_every=2), on_step=kill_at(3))
    resumed = train_draft(config(setup, "cuda-killed", device="cuda", max_steps=4, checkpoint_every=2, resume=True))
    assert resumed["steps"] == 4 and resumed["final_val"]["positions"] == cached["final_val"]["positions"]
    assert open_checkpoint(cached["draft"]).shapes()["fc.weight"][1] == "bfloat16"


def test_train_runs_exports_drafts_and_the_final_one(setup):
    from eagle3lab.io import write_jsonl
    from eagle3lab.train.answer_tokens import AnswerTokens
    from eagle3lab.train.plan import plan_runs
    from eagle3lab.train.scales import export_final, train_metrics, train_runs

    root, artifacts = setup["root"], setup["root"] / "artifacts"
    rows = [row | {"source": "aab"[i % 3]} for i, row in enumerate(read_jsonl(setup["train"]))]
    write_jsonl(root / "sourced.jsonl", rows)
    runs, _ = plan_runs(
        root,
        AnswerTokens(setup["target"], max_len=160),
        train_data="sourced.jsonl",
        original_data="sourced.jsonl",  # the same answers: the original draft takes the same conversations
        scales=[6, 12],
        original_scales=[6],
        source_drafts=["a", "b"],
        ablations=[{"scale": 6, "ttt_length": 2}],
    )
    settings = dict(
        target=setup["target"], device="cpu", draft_vocab_size=128, max_steps=1, batch_tokens=600, max_len=160
    )
    lines = []
    results = train_runs(runs, settings, root, artifacts, "val.jsonl", report=lines.append)
    assert [line.split(":")[0] for line in lines] == [r.name for r in runs]
    assert results["ablation-tttlength2-00006"]["config"]["ttt_length"] == 2
    assert results["scale-00012"]["config"]["ttt_length"] == 3 and results["scale-00012"]["data"]["records"] == 12
    assert results["original-00006"]["data"]["records"] == 6
    sources = {s: results[f"source-{s}"]["data"]["records"] for s in "ab"}
    assert sources["a"] == 16 or sources["b"] == 8  # the source with fewer answer tokens: all of its conversations
    for run in runs:  # the plan counts the answer tokens training trains on
        assert results[run.name]["data"]["loss_tokens"] == run.answer_tokens > 0
    assert export_final(results, artifacts) == "scale-00012"
    assert (artifacts / "drafts" / "final" / "config.json").exists()
    drafts = train_metrics(results, artifacts, root)["drafts"]
    assert [d["name"] for d in drafts] == [r.name for r in runs] and all((root / d["path"]).is_dir() for d in drafts)
    assert [(d["responses"], d["source"], d["matched_to"]) for d in drafts if d["responses"] != "regenerated"] == [
        ("original", None, "scale-00006"),
        ("source", "a", None),
        ("source", "b", None),
        ("ablation", None, "scale-00006"),
    ]
