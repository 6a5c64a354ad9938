"""EAGLE-3 draft training with training-time test (TTT), from cached target features or online: the shared loop
(train.loop.Trainer: plan, schedule, checkpoints, held-out pick, patience, DDP) with EAGLE-3's draft, its TTT
objective (drafters.eagle3.loss) and the exact accept length of a chain on the held-out answers.

`train_draft(Eagle3TrainConfig(...))` from Python, or `eagle3lab train` (train.cli)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from eagle3lab.decoding.offline import draft_hits, last_answer, walk
from eagle3lab.drafters.eagle3.loss import TTTObjective, summarize, ttt_loss
from eagle3lab.io import InputError, write_json
from eagle3lab.models.checkpoint import DraftFormatError, read_json
from eagle3lab.models.draft import DraftConfig, Eagle3Draft, load_draft, save_draft
from eagle3lab.options import option
from eagle3lab.train.batches import Examples, make_batches
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.distributed import Dist
from eagle3lab.train.inputs import Inputs, with_features
from eagle3lab.train.loop import Trainer, TrainingError, run_trainer
from eagle3lab.train.resume import load_draft_weights, param_checksum


@dataclass
class Eagle3TrainConfig(TrainConfig):
    """TrainConfig's settings, plus EAGLE-3's fine-tuning: a draft trained elsewhere (the GPU drafts of drafts/, on
    more data) goes on training on this data. It keeps its own draft vocabulary, which its head's rows stand for; the
    data's token counts still report the coverage."""

    init_draft: str | None = option(
        None,
        "start from this EAGLE-3 draft folder: its weights and its draft vocabulary (fine-tuning; draft_vocab_size "
        "and aux_layer_ids must match its config.json)",
    )

    def check(self) -> None:
        super().check()
        if self.init_draft:
            self.check_init_draft()

    def check_init_draft(self) -> None:
        """The draft fine-tuning starts from is one these settings would train: refused before the target loads."""
        where = Path(self.init_draft) / "config.json"
        if self.init_head_from_target or self.init_layer_from_target is not None:
            raise InputError(
                f"init_draft {self.init_draft}: init_head_from_target and init_layer_from_target start a fresh "
                "draft; a fine-tuned one starts from its own weights"
            )
        try:
            config = DraftConfig.from_sglang(read_json(where), where=str(where))
        except DraftFormatError as e:
            raise InputError(f"init_draft: {e}") from None
        for name in ("draft_vocab_size", "aux_layer_ids"):
            if getattr(config, name) != getattr(self, name):
                raise InputError(
                    f"{where}: field {name} is {getattr(config, name)}, the training settings say {getattr(self, name)}"
                )


def build_draft(cfg: Eagle3TrainConfig, inputs: Inputs, device: torch.device) -> tuple[Eagle3Draft, torch.Tensor]:
    """The draft on `device`, fresh and shaped like one target layer or the one fine-tuning starts from (whose
    vocabulary training then keeps), and the target's head rows over the draft vocab."""
    model = inputs.target.model
    if cfg.init_draft:
        draft = load_draft(cfg.init_draft, inputs.target, dtype=torch.float32).train()
        inputs.keep_vocab(draft.draft_ids)
        return draft.to(device), model.get_output_embeddings().weight[inputs.vocab.ids.to(device)].detach()
    draft = Eagle3Draft(DraftConfig.from_target(model.config, cfg.draft_vocab_size, cfg.aux_layer_ids))
    ids = inputs.vocab.ids
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
        draft.set_vocab(ids)
        if cfg.init_head_from_target:
            draft.lm_head.weight.copy_(model.get_output_embeddings().weight[ids.to(device)])
            draft.norm.weight.copy_(model.model.norm.weight)
        if cfg.init_layer_from_target is not None:
            draft.midlayer.copy_target_layer(model.model.layers[cfg.init_layer_from_target])
    return draft.to(device), model.get_output_embeddings().weight[ids.to(device)].detach()


