"""EAGLE-3 draft training with training-time test (TTT), from cached target features or online.

`eagle3lab train --data TRAIN.jsonl --output DIR [...]`, or `train_draft(TrainConfig(...))` from Python. Runs
unchanged under `torchrun --nproc-per-node N` (DDP: gloo on CPU, NCCL on GPU). Exit codes: 0 done, 1 training
failed (non-finite loss), 2 bad input or settings."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from eagle3lab.io import InputError, atomic_path, read_jsonl, sha256_file, write_json, write_jsonl
from eagle3lab.models.draft import DraftConfig, Eagle3Draft, save_draft
from eagle3lab.models.target import DEFAULT_TARGET, aux_hidden_indices, load_target
from eagle3lab.models.vocab import build_vocab, count_tokens
from eagle3lab.paths import ARTIFACTS
from eagle3lab.train.features import Tokenized, online_features, open_cache, tokenize_file

STEP_DECAY = 0.8  # TTT step i is weighted 0.8^i (SpecForge)
CHECKPOINT = "checkpoint.pt"
METRICS = "metrics.jsonl"


class TrainingError(RuntimeError):
    pass


@dataclass
class TrainConfig:
    data: str
    output: str
    val: str | None = None
    target: str = DEFAULT_TARGET
    features_cache: str | None = None  # root of the offline cache; default artifacts/features
    online: bool = False  # run the target inside the training step instead of reading the cache
    max_records: int | None = None  # train on the first N records of --data (a data scale)
    val_max_records: int | None = 200
    draft_vocab_size: int = 8192
    ttt_length: int = 3
    epochs: int = 1
    max_steps: int | None = None
    lr: float = 1e-3
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    batch_tokens: int = 2048
    max_len: int = 1024
    aux_layer_ids: list[int] | None = None
    dtype: str = "bf16"  # autocast dtype for the draft's matmuls: bf16 or fp32
    seed: int = 0
    eval_every: int = 100
    checkpoint_every: int = 50
    resume: bool = False
    # lm_head = the target's head rows over the draft vocab, norm = the target's final norm. Off by default: the
    # untrained midlayer's output is not in the target's hidden space, so the copied head starts at twice the uniform
    # loss (17-19 nats vs ln 4096 = 8.3) and spends the first steps unlearning it. Measured on the reference data
    # (5 epochs, vocab 4096): held-out top-1 accuracy 0.115 vs 0.088 at 22 conversations, 0.162 vs 0.137 at 45.
    init_head_from_target: bool = False
    shard_records: int = 64
    threads: int | None = None  # torch CPU threads (default: torch's choice; under DDP, cores / local ranks)
    progress: bool = True

    def check(self) -> None:
        if self.dtype not in ("bf16", "fp32"):
            raise InputError(f"dtype '{self.dtype}': expected bf16 or fp32")
        for name in (
            "ttt_length",
            "epochs",
            "batch_tokens",
            "max_len",
            "draft_vocab_size",
            "checkpoint_every",
            "eval_every",
        ):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise InputError(f"max_steps must be >= 1, got {self.max_steps}")
        if not Path(self.data).exists():
            raise InputError(f"training data {self.data} does not exist")
        if self.val and not Path(self.val).exists():
            raise InputError(f"held-out data {self.val} does not exist")


# ---- distributed ---------------------------------------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.world > 1:
            dist.barrier()

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            t = t.clone()
            dist.all_reduce(t)
        return t


def init_distributed() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share the cores
    return Dist(dist.get_rank(), dist.get_world_size())


# ---- batching ------------------------------------------------------------------------------------------------------


def make_batches(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Token-budget batches (rows x longest row <= batch_tokens), a deterministic function of (seed, epoch).

    Shuffle, sort within windows of 64 so rows in a batch have similar lengths (little padding), pack greedily,
    then shuffle the batches."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    window = 64
    order = [i for w in range(0, len(order), window) for i in sorted(order[w : w + window], key=lambda i: lengths[i])]
    batches, cur, longest = [], [], 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if cur and new_longest * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, new_longest = [], lengths[i]
        cur.append(i)
        longest = new_longest
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples: list[dict]) -> dict:
    """Right-pad a list of per-record tensors to a batch [B, T, ...]."""
    t = max(e["input_ids"].numel() for e in examples)
    out = {"lengths": torch.tensor([e["input_ids"].numel() for e in examples])}
    for key in examples[0]:
        rows = [e[key] for e in examples]
        out[key] = torch.stack([F.pad(r, [0, 0] * (r.dim() - 1) + [0, t - r.shape[0]]) for r in rows])
    return out


class Examples:
    """Uniform access to training records, from the offline cache or (online) as tokens only."""

    def __init__(self, records: list[Tokenized], cache=None, n_records: int | None = None):
        self.cache = cache
        if cache is None:
            self.items = records
            self.lengths = [len(r) for r in records]
        else:
            self.items = cache.index(n_records)
            self.lengths = [n for *_, n in self.items]

    def __len__(self):
        return len(self.items)

    def get(self, i: int) -> dict:
        if self.cache is None:
            r = self.items[i]
            return {"input_ids": r.input_ids, "loss_mask": r.loss_mask}
        shard, _, start, length = self.items[i]
        return self.cache.load(shard, start, length)

    def batch(self, indices: list[int]) -> dict:
        return collate([self.get(i) for i in indices])


# ---- loss ----------------------------------------------------------------------------------------------------------


def ttt_loss(draft: Eagle3Draft, batch: dict, head: torch.Tensor, ttt_length: int, autocast: bool) -> dict:
    """Weighted TTT loss of one batch, with per-step loss sums, correct counts and scored positions.

    Draft position t reads token t+1 and the target state at t; at step i it predicts token t+2+i, whose target
    distribution is the target's at position t+1+i restricted to the draft vocab: softmax(final @ head.T).
    A position counts only if that token is an assistant token and the target's argmax is in the draft vocab."""
    ids, loss_mask = batch["input_ids"], batch["loss_mask"]
    b, t = ids.shape
    with torch.no_grad():
        target_p = torch.softmax(batch["final"].float() @ head.float().T, dim=-1)  # [B, T, Vd] at target position j
        # target position j scores token j+1: it must be an assistant token the draft vocab can express
        valid = F.pad(loss_mask[:, 1:], (0, 1)) & draft.t2d[batch["argmax"]]
        target_top = target_p.argmax(-1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        hidden = draft.project(batch["aux"].to(draft.fc.weight.dtype))
        inputs = F.pad(ids[:, 1:], (0, 1))
        positions = torch.arange(t, device=ids.device).expand(b, t)
        logits = draft.ttt_forward(inputs, hidden, positions, ttt_length)
    total = torch.zeros((), dtype=torch.float32)
    losses, correct, counts = [], [], []
    for i, step_logits in enumerate(logits):
        shift = 1 + i
        p = F.pad(target_p[:, shift:], (0, 0, 0, shift))
        m = F.pad(valid[:, shift:], (0, shift))
        n = m.sum()
        ce = -(p * torch.log_softmax(step_logits.float(), dim=-1)).sum(-1)
        loss_sum = (ce * m).sum()
        total = total + STEP_DECAY**i * loss_sum / n.clamp(min=1)
        losses.append(loss_sum.detach())
        correct.append(((step_logits.argmax(-1) == F.pad(target_top[:, shift:], (0, shift))) & m).sum())
        counts.append(n)
    return {
        "loss": total,
        "loss_sum": torch.stack(losses),
        "correct": torch.stack(correct),
        "count": torch.stack(counts),
    }


class TTTObjective(torch.nn.Module):
    def __init__(self, draft: Eagle3Draft):
        super().__init__()
        self.draft = draft

    def forward(self, batch, head, ttt_length, autocast):
        return ttt_loss(self.draft, batch, head, ttt_length, autocast)


def _features(batch: dict, target, indices, online: bool) -> dict:
    if online:
        mask = torch.arange(batch["input_ids"].shape[1])[None] < batch["lengths"][:, None]
        batch.update(online_features(target, batch["input_ids"], mask, indices))
    return batch


def evaluate(draft, examples: Examples, head, cfg: TrainConfig, target, indices) -> dict:
    draft.eval()
    sums = torch.zeros(cfg.ttt_length)
    correct = torch.zeros(cfg.ttt_length)
    counts = torch.zeros(cfg.ttt_length)
    with torch.no_grad():
        for batch_idx in make_batches(examples.lengths, cfg.batch_tokens, seed=0, epoch=0):
            out = ttt_loss(
                draft,
                _features(examples.batch(batch_idx), target, indices, cfg.online),
                head,
                cfg.ttt_length,
                cfg.dtype == "bf16",
            )
            sums += out["loss_sum"].float()
            correct += out["correct"].float()
            counts += out["count"].float()
    draft.train()
    return _summary(sums, correct, counts)


def _summary(sums, correct, counts) -> dict:
    c = counts.clamp(min=1)
    loss_pos = (sums / c).tolist()
    return {
        "loss": sum(STEP_DECAY**i * l for i, l in enumerate(loss_pos)),
        "loss_pos": [round(x, 5) for x in loss_pos],
        "acc_pos": [round(x, 5) for x in (correct / c).tolist()],
        "positions": [int(x) for x in counts.tolist()],
    }


# ---- schedule / checkpoint -----------------------------------------------------------------------------------------


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def _trainable_state(draft: Eagle3Draft) -> dict:
    return {k: v for k, v in draft.state_dict().items() if k != "embed_tokens.weight"}


def _run_identity(cfg: TrainConfig, data_sha: str) -> dict:
    """Settings that must not change between a run and its resumption."""
    skip = {
        "output",
        "resume",
        "progress",
        "threads",
        "eval_every",
        "checkpoint_every",
        "features_cache",
        "online",
        "val",
        "val_max_records",
    }
    ident = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in skip}
    ident["data"] = data_sha
    return ident


