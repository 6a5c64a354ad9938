"""The speculative part of a launch, as one engine-neutral `Launch`, read from a command line (as the engine's
argparse would) or from a running server, and rewritten with corrected flags for a finding's fix.

Each engine folder has one reader that fills a `Launch` (`engines/<engine>/launch_line.py`) and one `LaunchSyntax`
that writes fixes back in that engine's own flags, so the checks never branch on the engine for wording;
`doctor.reading.parse_launch` picks the reader from the line.

A line the engine would refuse fails closed: each reader checks every option against its engine's `KnownFlags` (the
one list of what that engine's server takes) before reading it, and its choice values against the engine's own names.
An unknown one is an error naming the nearest known one, and the line is read on with that one in its place, so the
other checks judge what was meant and every fix is a line the engine takes."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from eagle3lab.io import InputError

# Algorithms whose target captures the three aux hidden states (SpeculativeAlgorithm.is_eagle3()).
EAGLE3_ALGORITHMS = {"EAGLE3"}
# Algorithms that hand the draft only the target's final hidden state (NEXTN is rewritten to EAGLE by SGLang).
EAGLE_ALGORITHMS = {"EAGLE", "NEXTN"}


class LaunchUsageError(InputError):
    """A launch line the doctor cannot check at all (blank, not shell syntax, no model): bad usage, not a finding."""


def closest(word: str, known: Iterable[str]) -> str | None:
    """The known name nearest to a misspelled one, None when none is near (difflib's ratio below 0.6)."""
    return next(iter(difflib.get_close_matches(word, list(known), n=1)), None)


@dataclass(frozen=True)
class KnownFlags:
    """Every option one engine's server parser takes: the one home of that list for the engine's reader. `engine`
    names the version the list was read from (messages say which server refuses); `prefixes`: argparse takes a unique
    prefix of a `--` option for it; `renamed`: options the engine dropped, with what replaced them."""

    engine: str
    names: frozenset[str]
    prefixes: bool = False
    renamed: Mapping[str, str] = field(default_factory=dict)

    def resolve(self, name: str) -> list[str]:
        """The options `name` stands for: itself, or every option it begins (with prefixes). Exactly one: read."""
        if name in self.names:
            return [name]
        if self.prefixes and name.startswith("--"):
            return sorted(n for n in self.names if n.startswith(name))
        return []

    def problem(self, name: str) -> tuple[str, str | None] | None:
        """Why the server refuses option `name` and the option meant (None: none near), or None when it reads it."""
        matches = self.resolve(name)
        if len(matches) == 1:
            return None
        if matches:
            shown = ", ".join(matches[:4]) + (", ..." if len(matches) > 4 else "")
            meant = closest(name, matches) or matches[0]
            return f"{self.engine} refuses {name}, which begins {shown}: did you mean {meant}?", meant
        if name in self.renamed:
            return f"{self.engine} removed {name}: did you mean {self.renamed[name]}?", self.renamed[name]
        meant = closest(name, self.names)
        return f"{self.engine} has no {name}" + (f": did you mean {meant}?" if meant else ""), meant


_NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?")


def is_option(token: str) -> bool:
    """An option as argparse and llama.cpp tell one from a value: a leading dash, but not a negative number."""
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.fullmatch(token)


def check_flags(launch: Launch, start: int, known: KnownFlags, name_of: Callable[[str], str]) -> None:
    """Check every option of argv[start:] against `known`; `name_of` gives the name the engine matches (`--x=1` ->
    `--x`, underscores as dashes), as long as the token's own prefix. An unknown or ambiguous option is an error, and
    argv is rewritten with the option meant in its place, or without it (and its value) where none is near."""
    argv, out, i = launch.argv, launch.argv[:start], start
    while i < len(argv):
        token = argv[i]
        i += 1
        name = name_of(token) if is_option(token) else None
        problem = known.problem(name) if name else None
        if problem is None:
            out.append(token)
            continue
        message, meant = problem
        if meant:
            out.append(meant + token[len(name) :])  # keeps `=value` and vLLM's `.key`
        else:
            message += " (dropped from the corrected line)"
            if i < len(argv) and not is_option(argv[i]):
                i += 1  # its value goes with it
        launch.errors.append(message)
    launch.argv = out


def check_value(launch: Launch, flag: str, value: str, known: Iterable[str], what: str = "value") -> str | None:
    """A choice (a value, or a key of a JSON option) the engine refuses unless it is one of `known`: an error naming
    the nearest, which is returned for the reader to read on with (None when it is known or none is near)."""
    known = list(known)
    if value in known:
        return None
    meant = closest(value, known)
    hint = f"did you mean {meant}?" if meant else f"one of {', '.join(known)}"
    launch.errors.append(f"{flag} {value}: {launch.syntax.known.engine} has no such {what}; {hint}")
    return meant


class LaunchSyntax:
    """How one engine spells the Launch fields and writes a fix back into its command; the hooks' defaults are what
    an engine does when it reads a draft as the trainers do. Subclasses set `engine`, `known` (every option its
    server takes) and `speculation_fix`."""

    engine: str
    known: KnownFlags
    speculation_fix: str
    missing_spec_params: str | None = None  # why a line without steps/topk/num-draft-tokens fails, if it does
    draft_placeholder = "DRAFT"  # what a fix names the draft by when none is at hand

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

    def missing_draft(self, launch: Launch) -> list[str] | None:
        """What the engine does with a line that asks for speculation and names no draft, as evidence lines read
        from its pinned source (it serves the target alone, or refuses to start); None when the line's algorithm
        needs no draft (n-gram, the target's own MTP layers) or one is named."""
        return None


@dataclass
class Launch:
    """The speculative part of a launch, from a command line or from a server's /server_info. vLLM's method and
    llama.cpp's --spec-type are mapped onto the algorithm (eagle3 / draft-eagle3 -> EAGLE3), their draft length k
    (num_speculative_tokens, --spec-draft-n-max) onto steps k, topk 1, num-draft-tokens k+1."""

    source: str
    argv: list[str] | None = None  # as read: unknown options and values replaced by the ones meant
    written: list[str] | None = None  # as the user wrote it
    model_path: str | None = None
    draft_path: str | None = None
    algorithm: str | None = None
    num_steps: int | None = None
    topk: int | None = None
    num_draft_tokens: int | None = None
    context_length: int | None = None
    tp_size: int | None = None
    spec_config: dict | None = None  # vLLM's --speculative-config or llama.cpp's --spec-* settings, as read by it
    errors: list[str] = field(default_factory=list)  # what the engine refuses to start with, as evidence lines
    notes: list[str] = field(default_factory=list)  # what it starts with but may not mean, as evidence lines
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
