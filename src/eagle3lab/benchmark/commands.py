"""`eagle3lab bench` and `eagle3lab tune`: each asks the draft's kind (drafters.base.DrafterTools `bench`, `tune`),
which runs it in our own engine or in a served engine, as `--engine` says."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from eagle3lab.benchmark.run import BenchSettings
from eagle3lab.benchmark.systems import DEFAULT_DRAFT, check_draft_folders, parse_system_config
from eagle3lab.benchmark.tune import TuneSettings
from eagle3lab.cli import COMMANDS
from eagle3lab.drafters.base import DrafterTools
from eagle3lab.drafters.tools import tools_of
from eagle3lab.io import InputError, command, write_json
from eagle3lab.options import add_options, from_options

# What each command's --help adds to its one-line summary (that summary's one home is `eagle3lab.cli.COMMANDS`).
DETAILS = {
    "bench": "It times the target alone (the baseline), each draft and shape, and the HF peers on the same prompts in "
    "one run, and reports each one's accept length, tokens/s, speedups against the baseline and how often its output "
    "is identical to the baseline's. --engine local runs it in our own engine; vllm or llamacpp in a served engine. A "
    "DFlash draft folder is timed alone at its whole block (tune picks its k), against the engine's baseline.",
    "tune": "With --engine local it measures the draft's acceptance and this machine's forward costs in our own "
    "engine, predicts every shape's speedup and benchmarks the best few beside the baseline; with vllm or llamacpp "
    "it serves each chain shape and predicts from that engine's own costs and counters. A DFlash draft gets its k in "
    "any engine, from its exact offline acceptance (scored here on --eval-cache, or read with --offline FILE: options "
    "that --draft DFLASH_FOLDER adds) and the engine's costs. It "
    "prints the ranked shapes and the winner's launch flags, or says not to speculate when nothing beats the "
    "baseline.",
}


def _parser(name: str, settings_class) -> argparse.ArgumentParser:
    description = f"{COMMANDS[name][2]} {DETAILS[name]}"
    p = argparse.ArgumentParser(prog=f"eagle3lab {name}", description=description)
    add_options(p, settings_class)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def bench_parser() -> argparse.ArgumentParser:
    return _parser("bench", BenchSettings)


def tune_parser(settings_class: type = TuneSettings) -> argparse.ArgumentParser:
    """`eagle3lab tune`'s options: those of the draft's kind (drafters.base.DrafterTools.tune_settings)."""
    return _parser("tune", settings_class)


def tune_kind(argv: list[str]) -> DrafterTools:
    """The kind of the draft --draft names, read first (as `train` reads --drafter): it decides the other options.
    Without --draft, EAGLE-3's, whose parser then says --draft is required."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--draft")
    return tools_of(pre.parse_known_args(argv)[0].draft or DEFAULT_DRAFT)


def _show(result: dict, text: str, output: str | None) -> int:
    """Print a command's text and write its result where --output says."""
    print(text)
    if output:
        write_json(Path(output), result)
        print(f"wrote {output}")
    return 0


def one_kind(drafts: list[str]) -> DrafterTools:
    """The tools of the drafts' kind (each kind benches its own), or an InputError naming the drafts of each kind."""
    by_kind: dict[str, list[str]] = {}
    for draft in drafts:
        by_kind.setdefault(tools_of(draft).name, []).append(draft)
    if len(by_kind) > 1:
        kinds = "; ".join(f"{kind}: {' '.join(folders)}" for kind, folders in by_kind.items())
        raise InputError(f"--draft: drafts of different kinds ({kinds}): bench one kind at a time")
    return tools_of(drafts[0])


@command("eagle3lab bench")
def bench(argv: list[str]) -> int:
    """`eagle3lab bench`: the local benchmark, or one in a served engine, by the drafts' kind."""
    args = bench_parser().parse_args(argv)
    settings = from_options(args, BenchSettings)
    # a run that never drafts reads no folder: a missing one is read as the default kind, whose bench runs baselines
    settings = replace(settings, drafts=settings.drafts or [str(DEFAULT_DRAFT)])
    if any(not parse_system_config(c)[0].is_baseline for c in settings.configs):  # a shape that drafts
        check_draft_folders(settings.drafts)
    result, text = one_kind(settings.drafts).bench(settings, progress=not args.quiet)
    return _show(result, text, settings.output)


@command("eagle3lab tune")
def tune(argv: list[str]) -> int:
    """`eagle3lab tune`: tune in our engine, or in a served engine."""
    kind = tune_kind(argv)
    options = kind.tune_settings()  # the kind's settings class: its fields are the command's options
    args = tune_parser(options).parse_args(argv)
    settings = from_options(args, options)
    check_draft_folders([settings.draft])
    result, text = kind.tune(settings, progress=not args.quiet)  # each kind tunes its own shape
    return _show(result, text, settings.output)