def param_checksum(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


# ---- main loop -----------------------------------------------------------------------------------------------------


def train_draft(cfg: TrainConfig, on_step=None) -> dict:
    """Train one draft; returns a result dict (also written to OUTPUT/result.json). `on_step(step, record)` is called
    after every optimizer step (the notebook's live plot; tests use it to simulate a kill)."""
    from tqdm import tqdm

    cfg.check()
    env = init_distributed()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(cfg.output)
    ckpt_path, metrics_path = out / CHECKPOINT, out / METRICS
    if env.main:
        out.mkdir(parents=True, exist_ok=True)
    if ckpt_path.exists() and not cfg.resume:
        raise InputError(f"{out} already holds a checkpoint: pass --resume to continue it, or choose a new --output")
    data_sha = sha256_file(cfg.data)
    identity = _run_identity(cfg, data_sha)
    resume_state = None
    if cfg.resume and ckpt_path.exists():
        resume_state = torch.load(ckpt_path, weights_only=False)
        if resume_state["identity"] != identity:
            diff = sorted(k for k in identity if resume_state["identity"].get(k) != identity[k])
            raise InputError(f"{ckpt_path}: made with different settings ({', '.join(diff)}); cannot resume")

    torch.manual_seed(cfg.seed)
    target = load_target(cfg.target)
    indices = aux_hidden_indices(target.num_layers, cfg.aux_layer_ids)

    records, data_stats = tokenize_file(cfg.data, target.tokenizer, cfg.max_len, cfg.max_records)
    if not records:
        raise InputError(f"{cfg.data}: no record has assistant tokens to train on")
    n_records = data_stats["records"]
    val_records, val_stats = (
        tokenize_file(cfg.val, target.tokenizer, cfg.max_len, cfg.val_max_records) if cfg.val else ([], None)
    )

    counts = count_tokens(((r.input_ids, r.loss_mask) for r in records), target.vocab_size)
    vocab = build_vocab(counts, cfg.draft_vocab_size)
    val_counts = (
        count_tokens(((r.input_ids, r.loss_mask) for r in val_records), target.vocab_size) if val_records else None
    )
    vocab_report = vocab.report(val_counts)

    cache_stats = {}
    if cfg.online:
        train_ex = Examples(records)
        val_ex = Examples(val_records) if val_records else None
    else:
        root = Path(cfg.features_cache) if cfg.features_cache else ARTIFACTS / "features"
        cache = open_cache(root, cfg.data, target, cfg.aux_layer_ids, cfg.max_len, cfg.shard_records)
        val_cache = (
            open_cache(root, cfg.val, target, cfg.aux_layer_ids, cfg.max_len, cfg.shard_records)
            if val_records
            else None
        )
        if env.main:  # one rank computes the features, the others wait and then read them
            cache_stats["train"] = cache.build(records, target, n_records, cfg.progress)
            if val_cache is not None:
                cache_stats["val"] = val_cache.build(val_records, target, val_stats["records"], cfg.progress)
        env.barrier()
        train_ex = Examples(records, cache, n_records)
        val_ex = Examples(val_records, val_cache, val_stats["records"]) if val_cache is not None else None

    draft_cfg = DraftConfig.from_target(target.model.config, cfg.draft_vocab_size, cfg.aux_layer_ids)
    draft = Eagle3Draft(draft_cfg)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.model.get_input_embeddings().weight)
        draft.set_vocab(vocab.ids)
        if cfg.init_head_from_target:
            draft.lm_head.weight.copy_(target.model.get_output_embeddings().weight[vocab.ids])
            draft.norm.weight.copy_(target.model.model.norm.weight)
    head = target.model.get_output_embeddings().weight[vocab.ids].detach()  # target head over the draft vocab
    model = TTTObjective(draft)
    if env.world > 1:  # DDP must wrap the module whose forward runs, so the objective is a module
        model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)

    # the whole data order, fixed by (seed, epoch): position in it is the step counter
    plan = []
    for epoch in range(cfg.epochs):
        batches = make_batches(train_ex.lengths, cfg.batch_tokens, cfg.seed, epoch)
        per_rank = len(batches) // env.world
        if per_rank == 0:
            raise InputError(f"{cfg.data}: {len(batches)} batches cannot feed {env.world} ranks; lower --batch-tokens")
        plan += [(epoch, i, batches[i * env.world + env.rank]) for i in range(per_rank)]
    total = min(len(plan), cfg.max_steps) if cfg.max_steps else len(plan)
    warmup = max(1, int(cfg.warmup_ratio * total))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, warmup, cfg.min_lr_ratio))

    step, tokens_seen, train_time = 0, 0, 0.0
    if resume_state is not None:
        draft.load_state_dict({**resume_state["draft"], "embed_tokens.weight": draft.embed_tokens.weight.data})
        optimizer.load_state_dict(resume_state["optimizer"])
        scheduler.load_state_dict(resume_state["scheduler"])
        torch.set_rng_state(resume_state["rng"])
        random.setstate(resume_state["py_rng"])
        step, tokens_seen, train_time = resume_state["step"], resume_state["tokens_seen"], resume_state["train_time"]
        if env.main and metrics_path.exists():  # drop rows logged after the checkpoint: they will be redone
            kept = [r for r in read_jsonl(metrics_path, tolerate_torn_tail=True) if r["step"] <= step]
            write_jsonl(metrics_path, kept)
    elif env.main:
        write_jsonl(metrics_path, [])

    def log_row(row):
        if env.main:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def save_checkpoint():
        if not env.main:
            return
        state = {
            "identity": identity,
            "draft": _trainable_state(draft),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
            "step": step,
            "tokens_seen": tokens_seen,
            "train_time": train_time,
        }
        with atomic_path(ckpt_path) as tmp:
            torch.save(state, tmp)

    autocast = cfg.dtype == "bf16"
    bar = tqdm(total=total, initial=step, unit="step", desc="train", disable=not (cfg.progress and env.main))
    model.train()
    last_val = None
    while step < total:
        epoch, batch_no, indices_ = plan[step]
        t0 = time.perf_counter()
        batch = _features(train_ex.batch(indices_), target, indices, cfg.online)
        out_ = model(batch, head, cfg.ttt_length, autocast)
        loss = out_["loss"]
        bad = env.sum(torch.tensor([0.0 if torch.isfinite(loss) else 1.0]))
        if bad.item():
            raise TrainingError(
                f"non-finite loss ({loss.item()}) at step {step + 1}, epoch {epoch}, batch {batch_no} "
                f"(rank {env.rank}); nothing was saved from this step; last checkpoint: {ckpt_path if ckpt_path.exists() else 'none'}"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        if not torch.isfinite(grad_norm):
            raise TrainingError(
                f"non-finite gradient norm at step {step + 1}, epoch {epoch}, batch {batch_no}; not applied"
            )
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        step += 1
        real_tokens = int(env.sum(batch["lengths"].sum()))
        train_time += time.perf_counter() - t0
        tokens_seen += real_tokens
        stats = env.sum(torch.stack([out_["loss_sum"].float(), out_["correct"].float(), out_["count"].float()]))
        row = {
            "step": step,
            "epoch": epoch,
            "split": "train",
            **_summary(*stats),
            "lr": lr,
            "grad_norm": round(float(grad_norm), 5),
            "tokens": tokens_seen,
            "tokens_per_s": round(tokens_seen / max(train_time, 1e-9), 1),
        }
        log_row(row)
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row['acc_pos'][0]:.3f}", tok_s=f"{row['tokens_per_s']:.0f}")
        if val_ex is not None and env.main and (step % cfg.eval_every == 0 or step == total):
            last_val = {
                "step": step,
                "epoch": epoch,
                "split": "val",
                **evaluate(draft, val_ex, head, cfg, target, indices),
            }
            log_row(last_val)
        if step % cfg.checkpoint_every == 0 or step == total:
            save_checkpoint()
        if on_step is not None:
            on_step(step, row)
    bar.close()

    checksums = [param_checksum(draft)]
    if env.world > 1:
        gathered = [None] * env.world
        dist.all_gather_object(gathered, checksums[0])
        checksums = gathered
    result = {
        "output": str(out),
        "draft": str(out / "draft"),
        "steps": step,
        "epochs": cfg.epochs,
        "world_size": env.world,
        "ranks_agree": len(set(checksums)) == 1,
        "param_checksums": checksums,
        "tokens_seen": tokens_seen,
        "train_seconds": round(train_time, 2),
        "tokens_per_s": round(tokens_seen / max(train_time, 1e-9), 1),
        "data": data_stats,
        "val_data": val_stats,
        "vocab": vocab_report,
        "features_cache": cache_stats,
        "final_val": last_val,
        "config": asdict(cfg),
    }
    if env.main:
        save_draft(draft, out / "draft")
        write_json(out / "vocab.json", {**vocab_report, "ids": vocab.ids.tolist()})
        write_json(out / "result.json", result)
    if not result["ranks_agree"]:
        raise TrainingError(f"ranks hold different weights after training: {checksums}")
    env.barrier()
    return result


