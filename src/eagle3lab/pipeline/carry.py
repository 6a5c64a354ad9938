"""`python -m eagle3lab.pipeline.carry [STAGE|CELL ...] [--budget MINUTES] [--allow-unestimated] [--commit] [--dry]`:
carry a run forward one sitting at a time, running only the cells (dvc.yaml's stages, foreach/matrix items included)
whose inputs changed or that never ran, each started only when its estimate fits the minutes left. Named stages or
cells narrow the plan to them, in its order: a sitting on a quiet machine can take the timed cells (`carry costs`)
while another trains.

`make repro` is one uninterrupted `dvc repro`, longer than a sitting on a slow machine. Here DVC itself decides what
is to run (`dvc repro --allow-missing`'s plan and its test of each cell, every cell downstream of a changed one
included); each cell runs as its own `dvc repro --single-item NAME`, so dvc.lock holds every finished cell even if the
sitting is killed; and each cell run leaves a record (metrics/cells/NAME.json: its minutes, commit and machine) that
estimates its next run, and its grid siblings' first. An input that a fresh machine lacks but can rebuild bitwise
(stage 01's mixture, `mixture_restore`; the prompts that grow it, `more_mixture`) is rebuilt before the first cell
that reads it.

Exit 0: everything planned finished (or nothing was to run); 1: a cell failed (named); 2: bad input; 3: the budget,
or a cell without an estimate, left cells undone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote

from dvc.exceptions import DvcException
from dvc.logger import set_loggers_level
from dvc.repo import Repo
from dvc.stage import PipelineStage, Stage

from eagle3lab import paths
from eagle3lab.io import InputError, RunFailed, command, require, write_json
from eagle3lab.pipeline import machine, mixture_restore, more_mixture, repro_log
from eagle3lab.pipeline.stages import named

EXIT_CELLS_LEFT = 3
CELLS = "metrics/cells"  # one record per finished cell
# How `dvc repro` says it did not run a cell's command: it was unchanged once the cells before it ran (their outputs
# came out the same), or DVC restored its outputs from its run cache. Such a run's minutes say nothing of the cell's.
DVC_SKIPPED = ("didn't change, skipping", "is cached - skipping run")
# Inputs a fresh machine lacks (DVC-cached outputs, and the DVC remote stays with its checkout) but rebuilds bitwise,
# checked against dvc.lock's hash, without rerunning the stage that made them: path -> its restore(root).
RESTORABLE = {mixture_restore.FOLDER: mixture_restore.restore, more_mixture.FOLDER: more_mixture.restore}


@dataclass(frozen=True)
class Estimate:
    minutes: float | None  # None: nothing recorded
    source: str

    def __str__(self) -> str:
        said = "no estimate" if self.minutes is None else f"estimate ~{self.minutes:.1f} min"
        return f"{said} ({self.source})"


@dataclass(frozen=True)
class Cell:
    name: str  # as DVC addresses it: `train_draft`, `train@draft-0350-seed1`
    estimate: Estimate


@dataclass(frozen=True)
class ReferenceRun:
    """metrics/repro.log: the last `make repro`'s minutes per stage, and where it ran."""

    minutes: dict[str, float]
    began: str
    commit: str
    cpu: str


def _never_ran(stage: Stage) -> bool:
    """A cell dvc.lock has no entry for (a data source, a .dvc file, is no cell)."""
    return isinstance(stage, PipelineStage) and stage.name not in stage.dvcfile.lockfile_contents.get("stages", {})


def _would_run(stage: Stage, upstream: list | None = None, force: bool = False, **_) -> Stage | None:
    """Whether `dvc repro --allow-missing` runs this cell, by DVC's own test (Stage.reproduce's `changed`), or a cell
    that never ran: --allow-missing would pass over one whose inputs are absent too (a new cell after one whose
    outputs this checkout lacks). DVC's dry run is not used: it probes the run cache, which fails on a changed cell
    whose inputs are absent, as in a fresh clone."""
    return stage if force or _never_ran(stage) or stage.changed(allow_missing=True, upstream=upstream) else None


def planned_cells(root: Path) -> list[str]:
    """The cells `dvc repro --allow-missing` would run, in its order: those whose inputs, command or params changed or
    that never ran, and every cell downstream of one (DVC cannot know before the run whether a changed cell's outputs
    change); a cell whose outputs are merely absent while its inputs are unchanged is left out."""
    try:
        # From the root, as `make repro` runs: DVC reads its target (dvc.yaml) and its stages' paths relative to the
        # working directory. DVC logs its progress at INFO; the plan is printed here, once, with estimates.
        with contextlib.chdir(root), set_loggers_level(logging.WARNING), Repo(str(root)) as repo:
            stages = repo.reproduce(dry=True, allow_missing=True, force_downstream=True, repro_fn=_would_run)
            return [stage.addressing for stage in stages]  # a name relative to the working directory
    except DvcException as e:
        raise InputError(f"{root}: DVC cannot plan the run: {e}") from None


