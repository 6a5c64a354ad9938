"""Run one pipeline stage: notebooks/NN_NAME.ipynb through papermill with params.yaml's `common` section plus
section NAME, working directory the repository root, output reports/NN_NAME.ipynb.

Papermill only warns about a parameter the notebook does not declare; here the whole params file is checked before
running: every section is `common`, a stage or one of OTHER_SECTIONS, every `common` key is a parameter of two or
more stages and set in no stage's section, every key of the stage's section one of its notebook's, and the
notebook's parameters are all set. Each mismatch is an error naming the file, the section and the key (with the
closest known name).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
import time
from pathlib import Path

import nbformat
import yaml

from eagle3lab import paths
from eagle3lab.io import RunFailed, atomic_path, command
from eagle3lab.pipeline import repro_log

SHARED_SECTION = "common"
# Params sections that are no stage's, and what reads each: a stage never receives them.
OTHER_SECTIONS = {
    "sglang": "`eagle3lab sglang` (SGLang server settings, params/gpu-llama3-8b.yaml)",
    "answers": "`python -m eagle3lab.pipeline.answers` (the grid's regeneration cells, dvc.yaml's `answers`)",
    "drafts": "`python -m eagle3lab.pipeline.drafts` (the grid's draft cells, dvc.yaml's `drafts`)",
    "costs": "`python -m eagle3lab.pipeline.costs` (the grid's cost cells, dvc.yaml's `costs`)",
}


class StageError(RunFailed):
    pass


def stage_notebooks(notebooks: Path | None = None) -> dict[str, Path]:
    """Stage name -> its notebook (NN_NAME.ipynb), in DAG order."""
    found = sorted((notebooks or paths.NOTEBOOKS).glob("[0-9][0-9]_*.ipynb"))
    return {p.stem.split("_", 1)[1]: p for p in found}


def notebook_for(stage: str, notebooks: Path | None = None) -> Path:
    found = stage_notebooks(notebooks)
    if stage not in found:
        raise StageError(
            f"no notebook for stage '{stage}' in {notebooks or paths.NOTEBOOKS} "
            f"(known stages: {', '.join(sorted(found))})"
        )
    return found[stage]


def declared_parameters(notebook: Path) -> dict[str, object]:
    """Names (and literal defaults) assigned in the notebook's cell tagged `parameters`."""
    nb = nbformat.read(notebook, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise StageError(
            f"{notebook}: no cell tagged 'parameters'; tag the cell that holds the defaults (View > Cell tags)"
        )
    names: dict[str, object] = {}
    for node in ast.parse(cells[0].source).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Name):
                try:
                    names[t.id] = ast.literal_eval(node.value) if node.value is not None else None
                except ValueError:
                    names[t.id] = None
    return names


def load_params(params_file: Path | None = None) -> dict:
    params_file = params_file or paths.PARAMS
    try:
        params = yaml.safe_load(Path(params_file).read_text()) or {}
    except yaml.YAMLError as e:
        raise StageError(f"{params_file}: not valid YAML: {e}") from None
    if not isinstance(params, dict):
        raise StageError(f"{params_file}: expected a mapping of sections")
    return params


def section_at(params: dict, keys: tuple[str, ...]):
    """The value at a params path (("answers", "more"): answers.more), or None where a key on the way is absent."""
    for key in keys:
        params = params.get(key) if isinstance(params, dict) else None
    return params


def _named(names, known) -> str:
    """`names` as a list, each with the closest of `known` where one is close: ['devcie' (did you mean 'device'?)]."""
    listed = []
    for name in names:
        close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
        listed.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return f"[{', '.join(listed)}]"


