"""`make smoke`: every cell of dvc.yaml, in order, on the tiny parameters of params/smoke.yaml, in a scratch root (so
the reference run's artifacts, metrics and figures are never touched). The scratch root is a DVC project of its own
(no git) linked to the repository's dvc.yaml, so DVC itself resolves the grid's cells (its foreach stages) from the
smoke parameters, and each cell runs its own command as `dvc repro` would."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eagle3lab import paths
from eagle3lab.pipeline.stages import named

SMOKE_PARAMS = paths.ROOT / "params" / "smoke.yaml"


def pipeline_stages(dvc_file: Path | None = None) -> list[str]:
    """Stage names in dvc.yaml order (kept in DAG order there), a grid's stage once."""
    return list(yaml.safe_load(Path(dvc_file or paths.ROOT / "dvc.yaml").read_text())["stages"])


def prepare_root(scratch: Path, params_file: Path = SMOKE_PARAMS) -> Path:
    """A scratch repository root: shared notebooks, raw data, params/ (files that params name), the committed drafts
    (a cost cell times one) and dvc.yaml, its own params.yaml, DVC project and outputs."""
    scratch.mkdir(parents=True, exist_ok=True)
    for shared in ("notebooks", "data", "params", "drafts", "dvc.yaml"):
        link = scratch / shared
        if not link.is_symlink():
            link.symlink_to(paths.ROOT / shared)
    (scratch / "params.yaml").write_text(Path(params_file).read_text())
    if not (scratch / ".dvc").is_dir():
        from dvc.repo import Repo  # here: the GPU run imports this module before its kit installs DVC

        Repo.init(str(scratch), no_scm=True).close()
    return scratch


def pipeline_cells(scratch: Path) -> dict[str, str]:
    """Cell -> its command, in dvc.yaml order (kept in DAG order there), foreach items resolved by DVC from the
    scratch root's params.yaml: `answers@train-000`, ..., `train_draft`."""
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with Repo(str(scratch)) as repo:
        return {s.name: s.cmd for s in repo.index.stages if isinstance(s, PipelineStage)}


def chosen(cells: dict[str, str], names: list[str] | None) -> dict[str, str]:
    """The cells named, a stage's name standing for all its cells (`answers` for answers@*); all when None."""
    if not names:
        return cells
    unknown = [n for n in names if not any(named(c, [n]) for c in cells)]
    if unknown:
        raise SystemExit(f"smoke: no cell or stage {unknown} in dvc.yaml (cells: {', '.join(cells)})")
    return {c: cmd for c, cmd in cells.items() if named(c, names)}


def run(cells: dict[str, str], scratch: Path) -> None:
    # The cells' commands say `python`: this interpreter's, as make repro puts the project's environment first.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = dict(os.environ, EAGLE3LAB_ROOT=str(scratch), PATH=path)
    for cell, cmd in cells.items():
        start = time.perf_counter()
        result = subprocess.run(cmd, shell=True, env=env, cwd=scratch)
        if result.returncode != 0:
            raise SystemExit(f"smoke: cell '{cell}' failed (exit {result.returncode})")
        print(f"smoke: {cell} ok in {time.perf_counter() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="scratch root (default: a new temporary folder)")
    parser.add_argument(
        "--stages", nargs="*", default=None, help="cells or stages to run (default: all, in dvc.yaml order)"
    )
    args = parser.parse_args(argv)
    scratch = prepare_root(args.root or Path(tempfile.mkdtemp(prefix="eagle3lab-smoke-")))
    print(f"smoke: scratch root {scratch}", flush=True)
    run(chosen(pipeline_cells(scratch), args.stages), scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