# ---- CLI -----------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser(prog="eagle3lab train", description="Train an EAGLE-3 draft with training-time test.")
    p.add_argument("--data", required=True, help="training conversations, ShareGPT-style JSONL")
    p.add_argument("--val", help="held-out conversations (same format) for per-step evaluation")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--output", required=True, help="run folder: checkpoint, metrics.jsonl, result.json, draft/")
    p.add_argument("--features-cache", help="root folder of the offline feature cache (default artifacts/features)")
    p.add_argument("--online", action="store_true", help="run the target inside each step instead of caching")
    p.add_argument("--max-records", type=int, help="use the first N records of --data (a data scale)")
    p.add_argument("--val-max-records", type=int, default=200)
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--ttt-length", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-ratio", type=float, default=0.03)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--aux-layer-ids", type=lambda s: [int(x) for x in s.split(",")], help="e.g. 1,14,26 (SGLang ids)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--resume", action="store_true")
    p.add_argument(
        "--init-head-from-target",
        action="store_true",
        help="start lm_head and the final norm from the target's (default: fresh, near-uniform logits)",
    )
    p.add_argument("--threads", type=int, help="CPU threads for torch (1 is faster when the cores are shared)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    a = p.parse_args(argv)
    return TrainConfig(**{f.name: getattr(a, f.name) for f in fields(TrainConfig) if hasattr(a, f.name)})


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = train_draft(cfg)
    except InputError as e:
        print(f"eagle3lab train: {e}", file=sys.stderr)
        return 2
    except TrainingError as e:
        print(f"eagle3lab train: {e}", file=sys.stderr)
        return 1
    if result["world_size"] == 1 or int(os.environ.get("RANK", "0")) == 0:
        v = result["final_val"]
        print(
            f"trained {result['steps']} steps, {result['tokens_seen']} tokens at {result['tokens_per_s']:.0f} tok/s; "
            f"vocab coverage {result['vocab']['coverage']:.3f}"
            + (f"; held-out acc per TTT position {v['acc_pos']}" if v else "")
            + f"\ndraft: {result['draft']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
