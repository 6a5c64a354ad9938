"""The reference run's log, metrics/repro.log: when `make repro` began, at which commit and on which CPU, each stage's
minutes as it ends, and the total. `make repro` begins it afresh and sets EAGLE3LAB_REPRO_LOG for the stages it runs,
so a stage run by hand never writes into a reference run's log.

    python -m eagle3lab.pipeline.repro_log begin|end
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from eagle3lab import paths
from eagle3lab.pipeline.machine import commit, cpu_model, utc_now

LOG = "metrics/repro.log"
ENV = "EAGLE3LAB_REPRO_LOG"  # the log a stage appends its minutes to (set by make repro)


def begin(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# make repro began {utc_now()} at {commit(paths.ROOT)} on {os.cpu_count()} cores: {cpu_model()}\n"
        f"# unix_start {time.time():.0f}\n"
        "# stage  ended  minutes\n"
    )


def stage(name: str, seconds: float) -> None:
    """Append a stage's minutes to the log make repro began; nothing when no log was begun."""
    target = os.environ.get(ENV)
    if target:
        with open(target, "a") as f:
            f.write(f"{name}  {utc_now()}  {seconds / 60:.1f}\n")


def end(path: Path) -> None:
    lines = path.read_text().splitlines()
    start = next(float(line.split()[-1]) for line in lines if line.startswith("# unix_start"))
    with open(path, "a") as f:
        f.write(f"# make repro ended {utc_now()}: {(time.time() - start) / 60:.1f} minutes in all\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["begin"], ["end"]):
        print("usage: python -m eagle3lab.pipeline.repro_log begin|end", file=sys.stderr)
        return 2
    (begin if args == ["begin"] else end)(paths.ROOT / LOG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
