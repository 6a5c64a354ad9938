"""`python -m eagle3lab.pipeline.relock BEFORE AFTER`: record the current code in dvc.lock without a rerun, once the
smoke comparison proves the change output-neutral: BEFORE is a smoke root made at the locked code, AFTER one made at
the current code, on the same machine (`python -m eagle3lab.pipeline.smoke --root DIR` at each commit). Any output
difference refuses, naming it: the stages whose outputs differ need a rerun instead. Only the outputs of the stages
dvc.lock holds are compared (every smoke cell of a grid stage with a locked cell): cells that never ran (new in
dvc.yaml) are left to run, and what they write proves nothing about the locked ones.

Only what the repository commits and no stage writes is rewritten: the code a stage runs (its notebook and its `src/`
dependencies, dvc.yaml's list) and the committed drafts folder, each hashed by DVC itself; data, params and other
stages' outputs stay as the reference run locked them, but for a parameter new to a stage whose value is empty (a
grid cell's own entry with no keys), which is recorded: the smoke parameters hold the same empty entries. `dvc
commit` would do the same but needs every output in the workspace, which a clone without the run's cache lacks.

`--rerun STAGE ...` names locked stages the change does alter (their code is new, and they run next): their outputs
are not compared and their lock entries stay as they are, so DVC still sees them changed and reruns them, while the
rest are relocked."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dvc.dependency.param import ParamsDependency
from dvc.repo import Repo
from dvc.stage import PipelineStage
from ruamel.yaml import YAML

from eagle3lab import paths
from eagle3lab.io import InputError, atomic_path, command
from eagle3lab.pipeline.smoke_compare import compare
from eagle3lab.pipeline.stages import named

# what the repository commits and no stage writes: the package, the notebooks, the GPU-trained drafts
COMMITTED = ("src/", "notebooks/", "drafts")


def dvc_entry(dep) -> dict:
    """A dependency's dvc.lock entry, hashed as `dvc repro` hashes it (a folder: its .dir hash, size and files)."""
    dep.save()
    entry = {"path": dep.def_path, "hash": "md5", "md5": dep.hash_info.value, "size": dep.meta.size}
    return entry | ({"nfiles": dep.meta.nfiles} if dep.meta.nfiles is not None else {})


def lock_yaml() -> YAML:
    """A round-trip YAML in DVC's own layout for dvc.lock: a diff shows only the changed entries."""
    yaml = YAML()
    yaml.indent(mapping=2, sequence=2, offset=0)
    return yaml


def relocked(root: Path, rerun: frozenset[str] = frozenset()) -> tuple[dict, list[str], list[str]]:
    """dvc.lock with every locked stage's committed dependencies as dvc.yaml lists them now, hashed from the working
    tree, but for the stages in `rerun` (left as locked); the paths whose entry changed; and the cells dvc.lock has
    no entry for, which need a run."""
    lock = lock_yaml().load((root / "dvc.lock").read_text())
    changed, never_ran = [], []
    with Repo(str(root)) as repo:
        for stage in (s for s in repo.index.stages if isinstance(s, PipelineStage)):  # not data.dvc
            if stage.name not in lock["stages"]:
                never_ran.append(stage.name)
                continue
            if named(stage.name, rerun):
                continue
            deps = [d for d in stage.deps if not isinstance(d, ParamsDependency)]  # params are locked as they were
            locked = lock["stages"][stage.name]["deps"]
            before = {dep["path"]: dep for dep in locked}
            kept = [dep for dep in locked if not dep["path"].startswith(COMMITTED)]
            missing = [d.def_path for d in deps if not d.def_path.startswith(COMMITTED) and d.def_path not in before]
            if missing:
                raise InputError(f"{root / 'dvc.yaml'}: stage '{stage.name}': new dependencies {missing} need a run")
            changed += _new_empty_params(root, stage, lock["stages"][stage.name])
            now = [dvc_entry(dep) for dep in deps if dep.def_path.startswith(COMMITTED)]
            changed += [e["path"] for e in now if (before.get(e["path"]) or {}).get("md5") != e["md5"]]
            changed += [p for p in before if p.startswith(COMMITTED) and p not in {e["path"] for e in now}]
            locked[:] = sorted([*kept, *now], key=lambda dep: dep["path"])
    return lock, sorted(set(changed)), never_ran