def check_params(params: dict, params_file: Path, notebooks: Path | None = None) -> None:
    """Refuse a section that is not `common`, a stage or one of OTHER_SECTIONS, a section that is not a mapping, a
    `common` key that no stage declares (a stage receives only the names its notebook declares, so a misspelled
    section or shared key would otherwise be read past), one that a single stage declares, and one that a stage's
    section sets too."""
    declared = {stage: declared_parameters(nb) for stage, nb in stage_notebooks(notebooks).items()}
    sections = [SHARED_SECTION, *declared, *OTHER_SECTIONS]
    problems = []
    unknown = [name for name in params if name not in sections]
    if unknown:
        others = ", ".join(f"'{name}', read by {reader}" for name, reader in OTHER_SECTIONS.items())
        problems.append(
            f"unknown section(s) {_named(unknown, sections)}: a section is '{SHARED_SECTION}', a stage's "
            f"({', '.join(declared)}) or {others}"
        )
    for name in [SHARED_SECTION, *declared]:
        if not isinstance(params.get(name) or {}, dict):
            problems.append(f"section '{name}' should be a mapping of keys, got {type(params[name]).__name__}")
    parameters = {k for names in declared.values() for k in names}
    shared = params.get(SHARED_SECTION)
    shared = shared if isinstance(shared, dict) else {}
    unshared = [k for k in shared if k not in parameters]
    if unshared:
        problems.append(
            f"section '{SHARED_SECTION}': key(s) {_named(unshared, parameters)} are no stage's parameters (a stage's "
            f"parameters are the names its notebook's `parameters` cell assigns)"
        )
    # A shared key is one that several stages read; one that a single stage reads belongs in that stage's section,
    # where nothing else can set it.
    single = {k: [s for s, names in declared.items() if k in names] for k in shared if k in parameters}
    for key, readers in single.items():
        if len(readers) == 1:
            problems.append(
                f"section '{SHARED_SECTION}': key '{key}' is read by stage '{readers[0]}' only: move it to section "
                f"'{readers[0]}'"
            )
    # A key in both places would have two values and the stage's would win in silence: refuse it, naming both.
    for stage in declared:
        section = params.get(stage)
        for key in [k for k in section if k in shared] if isinstance(section, dict) else []:
            problems.append(
                f"key '{key}' is set in section '{SHARED_SECTION}' ({shared[key]!r}) and in section '{stage}' "
                f"({section[key]!r}): keep one of the two"
            )
    if problems:
        raise StageError("\n".join(f"{params_file}: {p}" for p in problems))


def stage_parameters(stage: str, notebook: Path, params: dict, params_file: Path) -> dict:
    """The parameters papermill receives: every key of section `stage`, plus the shared keys the notebook declares;
    the whole params file is checked first (check_params)."""
    check_params(params, params_file, notebook.parent)
    if stage not in params:
        raise StageError(f"{params_file}: no section '{stage}' for stage '{stage}'")
    section = params[stage] or {}
    shared = params.get(SHARED_SECTION) or {}
    declared = declared_parameters(notebook)
    unknown = [k for k in section if k not in declared]
    if unknown:
        raise StageError(
            f"{params_file}: section '{stage}': key(s) {_named(unknown, declared)} are not parameters of "
            f"{notebook.name} (it declares: {', '.join(declared)})"
        )
    values = {k: v for k, v in shared.items() if k in declared} | dict(section)
    missing = [k for k in declared if k not in values]
    if missing:
        raise StageError(
            f"stage '{stage}': {notebook.name} needs parameter(s) {missing} that {params_file} does not set "
            f"(add them to section '{stage}' or '{SHARED_SECTION}')"
        )
    return values


def _module_file(package: Path, module: str) -> Path | None:
    """The file of dotted `module` (relative to the package): a module, or a sub-package's __init__.py."""
    base = package.joinpath(*module.split(".")) if module else package
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def _package_imports(source: str, package: Path, current: str = "") -> set[str]:
    """Dotted modules of this package (relative to it) that `source` imports anywhere, function-level imports
    included; `current` is the importing module's own sub-package, for relative imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = current.split(".") if current else []
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == package.name:
                base = node.module.removeprefix(package.name).lstrip(".")
            else:
                continue
            found.add(base)
            found.update(f"{base}.{a.name}".lstrip(".") for a in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Import):
            found.update(
                a.name.removeprefix(package.name + ".") for a in node.names if a.name.startswith(package.name + ".")
            )
    return {m for m in found if m and _module_file(package, m)}


def _with_parents(module: str) -> list[str]:
    """Importing a.b.c runs a/__init__.py and a/b/__init__.py first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def code_deps(notebook: Path, package: Path | None = None) -> list[str]:
    """The package files a stage runs: the modules its notebook imports, transitively (with their sub-packages'
    __init__.py), the stage runner, and the files those modules read beside themselves
    (`Path(__file__).with_name(...)`). dvc.yaml lists exactly these (a test checks it), so editing one module
    reruns only the stages that use it."""
    package = package or paths.ROOT / "src" / "eagle3lab"
    cells = json.loads(Path(notebook).read_text())["cells"]
    code = "\n".join(
        line
        for c in cells
        if c["cell_type"] == "code"
        for line in "".join(c["source"]).splitlines()
        if not line.lstrip().startswith(("%", "!"))
    )
    runner = "pipeline.stages" if _module_file(package, "pipeline.stages") else "stages"
    return _closure([*_package_imports(code, package), runner], package)


