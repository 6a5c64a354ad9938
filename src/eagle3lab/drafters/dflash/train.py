"""DFlash draft training from the same inputs as EAGLE-3's: the data files, the offline feature cache (the same
target layers, so one cache serves both drafters), the step plan, checkpoints, held-out pick and patience rule of
`train.loop.Trainer`, which this trainer extends with the block drafter's model, loss and exact held-out walk.

The loss (SpecForge's and speculators' recipe): blocks anchored at random answer positions of each conversation, all
drafted in one forward; slot k of a block anchored at a is trained, by cross entropy, towards the target's own greedy
choice of token a + k (the cached argmax, so what verification will compare with), weighted exp(-(k - 1) / gamma) as
the later slots count for less (a round stops at its first miss)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from eagle3lab.decoding.offline import last_answer, walk
from eagle3lab.devices import autocast
from eagle3lab.drafters.dflash.config import DFlashConfig
from eagle3lab.drafters.dflash.model import DFlashDraft, draft_blocks, save_dflash
from eagle3lab.drafters.dflash.offline import block_hits
from eagle3lab.io import InputError, write_json
from eagle3lab.options import option
from eagle3lab.train.batches import make_batches
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.loop import Trainer, run_trainer
from eagle3lab.train.resume import param_checksum


@dataclass
class DFlashTrainConfig(TrainConfig):
    """TrainConfig's data, schedule, checkpoint and held-out settings, plus the block drafter's. The EAGLE-3 fields
    (draft_vocab_size, ttt_length, init_head_from_target) are unused: a DFlash draft drafts with the target's head."""

    block_size: int = option(4, "the anchor plus block_size - 1 drafted tokens (vLLM's num_speculative_tokens + 1)")
    num_draft_layers: int = option(1, "draft decoder layers")
    mask_token_id: int | None = option(
        None, "the block's mask token (default: a vocabulary row the tokenizer leaves unused, else the rarest "
        "special token of the training answers)"
    )  # fmt: skip
    anchors: int = option(64, "blocks trained per conversation and step, anchored at random answer positions")
    decay_gamma: float = option(4.0, "slot k's loss weight exp(-(k - 1) / gamma) (SpecForge: 7 for blocks of 16)")
    lr: float = option(6e-4, "peak learning rate (AdamW, cosine decay; SpecForge's DFlash default)")

    def check(self) -> None:
        super().check()
        for name in ("block_size", "num_draft_layers", "anchors"):
            if getattr(self, name) < (2 if name == "block_size" else 1):
                raise InputError(f"{name} {getattr(self, name)} is too small")
        if self.decay_gamma <= 0:
            raise InputError(f"decay_gamma must be > 0, got {self.decay_gamma}")


def mask_token(tokenizer, vocab_size: int, answer_counts: torch.Tensor) -> int:
    """A row the tokenizer never produces when the embedding has spare rows (z-lab's choice), else the special token
    least seen in the training answers (ties: the highest id)."""
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    special = sorted({int(i) for i in tokenizer.all_special_ids} | set(tokenizer.added_tokens_decoder))
    return min(reversed(special), key=lambda i: int(answer_counts[i]))


def block_loss(draft, embed, head, batch: dict, cfg: DFlashTrainConfig, generator) -> dict:
    """The weighted loss of one batch, per-slot loss sums, correct counts and scored slots."""
    drafted = cfg.block_size - 1
    weights = torch.exp(-torch.arange(drafted, dtype=torch.float32) / cfg.decay_gamma).to(embed.device)
    total_loss = torch.zeros((), device=embed.device)
    total_weight = torch.zeros((), device=embed.device)
    sums, correct, counts = (torch.zeros(drafted, device=embed.device) for _ in range(3))
    for row, t in enumerate(batch["lengths"].tolist()):
        ids, mask, argmax = batch["input_ids"][row, :t], batch["loss_mask"][row, :t], batch["argmax"][row, :t]
        candidates = torch.nonzero(mask[1:-1]).flatten() + 1  # answer tokens with a token after them
        if candidates.numel() == 0:
            continue
        pick = torch.randperm(candidates.numel(), generator=generator)[: cfg.anchors].to(candidates.device)
        anchors = candidates[pick].sort().values
        with autocast(ids.device, torch.bfloat16 if cfg.bf16 else None):
            logits = draft_blocks(draft, embed, head, batch["aux"][row, :t], ids, anchors)  # [N, drafted, V]
        labels_at = anchors[:, None] + torch.arange(1, drafted + 1, device=ids.device)  # token a + k
        inside = labels_at < t
        labels_at = labels_at.clamp(max=t - 1)
        valid = inside & mask[labels_at]
        labels = argmax[labels_at - 1]  # the target's greedy choice of token a + k
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
        total_loss = total_loss + (ce * valid * weights).sum()
        total_weight = total_weight + (valid * weights).sum()
        sums += (ce * valid).sum(0).detach()
        correct += ((logits.argmax(-1) == labels) & valid).sum(0)
        counts += valid.sum(0)
    loss = total_loss / total_weight.clamp(min=1e-9)
    return {"loss": loss, "loss_sum": sums, "correct": correct, "count": counts}