def _new_empty_params(root: Path, stage: PipelineStage, entry: dict) -> list[str]:
    """A parameter the stage reads since it ran is recorded only where its value is empty (a cell's own entry of no
    keys, `{}`): the smoke parameters carry the same empty entries, so the comparison covers them. Any other new
    value needs a run. Returns the `file:key` entries recorded."""
    recorded = []
    for dep in (d for d in stage.deps if isinstance(d, ParamsDependency)):
        held = entry.setdefault("params", {}).setdefault(dep.def_path, {})
        for key, value in dep.read_params().items():
            if key in held:
                continue
            if value not in ({}, [], None):
                raise InputError(
                    f"{root / 'dvc.yaml'}: stage '{stage.name}': new parameter {key} = {value!r} needs a run"
                )
            held[key] = value
            recorded.append(f"{dep.def_path}:{key}")
        held_sorted = dict(sorted(held.items()))  # DVC writes a file's parameters in key order
        held.clear()
        held.update(held_sorted)
    return recorded


def _outputs(root: Path, chosen) -> set[str]:
    with Repo(str(root)) as repo:
        stages = [s for s in repo.index.stages if isinstance(s, PipelineStage) and chosen(s.name)]
        return {out.def_path for stage in stages for out in stage.outs}


def locked_outputs(root: Path, smoke_root: Path, rerun: frozenset[str] = frozenset()) -> set[str]:
    """What a relock vouches for: the outputs of the stages dvc.lock holds, and, where a grid stage has a locked cell,
    the outputs of that stage's cells in the smoke root (its cells are named by the smoke parameters, so a locked
    cell's own name may not be among them); the stages in `rerun` left out."""
    locked = {name for name in lock_yaml().load((root / "dvc.lock").read_text())["stages"] if not named(name, rerun)}
    grids = {name.partition("@")[0] for name in locked if "@" in name}
    mine = _outputs(root, lambda name: name in locked)
    if not (smoke_root / ".dvc").is_dir():  # a smoke root made before smoke roots were DVC projects: no grid cells
        return mine
    return mine | _outputs(smoke_root, lambda name: "@" in name and name.partition("@")[0] in grids)


@command("python -m eagle3lab.pipeline.relock")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.relock", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="smoke root made at the code dvc.lock records")
    parser.add_argument("after", type=Path, help="smoke root made at the current code, on the same machine")
    parser.add_argument(
        "--rerun", nargs="+", default=[], metavar="STAGE", help="locked stages the change alters: left to rerun"
    )
    args = parser.parse_args(argv)
    rerun = frozenset(args.rerun)
    differences, compared = compare(args.before, args.after, within=locked_outputs(paths.ROOT, args.after, rerun))
    if differences:
        print("\n".join(differences))
        print(f"relock refused: {len(differences)} of {compared} outputs differ; rerun the stages that make them")
        return 1
    lock, changed, never_ran = relocked(paths.ROOT, rerun)
    with atomic_path(paths.ROOT / "dvc.lock") as tmp, open(tmp, "w") as f:
        lock_yaml().dump(lock, f)
    print(f"relock: {compared} smoke outputs equal; dvc.lock records {len(changed)} new entries (code, empty params)")
    print("\n".join(f"  {path}" for path in changed))
    if rerun:
        print(f"left as locked, to rerun: {', '.join(sorted(rerun))}")
    if never_ran:
        print(f"{len(never_ran)} cell(s) never ran and need a run (make carry): {', '.join(never_ran)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
