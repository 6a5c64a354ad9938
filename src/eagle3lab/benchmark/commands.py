"""`eagle3lab bench` and `eagle3lab tune`: each runs in our own engine (`run`, `tune`) or in a served engine
(`served`, `tune_engine`), as `--engine` says."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from eagle3lab.benchmark.run import BenchSettings, format_table, run_benchmark
from eagle3lab.benchmark.served import SERVED_COLUMNS, run_served_benchmark
from eagle3lab.benchmark.table import render_rows
from eagle3lab.benchmark.tune import TuneSettings, format_result
from eagle3lab.benchmark.tune import tune as tune_locally
from eagle3lab.benchmark.tune_engine import format_engine_result, tune_in_engine
from eagle3lab.io import InputError, write_json
from eagle3lab.options import add_options, from_options
from eagle3lab.serving.client import ServerError


def bench_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3lab bench", description=__doc__.split("\n")[0])
    add_options(p, BenchSettings)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def bench(argv: list[str]) -> int:
    """`eagle3lab bench`: the local benchmark, or one in a served engine."""
    args = bench_parser().parse_args(argv)
    settings = from_options(args, BenchSettings)
    try:
        if settings.engine == "local":
            result = run_benchmark(settings=settings, progress=not args.quiet)
            print(format_table(result))
        else:
            result = run_served_benchmark(settings)
            print(render_rows(result["rows"], SERVED_COLUMNS))
    except (InputError, ValueError) as e:
        print(f"eagle3lab bench: {e}", file=sys.stderr)
        return 2
    except ServerError as e:  # a served engine that failed to start or died: its log's tail is in the message
        print(f"eagle3lab bench: {e}", file=sys.stderr)
        return 1
    if settings.output:
        write_json(Path(settings.output), result)
        print(f"wrote {settings.output}")
    return 0


def tune_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3lab tune", description=__doc__.split("\n")[0])
    add_options(p, TuneSettings)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def tune(argv: list[str]) -> int:
    """`eagle3lab tune`: tune in our engine, or in a served engine."""
    args = tune_parser().parse_args(argv)
    settings = from_options(args, TuneSettings)
    try:
        if settings.engine == "local":
            result = tune_locally(settings, progress=not args.quiet)
            print(format_result(result))
        else:
            result = tune_in_engine(settings) | {"settings": asdict(settings)}
            print(format_engine_result(result))
    except (InputError, ValueError) as e:
        print(f"eagle3lab tune: {e}", file=sys.stderr)
        return 2
    except ServerError as e:  # a served engine that failed to start or died: its log's tail is in the message
        print(f"eagle3lab tune: {e}", file=sys.stderr)
        return 1
    write_json(Path(settings.output), result)
    print(f"wrote {settings.output}")
    return 0
