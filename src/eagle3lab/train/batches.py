"""Training batches: token-budget packing with a deterministic order, right-padded collation, and uniform access to
records from the offline feature cache or (online) as tokens only."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from eagle3lab.io import InputError
from eagle3lab.train.features import Tokenized

SORT_WINDOW = 64  # rows sorted by length within windows this long: little padding, order still shuffled


def make_batches(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Token-budget batches (rows x longest row <= batch_tokens), a deterministic function of (seed, epoch).

    Shuffle, sort within windows so rows in a batch have similar lengths, pack greedily, then shuffle the batches."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    order = [
        i
        for w in range(0, len(order), SORT_WINDOW)
        for i in sorted(order[w : w + SORT_WINDOW], key=lambda i: lengths[i])
    ]
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
    """Uniform access to training records, from the offline cache or (online) as tokens only. Batches come out on
    `device` (the cache stays fp16 on disk; the loss casts)."""

    def __init__(self, records: list[Tokenized], cache=None, n_records: int | None = None, device="cpu"):
        self.cache = cache
        self.device = torch.device(device)
        if cache is None:
            self.items = records
            self.lengths = [len(r) for r in records]
        else:
            self.items = cache.index(n_records)
            self.lengths = [n for *_, n in self.items]
            records = [r for r in records if n_records is None or r.index < n_records]
            if [len(r) for r in records] != self.lengths:
                raise InputError(f"feature cache {cache.folder} does not hold these records; delete it to rebuild")
        # the tokens the loss scores: a training budget counts these, so prompts of any length cost it nothing
        self.answer_lengths = [int(r.loss_mask.sum()) for r in records]

    def __len__(self):
        return len(self.items)

    def get(self, i: int) -> dict:
        if self.cache is None:
            r = self.items[i]
            return {"input_ids": r.input_ids, "loss_mask": r.loss_mask}
        shard, _, start, length = self.items[i]
        return self.cache.load(shard, start, length)

    def batch(self, indices: list[int]) -> dict:
        return {k: v.to(self.device, non_blocking=True) for k, v in collate([self.get(i) for i in indices]).items()}
