"""Where and when a pipeline run ran: the CPU, the checkout's commit, the UTC clock, and what the stages make of this
machine. metrics/repro.log's header (repro_log) and each cell's record in metrics/cells/ (carry) both describe a run
with these, so a minute figure from one machine is never read as if it came from another."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cpu_model() -> str:
    """The CPU's model name as Linux reports it (elsewhere: what Python's platform module knows)."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@dataclass(frozen=True)
class Commit:
    head: str  # git's short hash of HEAD, or "unknown" outside a git checkout
    uncommitted: bool | None  # tracked files differ from HEAD; None outside a git checkout

    def __str__(self) -> str:
        return self.head + (" (uncommitted changes)" if self.uncommitted else "")


# What the pipeline itself writes into tracked files as a sitting goes on: dvc.lock and the committed records and
# answers of the cells before. A change there says nothing of the code a cell ran.
PIPELINE_WRITES = ("dvc.lock", "metrics", "answers")


def commit(root: Path) -> Commit:
    """The checkout's HEAD and whether its tracked files differ from it, other than what the pipeline writes
    (PIPELINE_WRITES; untracked files do not count either)."""
    excluded = [f":(exclude){path}" for path in PIPELINE_WRITES]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".", *excluded],
            capture_output=True,
            text=True,
        )
    except OSError:  # no git on this machine
        return Commit("unknown", None)
    if head.returncode:
        return Commit("unknown", None)
    return Commit(head.stdout.strip(), bool(status.stdout.strip()))


@functools.cache  # the machine does not change during a run; torch is imported once
def description() -> dict:
    """What decides a stage's speed here: the CPU, whether it multiplies bf16 natively, the dtype a stage's
    `dtype: auto` resolves to (with `device: auto`), the cores and torch's default thread count."""
    import torch

    from eagle3lab import devices

    return {
        "cpu": cpu_model(),
        "native_bf16": devices.native_bf16_cpu(),
        "auto_dtype": devices.resolve_dtype("auto"),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def where_ran(root: Path, **measured) -> dict:
    """A cell record's `ran`: when, at which commit of `root` (with its uncommitted changes said), what the cell
    measured of itself (its minutes), and the machine's description."""
    return {"at": utc_now(), "commit": str(commit(root)), **measured, **description()}
