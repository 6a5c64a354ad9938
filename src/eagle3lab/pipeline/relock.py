"""`python -m eagle3lab.pipeline.relock BEFORE AFTER`: record the current code in dvc.lock without a rerun, once the
smoke comparison proves the change output-neutral: BEFORE is a smoke root made at the locked code, AFTER one made at
the current code, on the same machine (`python -m eagle3lab.pipeline.smoke --root DIR` at each commit). Any output
difference refuses, naming it: the stages whose outputs differ need a rerun instead.

Only the code a stage runs (its `src/` dependencies, dvc.yaml's list) is rewritten, with DVC's own hash (the md5 of
the file's bytes) and size; data, notebooks, params and outputs stay as the reference run locked them. `dvc commit`
would do the same but needs every output in the workspace, which a clone without the run's cache lacks."""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from ruamel.yaml import YAML

from eagle3lab import paths
from eagle3lab.io import InputError, atomic_path, command
from eagle3lab.pipeline.smoke_compare import compare

CODE = "src/"


def code_entry(root: Path, path: str) -> dict:
    data = (root / path).read_bytes()
    return {"path": path, "hash": "md5", "md5": hashlib.md5(data).hexdigest(), "size": len(data)}


def relocked(root: Path) -> tuple[dict, list[str]]:
    """dvc.lock with every stage's code dependencies as dvc.yaml lists them now, hashed from the working tree; and the
    files whose entry changed."""
    yaml = YAML()
    yaml.indent(mapping=2, sequence=2, offset=0)  # DVC's own layout: a diff shows only the changed entries
    lock = yaml.load((root / "dvc.lock").read_text())
    stages = YAML(typ="safe").load((root / "dvc.yaml").read_text())["stages"]
    changed = []
    for name, stage in stages.items():
        if name not in lock["stages"]:
            raise InputError(f"{root / 'dvc.lock'}: no stage '{name}': it never ran, and needs a run, not a relock")
        locked = lock["stages"][name]["deps"]
        kept = [dep for dep in locked if not dep["path"].startswith(CODE)]
        missing = [d for d in stage["deps"] if not d.startswith(CODE) and d not in {k["path"] for k in kept}]
        if missing:
            raise InputError(f"{root / 'dvc.yaml'}: stage '{name}': new dependencies {missing} need a run")
        before = {dep["path"]: dep["md5"] for dep in locked if dep["path"].startswith(CODE)}
        code = [code_entry(root, d) for d in stage["deps"] if d.startswith(CODE)]
        changed += [c["path"] for c in code if before.get(c["path"]) != c["md5"]]
        changed += [p for p in before if p not in {c["path"] for c in code}]
        locked[:] = sorted([*kept, *code], key=lambda dep: dep["path"])
    return lock, sorted(set(changed))


@command("python -m eagle3lab.pipeline.relock")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.relock", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="smoke root made at the code dvc.lock records")
    parser.add_argument("after", type=Path, help="smoke root made at the current code, on the same machine")
    args = parser.parse_args(argv)
    differences, compared = compare(args.before, args.after)
    if differences:
        print("\n".join(differences))
        print(f"relock refused: {len(differences)} of {compared} outputs differ; rerun the stages that make them")
        return 1
    lock, changed = relocked(paths.ROOT)
    yaml = YAML()
    yaml.indent(mapping=2, sequence=2, offset=0)
    with atomic_path(paths.ROOT / "dvc.lock") as tmp, open(tmp, "w") as f:
        yaml.dump(lock, f)
    print(f"relock: {compared} smoke outputs equal; dvc.lock records the current code of {len(changed)} file(s)")
    print("\n".join(f"  {path}" for path in changed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
