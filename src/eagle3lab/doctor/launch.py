"""The speculative part of a launch, read from a command line (as the engine's argparse would) or from a running SGLang
server's /server_info, and rewritten with corrected flags for a finding's fix.

One reader per engine fills the same `Launch` (SGLang here, vLLM in `doctor.vllm`, llama.cpp's llama-server in
`doctor.llamacpp`); `parse_launch` picks the reader from the line. The launch's `syntax` writes fixes back in that
engine's own flags, so the checks never branch on the engine for wording."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Algorithms whose target captures the three aux hidden states (SpeculativeAlgorithm.is_eagle3()).
EAGLE3_ALGORITHMS = {"EAGLE3"}
# Algorithms that hand the draft only the target's final hidden state (NEXTN is rewritten to EAGLE by SGLang).
EAGLE_ALGORITHMS = {"EAGLE", "NEXTN"}

# field -> SGLang option strings (server_args.py: primary name first, then aliases)
LAUNCH_FLAGS = {
    "model_path": ["--model-path", "--model"],
    "draft_path": ["--speculative-draft-model-path", "--speculative-draft-model"],
    "algorithm": ["--speculative-algorithm"],
    "num_steps": ["--speculative-num-steps"],
    "topk": ["--speculative-eagle-topk"],
    "num_draft_tokens": ["--speculative-num-draft-tokens"],
    "context_length": ["--context-length"],
    "tp_size": ["--tp-size", "--tensor-parallel-size"],
}
# Other SGLang options sharing prefixes with ours: argparse resolves an abbreviation only when it is unique.
_SIBLING_FLAGS = [
    "--model-impl",
    "--model-loader-extra-config",
    "--model-checksum",
    "--speculative-draft-model-revision",
    "--speculative-draft-load-format",
    "--speculative-draft-attention-backend",
    "--speculative-draft-window-size",
    "--speculative-draft-model-quantization",
    "--speculative-draft-placement",
    "--speculative-draft-gpu",
    "--speculative-accept-threshold-single",
    "--speculative-accept-threshold-acc",
    "--speculative-attention-mode",
    "--speculative-token-map",
    "--speculative-use-rejection-sampling",
    "--speculative-adaptive",
    "--speculative-adaptive-config",
    "--speculative-moe-runner-backend",
    "--speculative-moe-a2a-backend",
    "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth",
    "--speculative-dflash-block-size",
    "--context-parallel-size",
]
# SGLang ServerArgs field names as /server_info reports them
SERVER_INFO_FIELDS = {
    "model_path": "model_path",
    "draft_path": "speculative_draft_model_path",
    "algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
    "context_length": "context_length",
    "tp_size": "tp_size",
}
_INT_FIELDS = {"num_steps", "topk", "num_draft_tokens", "context_length", "tp_size"}


class SGLangSyntax:
    """How SGLang spells the Launch fields, and how a fix is written back into an SGLang command."""

    engine = "sglang"
    missing_spec_params = None  # SGLang picks steps/topk/num-draft-tokens per model when none is given
    speculation_fix = "--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT"

    def flag(self, key: str) -> str:
        return LAUNCH_FLAGS[key][0]

    def describe(self, launch: Launch, key: str) -> str:
        value = getattr(launch, key)
        return f"{self.flag(key)} {value}" if value is not None else f"no {self.flag(key)}"

    def describe_spec(self, launch: Launch) -> str:
        return ", ".join(f"{self.flag(k)} {getattr(launch, k)}" for k in ("num_steps", "topk", "num_draft_tokens"))

    def flags(self, launch: Launch, changes: dict[str, Any]) -> str:
        return " ".join(f"{self.flag(k)} {v}" for k, v in changes.items())

    def consequences(self, algorithm: str) -> list[str]:
        """What the engine does with an EAGLE draft under a non-EAGLE algorithm, beyond the generic finding."""
        return []

    def aux_capture(self, config: dict, num_layers: int) -> tuple[list[int], str] | None:
        """The hidden_states the engine captures when it reads layer ids its own way; None: as the trainers do
        (SGLang: eagle_config's ids, id i = hidden_states[i + 1], else [2, N//2, N-3])."""
        return None

    def corrected(self, launch: Launch, changes: dict[str, Any]) -> str:
        """The command with each changed flag's value replaced in place (the user's spelling kept), or appended."""
        argv = list(launch.argv)
        appended = []
        for key, value in changes.items():
            if key in launch._spans:
                i, eq = launch._spans[key]
                if eq:
                    argv[i] = f"{argv[i].split('=', 1)[0]}={value}"
                else:
                    argv[i + 1] = str(value)
            else:
                appended += [self.flag(key), str(value)]
        return shlex.join(argv + appended)


SGLANG = SGLangSyntax()


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
    syntax: Any = field(default=SGLANG, repr=False)  # the engine's spelling: SGLang's, doctor.vllm's, doctor.llamacpp's
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


def _resolve_flag(opt: str) -> tuple[str | None, str | None]:
    """Map an option string to a Launch field like argparse does (exact, alias, or unique prefix).

    Returns (field, note); field None when the option is not one of ours."""
    for key, names in LAUNCH_FLAGS.items():
        if opt in names:
            return key, None
    ours = [(key, name) for key, names in LAUNCH_FLAGS.items() for name in names if name.startswith(opt)]
    if not ours or len(opt) < 4:
        return None, None
    keys = {key for key, _ in ours}
    if len(keys) > 1:
        return None, f"`{opt}` is ambiguous ({', '.join(n for _, n in ours)}); SGLang rejects it"
    key = keys.pop()
    others = [name for name in _SIBLING_FLAGS if name.startswith(opt)]
    if others:
        return key, (
            f"`{opt}` read as {LAUNCH_FLAGS[key][0]}, but newer SGLang rejects it as ambiguous "
            f"(also matches {', '.join(others[:3])}); write {LAUNCH_FLAGS[key][0]}"
        )
    return key, None


def parse_launch(command: str | list[str]) -> Launch:
    """Parse a server command (shell quoting and line continuations): vLLM's (`vllm serve`, `-m
    vllm.entrypoints.openai.api_server`) through doctor.vllm, llama.cpp's `llama-server` through doctor.llamacpp,
    anything else as SGLang's `python -m sglang.launch_server ...` / `sglang serve ...` (`--flag=value`, aliases,
    unique prefixes)."""
    from eagle3lab.doctor import llamacpp, vllm  # they build on this module's Launch

    launch = Launch(source="launch line")
    if isinstance(command, str):
        try:
            argv = shlex.split(command.replace("\\\r\n", " ").replace("\\\n", " "))
        except ValueError as e:
            launch.notes.append(f"the launch line is not valid shell syntax ({e})")
            return launch
    else:
        argv = [str(a) for a in command]
    launch.argv = [a for a in argv if a.strip()]
    if vllm.entry_index(launch.argv) is not None:
        return vllm.read_launch(launch)
    if llamacpp.entry_index(launch.argv) is not None:
        return llamacpp.read_launch(launch)
    _read_flags(launch, _flags_start(launch))
    return launch


def _flags_start(launch: Launch) -> int:
    """Index of the first server argument after `-m sglang.launch_server` / `sglang serve [MODEL]` (0: not found)."""
    argv = launch.argv
    for i, tok in enumerate(argv):
        if tok == "sglang.launch_server" and i > 0 and argv[i - 1] == "-m":
            return i + 1
        if Path(tok).name == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            # `sglang serve MODEL` also takes the model positionally
            if i + 2 < len(argv) and not argv[i + 2].startswith("-"):
                launch.model_path = argv[i + 2]
            return i + 2
    launch.notes.append(
        "not an SGLang launch (expected `python -m sglang.launch_server` or `sglang serve`); flags read anyway"
    )
    return 0


def _read_flags(launch: Launch, i: int) -> None:
    """Set the Launch fields from argv[i:], remembering where each value sits for `corrected`."""
    argv = launch.argv
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            i += 1
            continue
        opt, eq, inline = tok.partition("=")
        key, note = _resolve_flag(opt)
        if note:
            launch.notes.append(note)
        if key is None:
            i += 1
            continue
        if eq:
            value, span = inline, (i, True)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value, span = argv[i + 1], (i, False)
            i += 2
        else:
            launch.notes.append(f"{opt} has no value")
            i += 1
            continue
        if key in _INT_FIELDS:
            try:
                value = int(value)
            except ValueError:
                launch.notes.append(f"{opt} {value!r} is not an integer")
                continue
        elif key == "algorithm":
            value = value.upper()
        setattr(launch, key, value)
        launch._spans[key] = span


def launch_from_server_info(info: dict) -> Launch:
    """What a server reports it was launched with (no argv: fixes are given as flags)."""
    launch = Launch(source="server /server_info")
    for key, name in SERVER_INFO_FIELDS.items():
        value = info.get(name)
        if value is not None:
            setattr(launch, key, value.upper() if key == "algorithm" and isinstance(value, str) else value)
    return launch
