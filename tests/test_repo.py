"""Repository invariants: clean notebooks, one environment described twice in step, data provably identical."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import yaml

from eagle3lab.paths import NOTEBOOKS, ROOT
from eagle3lab.pipeline import report


def test_notebooks_are_committed_without_outputs():
    notebooks = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert notebooks, "no notebooks found"
    for path in notebooks:
        nb = nbformat.read(path, as_version=4)
        dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
        assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), f"{path.name}: no parameters cell"


def _name(req: str) -> str:
    return re.split(r"[=<>!\[ ]", req, maxsplit=1)[0].lower()


def test_environment_yml_pins_match_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r): r for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_name(r): r for r in pip if not r.startswith("-e")}
    assert set(listed) == set(wanted)
    torch_default = re.search(r"^TORCH_SPEC \?= (\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    for name, req in listed.items():
        expected = torch_default if name == "torch" else wanted[name]
        assert req == expected, f"environment.yml has {req}, pyproject/Makefile say {expected}"


def test_fetched_data_matches_data_dvc():
    out = subprocess.run(
        [str(Path(sys.executable).with_name("dvc")), "status", "data.dvc"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "up to date" in out.stdout, out.stdout


def test_readme_results_are_rendered_from_the_committed_metrics():
    readme = ROOT / "README.md"
    assert report.update(readme, report.render()) == readme.read_text(), "run python -m eagle3lab.pipeline.report"


def test_notebooks_run_in_dag_order_on_the_project_kernel():
    stages = list(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    notebooks = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert [p.stem for p in notebooks] == [f"{i:02d}_{s}" for i, s in enumerate(stages, 1)]
    for path in notebooks:
        kernel = nbformat.read(path, as_version=4).metadata.get("kernelspec", {}).get("name")
        assert kernel == "eagle3lab", f"{path.name}: kernel {kernel!r}; `make setup` installs the 'eagle3lab' kernel"


MODULE_LINES, FUNCTION_LINES = 400, 60
REASON = "# long:"  # on a def line (or the line above it), or in a module's first lines: why it stays long


def test_modules_and_functions_stay_small_or_say_why():
    too_long = []
    for path in sorted((ROOT / "src" / "eagle3lab").rglob("*.py")):
        lines = path.read_text().splitlines()
        where = path.relative_to(ROOT)
        if len(lines) > MODULE_LINES and not any(REASON in line for line in lines[:10]):
            too_long.append(f"{where}: {len(lines)} lines")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                size = node.end_lineno - node.lineno + 1
                said = any(REASON in lines[i - 1] for i in (first - 1, first, node.lineno) if i >= 1)
                if size > FUNCTION_LINES and not said:
                    too_long.append(f"{where}:{node.lineno} {node.name}(): {size} lines")
    assert not too_long, "split these or give a '# long: reason' comment:\n" + "\n".join(too_long)


def test_papermill_reads_every_declared_parameter():
    """Papermill parses the parameters cell itself: a comment it misreads (an `=` in it, say) loses the parameter."""
    from papermill.translators import PythonTranslator

    from eagle3lab.pipeline.stages import declared_parameters

    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
        assert [p.name for p in PythonTranslator.inspect(cell)] == list(declared_parameters(path)), path.name
