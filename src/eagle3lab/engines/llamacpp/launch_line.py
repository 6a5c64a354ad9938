"""llama-server's launch line for the doctor: read into the doctor's `Launch`, fixes written back in llama-server's
flags. llama-server's parser (common/arg.cpp) takes exact option names (no prefixes, no `--flag=value`), reads
underscores in `--` options as dashes, and keeps the last of a repeated option, except --spec-type, whose
comma-separated lists add up (a list naming `none` adds nothing)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from eagle3lab.doctor.launch import Launch, LaunchSyntax
from eagle3lab.engines.llamacpp.gguf import SPEC_TYPE

BINARY = "llama-server"
# llama-server option -> the setting it carries (common/arg.cpp)
OPTIONS = {
    "-m": "model_path",
    "--model": "model_path",
    "-md": "draft_path",
    "--model-draft": "draft_path",
    "--spec-draft-model": "draft_path",
    "--spec-type": "spec_type",
    "--spec-draft-n-max": "n_max",
    "--spec-draft-n-min": "n_min",
    "--spec-draft-p-min": "p_min",
    "--draft-p-min": "p_min",
    "-c": "context_length",
    "--ctx-size": "context_length",
}
FLAGS = {setting: option for option, setting in reversed(OPTIONS.items())}  # each setting's first spelling
DEFAULTS = {"n_max": 3, "n_min": 0, "p_min": 0.0}  # common_params_speculative
# common_speculative_all_types_str()
SPEC_TYPES = {"none", "draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark", "ngram-cache"}
SPEC_TYPES |= {"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}
REMOVED = {"--draft", "--draft-n", "--draft-max", "--draft-min", "--draft-n-min"}  # llama-server refuses to start


def reads(argv: list[str]) -> bool:
    return entry_index(argv) is not None


def entry_index(argv: list[str]) -> int | None:
    """Index of the first server argument of a llama-server command, None when the line does not start one."""
    for i, tok in enumerate(argv):
        if Path(tok).name == BINARY:
            return i + 1
    return None


def _option(tok: str) -> str:
    return "--" + tok[2:].replace("_", "-") if tok.startswith("--") else tok


def read_launch(launch: Launch) -> Launch:
    """Fill `launch` (argv set, a llama-server line) as llama-server's parser would."""
    launch.syntax = LLAMACPP
    argv = launch.argv
    start = entry_index(argv)
    env = [tok.split("=", 1)[0] for tok in argv[: start - 1] if tok.startswith("LLAMA_ARG_") and "=" in tok]
    if env:
        launch.notes.append(f"{', '.join(env)}: llama-server reads these from the environment; the doctor reads flags")
    values: dict[str, str] = {}
    types: list[str] = []
    metrics = False
    i = start
    while i < len(argv):
        name = _option(argv[i])
        metrics = metrics or name == "--metrics"
        if name in REMOVED:
            launch.notes.append(
                f"{name} was removed from llama.cpp: llama-server refuses to start (use {FLAGS['n_max']})"
            )
        setting = OPTIONS.get(name)
        if setting is None:
            i += 1
            continue
        if i + 1 >= len(argv):
            launch.notes.append(f"{name} has no value")
            break
        launch._spans.setdefault(setting, []).append(i)
        if setting == "spec_type":
            types += _spec_types(launch, argv[i + 1])
        else:
            values[setting] = argv[i + 1]
        i += 2
    launch.model_path = values.get("model_path")
    launch.draft_path = values.get("draft_path")
    spec = {key: _number(launch, key, values.get(key), type(default)) for key, default in DEFAULTS.items()}
    types = list(dict.fromkeys(types))
    launch.spec_config = {"types": types, **spec, "metrics": metrics}
    context = _number(launch, "context_length", values.get("context_length"), int)
    launch.context_length = context or None  # 0: the model's own context
    if types:
        launch.algorithm = "EAGLE3" if types == [SPEC_TYPE] else ",".join(types).upper()
        k = spec["n_max"]
        launch.num_steps, launch.topk, launch.num_draft_tokens = k, 1, k + 1
    return launch


def _spec_types(launch: Launch, value: str) -> list[str]:
    """One --spec-type list: llama.cpp refuses unknown names, and a list naming `none` turns nothing on."""
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SPEC_TYPES]
    if unknown:
        launch.notes.append(f"--spec-type {', '.join(unknown)}: unknown to llama.cpp, which refuses to start")
    return [] if "none" in names else [n for n in names if n in SPEC_TYPES]


def _number(launch: Launch, setting: str, text: str | None, kind: type):
    if text is None:
        return DEFAULTS.get(setting)
    try:
        return kind(text)
    except ValueError:
        launch.notes.append(f"{FLAGS[setting]} {text!r} is not a number: llama-server refuses to start")
        return DEFAULTS.get(setting)


class LlamaCppSyntax(LaunchSyntax):
    """How llama-server spells the Launch fields, and how a fix is written back into its command. Fixes name the
    Launch fields (algorithm EAGLE3, num_steps, context_length) or llama.cpp's own settings (n_min, p_min)."""

    engine = "llamacpp"
    speculation_fix = f"-md DRAFT.gguf --spec-type {SPEC_TYPE}"
    _SETTINGS = {"algorithm": "spec_type", "num_steps": "n_max", "topk": "n_max", "num_draft_tokens": "n_max"}

    def _setting(self, key: str) -> str:
        return self._SETTINGS.get(key, key)

    def flag(self, key: str) -> str:
        return FLAGS[self._setting(key)]

    def describe(self, launch: Launch, key: str) -> str:
        """Every occurrence as written, else what llama.cpp uses without it."""
        setting = self._setting(key)
        spans = launch._spans.get(setting)
        if spans:
            return " ".join(f"{launch.argv[i]} {launch.argv[i + 1]}" for i in spans)
        default = DEFAULTS.get(setting)
        return f"no {FLAGS[setting]}" + (f" (llama.cpp's default: {default})" if default is not None else "")

    def _changed(self, changes: dict[str, Any]) -> list[tuple[str, str]]:
        """(setting, value as llama-server takes it) for each change; topk and num-draft-tokens follow n-max."""
        return [(self._setting(k), _text(k, v)) for k, v in changes.items() if k not in ("topk", "num_draft_tokens")]

    def flags(self, launch: Launch, changes: dict[str, Any]) -> str:
        return shlex.join([tok for setting, value in self._changed(changes) for tok in (FLAGS[setting], value)])

    def corrected(self, launch: Launch, changes: dict[str, Any]) -> str:
        """The command with each changed setting's last occurrence set (the one llama.cpp reads; earlier ones dropped,
        since --spec-type lists add up) or the flag appended."""
        argv = list(launch.argv)
        dropped: set[int] = set()
        appended: list[str] = []
        for setting, value in self._changed(changes):
            spans = launch._spans.get(setting)
            if not spans:
                appended += [FLAGS[setting], value]
                continue
            argv[spans[-1] + 1] = value
            dropped |= {j for i in spans[:-1] for j in (i, i + 1)}
        return shlex.join([tok for j, tok in enumerate(argv) if j not in dropped] + appended)


def _text(key: str, value: Any) -> str:
    if key == "algorithm":
        return SPEC_TYPE if value == "EAGLE3" else str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


LLAMACPP = LlamaCppSyntax()
