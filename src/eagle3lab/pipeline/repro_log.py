"""The reference run's log, metrics/repro.log: when `make repro` began, at which commit and on which CPU, each stage's
minutes as it ends, and the total. `make repro` begins it afresh and sets EAGLE3LAB_REPRO_LOG for the stages it runs,
so a stage run by hand never writes into a reference run's log.

    python -m eagle3lab.pipeline.repro_log begin|end

`read` gives a finished log's commit, stage minutes and total (the results test holds the prose to them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from eagle3lab import paths
from eagle3lab.cpu import cpu_model
from eagle3lab.io import InputError

LOG = "metrics/repro.log"
ENV = "EAGLE3LAB_REPRO_LOG"  # the log a stage appends its minutes to (set by make repro)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _commit(root: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")


def begin(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"# make repro began {_now()} at {_commit(paths.ROOT)} on {os.cpu_count()} cores: {cpu_model()}\n"
        f"# unix_start {int(time.time())}\n"  # floored: a run's total never reads below zero
        "# stage  ended  minutes\n"
    )


def stage(name: str, seconds: float) -> None:
    """Append a stage's minutes to the log make repro began; nothing when no log was begun."""
    target = os.environ.get(ENV)
    if target:
        with open(target, "a") as f:
            f.write(f"{name}  {_now()}  {seconds / 60:.1f}\n")


def end(path: Path) -> None:
    lines = path.read_text().splitlines()
    start = next(float(line.split()[-1]) for line in lines if line.startswith("# unix_start"))
    with open(path, "a") as f:
        f.write(f"# make repro ended {_now()}: {(time.time() - start) / 60:.1f} minutes in all\n")


@dataclass
class RunLog:
    commit: str  # with " (uncommitted changes)" where the clone had any
    stages: dict[str, float]  # minutes, in the order the stages ran
    total: float  # minutes, make repro's own start to end


def read(path: Path) -> RunLog:
    """A finished log; an InputError naming the file when make repro never began or ended it."""
    text = Path(path).read_text()
    began = re.search(r"^# make repro began \S+ at (.+) on \d+ cores", text, re.M)
    ended = re.search(r"^# make repro ended \S+: (\d+\.\d) minutes in all$", text, re.M)
    if not began or not ended:
        raise InputError(f"{path}: no '# make repro {'ended' if began else 'began'}' line: not a finished run's log")
    stages = {name: float(minutes) for name, minutes in re.findall(r"^(\w+)  \S+  (\d+\.\d)$", text, re.M)}
    return RunLog(began.group(1), stages, float(ended.group(1)))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["begin"], ["end"]):
        print("usage: python -m eagle3lab.pipeline.repro_log begin|end", file=sys.stderr)
        return 2
    (begin if args == ["begin"] else end)(paths.ROOT / LOG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
