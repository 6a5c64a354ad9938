"""The speculative part of a launch, as one engine-neutral `Launch`, read from a command line (as the engine's
argparse would) or from a running server, and rewritten with corrected flags for a finding's fix.

Each engine folder has one reader that fills a `Launch` (`engines/<engine>/launch_line.py`) and one `LaunchSyntax`
that writes fixes back in that engine's own flags, so the checks never branch on the engine for wording;
`doctor.reading.parse_launch` picks the reader from the line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Algorithms whose target captures the three aux hidden states (SpeculativeAlgorithm.is_eagle3()).
EAGLE3_ALGORITHMS = {"EAGLE3"}
# Algorithms that hand the draft only the target's final hidden state (NEXTN is rewritten to EAGLE by SGLang).
EAGLE_ALGORITHMS = {"EAGLE", "NEXTN"}


class LaunchSyntax:
    """How one engine spells the Launch fields and writes a fix back into its command; the hooks' defaults are what
    an engine does when it reads a draft as the trainers do. Subclasses set `engine` and `speculation_fix`."""

    engine: str
    speculation_fix: str
    missing_spec_params: str | None = None  # why a line without steps/topk/num-draft-tokens fails, if it does

    def flag(self, key: str) -> str:
        raise NotImplementedError

    def describe(self, launch: Launch, key: str) -> str:
        value = getattr(launch, key)
        return f"{self.flag(key)} {value}" if value is not None else f"no {self.flag(key)}"

    def describe_spec(self, launch: Launch) -> str:
        return ", ".join(f"{self.flag(k)} {getattr(launch, k)}" for k in ("num_steps", "topk", "num_draft_tokens"))

    def flags(self, launch: Launch, changes: dict[str, Any]) -> str:
        raise NotImplementedError

    def corrected(self, launch: Launch, changes: dict[str, Any]) -> str:
        raise NotImplementedError

    def consequences(self, algorithm: str) -> list[str]:
        """What the engine does with an EAGLE draft under a non-EAGLE algorithm, beyond the generic finding."""
        return []

    def aux_capture(self, config: dict, num_layers: int) -> tuple[list[int], str] | None:
        """The hidden_states the engine captures when it reads layer ids its own way; None: as the trainers do
        (eagle_config's ids, id i = hidden_states[i + 1], else [2, N//2, N-3])."""
        return None

    def eagle3_under_eagle(self, launch: Launch, draft, ev: list[str]):
        """The engine's own finding for an EAGLE-3 draft under EAGLE/NEXTN; None: the generic fc-bypass finding."""
        return None

    def draft_checks(self, launch: Launch, draft, target) -> list:
        """The engine's own static checks of a draft folder under this launch (findings)."""
        return []


@dataclass
class Launch:
    """The speculative part of a launch, from a command line or from a server's /server_info. vLLM's method and
    llama.cpp's --spec-type are mapped onto the algorithm (eagle3 / draft-eagle3 -> EAGLE3), their draft length k
    (num_speculative_tokens, --spec-draft-n-max) onto steps k, topk 1, num-draft-tokens k+1."""

    source: str
    argv: list[str] | None = None
    model_path: str | None = None
    draft_path: str | None = None
    algorithm: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    context_length: int | None = None
    tp_size: int | None = None
    spec_config: dict | None = None  # vLLM's --speculative-config or llama.cpp's --spec-* settings, as read by it
    notes: list[str] = field(default_factory=list)  # parse problems, as evidence lines
    syntax: Any = field(default=None, repr=False)  # the engine's LaunchSyntax, set by its reader
    _spans: dict[str, Any] = field(default_factory=dict, repr=False)  # field -> where its value sits (the syntax's)

    @property
    def engine(self) -> str:
        return self.syntax.engine

    @property
    def speculative(self) -> bool:
        return self.algorithm is not None

    def flag(self, key: str) -> str:
        """The engine's name for a field, for evidence lines."""
        return self.syntax.flag(key)

    def describe(self, key: str) -> str:
        """A field as the launch gave it, in the engine's syntax."""
        return self.syntax.describe(self, key)

    def corrected(self, **changes: Any) -> str:
        """The command with the given fields set (flag replaced in place, or appended); argv-less sources give flags."""
        if self.argv is None:
            return self.syntax.flags(self, changes)
        return self.syntax.corrected(self, changes)


def fix_flags(launch: Launch, **changes: Any) -> str:
    """A fix as the changed flags, then (for a command line) the whole corrected command."""
    flags = launch.syntax.flags(launch, changes)
    return flags if launch.argv is None else f"{flags}\n{launch.corrected(**changes)}"
