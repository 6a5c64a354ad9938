"""What one generation returns: its tokens, its accounting (verify forwards, accepted drafts, time split) and, when
traced, what each round proposed and what the target took."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Round:
    """One verify forward, traced: what the draft proposed and what the target took (for `tune`'s profile)."""

    tokens: list[int]  # proposed draft tokens (root excluded), in tree order
    depths: list[int]  # per proposed token
    confidence: list[float]  # per proposed token: the draft's cumulative probability of its path
    accepted: int  # draft tokens accepted
    ranks: list[int]  # sibling rank (0 = the draft's best) of each accepted node, by depth


@dataclass
class Generation:
    """One generation's output and metrics."""

    config: str
    mode: str
    prompt_tokens: int
    tokens: list[int]  # completion token ids (the EOS that stopped it included)
    finished_by: str  # "eos" or "length"
    verify_count: int = 0  # target forwards after the prefill (SGLang's spec_verify_ct)
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted by each verify forward
    depth: int = 0  # draft depth (steps); per-position acceptance has this many entries
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0
    rounds: list[Round] | None = None  # with trace=True: one per verify forward

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    @property
    def accept_length(self) -> float:
        """Tokens per target verify forward: accepted drafts + the bonus token (1.0 when nothing is ever accepted).

        The token sampled from the prefill is not a verify's output, so it is not counted; SGLang's
        `completion_tokens / spec_verify_ct` (`sglang_accept_length`) counts it and reads slightly higher.
        """
        return (self.completion_tokens - 1) / self.verify_count if self.verify_count else 1.0

    @property
    def sglang_accept_length(self) -> float:
        return self.completion_tokens / self.verify_count if self.verify_count else 1.0

    @property
    def position_acceptance(self) -> list[float]:
        """Fraction of verify forwards that accepted at least d draft tokens, for d = 1..depth."""
        n = len(self.accepted)
        return [sum(a >= d for a in self.accepted) / n if n else 0.0 for d in range(1, self.depth + 1)]

    @property
    def time_other(self) -> float:
        return max(self.time_total - self.time_prefill - self.time_draft - self.time_verify, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.time_total if self.time_total > 0 else 0.0

    def summary(self) -> dict:
        return {
            "config": self.config,
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finished_by": self.finished_by,
            "verify_count": self.verify_count,
            "accept_length": self.accept_length,
            "sglang_accept_length": self.sglang_accept_length,
            "position_acceptance": self.position_acceptance,
            "tokens_per_s": self.tokens_per_s,
            "time_total": self.time_total,
            "time_prefill": self.time_prefill,
            "time_draft": self.time_draft,
            "time_verify": self.time_verify,
            "time_other": self.time_other,
        }
