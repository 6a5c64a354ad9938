"""`make smoke`: every stage of dvc.yaml, in order, on the tiny parameters of params/smoke.yaml, in a scratch
root (so the reference run's artifacts, metrics and figures are never touched)."""

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

SMOKE_PARAMS = paths.ROOT / "params" / "smoke.yaml"


def pipeline_stages(dvc_file: Path | None = None) -> list[str]:
    """Stage names in dvc.yaml order (kept in DAG order there)."""
    return list(yaml.safe_load(Path(dvc_file or paths.ROOT / "dvc.yaml").read_text())["stages"])


def prepare_root(scratch: Path, params_file: Path = SMOKE_PARAMS) -> Path:
    """A scratch repository root: shared notebooks, raw data and params/ (files that params name), its own
    params.yaml and outputs."""
    scratch.mkdir(parents=True, exist_ok=True)
    for shared in ("notebooks", "data", "params"):
        link = scratch / shared
        if not link.exists():
            link.symlink_to(paths.ROOT / shared)
    (scratch / "params.yaml").write_text(Path(params_file).read_text())
    return scratch


def run(stages: list[str], scratch: Path) -> None:
    env = dict(os.environ, EAGLE3LAB_ROOT=str(scratch))
    for stage in stages:
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "eagle3lab.pipeline.stages", stage], env=env, cwd=scratch)
        if result.returncode != 0:
            raise SystemExit(f"smoke: stage '{stage}' failed (exit {result.returncode})")
        print(f"smoke: {stage} ok in {time.perf_counter() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=None, help="scratch root (default: a new temporary folder)")
    parser.add_argument("--stages", nargs="*", default=None, help="subset of stages (default: all, in dvc.yaml order)")
    args = parser.parse_args(argv)
    scratch = prepare_root(args.root or Path(tempfile.mkdtemp(prefix="eagle3lab-smoke-")))
    print(f"smoke: scratch root {scratch}", flush=True)
    run(args.stages or pipeline_stages(), scratch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
