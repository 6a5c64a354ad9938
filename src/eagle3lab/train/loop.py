"""EAGLE-3 draft training with training-time test (TTT), from cached target features or online.

`train_draft(TrainConfig(...))` from Python, or `eagle3lab train` (train.cli). Runs unchanged under
`torchrun --nproc-per-node N` (DDP: gloo on CPU, NCCL with one GPU per rank). The checkpoint holds plain types only
(tensors, dicts, lists, numbers, strings) and is read with torch.load(weights_only=True)."""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from eagle3lab.devices import clock, resolve_device
from eagle3lab.io import InputError, atomic_path, read_jsonl, sha256_file, write_json, write_jsonl
from eagle3lab.models.draft import DraftConfig, Eagle3Draft, save_draft
from eagle3lab.models.target import aux_hidden_indices, load_target
from eagle3lab.models.vocab import build_vocab, count_tokens
from eagle3lab.paths import ARTIFACTS
from eagle3lab.train.batches import Examples, make_batches
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.distributed import Dist, init_distributed
from eagle3lab.train.features import online_features, open_cache, tokenize_file
from eagle3lab.train.loss import TTTObjective, summarize, ttt_loss

CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"
# Settings a run may change when it resumes (where things are, how often to report), not what it computes.
RESUMABLE = {"output", "resume", "progress", "threads", "eval_every", "checkpoint_every", "features_cache", "online"}
RESUMABLE |= {"val", "val_max_records", "device"}


class TrainingError(RuntimeError):
    pass


@dataclass
class Inputs:
    """What training reads: the target, its capture layers, the draft vocabulary and the examples."""

    target: object
    indices: list[int]
    vocab: object
    vocab_report: dict
    data_stats: dict
    val_stats: dict | None
    train: Examples
    val: Examples | None
    cache_stats: dict


# ---- inputs --------------------------------------------------------------------------------------------------------


def _tokenize_and_vocab(cfg: TrainConfig, target) -> tuple:
    records, data_stats = tokenize_file(cfg.data, target.tokenizer, cfg.max_len, cfg.max_records)
    if not records:
        raise InputError(f"{cfg.data}: no record has assistant tokens to train on")
    val_records, val_stats = (
        tokenize_file(cfg.val, target.tokenizer, cfg.max_len, cfg.val_max_records) if cfg.val else ([], None)
    )
    vocab = build_vocab(
        count_tokens(((r.input_ids, r.loss_mask) for r in records), target.vocab_size), cfg.draft_vocab_size
    )
    val_counts = (
        count_tokens(((r.input_ids, r.loss_mask) for r in val_records), target.vocab_size) if val_records else None
    )
    return records, data_stats, val_records, val_stats, vocab, vocab.report(val_counts)


def load_inputs(cfg: TrainConfig, env: Dist, device: torch.device) -> Inputs:
    """Load the target (fp32, on `device`), tokenize, build the draft vocab and, offline, the feature cache."""
    target = load_target(cfg.target, device=device)
    indices = aux_hidden_indices(target.num_layers, cfg.aux_layer_ids)
    records, data_stats, val_records, val_stats, vocab, vocab_report = _tokenize_and_vocab(cfg, target)
    if cfg.online:
        train = Examples(records, device=device)
        val = Examples(val_records, device=device) if val_records else None
        return Inputs(target, indices, vocab, vocab_report, data_stats, val_stats, train, val, {})
    root = Path(cfg.features_cache) if cfg.features_cache else ARTIFACTS / "features"
    cache = open_cache(root, cfg.data, target, cfg.aux_layer_ids, cfg.max_len, cfg.shard_records)
    val_cache = (
        open_cache(root, cfg.val, target, cfg.aux_layer_ids, cfg.max_len, cfg.shard_records) if val_records else None
    )
    cache_stats = {}
    if env.main:  # one rank computes the features, the others wait and then read them
        cache_stats["train"] = cache.build(records, target, data_stats["records"], cfg.progress)
        if val_cache is not None:
            cache_stats["val"] = val_cache.build(val_records, target, val_stats["records"], cfg.progress)
    env.barrier()
    train = Examples(records, cache, data_stats["records"], device=device)
    val = Examples(val_records, val_cache, val_stats["records"], device=device) if val_cache is not None else None
    return Inputs(target, indices, vocab, vocab_report, data_stats, val_stats, train, val, cache_stats)


def _features(batch: dict, inputs: Inputs, online: bool) -> dict:
    if online:
        mask = torch.arange(batch["input_ids"].shape[1], device=batch["input_ids"].device)[None]
        batch.update(
            online_features(inputs.target, batch["input_ids"], mask < batch["lengths"][:, None], inputs.indices)
        )
    return batch


