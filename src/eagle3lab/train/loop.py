"""The training loop every drafter kind shares: the data plan, optimizer and cosine schedule, checkpoints and resume,
held-out evaluation and the export pick (train.selection), the patience rule and DDP. A kind subclasses `Trainer`
with what is its own: its draft and objective (`build`), one batch's loss (`step_loss`) and the metrics of it
(`step_metrics`), and its exact held-out walk (`held_out`); drafters/<kind>/train.py runs it with `run_trainer`
and exports what it trained.

Runs unchanged under `torchrun --nproc-per-node N` where the kind allows it (DDP: gloo on CPU, NCCL with one GPU per
rank). The checkpoint holds plain types only (tensors, dicts, lists, numbers, strings) and is read with
torch.load(weights_only=True). With held-out data the exported draft is the one of the best held-out accept length;
`max_answer_tokens` ends the data plan early, `epochs` being then the most passes."""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import torch

from eagle3lab.devices import clock, resolve_device
from eagle3lab.io import InputError, RunFailed, atomic_path, read_jsonl, sha256_file, write_jsonl
from eagle3lab.train.batches import make_batches
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.distributed import Dist, init_distributed
from eagle3lab.train.inputs import Inputs, load_inputs
from eagle3lab.train.live import LiveCurves
from eagle3lab.train.resume import (
    CHECKPOINT,
    draft_weights,
    load_draft_weights,
    read_checkpoint,
    rng_state,
    set_rng_state,
)
from eagle3lab.train.selection import BestDraft

METRICS = "metrics.jsonl"
# Settings a run may change when it resumes (where things are, how often to save), not what it computes or exports:
# the held-out data and eval_every pick the exported draft, so they stay (the data files by content).
RESUMABLE = {"output", "resume", "progress", "threads", "checkpoint_every", "features_cache", "online", "device"}
RESUMABLE |= {"live_dir"}
# Settings added after runs were checkpointed without them: in a run's identity only when set, so those runs resume.
ADDED_LATER = {"init_layer_from_target": None, "acceptance_loss_weight": 0.0, "init_draft": None}


class TrainingError(RunFailed):
    pass


# ---- schedule / checkpoint -----------------------------------------------------------------------------------------


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def run_identity(cfg: TrainConfig) -> dict:
    """Settings that must not change between a run and its resumption."""
    ident = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in RESUMABLE}
    ident = {k: v for k, v in ident.items() if k not in ADDED_LATER or v != ADDED_LATER[k]}
    ident["data"] = sha256_file(cfg.data)
    ident["val"] = sha256_file(cfg.val) if cfg.val else None
    return ident


# ---- the run -------------------------------------------------------------------------------------------------------


