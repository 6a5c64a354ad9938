"""What draft training reads: the target and its capture layers, the tokenized examples, the draft vocabulary, and
the target's features (from the offline cache, built here once, or computed inside each step when online)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3lab.io import InputError
from eagle3lab.models.target import aux_hidden_indices, load_target
from eagle3lab.models.vocab import build_vocab, count_tokens, fixed_vocab
from eagle3lab.paths import ARTIFACTS
from eagle3lab.train.batches import Examples
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.distributed import Dist
from eagle3lab.train.features import online_features, open_cache, tokenize_file


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
    val_counts: torch.Tensor | None = None  # the held-out answers' token counts, which the vocab report reads

    def keep_vocab(self, ids: torch.Tensor) -> None:
        """Train with these draft ids instead of the data's most frequent tokens (a fine-tuned draft's own: its
        head's rows stand for them), reported on the same counts."""
        self.vocab = fixed_vocab(ids, self.vocab.counts)
        self.vocab_report = self.vocab.report(self.val_counts)


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
    return records, data_stats, val_records, val_stats, vocab, val_counts


def load_inputs(cfg: TrainConfig, env: Dist, device: torch.device) -> Inputs:
    """Load the target (fp32, on `device`), tokenize, build the draft vocab and, offline, the feature cache."""
    target = load_target(cfg.target, device=device)
    indices = aux_hidden_indices(target.num_layers, cfg.aux_layer_ids)
    records, data_stats, val_records, val_stats, vocab, val_counts = _tokenize_and_vocab(cfg, target)
    vocab_report = vocab.report(val_counts)
    if cfg.online:
        train = Examples(records, device=device)
        val = Examples(val_records, device=device) if val_records else None
        return Inputs(target, indices, vocab, vocab_report, data_stats, val_stats, train, val, {}, val_counts)
    root = Path(cfg.features_cache) if cfg.features_cache else ARTIFACTS / "features"
    # bf16 features where the draft autocasts to bf16: the precision the stages regenerate and serve in, and 2.8x
    # fp32's target forward on an AMX CPU (the target stays fp32: the draft's embedding and head start from it)
    dtype = "bfloat16" if cfg.bf16 else "float32"
    cache = open_cache(root, cfg.data, target, cfg.aux_layer_ids, cfg.max_len, cfg.shard_records, dtype)
    val_cache = (
        open_cache(root, cfg.val, target, cfg.aux_layer_ids, cfg.max_len, cfg.shard_records, dtype)
        if val_records
        else None
    )
    cache_stats = {}
    if env.main:  # one rank computes the features, the others wait and then read them
        cache_stats["train"] = cache.build(records, target, data_stats["records"], cfg.progress)
        if val_cache is not None:
            cache_stats["val"] = val_cache.build(val_records, target, val_stats["records"], cfg.progress)
    env.barrier()
    train = Examples(records, cache, data_stats["records"], device=device)
    val = Examples(val_records, val_cache, val_stats["records"], device=device) if val_cache is not None else None
    return Inputs(target, indices, vocab, vocab_report, data_stats, val_stats, train, val, cache_stats, val_counts)


def with_features(batch: dict, inputs: Inputs, online: bool) -> dict:
    """The batch with the target's features added, when they are computed online (else they came from the cache)."""
    if online:
        mask = torch.arange(batch["input_ids"].shape[1], device=batch["input_ids"].device)[None]
        batch.update(
            online_features(inputs.target, batch["input_ids"], mask < batch["lengths"][:, None], inputs.indices)
        )
    return batch
