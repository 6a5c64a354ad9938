"""`eagle3lab COMMAND ...`: a thin dispatcher; each command's parser and logic live in its own module."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import version

# command -> (module, function taking argv and returning an exit code, one-sentence summary)
COMMANDS = {
    "data": ("eagle3lab.data.fetch", "main", "Fetch the pinned raw data archives, verify and extract them into data/."),
    "regen": (
        "eagle3lab.regen.cli",
        "main",
        "Regenerate a dataset's answers with the target: local, OpenAI-compatible servers or llama.cpp.",
    ),
    "monitor": ("eagle3lab.regen.monitor", "main", "Show a regeneration run's progress from its files."),
    "train": (
        "eagle3lab.train.cli",
        "main",
        "Train a draft: EAGLE-3 with training-time test, or a DFlash block drafter (--drafter dflash).",
    ),
    "bench": (
        "eagle3lab.benchmark.commands",
        "bench",
        "Benchmark drafts against the target alone and HF peers: accept length, tokens/s, speedup.",
    ),
    "acceptance": (
        "eagle3lab.benchmark.scoring",
        "main",
        "Measure drafts' exact accept length offline on the target's own answers to hundreds of prompts.",
    ),
    "generate": (
        "eagle3lab.benchmark.generate",
        "main",
        "Decode one prompt with a draft in the local engine, checked against plain greedy decoding.",
    ),
    "tune": (
        "eagle3lab.benchmark.commands",
        "tune",
        "Pick a draft's steps, topk and draft tokens from its acceptance and this machine's costs.",
    ),
    "doctor": (
        "eagle3lab.doctor.cli",
        "main",
        "Check SGLang, vLLM and llama-server launch lines, drafts and servers for an unused draft.",
    ),
    "serve": (
        "eagle3lab.serving.cli",
        "main",
        "Serve the target with a draft in vLLM or llama.cpp on loopback, printing the launch line.",
    ),
    "export": (
        "eagle3lab.drafters.export",
        "main",
        "Write a draft's GGUF for llama.cpp, checked against the target.",
    ),
    "stage": (
        "eagle3lab.pipeline.stages",
        "main",
        "Run one pipeline stage's notebook through papermill, its params file checked first.",
    ),
    "sglang": (
        "eagle3lab.engines.sglang.cli",
        "main",
        "Print SGLang launch lines from a params profile and benchmark SGLang servers.",
    ),
}


def usage() -> str:
    lines = ["usage: eagle3lab COMMAND [ARGS...] | --version", "", "commands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}} {summary}" for name, (_, _, summary) in COMMANDS.items()]
    lines += ["", "`eagle3lab COMMAND --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"eagle3lab {version('eagle3lab')}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"eagle3lab: unknown command '{name}'\n\n{usage()}", file=sys.stderr)
        return 2
    module, func, _ = COMMANDS[name]
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