class Trainer:
    """One run's moving parts: the draft and what a step calls (DDP-wrapped across ranks), optimizer, schedule, data
    plan and counters. A drafter kind implements the four methods that raise NotImplementedError."""

    def __init__(self, cfg: TrainConfig, env: Dist, device: torch.device, inputs: Inputs, out: Path):
        self.cfg, self.env, self.device, self.inputs, self.out = cfg, env, device, inputs, out
        self.draft, self.model = self.build()
        if env.world > 1:
            ids = [device.index] if device.type == "cuda" else None
            self.model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=ids, broadcast_buffers=False)
        self.params = [p for p in self.draft.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.plan = self._plan()
        total = min(len(self.plan), cfg.max_steps) if cfg.max_steps else len(self.plan)
        warmup = max(1, int(cfg.warmup_ratio * total))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, total, warmup, cfg.min_lr_ratio)
        )
        self.total, self.step, self.tokens_seen, self.answer_tokens_seen = total, 0, 0, 0
        self.train_time, self.last_val = 0.0, None
        self.best, self.curves = BestDraft(), None

    # ---- what a drafter kind supplies

    def build(self) -> tuple[torch.nn.Module, torch.nn.Module]:
        """A fresh draft on self.device, and the module a step calls (the draft, or an objective wrapping it): the
        one DDP wraps. The target's weights the kind needs (embedding, head) it keeps on self."""
        raise NotImplementedError

    def step_loss(self, rows: list[int]) -> tuple[dict, dict]:
        """(the loss dict of this rank's batch of `rows`, with "loss" to backpropagate; the batch, with "lengths"
        and "loss_mask")."""
        raise NotImplementedError

    def step_metrics(self, out: dict) -> dict:
        """The metrics row's loss and per-position fields from a step's loss dict (summed over ranks)."""
        raise NotImplementedError

    def held_out(self) -> dict:
        """Scores of the draft on the held-out data; "accept_length" (exact, the kind's offline walk) picks the
        export."""
        raise NotImplementedError

    # ---- the shared run

    def _plan(self) -> list[tuple[int, int, list[int]]]:
        """The whole data order, fixed by (seed, epoch): position in it is the step counter. It holds `epochs` passes,
        more while the answer tokens trained on (summed over ranks) are short of min_answer_tokens, and ends before
        the first step that would take them past max_answer_tokens, so the cosine schedule spans the run. Answer
        tokens, not all tokens: drafts on answers of unequal prompts (original against regenerated ones) then learn
        from equal numbers of predicted tokens."""
        cfg, env, lengths, answers = self.cfg, self.env, self.inputs.train.lengths, self.inputs.train.answer_lengths
        plan, tokens, epoch = [], 0, 0
        while epoch < cfg.epochs or tokens < (cfg.min_answer_tokens or 0):
            batches = make_batches(lengths, cfg.batch_tokens, cfg.seed, epoch)
            per_rank = len(batches) // env.world
            if per_rank == 0:
                raise InputError(
                    f"{cfg.data}: {len(batches)} batches cannot feed {env.world} ranks; lower --batch-tokens"
                )
            if epoch and tokens == 0:
                raise InputError(f"{cfg.data}: no answer tokens to train on (min_answer_tokens cannot be reached)")
            for i in range(per_rank):
                step_batches = batches[i * env.world : (i + 1) * env.world]
                tokens += sum(answers[j] for b in step_batches for j in b)
                if cfg.max_answer_tokens is not None and tokens > cfg.max_answer_tokens:
                    if not plan:
                        raise InputError(
                            f"max_answer_tokens {cfg.max_answer_tokens}: the first step alone trains on {tokens} "
                            "answer tokens; raise it or lower batch_tokens"
                        )
                    return plan
                plan.append((epoch, i, step_batches[env.rank]))
            epoch += 1
        return plan

    @property
    def metrics_path(self) -> Path:
        return self.out / METRICS

    def restore(self, state: dict) -> None:
        load_draft_weights(self.draft, state["draft"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"], self.device)
        self.best.restore(state["best"])
        self.step, self.tokens_seen, self.train_time = state["step"], state["tokens_seen"], state["train_time"]
        self.answer_tokens_seen = state["answer_tokens_seen"]
        if self.env.main and self.metrics_path.exists():  # drop rows logged after the checkpoint: they are redone
            kept = [r for r in read_jsonl(self.metrics_path, tolerate_torn_tail=True) if r["step"] <= self.step]
            write_jsonl(self.metrics_path, kept)

    def open_curves(self) -> None:
        """dvclive's per-step curves in cfg.live_dir, rebuilt from the rows metrics.jsonl holds (main rank only)."""
        if self.cfg.live_dir and self.env.main:
            self.curves = LiveCurves(self.cfg.live_dir, self.out.name, list(read_jsonl(self.metrics_path)))

    def save(self, identity: dict) -> None:
        if not self.env.main:
            return
        state = {
            "identity": identity,
            "draft": draft_weights(self.draft),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(self.device),
            "best": self.best.state(),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "answer_tokens_seen": self.answer_tokens_seen,
            "train_time": self.train_time,
        }
        with atomic_path(self.out / CHECKPOINT) as tmp:
            torch.save(state, tmp)

    def log(self, row: dict) -> None:
        if self.env.main:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            if self.curves is not None:
                self.curves.log(row)

    def plateaued(self) -> bool:
        """The patience rule: `patience` held-out evaluations in a row have not beaten the best. The main rank
        evaluates; every rank learns its verdict."""
        if not self.cfg.patience:
            return False
        spent = torch.tensor([float(self.best.stale >= self.cfg.patience)], device=self.device)
        return bool(self.env.sum(spent).item() > 0)

    def evaluates(self, epoch: int) -> bool:
        """Held-out evaluation (main rank) every eval_every steps, at each epoch's end and at the last step."""
        if self.inputs.val is None or not self.env.main:
            return False
        epoch_ends = self.step == self.total or self.plan[self.step][0] != epoch
        return epoch_ends or self.step % self.cfg.eval_every == 0

    def evaluate_held_out(self, epoch: int) -> None:
        scores = self.held_out()
        self.best.offer(self.draft, self.step, epoch, scores["accept_length"])
        self.last_val = {"step": self.step, "epoch": epoch, "split": "val", **scores}
        self.log(self.last_val)

    def train_step(self) -> dict:
        """One optimizer step over this rank's batch; the metrics row (summed over ranks)."""
        cfg, env = self.cfg, self.env
        epoch, batch_no, rows = self.plan[self.step]
        t0 = clock(self.device)
        out, batch = self.step_loss(rows)
        loss = out["loss"]
        if env.sum(torch.isfinite(loss).logical_not().float().reshape(1)).item():
            last = self.out / CHECKPOINT
            raise TrainingError(
                f"non-finite loss ({loss.item()}) at step {self.step + 1}, epoch {epoch}, batch {batch_no} "
                f"(rank {env.rank}); nothing was saved from this step; last checkpoint: "
                f"{last if last.exists() else 'none'}"
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip)
        if not torch.isfinite(grad_norm):
            raise TrainingError(
                f"non-finite gradient norm at step {self.step + 1}, epoch {epoch}, batch {batch_no}; not applied"
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        # one collective for both counts: all tokens, and the answer tokens the loss scores
        real_tokens, answer_tokens = env.sum(torch.stack([batch["lengths"].sum(), batch["loss_mask"].sum()])).tolist()
        self.train_time += clock(self.device) - t0
        self.tokens_seen += real_tokens
        self.answer_tokens_seen += answer_tokens
        return {
            "step": self.step,
            "epoch": epoch,
            "split": "train",
            **self.step_metrics(out),
            "lr": lr,
            "grad_norm": round(float(grad_norm), 5),
            "tokens": self.tokens_seen,
            "answer_tokens": self.answer_tokens_seen,
            "tokens_per_s": round(self.tokens_seen / max(self.train_time, 1e-9), 1),
        }

    def run(self, identity: dict, on_step=None) -> None:
        from tqdm import tqdm

        cfg = self.cfg
        bar = tqdm(
            total=self.total, initial=self.step, unit="step", desc="train", disable=not (cfg.progress and self.env.main)
        )
        self.model.train()
        stop = self.plateaued()  # a resumed run that had plateaued stays stopped
        while self.step < self.total and not stop:
            row = self.train_step()
            self.log(row)
            bar.update(1)
            bar.set_postfix(
                loss=f"{row['loss']:.3f}", acc0=f"{row['acc_pos'][0]:.3f}", tok_s=f"{row['tokens_per_s']:.0f}"
            )
            if self.evaluates(row["epoch"]):
                self.evaluate_held_out(row["epoch"])
            stop = self.plateaued()  # one verdict (and, under DDP, one collective) a step
            if self.step % cfg.checkpoint_every == 0 or self.step == self.total or stop:
                self.save(identity)
            if on_step is not None:
                on_step(self.step, row)
        bar.close()
        if self.curves is not None:
            self.curves.close(self.best.meta)


def _open_output(cfg: TrainConfig, env: Dist) -> tuple[Path, dict, dict | None]:
    """The run folder, this run's identity, and the checkpoint to resume (None for a fresh run)."""
    out = Path(cfg.output)
    ckpt_path = out / CHECKPOINT
    if env.main:
        out.mkdir(parents=True, exist_ok=True)
    if ckpt_path.exists() and not cfg.resume:
        raise InputError(f"{out} already holds a checkpoint: pass --resume to continue it, or choose a new --output")
    identity = run_identity(cfg)
    return out, identity, read_checkpoint(ckpt_path, identity) if cfg.resume and ckpt_path.exists() else None


def run_trainer(cfg: TrainConfig, trainer_class, on_step=None) -> tuple[Trainer, Dist, Path]:
    """Set up and run a trainer of `trainer_class` (Trainer or a drafter's subclass) on `cfg`, resuming OUTPUT's
    checkpoint where there is one; returns (trainer, env, output folder) for the drafter's own export."""
    cfg.check()
    device = resolve_device(cfg.device)
    env = init_distributed(device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out, identity, resume_state = _open_output(cfg, env)
    torch.manual_seed(cfg.seed)
    inputs = load_inputs(cfg, env, device)
    trainer = trainer_class(cfg, env, device, inputs, out)
    if resume_state is not None:
        trainer.restore(resume_state)
    elif env.main:
        write_jsonl(trainer.metrics_path, [])
    trainer.open_curves()
    trainer.run(identity, on_step)
    return trainer, env, out
