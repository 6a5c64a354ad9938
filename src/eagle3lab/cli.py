"""`eagle3lab COMMAND ...`: a thin dispatcher; each command's parser and logic live in its own module."""

from __future__ import annotations

import importlib
import sys

# command -> (module, function taking argv and returning an exit code, one-line help)
COMMANDS = {
    "data": ("eagle3lab.data.fetch", "main", "fetch and verify the pinned raw data archives into data/"),
    "regen": (
        "eagle3lab.regen.cli",
        "main",
        "regenerate responses with the target (local or OpenAI-compatible server)",
    ),
    "monitor": ("eagle3lab.regen.monitor", "main", "show progress of a regeneration run from its files"),
    "train": ("eagle3lab.train.cli", "main", "train an EAGLE-3 draft"),
    "bench": ("eagle3lab.benchmark.commands", "bench", "benchmark drafts against the baseline and peers"),
    "tune": (
        "eagle3lab.benchmark.commands",
        "tune",
        "pick steps/topk/ndraft for a draft from its acceptance and costs",
    ),
    "doctor": (
        "eagle3lab.doctor.cli",
        "main",
        "check an SGLang launch line, a draft and a server for a bypassed draft",
    ),
    "serve": (
        "eagle3lab.serving.cli",
        "main",
        "serve the target with a draft in vLLM or llama.cpp on loopback, printing the line",
    ),
    "export": (
        "eagle3lab.engines.llamacpp.gguf",
        "main",
        "write a draft's GGUF for llama.cpp, checked against the target",
    ),
    "stage": ("eagle3lab.pipeline.stages", "main", "run one pipeline stage notebook through papermill"),
    "sglang": (
        "eagle3lab.engines.sglang.cli",
        "main",
        "build SGLang launch lines from a params profile and benchmark a server",
    ),
}


def usage() -> str:
    lines = ["usage: eagle3lab COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"eagle3lab: unknown command '{name}'\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