def record_path(root: Path, name: str) -> Path:
    """metrics/cells/NAME.json; a name's `/` and `:` (a stage of another dvc.yaml) are %-escaped, so every cell has
    its own file."""
    return root / CELLS / f"{quote(name, safe='@')}.json"


def reference_run(path: Path) -> ReferenceRun | None:
    """A reference run's log (metrics/repro.log) as repro_log writes it (None when there is none): its header and its
    stage lines."""
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    header = re.fullmatch(r"# make repro began (\S+) at (.*) on \d+ cores: (.*)", lines[0]) if lines else None
    if not header:
        raise InputError(f"{path}: line 1: expected `# make repro began TIME at COMMIT on N cores: CPU`")
    minutes = {}
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.startswith("#"):
            row = re.fullmatch(r"(\S+)\s+\S+\s+(\d+(?:\.\d+)?)", line.strip())
            if not row:
                raise InputError(f"{path}: line {number}: expected `STAGE  ENDED  MINUTES`, got {line!r}")
            minutes[row[1]] = float(row[2])
    return ReferenceRun(minutes, *header.groups())


def read_record(path: Path) -> dict:
    """One cell's record (metrics/cells/NAME.json), checked for the fields its readers use (its estimate, the
    results page): an InputError names the file and the field."""
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e.msg})") from None
    for field, kind in (("cell", str), ("minutes", (int, float)), ("ended", str), ("commit", str)):
        require(record, field, str(path), kind)
    where = require(record, "machine", str(path), dict)
    for field, kind in (("cpu", str), ("native_bf16", bool), ("auto_dtype", str), ("torch_threads", int)):
        require(where, field, f"{path}: machine", kind)
    return record


def cell_records(folder: Path) -> list[dict]:
    """The records of the cells carried forward (metrics/cells/*.json), in the order they ended."""
    return sorted((read_record(path) for path in folder.glob("*.json")), key=lambda record: record["ended"])


def _recorded_on(cpu: str, here: str) -> str:
    return "" if cpu == here else f", on {cpu}; this machine: {here}"


def estimate(root: Path, name: str, reference: ReferenceRun | None, here: str) -> Estimate:
    """A cell's expected minutes: its own last record; else, for a grid's cell (`stage@item`), the longest recorded
    cell of its stage (the grid's cells run in the plan's order, smallest first, so a later one may run longer); else
    the reference run's line for it; else none. The source names the CPU it was measured on when that is not this
    machine's (`here`)."""
    path = record_path(root, name)
    if path.exists():
        record = read_record(path)
        ended, cpu = record["ended"], record["machine"]["cpu"]
        return Estimate(record["minutes"], f"its last run, {ended[:10]}{_recorded_on(cpu, here)}")
    stage, grid, _ = name.partition("@")
    siblings = [read_record(p) for p in record_path(root, stage + "@").parent.glob(f"{quote(stage, safe='@')}@*.json")]
    if grid and siblings:
        longest = max(siblings, key=lambda record: record["minutes"])
        cpu = longest["machine"]["cpu"]
        return Estimate(
            longest["minutes"],
            f"the longest of {len(siblings)} recorded cell(s) of {stage}, {longest['cell']}{_recorded_on(cpu, here)}",
        )
    if reference and name in reference.minutes:
        source = f"{repro_log.LOG}, {reference.began[:10]} at {reference.commit}"
        return Estimate(reference.minutes[name], source + _recorded_on(reference.cpu, here))
    return Estimate(None, f"no record in {CELLS}/ nor a line in {repro_log.LOG}")


def estimator(root: Path):
    """name -> its Estimate now, from the records on disk (they grow as a sitting's cells finish)."""
    here, reference = machine.cpu_model(), reference_run(root / repro_log.LOG)
    return lambda name: estimate(root, name, reference, here)


def plan(root: Path, only: list[str] | None = None) -> list[Cell]:
    """The cells to run, in DVC's order; with `only` (stage or cell names), just those among them."""
    estimated = estimator(root)
    names = [name for name in planned_cells(root) if not only or named(name, only)]
    return [Cell(name, estimated(name)) for name in names]