def build_draft(cfg: TrainConfig, inputs: Inputs, device: torch.device) -> tuple[Eagle3Draft, torch.Tensor]:
    """A fresh draft shaped like one target layer, on `device`, and the target's head rows over the draft vocab."""
    model = inputs.target.model
    draft = Eagle3Draft(DraftConfig.from_target(model.config, cfg.draft_vocab_size, cfg.aux_layer_ids))
    ids = inputs.vocab.ids
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        draft.set_vocab(ids)
        if cfg.init_head_from_target:
            draft.lm_head.weight.copy_(model.get_output_embeddings().weight[ids.to(device)])
            draft.norm.weight.copy_(model.model.norm.weight)
    return draft.to(device), model.get_output_embeddings().weight[ids.to(device)].detach()


def evaluate(draft, examples: Examples, head, cfg: TrainConfig, inputs: Inputs) -> dict:
    draft.eval()
    sums, correct, counts = (torch.zeros(cfg.ttt_length) for _ in range(3))
    with torch.no_grad():
        for batch_idx in make_batches(examples.lengths, cfg.batch_tokens, seed=0, epoch=0):
            batch = _features(examples.batch(batch_idx), inputs, cfg.online)
            out = ttt_loss(draft, batch, head, cfg.ttt_length, cfg.bf16)
            sums += out["loss_sum"].float().cpu()
            correct += out["correct"].float().cpu()
            counts += out["count"].float().cpu()
    draft.train()
    return summarize(sums, correct, counts)


# ---- schedule / checkpoint -----------------------------------------------------------------------------------------


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def run_identity(cfg: TrainConfig, data_sha: str) -> dict:
    """Settings that must not change between a run and its resumption."""
    ident = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in RESUMABLE}
    ident["data"] = data_sha
    return ident


