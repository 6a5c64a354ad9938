"""The shape of a speculative draft: SpecForge's `bs,steps,topk,ndraft` and SGLang's rules for it.

This is the one home of the steps/topk/num-draft-tokens rule: the engine, the SGLang launch helpers, the doctor
and `tune` all validate through it.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3lab.io import InputError


def max_draft_tokens(steps: int, topk: int) -> int:
    """Tokens a tree of this depth and branching can offer for verification, root included (SGLang's bound:
    the root, topk children, then topk^2 candidates at each further depth, of which topk are expanded)."""
    return 1 + topk + (steps - 1) * topk**2 if steps else 1


@dataclass(frozen=True)
class SpecConfig:
    """SpecForge's `bs,steps,topk,ndraft` tuple; `1,0,0,0` is the non-speculative baseline."""

    batch_size: int = 1
    steps: int = 0
    topk: int = 0
    num_draft_tokens: int = 0

    @classmethod
    def parse(cls, text: str) -> SpecConfig:
        parts = str(text).split(",")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 4:
            raise InputError(f"config '{text}': expected four integers bs,steps,topk,ndraft (e.g. 1,0,0,0 or 1,5,1,6)")
        config = cls(*values)
        config.validate()
        return config

    @property
    def label(self) -> str:
        return f"{self.batch_size},{self.steps},{self.topk},{self.num_draft_tokens}"

    @property
    def is_baseline(self) -> bool:
        return self.steps == 0

    @property
    def max_draft_tokens(self) -> int:
        return max_draft_tokens(self.steps, self.topk)

    def validate(self) -> None:
        """What this package's engine runs: batch 1, and a valid shape."""
        if self.batch_size != 1:
            raise InputError(f"config {self.label}: batch size {self.batch_size} is not supported yet (only 1)")
        self.validate_shape()

    def validate_shape(self) -> None:
        """SGLang's rule for steps/topk/ndraft, whatever the batch (requests in flight on a server)."""
        if self.batch_size < 1:
            raise InputError(f"config {self.label}: batch size must be >= 1")
        if self.steps == 0:
            if self.topk or self.num_draft_tokens:
                raise InputError(f"config {self.label}: with 0 steps (no speculation) topk and ndraft must be 0")
            return
        if self.steps < 0 or self.topk < 1:
            raise InputError(f"config {self.label}: steps must be >= 0 and topk >= 1")
        if self.topk == 1 and self.num_draft_tokens != self.steps + 1:
            raise InputError(
                f"config {self.label}: with topk 1 (a chain) ndraft must be steps + 1 = {self.steps + 1}, as in SGLang"
            )
        if not 2 <= self.num_draft_tokens <= self.max_draft_tokens:
            raise InputError(
                f"config {self.label}: ndraft must be between 2 and {self.max_draft_tokens} "
                f"(1 + topk + (steps - 1) * topk^2) for steps {self.steps}, topk {self.topk}"
            )


BASELINE = SpecConfig(1, 0, 0, 0)


def valid_configs(max_steps: int, max_topk: int, max_ndraft: int):
    """Every valid speculative SpecConfig with steps <= max_steps, topk <= max_topk, ndraft <= max_ndraft (batch 1),
    by the rule above: `tune`'s search space."""
    for steps in range(1, max_steps + 1):
        for topk in range(1, max_topk + 1):
            low = steps + 1 if topk == 1 else 2
            high = steps + 1 if topk == 1 else min(max_draft_tokens(steps, topk), max_ndraft)
            for ndraft in range(low, min(high, max_ndraft) + 1):
                yield SpecConfig(1, steps, topk, ndraft)