def refusal(cell: Cell, left: float | None, allow_unestimated: bool) -> str | None:
    """Why `cell` may not start with `left` minutes of budget (None: no budget), or None when it may."""
    if left is None:
        return None
    if cell.estimate.minutes is None:
        return None if allow_unestimated else "it has no estimate (--allow-unestimated starts it anyway)"
    if cell.estimate.minutes > left:
        return f"its estimate, {cell.estimate.minutes:.1f} min, is more than the {left:.1f} min left"
    return None


def _clock(minutes_from_now: float) -> str:
    return (datetime.now().astimezone() + timedelta(minutes=minutes_from_now)).strftime("%H:%M")


def print_plan(cells: list[Cell], budget: float | None, allow_unestimated: bool) -> None:
    """Each cell with its estimate and when it would end if every estimate held; where the budget would stop."""
    ahead: float | None = 0.0  # the minutes the cells so far need by their estimates; None past an unestimated one
    stop = None
    for i, cell in enumerate(cells, 1):
        left = None if budget is None or ahead is None else budget - ahead
        reason = refusal(cell, left, allow_unestimated)
        stop = stop or (reason and f"{cell.name}: {reason}")
        minutes = cell.estimate.minutes
        ahead = None if ahead is None or minutes is None else ahead + minutes
        print(f"[{i}/{len(cells)}] {cell.name}: {cell.estimate}, ETA {'?' if ahead is None else _clock(ahead)}")
    if stop:
        print(f"--budget {budget:g} would stop before {stop}")


def restore_inputs(root: Path, cells: list[Cell]) -> list[str]:
    """Each input of RESTORABLE that a planned cell reads and this machine lacks, rebuilt (and checked against
    dvc.lock) before the first cell starts, unless a planned cell writes it itself; returns the ones rebuilt."""
    missing = [path for path in RESTORABLE if not (root / path).exists()]
    if not missing:
        return []
    with contextlib.chdir(root), set_loggers_level(logging.WARNING), Repo(str(root)) as repo:
        stages = [stage for cell in cells for stage in repo.stage.collect(cell.name)]
        reads = {Path(dep.fs_path) for stage in stages for dep in stage.deps}
        writes = {Path(out.fs_path) for stage in stages for out in stage.outs}
    rebuilt = []
    for path in missing:
        if any(read.is_relative_to(root / path) for read in reads) and root / path not in writes:
            RESTORABLE[path](root)
            rebuilt.append(path)
    return rebuilt


def run_cell(root: Path, name: str) -> bool:
    """Run one cell as `dvc repro --single-item NAME`, its output passed through; whether DVC ran its command (it
    skips one whose inputs came out unchanged, or restores it from its run cache). RunFailed names a failed cell."""
    # The stages' `python` is this environment's (as make repro sets it); a cell never writes into metrics/repro.log,
    # which holds the reference run's minutes only.
    env = {key: value for key, value in os.environ.items() if key != repro_log.ENV}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    argv = [sys.executable, "-m", "dvc", "repro", "--single-item", name]
    skipped = False
    with subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as run:
        for line in run.stdout:
            print(line, end="", flush=True)
            skipped = skipped or (line.startswith(f"Stage '{name}' ") and any(s in line for s in DVC_SKIPPED))
    if run.returncode:
        raise RunFailed(
            f"cell {name} failed: `dvc repro --single-item {name}` exited {run.returncode} (its output above); the "
            f"cells before it are locked in dvc.lock and recorded in {CELLS}/"
        )
    return not skipped


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def commit_cell(root: Path, name: str, record: dict) -> str | None:
    """Commit what a finished cell wrote that git keeps: dvc.lock, its record, its outputs DVC does not cache (the
    answers, the metrics) and the .gitignore entries DVC writes for those it caches; only those paths, whatever else
    the checkout holds. Returns the new commit's hash, or None when the cell changed none of them."""
    with contextlib.chdir(root), set_loggers_level(logging.WARNING), Repo(str(root)) as repo:
        (stage,) = repo.stage.collect(name)
        kept = [Path(out.fs_path) for out in stage.outs if not out.use_cache]
        ignores = [Path(out.fs_path).parent / ".gitignore" for out in stage.outs if out.use_cache]
    wanted = [root / "dvc.lock", record_path(root, name), *kept, *ignores]
    present = [str(path.relative_to(root)) for path in wanted if path.exists()]
    added = _git(root, "add", "-A", "--", *present)
    if added.returncode:
        raise RunFailed(f"cell {name}: `git add` failed: {added.stderr.strip()}")
    if _git(root, "diff", "--cached", "--quiet", "--", *present).returncode == 0:
        return None  # the cell rewrote what git keeps with the same bytes
    where = record["machine"]
    message = (
        f"carry: cell {name}, {record['minutes']:.1f} min on {where['cpu']} ({where['auto_dtype']}, "
        f"{where['torch_threads']} threads) at {record['commit']}"
    )
    done = _git(root, "commit", "-q", "-m", message, "--", *present)
    if done.returncode:
        raise RunFailed(f"cell {name}: `git commit` failed: {(done.stderr or done.stdout).strip()}")
    return _git(root, "rev-parse", "--short", "HEAD").stdout.strip()


