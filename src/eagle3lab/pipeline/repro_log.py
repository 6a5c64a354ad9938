"""The reference run's log, metrics/repro.log: when `make repro` began, at which commit and on which CPU, each stage's
minutes as it ends, and the total. `make repro` begins it afresh and sets EAGLE3LAB_REPRO_LOG for the stages it runs,
so a stage run by hand never writes into a reference run's log.

    python -m eagle3lab.pipeline.repro_log begin|end
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from eagle3lab import paths

LOG = "metrics/repro.log"
ENV = "EAGLE3LAB_REPRO_LOG"  # the log a stage appends its minutes to (set by make repro)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


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
        f"# make repro began {_now()} at {_commit(paths.ROOT)} on {os.cpu_count()} cores: {_cpu()}\n"
        f"# unix_start {time.time():.0f}\n"
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["begin"], ["end"]):
        print("usage: python -m eagle3lab.pipeline.repro_log begin|end", file=sys.stderr)
        return 2
    (begin if args == ["begin"] else end)(paths.ROOT / LOG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
