"""`eagle3lab monitor OUT`: progress of a regeneration run, possibly running in another process, from its files.

Counts come from OUT and its .errors/.skipped files (the truth on disk); rates and the start time come from the
OUT-stem.progress.json sidecar the run rewrites about once a second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3lab.io import InputError, command
from eagle3lab.regen.files import ERRORS_SUFFIX, PROGRESS_SUFFIX, SKIPPED_SUFFIX, side_path


def count_lines(path: Path) -> int:
    """Complete lines only: a torn last line (no newline yet) is not a finished record."""
    if not path.exists():
        return 0
    n = 0
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
    return n


def count_input(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Snapshot:
    success: int
    errors: int
    skipped: int
    total: int | None
    status: str  # running | finished | aborted | failed | dead (the writer is gone without saying so) | unknown
    tokens_per_s: float | None
    records_per_s: float | None
    elapsed: float | None

    @property
    def done(self) -> int:
        return self.success + self.errors + self.skipped

    @property
    def eta(self) -> float | None:
        if self.total is None or not self.records_per_s:
            return None
        return max(self.total - self.done, 0) / self.records_per_s

    def line(self) -> str:
        total = "?" if self.total is None else str(self.total)
        pct = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        parts = [
            f"[{self.status}] records {self.done}/{total}{pct}",
            f"ok {self.success}",
            f"errors {self.errors}",
            f"skipped {self.skipped}",
        ]
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.elapsed is not None:
            parts.append(f"elapsed {_hms(self.elapsed)}")
        if self.status == "running":
            parts.append(f"ETA {_hms(self.eta) if self.eta is not None else '?'}")
        return ", ".join(parts)


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def snapshot(out: str | os.PathLike, input: str | os.PathLike | None = None) -> Snapshot:
    out = Path(out)
    progress_path = side_path(out, PROGRESS_SUFFIX)
    if not out.exists() and not progress_path.exists():
        raise FileNotFoundError(
            f"{out}: no such regeneration output (and no {progress_path.name}); is the run writing somewhere else?"
        )
    progress = {}
    if progress_path.exists():
        try:
            progress = json.loads(progress_path.read_text())
        except json.JSONDecodeError:  # replaced atomically, so this is a foreign file: ignore its figures
            progress = {}
    success = count_lines(out)
    errors = count_lines(side_path(out, ERRORS_SUFFIX))
    skipped = count_lines(side_path(out, SKIPPED_SUFFIX))
    total = count_input(Path(input)) if input else progress.get("input_total")
    status = progress.get("status", "unknown")
    if status == "running" and not _alive(progress.get("pid")):
        status = "dead"
    tokens_per_s = records_per_s = elapsed = None
    if "started_at" in progress:
        end = time.time() if status == "running" else progress.get("updated_at", time.time())
        elapsed = max(end - progress["started_at"], 1e-9)
        tokens_per_s = progress.get("tokens_this_run", 0) / elapsed
        records_per_s = progress.get("records_this_run", 0) / elapsed
    return Snapshot(success, errors, skipped, total, status, tokens_per_s, records_per_s, elapsed)


@command("eagle3lab monitor")
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="eagle3lab monitor", description=__doc__.split("\n\n")[0])
    p.add_argument("output", help="the OUT.jsonl of an `eagle3lab regen` run")
    p.add_argument("--input", default=None, help="count the total from this input file instead of the sidecar")
    p.add_argument("--follow", action="store_true", help="refresh until the run stops")
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--max-wait", type=float, default=7 * 24 * 3600.0, help="stop following after this many seconds")
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.max_wait
    while True:
        try:
            snap = snapshot(args.output, args.input)
        except FileNotFoundError as e:
            raise InputError(str(e)) from None
        print(snap.line(), flush=True)
        if not args.follow or snap.status != "running" or time.monotonic() >= deadline:
            break
        time.sleep(args.interval)
    return 1 if snap.status in ("dead", "failed", "aborted") else 0


if __name__ == "__main__":
    sys.exit(main())