def carry(
    root: Path, cells: list[Cell], budget: float | None, allow_unestimated: bool, began: float, commit: bool = False
) -> int:
    """Run the cells in order while each fits the budget left (minutes since `began`, a monotonic time); each one
    DVC ran leaves its record and, with `commit`, is committed before the next starts. Returns the exit code."""
    checkout = machine.commit(root)  # before any cell rewrites dvc.lock
    estimated = estimator(root)
    for i, planned in enumerate(cells, 1):
        cell = Cell(planned.name, estimated(planned.name))  # a cell of its stage that just ran may estimate it now
        left = None if budget is None else budget - (time.monotonic() - began) / 60
        reason = refusal(cell, left, allow_unestimated)
        if reason:
            print(f"carry: stopping before {cell.name}: {reason}")
            print("left undone, in plan order (each may need the ones before it):")
            print("\n".join(f"  {later.name}: {estimated(later.name)}" for later in cells[i - 1 :]))
            return EXIT_CELLS_LEFT
        if cell.estimate.minutes is None:
            eta, allowed = "?", "" if left is None else ", started without one (--allow-unestimated)"
        else:
            eta, allowed = _clock(cell.estimate.minutes), ""
        budget_left = "no budget" if left is None else f"budget left {left:.1f} min"
        print(f"[{i}/{len(cells)}] {cell.name}: {cell.estimate}{allowed}, {budget_left}, ETA {eta}", flush=True)
        started, start = machine.utc_now(), time.monotonic()
        ran = run_cell(root, cell.name)
        minutes = (time.monotonic() - start) / 60
        if not ran:
            print(f"[{i}/{len(cells)}] {cell.name}: DVC did not run it (unchanged, or from its run cache); no record")
            continue
        record = {
            "cell": cell.name,
            "minutes": round(minutes, 2),
            "started": started,
            "ended": machine.utc_now(),
            "commit": checkout.head,
            "uncommitted_changes": checkout.uncommitted,
            "machine": machine.description(),
        }
        write_json(record_path(root, cell.name), record)
        committed = commit and commit_cell(root, cell.name, record)
        said = f", committed as {committed}" if committed else ""
        print(f"[{i}/{len(cells)}] {cell.name}: done in {minutes:.1f} min{said}")
    print(f"carry: all {len(cells)} cells done in {(time.monotonic() - began) / 60:.1f} min")
    return 0


@command("python -m eagle3lab.pipeline.carry")
def main(argv: list[str] | None = None) -> int:
    began = time.monotonic()  # the budget counts from here: planning is part of the sitting
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.carry", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "only", nargs="*", metavar="STAGE|CELL", help="run only these stages' cells or these cells (default: all)"
    )
    parser.add_argument(
        "--budget", type=float, metavar="MINUTES", help="minutes this sitting may take (default: no limit)"
    )
    parser.add_argument(
        "--allow-unestimated", action="store_true", help="under a budget, start cells that have no estimate too"
    )
    parser.add_argument("--dry", action="store_true", help="print the plan with estimates and ETAs; run nothing")
    parser.add_argument(
        "--commit",
        action="store_true",
        help="git-commit each finished cell (dvc.lock, its record, its committed outputs) before the next starts",
    )
    args = parser.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        raise InputError(f"--budget {args.budget:g}: expected the minutes this sitting may take, above 0")
    root = paths.ROOT
    cells = plan(root, args.only)
    if not cells:
        named = f" among {', '.join(args.only)}" if args.only else ""
        print(f"carry: nothing to run{named}: every cell's inputs are as dvc.lock records them (absent outputs stay)")
        return 0
    print(f"carry: {len(cells)} cell(s) to run on {machine.cpu_model()}")
    if args.dry:
        print_plan(cells, args.budget, args.allow_unestimated)
        return 0
    for path in restore_inputs(root, cells):
        print(f"carry: {path} rebuilt here, as dvc.lock records it (python -m eagle3lab.pipeline.mixture_restore)")
    return carry(root, cells, args.budget, args.allow_unestimated, began, args.commit)


if __name__ == "__main__":
    sys.exit(main())
