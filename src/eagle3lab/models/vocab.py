"""The draft vocabulary: the target tokens the draft may propose, chosen as the most frequent tokens at
loss-bearing positions of the training set (SpecForge's rule), with the d2t/t2d maps SGLang reads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class DraftVocab:
    ids: torch.Tensor  # [draft_vocab] target ids, ascending (so every d2t offset is >= 0, as SpecForge writes it)
    vocab_size: int  # the target's
    counts: torch.Tensor  # [vocab_size] loss-position frequency of every target token
    padded: int  # ids added because fewer distinct tokens were seen than the draft vocab size

    @property
    def size(self) -> int:
        return self.ids.numel()

    @property
    def d2t(self) -> torch.Tensor:
        """Offsets: target id = draft id + d2t[draft id]."""
        return self.ids - torch.arange(self.size)

    @property
    def t2d(self) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[self.ids] = True
        return mask

    def coverage(self, counts: torch.Tensor | None = None) -> float:
        """Fraction of loss-bearing positions (of `counts`, default the training counts) whose token is in the vocab."""
        counts = self.counts if counts is None else counts
        total = int(counts.sum())
        return float(counts[self.ids].sum()) / total if total else 0.0

    def report(self, held_out_counts: torch.Tensor | None = None) -> dict:
        seen = int((self.counts > 0).sum())
        out = {
            "draft_vocab_size": self.size,
            "target_vocab_size": self.vocab_size,
            "loss_positions": int(self.counts.sum()),
            "distinct_tokens_seen": seen,
            "padded_ids": self.padded,
            "coverage": round(self.coverage(), 6),
        }
        if held_out_counts is not None:
            out["held_out_coverage"] = round(self.coverage(held_out_counts), 6)
        return out


def count_tokens(sequences: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """Frequency [vocab_size] of each target token over loss-bearing positions of (input_ids, loss_mask) pairs."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in sequences:
        ids = torch.as_tensor(ids, dtype=torch.long)[torch.as_tensor(mask, dtype=torch.bool)]
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise ValueError(f"token id {int(ids.max())} is outside the target vocabulary of {vocab_size}")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def fixed_vocab(ids: torch.Tensor, counts: torch.Tensor) -> DraftVocab:
    """A draft's own vocabulary (a fine-tuned draft keeps it), reported on the training data's `counts`. Its order is
    the draft's, not sorted: head row d stands for ids[d], and the target's rows are gathered in that order."""
    return DraftVocab(ids=torch.as_tensor(ids, dtype=torch.long).cpu(), vocab_size=counts.numel(),
                      counts=counts.clone(), padded=0)  # fmt: skip


def build_vocab(counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """Top `draft_vocab_size` tokens by frequency (ties broken by lower id); when fewer distinct tokens were seen,
    pad with the lowest unused ids so the head keeps its configured size."""
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft vocab size {draft_vocab_size} must be in 1..{vocab_size} (the target's vocabulary)")
    # stable sort on -count keeps ascending ids among equal counts: deterministic on every machine
    order = torch.sort(-counts, stable=True).indices
    seen = int((counts > 0).sum())
    chosen = order[: min(seen, draft_vocab_size)]
    padded = draft_vocab_size - chosen.numel()
    if padded:
        unused = torch.ones(vocab_size, dtype=torch.bool)
        unused[chosen] = False
        chosen = torch.cat([chosen, unused.nonzero().flatten()[:padded]])
    return DraftVocab(ids=chosen.sort().values, vocab_size=vocab_size, counts=counts.clone(), padded=padded)
