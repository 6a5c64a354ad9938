"""`eagle3lab bench` and `eagle3lab tune`: each runs in our own engine (`run`, `tune`) or in a served engine
(`served`, `tune_engine`), as `--engine` says."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3lab.benchmark.run import BenchSettings, format_table, run_benchmark
from eagle3lab.benchmark.served import SERVED_COLUMNS, run_served_benchmark
from eagle3lab.benchmark.systems import DEFAULT_DRAFT, check_draft_folders, parse_system_config
from eagle3lab.benchmark.table import render_rows
from eagle3lab.benchmark.tune import TuneSettings
from eagle3lab.cli import COMMANDS
from eagle3lab.drafters.tools import tools_of
from eagle3lab.io import command, write_json
from eagle3lab.options import add_options, from_options

# What each command's --help adds to its one-line summary (that summary's one home is `eagle3lab.cli.COMMANDS`).
DETAILS = {
    "bench": "It times the target alone (the baseline), each draft and shape, and the HF peers on the same prompts in "
    "one run, and reports each one's accept length, tokens/s, speedups against the baseline and how often its output "
    "is identical to the baseline's. --engine local runs it in our own engine; vllm or llamacpp in a served engine.",
    "tune": "With --engine local it measures the draft's acceptance and this machine's forward costs in our own "
    "engine, predicts every shape's speedup and benchmarks the best few beside the baseline; with vllm or llamacpp "
    "it serves each chain shape and predicts from that engine's own costs and counters. A DFlash draft gets its k in "
    "any engine, from its exact offline acceptance and the engine's costs. It prints the ranked shapes and the "
    "winner's launch flags, or says not to speculate when nothing beats the baseline.",
}


def _parser(name: str, settings_class) -> argparse.ArgumentParser:
    description = f"{COMMANDS[name][2]} {DETAILS[name]}"
    p = argparse.ArgumentParser(prog=f"eagle3lab {name}", description=description)
    add_options(p, settings_class)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def bench_parser() -> argparse.ArgumentParser:
    return _parser("bench", BenchSettings)


def tune_parser() -> argparse.ArgumentParser:
    return _parser("tune", TuneSettings)


def _show(result: dict, text: str, output: str | None) -> int:
    """Print a command's text and write its result where --output says."""
    print(text)
    if output:
        write_json(Path(output), result)
        print(f"wrote {output}")
    return 0


@command("eagle3lab bench")
def bench(argv: list[str]) -> int:
    """`eagle3lab bench`: the local benchmark, or one in a served engine."""
    args = bench_parser().parse_args(argv)
    settings = from_options(args, BenchSettings)
    if any(not parse_system_config(c)[0].is_baseline for c in settings.configs):  # a shape that drafts
        check_draft_folders(settings.drafts or [DEFAULT_DRAFT])

    if settings.engine == "local":
        result = run_benchmark(settings=settings, progress=not args.quiet)
        return _show(result, format_table(result), settings.output)
    result = run_served_benchmark(settings)
    return _show(result, render_rows(result["rows"], SERVED_COLUMNS), settings.output)


@command("eagle3lab tune")
def tune(argv: list[str]) -> int:
    """`eagle3lab tune`: tune in our engine, or in a served engine."""
    args = tune_parser().parse_args(argv)
    settings = from_options(args, TuneSettings)
    check_draft_folders([settings.draft])

    result, text = tools_of(settings.draft).tune(settings, progress=not args.quiet)  # each kind tunes its own shape
    return _show(result, text, settings.output)