def evaluate(draft, examples: Examples, head, cfg: TrainConfig, inputs: Inputs) -> dict:
    """Held-out loss and per-step accuracy, and the exact accept length of a chain of ttt_length steps on each
    conversation's last answer (decoding.offline's teacher-forced walk: with regenerated held-out data, the
    target's own answers; a token outside the draft vocabulary is a miss). The accept length picks the export."""
    draft.eval()
    sums, correct, counts = (torch.zeros(cfg.ttt_length) for _ in range(3))
    emitted = rounds = 0
    with torch.no_grad():
        for batch_idx in make_batches(examples.lengths, cfg.batch_tokens, seed=0, epoch=0):
            batch = with_features(examples.batch(batch_idx), inputs, cfg.online)
            out = ttt_loss(draft, batch, head, cfg.ttt_length, cfg.bf16)
            sums += out["loss_sum"].float().cpu()
            correct += out["correct"].float().cpu()
            counts += out["count"].float().cpu()
            for row, n in enumerate(batch["lengths"].tolist()):
                prompt, answer = last_answer(batch["loss_mask"][row, :n].cpu())
                if answer < 2:
                    continue
                ids, aux = batch["input_ids"][row, : prompt + answer], batch["aux"][row, : prompt + answer].float()
                hits = draft_hits(draft, aux, ids, cfg.ttt_length, first=prompt - 1)
                rounds += len(walk(hits, prompt, answer, cfg.ttt_length))
                emitted += answer - 1
    draft.train()
    return summarize(sums, correct, counts) | {"accept_length": round(emitted / rounds, 5) if rounds else 1.0}


class Eagle3Trainer(Trainer):
    """The shared loop with an EAGLE-3 draft: TTT over the target's head rows of the draft vocabulary."""

    def build(self) -> tuple[Eagle3Draft, torch.nn.Module]:
        draft, self.head = build_draft(self.cfg, self.inputs, self.device)
        return draft, TTTObjective(draft)

    def step_loss(self, rows: list[int]) -> tuple[dict, dict]:
        cfg = self.cfg
        batch = with_features(self.inputs.train.batch(rows), self.inputs, cfg.online)
        return self.model(batch, self.head, cfg.ttt_length, cfg.bf16, cfg.acceptance_loss_weight), batch

    def step_metrics(self, out: dict) -> dict:
        return summarize(
            *self.env.sum(torch.stack([out["loss_sum"].float(), out["correct"].float(), out["count"].float()]))
        )

    def held_out(self) -> dict:
        return evaluate(self.draft, self.inputs.val, self.head, self.cfg, self.inputs)


def train_draft(cfg: Eagle3TrainConfig, on_step=None) -> dict:
    """Train one draft; returns a result dict (also written to OUTPUT/result.json). `on_step(step, record)` is called
    after every optimizer step (the notebook's live plot; tests use it to simulate a kill)."""
    trainer, env, out = run_trainer(cfg, Eagle3Trainer, on_step)
    return _finish(cfg, env, trainer, out)


def _finish(cfg: TrainConfig, env: Dist, trainer: Eagle3Trainer, out: Path) -> dict:
    """Check the ranks agree (on the last weights), export the draft (SGLang format: the best held-out one where
    there was held-out data, else the last), the vocab and result.json."""
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
        "answer_tokens_seen": trainer.answer_tokens_seen,
        "train_seconds": round(trainer.train_time, 2),
        "tokens_per_s": round(trainer.tokens_seen / max(trainer.train_time, 1e-9), 1),
        "data": inputs.data_stats,
        "val_data": inputs.val_stats,
        "vocab": inputs.vocab_report,
        "features_cache": inputs.cache_stats,
        "final_val": trainer.last_val,
        "best": trainer.best.meta,
        "budget_steps": trainer.total,
        "plateaued": trainer.plateaued(),  # stopped by the patience rule before the budget
        # fine-tuning's start only where there is one: a draft from scratch records what it recorded before the
        # route existed, so the drafts trained then keep their results byte for byte
        "config": {key: value for key, value in asdict(cfg).items() if key != "init_draft" or value},
    }
    if env.main:
        if trainer.best.weights is not None:
            load_draft_weights(trainer.draft, trainer.best.weights)
        # In the dtype its matmuls trained in, as SpecForge's exports and the committed GPU drafts are (half the bytes
        # of float32); each engine casts it to the dtype it serves in.
        save_draft(trainer.draft, out / "draft", dtype=torch.bfloat16 if cfg.bf16 else None)
        write_json(out / "vocab.json", {**inputs.vocab_report, "ids": inputs.vocab.ids.tolist()})
        write_json(out / "result.json", result)
    if not result["ranks_agree"]:
        raise TrainingError(f"ranks hold different weights after training: {checksums}")
    env.barrier()
    return result