def module_deps(module: str, package: Path | None = None) -> list[str]:
    """The package files a cell that runs `python -m eagle3lab.MODULE` runs, as code_deps finds them."""
    package = package or paths.ROOT / "src" / "eagle3lab"
    if not _module_file(package, module):
        raise StageError(f"no module '{module}' in {package}")
    return _closure([module], package)


def _closure(todo: list[str], package: Path) -> list[str]:
    files, seen = {package / "__init__.py"}, set()
    while todo:
        module = todo.pop()
        for m in _with_parents(module):
            if m in seen:
                continue
            seen.add(m)
            f = _module_file(package, m)
            files.add(f)
            text = f.read_text()
            current = m if f.name == "__init__.py" else m.rpartition(".")[0]
            todo += _package_imports(text, package, current)
            named = re.findall(r"""with_name\(["']([^"']+)["']\)""", text)
            files.update(f.with_name(n) for n in named if f.with_name(n).is_file())
    return sorted(str(f.relative_to(paths.ROOT)) for f in files)


def run_stage(stage: str, params_file: Path | None = None, output: Path | None = None) -> Path:
    params_file = Path(params_file or paths.PARAMS)
    notebook = notebook_for(stage)
    values = stage_parameters(stage, notebook, load_params(params_file), params_file)
    return execute(notebook, values, Path(output or paths.REPORTS / notebook.name), f"stage '{stage}'")


def execute(notebook: Path, values: dict, output: Path, label: str) -> Path:
    """Run `notebook` through papermill with `values` as its parameters, in the repository root, into `output`
    (written only when every cell ran); a failure is an error naming `label` and the notebook's cell."""
    import papermill

    with atomic_path(output) as tmp:
        try:
            papermill.execute_notebook(
                str(notebook),
                str(tmp),
                parameters=values,
                cwd=str(paths.ROOT),
                kernel_name="eagle3lab",
                progress_bar=False,
                log_output=False,
            )
        except papermill.PapermillExecutionError as e:
            raise StageError(f"{label} failed in cell {e.exec_count}: {e.ename}: {e.evalue}") from None
    return output


def named(cell: str, names) -> bool:
    """Whether a cell (`stage@item`, or a whole stage) is one of `names`, a stage's name standing for all its cells."""
    return cell in names or cell.partition("@")[0] in names


def cell_arguments(module: str, doc: str, argv: list[str] | None, cell_help: str | None = None) -> argparse.Namespace:
    """The command line the grid's cells and the stages reading them share, `python -m eagle3lab.pipeline.MODULE
    [CELL] [--params P]`, with the params file resolved (default: params.yaml at the repository root)."""
    parser = argparse.ArgumentParser(prog=f"python -m eagle3lab.pipeline.{module}", description=doc.split("\n\n")[0])
    if cell_help:
        parser.add_argument("cell", help=cell_help)
    parser.add_argument("--params", type=Path, default=None, help="params file (default: params.yaml at the repo root)")
    args = parser.parse_args(argv)
    args.params = Path(args.params or paths.PARAMS)
    return args


@command("eagle3lab stage")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.pipeline.stages", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "stage", nargs="?", help="stage name, e.g. dataset_survey (runs notebooks/NN_dataset_survey.ipynb)"
    )
    parser.add_argument("--params", type=Path, default=None, help="params file (default: params.yaml at the repo root)")
    parser.add_argument("--output", type=Path, default=None, help="executed notebook (default: reports/NN_NAME.ipynb)")
    parser.add_argument("--deps", action="store_true", help="print the package files the stage runs (dvc.yaml deps)")
    parser.add_argument("--module", help="with --deps: the files of a cell that runs `python -m eagle3lab.MODULE`")
    args = parser.parse_args(argv)
    if args.deps:
        print("\n".join(module_deps(args.module) if args.module else code_deps(notebook_for(args.stage))))
        return 0
    if not args.stage:
        parser.error("a stage name is needed")
    started = time.monotonic()
    out = run_stage(args.stage, args.params, args.output)
    repro_log.stage(args.stage, time.monotonic() - started)
    print(f"stage '{args.stage}' done: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
