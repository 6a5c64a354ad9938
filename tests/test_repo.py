"""Repository invariants: clean notebooks, one environment described twice in step, data provably identical."""

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