class DFlashTrainer(Trainer):
    """train.loop.Trainer with the block drafter: its model, loss and held-out walk."""

    def build(self) -> tuple[DFlashDraft, DFlashDraft]:
        cfg, env, inputs = self.cfg, self.env, self.inputs
        if env.world > 1:
            raise InputError("DFlash training runs on one process (no torchrun)")
        target = inputs.target
        self.embed = target.model.get_input_embeddings().weight.detach()
        self.head = target.model.get_output_embeddings().weight.detach()
        token = cfg.mask_token_id
        if token is None:
            token = mask_token(target.tokenizer, target.vocab_size, answer_counts(inputs.train, target.vocab_size))
        config = DFlashConfig.from_target(
            target.model.config,
            mask_token_id=token,
            block_size=cfg.block_size,
            num_hidden_layers=cfg.num_draft_layers,
            target_layer_ids=[i - 1 for i in inputs.indices],  # the cache's layers, in DFlash ids
        )
        draft = DFlashDraft(config).to(self.device)
        return draft, draft

    def step_loss(self, rows: list[int]) -> tuple[dict, dict]:
        batch = self.inputs.train.batch(rows)
        # the anchors of step s are drawn from (seed, s): a resumed run trains on the blocks an uninterrupted one does
        generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.step)
        return block_loss(self.draft, self.embed, self.head, batch, self.cfg, generator), batch

    def step_metrics(self, out: dict) -> dict:
        return {
            "loss": round(float(out["loss"].detach()), 5),
            **slot_summary(out["loss_sum"], out["correct"], out["count"]),
        }

    def held_out(self) -> dict:
        return held_out_accept_length(self.draft, self.embed, self.head, self.inputs.val)


def answer_counts(examples, vocab_size: int) -> torch.Tensor:
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for i in range(len(examples)):
        item = examples.get(i)
        counts += torch.bincount(item["input_ids"][item["loss_mask"]], minlength=vocab_size)
    return counts


def slot_summary(sums, correct, counts) -> dict:
    c = counts.float().cpu().clamp(min=1)
    return {
        "loss_pos": [round(x, 5) for x in (sums.float().cpu() / c).tolist()],
        "acc_pos": [round(x, 5) for x in (correct.float().cpu() / c).tolist()],
        "positions": [int(x) for x in counts.tolist()],
    }


def held_out_accept_length(draft, embed, head, examples) -> dict:
    """The exact accept length of a block on each held-out conversation's last answer (the target's own, where stage
    02 regenerated them): `block_hits` along the answer and the engine's round walk."""
    draft.eval()
    emitted = rounds = 0
    drafted = draft.config.drafted
    with torch.no_grad():
        for rows in make_batches(examples.lengths, 4096, seed=0, epoch=0):
            batch = examples.batch(rows)
            for row, n in enumerate(batch["lengths"].tolist()):
                prompt, answer = last_answer(batch["loss_mask"][row, :n].cpu())
                if answer < 2:
                    continue
                ids, aux = batch["input_ids"][row, : prompt + answer], batch["aux"][row, : prompt + answer]
                hits = block_hits(draft, embed, head, aux, ids, first=prompt - 1)
                rounds += len(walk(hits, prompt, answer, drafted))
                emitted += answer - 1
    draft.train()
    return {"accept_length": round(emitted / rounds, 5) if rounds else 1.0}


def train_dflash(cfg: DFlashTrainConfig, on_step=None) -> dict:
    """Train one DFlash draft; OUTPUT/draft is the z-lab folder vLLM loads and llama.cpp converts (the best held-out
    one where there is held-out data), OUTPUT/result.json the record."""
    trainer, _, out = run_trainer(cfg, DFlashTrainer, on_step)
    if trainer.best.weights is not None:
        trainer.draft.load_state_dict(trainer.best.weights)
    save_dflash(trainer.draft, out / "draft", dtype=torch.bfloat16 if cfg.bf16 else None)
    result = {
        "output": str(out),
        "draft": str(out / "draft"),
        "kind": "dflash",
        "steps": trainer.step,
        "budget_steps": trainer.total,
        "plateaued": trainer.plateaued(),
        "tokens_seen": trainer.tokens_seen,
        "answer_tokens_seen": trainer.answer_tokens_seen,
        "train_seconds": round(trainer.train_time, 2),
        "tokens_per_s": round(trainer.tokens_seen / max(trainer.train_time, 1e-9), 1),
        "data": trainer.inputs.data_stats,
        "val_data": trainer.inputs.val_stats,
        "features_cache": trainer.inputs.cache_stats,
        "final_val": trainer.last_val,
        "best": trainer.best.meta,
        "mask_token_id": trainer.draft.config.mask_token_id,
        "param_checksum": param_checksum(trainer.draft),
        "config": asdict(cfg),
    }
    write_json(out / "result.json", result)
    return result
