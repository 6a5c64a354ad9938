"""SGLang's launch line for the doctor: `python -m sglang.launch_server ...` / `sglang serve ...` read as SGLang's
argparse would (`--flag=value`, aliases, unique prefixes), or a running server's /server_info, into the doctor's
`Launch`; fixes written back in SGLang's flags."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from eagle3lab.doctor.launch import Launch, LaunchSyntax

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


class SGLangSyntax(LaunchSyntax):
    """How SGLang spells the Launch fields, and how a fix is written back into an SGLang command."""

    engine = "sglang"
    speculation_fix = "--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT"

    def flag(self, key: str) -> str:
        return LAUNCH_FLAGS[key][0]

    def flags(self, launch: Launch, changes: dict[str, Any]) -> str:
        return " ".join(f"{self.flag(k)} {v}" for k, v in changes.items())

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


def reads(argv: list[str]) -> bool:
    """SGLang's reader takes any line the other engines' readers do not: it is the fallback."""
    return True


def read_launch(launch: Launch) -> Launch:
    """Fill `launch` (argv set) as SGLang's argparse would."""
    launch.syntax = SGLANG
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
    launch = Launch(source="server /server_info", syntax=SGLANG)
    for key, name in SERVER_INFO_FIELDS.items():
        value = info.get(name)
        if value is not None:
            setattr(launch, key, value.upper() if key == "algorithm" and isinstance(value, str) else value)
    return launch
