"""`eagle3lab train --data TRAIN.jsonl --output DIR [...]`, also under `torchrun --nproc-per-node N -m
eagle3lab.train.cli ...`. Every option is generated from a TrainConfig field (name, type, default, help), so the
dataclass stays the one home of the defaults. Exit codes: 0 done, 1 training failed (non-finite loss), 2 bad input
or settings."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from eagle3lab.drafters import DEFAULT, KINDS, drafter
from eagle3lab.drafters.base import Drafter
from eagle3lab.io import command
from eagle3lab.options import add_options, from_options


def build_parser(kind: str = DEFAULT) -> argparse.ArgumentParser:
    """The options of `--drafter KIND`'s trainer: its config class's fields (a TrainConfig, or one extending it)."""
    parser = argparse.ArgumentParser(
        prog="eagle3lab train",
        description="Train a draft: EAGLE-3 with training-time test, or another drafter kind (--drafter); the shared "
        "options (data, schedule, checkpoints, the held-out pick) are every kind's.",
    )
    parser.add_argument("--drafter", choices=list(KINDS), default=DEFAULT, help="the drafter kind to train")
    add_options(parser, drafter(kind).train_config())
    return parser


def parse_args(argv: list[str]) -> tuple[Drafter, object]:
    """The kind --drafter names (read first: the kind decides the other options) and its trainer's config."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--drafter", choices=list(KINDS), default=DEFAULT)
    kind = drafter(pre.parse_known_args(argv)[0].drafter)
    return kind, from_options(build_parser(kind.name).parse_args(argv), kind.train_config())


@command("eagle3lab train")
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    kind, config = parse_args(argv)
    result = kind.train(config)
    if result.get("world_size", 1) == 1 or int(os.environ.get("RANK", "0")) == 0:  # one rank speaks
        print(kind.train_summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