def param_checksum(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _rng_state(device: torch.device) -> dict:
    """Every RNG a step may draw from, as tensors (so the checkpoint loads with weights_only=True)."""
    version, state, gauss = random.getstate()
    out = {"torch": torch.get_rng_state(), "python": torch.tensor(state, dtype=torch.int64), "python_version": version}
    out["python_gauss"] = gauss
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def _set_rng_state(saved: dict, device: torch.device) -> None:
    torch.set_rng_state(saved["torch"])
    random.setstate((saved["python_version"], tuple(saved["python"].tolist()), saved["python_gauss"]))
    if device.type == "cuda" and "cuda" in saved:
        torch.cuda.set_rng_state(saved["cuda"], device)


def read_checkpoint(path: Path, identity: dict) -> dict:
    """A training checkpoint, loaded safely (weights_only: no code runs), made with these same settings."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a foreign or corrupt file: say which and why
        raise InputError(
            f"{path}: not a training checkpoint this version can read ({e.__class__.__name__}: {e})"
        ) from None
    if state.get("identity") != identity:
        diff = sorted(k for k in identity if state.get("identity", {}).get(k) != identity[k])
        raise InputError(f"{path}: made with different settings ({', '.join(diff)}); cannot resume")
    return state


# ---- the run -------------------------------------------------------------------------------------------------------


class Trainer:
    """One run's moving parts: the draft (DDP-wrapped across ranks), optimizer, schedule, data plan and counters."""

    def __init__(self, cfg: TrainConfig, env: Dist, device: torch.device, inputs: Inputs, out: Path):
        self.cfg, self.env, self.device, self.inputs, self.out = cfg, env, device, inputs, out
        self.draft, self.head = build_draft(cfg, inputs, device)
        self.model = TTTObjective(self.draft)
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
        self.total, self.step, self.tokens_seen, self.train_time, self.last_val = total, 0, 0, 0.0, None

    def _plan(self) -> list[tuple[int, int, list[int]]]:
        """The whole data order, fixed by (seed, epoch): position in it is the step counter."""
        plan, env = [], self.env
        for epoch in range(self.cfg.epochs):
            batches = make_batches(self.inputs.train.lengths, self.cfg.batch_tokens, self.cfg.seed, epoch)
            per_rank = len(batches) // env.world
            if per_rank == 0:
                raise InputError(
                    f"{self.cfg.data}: {len(batches)} batches cannot feed {env.world} ranks; lower --batch-tokens"
                )
            plan += [(epoch, i, batches[i * env.world + env.rank]) for i in range(per_rank)]
        return plan

    @property
    def metrics_path(self) -> Path:
        return self.out / METRICS

    def restore(self, state: dict) -> None:
        self.draft.load_state_dict({**state["draft"], "embed_tokens.weight": self.draft.embed_tokens.weight.data})
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"], self.device)
        self.step, self.tokens_seen, self.train_time = state["step"], state["tokens_seen"], state["train_time"]
        if self.env.main and self.metrics_path.exists():  # drop rows logged after the checkpoint: they are redone
            kept = [r for r in read_jsonl(self.metrics_path, tolerate_torn_tail=True) if r["step"] <= self.step]
            write_jsonl(self.metrics_path, kept)

    def save(self, identity: dict) -> None:
        if not self.env.main:
            return
        state = {
            "identity": identity,
            "draft": {k: v for k, v in self.draft.state_dict().items() if k != "embed_tokens.weight"},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": _rng_state(self.device),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "train_time": self.train_time,
        }
        with atomic_path(self.out / CHECKPOINT) as tmp:
            torch.save(state, tmp)

    def log(self, row: dict) -> None:
        if self.env.main:
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def train_step(self) -> dict:
        """One optimizer step over this rank's batch; the metrics row (summed over ranks)."""
        cfg, env = self.cfg, self.env
        epoch, batch_no, rows = self.plan[self.step]
        t0 = clock(self.device)
        batch = _features(self.inputs.train.batch(rows), self.inputs, cfg.online)
        out = self.model(batch, self.head, cfg.ttt_length, cfg.bf16)
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
        real_tokens = int(env.sum(batch["lengths"].sum()))
        self.train_time += clock(self.device) - t0
        self.tokens_seen += real_tokens
        stats = env.sum(torch.stack([out["loss_sum"].float(), out["correct"].float(), out["count"].float()]))
        return {
            "step": self.step,
            "epoch": epoch,
            "split": "train",
            **summarize(*stats),
            "lr": lr,
            "grad_norm": round(float(grad_norm), 5),
            "tokens": self.tokens_seen,
            "tokens_per_s": round(self.tokens_seen / max(self.train_time, 1e-9), 1),
        }

    def run(self, identity: dict, on_step=None) -> None:
        from tqdm import tqdm

        cfg = self.cfg
        bar = tqdm(
            total=self.total, initial=self.step, unit="step", desc="train", disable=not (cfg.progress and self.env.main)
        )
        self.model.train()
        while self.step < self.total:
            row = self.train_step()
            self.log(row)
            bar.update(1)
            bar.set_postfix(
                loss=f"{row['loss']:.3f}", acc0=f"{row['acc_pos'][0]:.3f}", tok_s=f"{row['tokens_per_s']:.0f}"
            )
            if (
                self.inputs.val is not None
                and self.env.main
                and (self.step % cfg.eval_every == 0 or self.step == self.total)
            ):
                scores = evaluate(self.draft, self.inputs.val, self.head, cfg, self.inputs)
                self.last_val = {"step": self.step, "epoch": row["epoch"], "split": "val", **scores}
                self.log(self.last_val)
            if self.step % cfg.checkpoint_every == 0 or self.step == self.total:
                self.save(identity)
            if on_step is not None:
                on_step(self.step, row)
        bar.close()


def _open_output(cfg: TrainConfig, env: Dist) -> tuple[Path, dict, dict | None]:
    """The run folder, this run's identity, and the checkpoint to resume (None for a fresh run)."""
    out = Path(cfg.output)
    ckpt_path = out / CHECKPOINT
    if env.main:
        out.mkdir(parents=True, exist_ok=True)
    if ckpt_path.exists() and not cfg.resume:
        raise InputError(f"{out} already holds a checkpoint: pass --resume to continue it, or choose a new --output")
    identity = run_identity(cfg, sha256_file(cfg.data))
    return out, identity, read_checkpoint(ckpt_path, identity) if cfg.resume and ckpt_path.exists() else None


def train_draft(cfg: TrainConfig, on_step=None) -> dict:
    """Train one draft; returns a result dict (also written to OUTPUT/result.json). `on_step(step, record)` is called
    after every optimizer step (the notebook's live plot; tests use it to simulate a kill)."""
    cfg.check()
    device = resolve_device(cfg.device)
    env = init_distributed(device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out, identity, resume_state = _open_output(cfg, env)
    torch.manual_seed(cfg.seed)
    inputs = load_inputs(cfg, env, device)
    trainer = Trainer(cfg, env, device, inputs, out)
    if resume_state is not None:
        trainer.restore(resume_state)
    elif env.main:
        write_jsonl(trainer.metrics_path, [])
    trainer.run(identity, on_step)
    return _finish(cfg, env, trainer, out)


def _finish(cfg: TrainConfig, env: Dist, trainer: Trainer, out: Path) -> dict:
    """Check the ranks agree, export the draft (SGLang format), the vocab and result.json."""
    checksums = env.gather(param_checksum(trainer.draft))
    inputs = trainer.inputs
    result = {
        "output": str(out),
        "draft": str(out / "draft"),
        "steps": trainer.step,
        "epochs": cfg.epochs,
        "world_size": env.world,
        "ranks_agree": len(set(checksums)) == 1,
        "param_checksums": checksums,
        "tokens_seen": trainer.tokens_seen,
        "train_seconds": round(trainer.train_time, 2),
        "tokens_per_s": round(trainer.tokens_seen / max(trainer.train_time, 1e-9), 1),
        "data": inputs.data_stats,
        "val_data": inputs.val_stats,
        "vocab": inputs.vocab_report,
        "features_cache": inputs.cache_stats,
        "final_val": trainer.last_val,
        "config": asdict(cfg),
    }
    if env.main:
        save_draft(trainer.draft, out / "draft")
        write_json(out / "vocab.json", {**inputs.vocab_report, "ids": inputs.vocab.ids.tolist()})
        write_json(out / "result.json", result)
    if not result["ranks_agree"]:
        raise TrainingError(f"ranks hold different weights after training: {checksums}")
    env.barrier()
    return result
