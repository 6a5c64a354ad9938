"""`python -m eagle3lab.pipeline.mixture_restore [--params P]`: stage 01's prompt mixture (artifacts/mixture/) rebuilt
on a machine that lacks it, and put in place only if it is byte for byte the one dvc.lock records.

The mixture is a DVC-cached output of `dataset_survey`, and the DVC remote (.dvc/config's `local`) lives beside one
checkout: a fresh machine has neither, so a cell that reads the mixture (a `points` cell, a new `answers` chunk) could
not run there, and rerunning stage 01 for it would redo the survey as well (its scores in this machine's dtype). The
draw needs no model: the training sources loaded as the survey loads them, the held-out records, and params.yaml's
quotas and seed (`data.mixture.build_mixture`, deterministic). It is written to a scratch folder, hashed as DVC hashes
the output, and renamed into place only when that hash is the lock's; otherwise the error says so and nothing is left.
`make carry` runs it before a sitting whose cells read the mixture when this machine has none.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml

from eagle3lab import paths
from eagle3lab.io import InputError, command, require
from eagle3lab.pipeline.stages import cell_arguments, load_params

STAGE = "dataset_survey"
FOLDER = "artifacts/mixture"  # the stage's output: train.jsonl, val.jsonl


def locked_hash(root: Path, stage: str = STAGE, folder: str = FOLDER) -> str:
    """A stage's output folder's hash as dvc.lock records it (DVC's md5 of the folder, `....dir`)."""
    lock = root / "dvc.lock"
    locked = (yaml.safe_load(lock.read_text()).get("stages") or {}).get(stage)
    if not locked:
        raise InputError(f"{lock}: no stage '{stage}': its output was never locked, so there is none to restore")
    out = next((out for out in locked.get("outs", []) if out.get("path") == folder), None)
    if not out:
        raise InputError(f"{lock}: stage '{stage}': no output '{folder}'")
    return require(out, "md5", f"{lock}: stage '{stage}': output '{folder}'", str)


def folder_hash(folder: Path) -> str:
    """DVC's hash of a folder, as `dvc repro` would lock it (nothing is written to any cache)."""
    from dvc.fs import LocalFileSystem
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.memory import MemoryFileSystem

    _, _, tree = build(HashFileDB(MemoryFileSystem(), "/staging"), str(folder), LocalFileSystem(), "md5", dry_run=True)
    return tree.hash_info.value


def draw(params: dict, total: int | None = None, val_fraction: float | None = None):
    """Stage 01's draw (notebooks/01_dataset_survey.ipynb's mixture cell), a `data.mixture.Mixture`; `total` and
    `val_fraction` replace params.yaml's for a grown draw (`pipeline.more_mixture`)."""
    from eagle3lab.data import catalog
    from eagle3lab.data.mixture import build_mixture
    from eagle3lab.data.packaged import held_out_records

    survey, seed = params[STAGE], params["common"]["seed"]
    training = {
        source.id: catalog.load_source(source, set_cap=survey["set_caps"].get(source.id), seed=seed).records
        for source in catalog.ranked(catalog.load_catalog())
        if catalog.local_path(source) is not None and not source.is_evaluation
    }
    total = survey["mixture_total"] if total is None else total
    val_fraction = survey["val_fraction"] if val_fraction is None else val_fraction
    return build_mixture(training, survey["mixture_quotas"], total, held_out=held_out_records(),
                         val_fraction=val_fraction, seed=seed)  # fmt: skip


def rebuild(params: dict, folder: Path, root: Path) -> None:
    """Stage 01's draw written to `folder`."""
    from eagle3lab.data.mixture import write_mixture

    write_mixture(draw(params), folder)


def restore(
    root: Path = paths.ROOT, params_file: Path | None = None, stage: str = STAGE, folder: str = FOLDER, build=None
) -> Path:
    """A stage's output folder rebuilt by `build(params, scratch, root)` and checked against dvc.lock (stage 01's
    mixture by default); a machine that has it keeps it untouched."""
    target = root / folder
    if target.exists():
        return target
    expected = locked_hash(root, stage, folder)
    scratch = target.with_name(target.name + ".restoring")  # a killed restore leaves only this, which nothing reads
    shutil.rmtree(scratch, ignore_errors=True)
    (build or rebuild)(load_params(params_file or root / "params.yaml"), scratch, root)
    got = folder_hash(scratch)
    if got != expected:
        shutil.rmtree(scratch)
        raise InputError(
            f"{root / 'dvc.lock'}: stage '{stage}' locked {folder} as {expected}, but its draw rebuilt here hashes "
            f"{got}: the data, params or code differ from the run that locked it (`dvc status {stage}` says which)"
        )
    scratch.rename(target)
    return target


@command("python -m eagle3lab.pipeline.mixture_restore")
def main(argv: list[str] | None = None) -> int:
    args = cell_arguments("mixture_restore", __doc__, argv)
    folder = restore(params_file=args.params)
    print(f"mixture_restore: {folder.relative_to(paths.ROOT)} is the one dvc.lock records ({locked_hash(paths.ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
