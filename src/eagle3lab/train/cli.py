"""`eagle3lab train --data TRAIN.jsonl --output DIR [...]`, also under `torchrun --nproc-per-node N -m
eagle3lab.train.cli ...`. Every option is generated from a TrainConfig field (name, type, default, help), so the
dataclass stays the one home of the defaults. Exit codes: 0 done, 1 training failed (non-finite loss), 2 bad input
or settings."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from eagle3lab.io import command
from eagle3lab.options import add_options, from_options
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.loop import train_draft


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3lab train", description="Train an EAGLE-3 draft with training-time test."
    )
    add_options(parser, TrainConfig)
    return parser


def parse_args(argv: list[str]) -> TrainConfig:
    return from_options(build_parser().parse_args(argv), TrainConfig)


@command("eagle3lab train")
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    result = train_draft(cfg)
    if result["world_size"] == 1 or int(os.environ.get("RANK", "0")) == 0:
        v = result["final_val"]
        print(
            f"trained {result['steps']} steps, {result['tokens_seen']} tokens at {result['tokens_per_s']:.0f} tok/s; "
            f"vocab coverage {result['vocab']['coverage']:.3f}"
            + (f"; held-out acc per TTT position {v['acc_pos']}" if v else "")
            + f"\ndraft: {result['draft']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
