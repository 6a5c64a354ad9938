"""The engine layer's interfaces. A served engine (vLLM, llama.cpp) offers the same few verbs (`Engine`): the
target as it loads it, the launch line for a target, a draft and a draft length, the server's start on loopback
(health first), one greedy request by token ids, its own speculation counters, and the stop of its process group.
Every engine folder, SGLang's too, registers one `EngineEntry`: its launch-line reader, its server probe, the
draft-config fields it reads, and its served engine where it runs here. The benchmark, the doctor and tune ask an
engine for these and never fork per engine."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from eagle3lab.io import InputError
from eagle3lab.serving.client import Completion, ServerClient
from eagle3lab.serving.processes import Server


class EngineMissing(InputError):
    """The engine's environment or build is not there; the message names the command that sets it up."""


@dataclass(frozen=True)
class SpecCounters:
    """An engine's cumulative speculation counters: rounds that drafted, tokens drafted, tokens accepted, and
    accepted tokens per draft position. Subtract two readings for what happened between them."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...] = ()

    def _combine(self, other: SpecCounters, sign: int) -> SpecCounters:
        width = max(len(self.per_position), len(other.per_position))
        mine, theirs = (tuple(c.per_position) + (0,) * (width - len(c.per_position)) for c in (self, other))
        return SpecCounters(
            self.drafts + sign * other.drafts,
            self.draft_tokens + sign * other.draft_tokens,
            self.accepted + sign * other.accepted,
            tuple(a + sign * b for a, b in zip(mine, theirs)),
        )

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        return self._combine(before, -1)

    def __add__(self, other: SpecCounters) -> SpecCounters:
        return self._combine(other, 1)

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify round, the bonus token included (1 + accepted / drafts); None when nothing drafted."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def position_acceptance(self) -> list[float]:
        """The share of rounds whose i-th draft token was accepted."""
        return [p / self.drafts for p in self.per_position] if self.drafts else []


def check_draft_folder(draft: str | os.PathLike, who: str) -> None:
    """Engines load (or export) a draft from a folder with config.json and safetensors weights; anything else fails
    minutes into start-up with a stack trace, so say so before launching. `who`: what needs it, for the message."""
    folder = Path(draft)
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise InputError(
            f"draft {folder}: {who} needs a draft folder with config.json and *.safetensors weights "
            "(an SGLang/SpecForge-format export: `eagle3lab train` writes one)"
        )


def parse_spec_counters(text: str, prefix: str) -> SpecCounters | None:
    """Speculation counters from Prometheus text, summed over engines: vLLM (`vllm:`) and llama.cpp (`llamacpp:`)
    both publish spec_decode_num_drafts, _num_draft_tokens, _num_accepted_tokens and _num_accepted_tokens_per_pos
    {position}. None when the server exposes none (it does not speculate)."""
    from prometheus_client.parser import text_string_to_metric_families  # a running server's: not the static doctor's

    totals: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefix + "spec_decode_"):
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name.removeprefix(prefix + "spec_decode_").removesuffix("_total")
            if name == "num_accepted_tokens_per_pos":
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
            else:
                totals[name] = totals.get(name, 0.0) + sample.value
    if "num_drafts" not in totals:
        return None
    return SpecCounters(
        drafts=int(totals["num_drafts"]),
        draft_tokens=int(totals.get("num_draft_tokens", 0)),
        accepted=int(totals.get("num_accepted_tokens", 0)),
        per_position=tuple(int(per_position[i]) for i in sorted(per_position)),
    )


class Engine(Protocol):
    """What every served engine offers (`engines.vllm.server.VLLM`, `engines.llamacpp.server.LlamaCpp`)."""

    name: str

    def model(self, spec: str) -> Path:
        """The target `spec` (an embedded target or a model path) as this engine loads it."""

    def launch_command(
        self,
        target: str | os.PathLike,
        *,
        port: int,
        draft: str | os.PathLike | None = None,
        k: int = 0,
        threshold: float = 0.0,
    ) -> list[str]:
        """The server command: the target alone (k 0) or with `draft` proposing up to k tokens per round, stopping
        early where the draft's confidence falls below `threshold` (engines without that setting refuse one)."""

    def serve(self, command: list[str], *, log_path: Path | None = None) -> contextlib.AbstractContextManager[Server]:
        """Start `command` on loopback, wait for health, yield the Server, stop its process group on exit."""

    def complete(self, client: ServerClient, input_ids: list[int], max_tokens: int) -> Completion:
        """One greedy completion of exactly these token ids, with the generated ids back."""

    def counters(self, client: ServerClient) -> SpecCounters | None:
        """The server's cumulative speculation counters; None when it does not speculate."""


@dataclass(frozen=True)
class DraftField:
    """One draft config.json field an engine reads: what it switches (`role`: capture, fc, vocab, positions, shape,
    or class), what the engine does with it, and what it does with a bad or missing value (`silent`: it still
    starts and serves, slower or worse, without a word)."""

    name: str  # dotted for nested keys: eagle_config.eagle_aux_hidden_state_layer_ids
    role: str
    effect: str
    when_bad: str
    silent: bool


@dataclass(frozen=True)
class EngineEntry:
    """One engine folder as the rest of the package sees it (`engines.registry.ENGINES`)."""

    name: str  # the folder's name, as `--engine` takes it
    title: str  # as its users write it
    reads: Callable[[list[str]], bool]  # is this argv a launch line of this engine
    read_launch: Callable[[Any], Any]  # fill the doctor's Launch from it
    check_server: Callable[..., Any]  # (client, launch, ProbeSettings) -> (findings, launch) or None: not this engine
    fields: tuple[DraftField, ...]  # every draft config field it reads
    server: Callable[..., Engine] | None = None  # the served engine, where it runs here
    files: Callable[..., Any] | None = None  # (launch, draft, target) -> its own draft/target files, or None

    @classmethod
    def of(cls, name: str, title: str, launch_line, probe, fields, **more) -> EngineEntry:
        """An engine folder's entry from its modules by their roles: `launch_line` (reads, read_launch), `probe`
        (check_server) and its fields table; `more`: server, files."""
        return cls(name, title, launch_line.reads, launch_line.read_launch, probe.check_server, fields, **more)
