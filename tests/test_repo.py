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


def test_results_page_and_readmes_table_are_rendered_from_the_committed_metrics():
    assert set(report.pages()) == {ROOT / "docs" / "results.md", ROOT / "README.md"}
    for page, text in report.pages().items():
        assert text == page.read_text(), f"{page.name}: run python -m eagle3lab.pipeline.report"
    assert report.main(["--check"]) == 0


README_LINES, HEADLINE_BY, PARAGRAPH_WORDS = 220, 40, 80
HEADLINE = "## What the reference run found"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose_paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks outside code fences and tables; each list item counts as a paragraph."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if not line.startswith(("|", "#"))]
        paragraphs += [p for p in re.split(r"\n(?=- )", "\n".join(lines)) if p.strip()]
    return paragraphs


def test_readme_is_a_short_front_door_with_the_answer_first():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    assert HEADLINE in lines[:HEADLINE_BY], f"README's {HEADLINE!r} must start within its first {HEADLINE_BY} lines"
    long = [p[:60] for p in _prose_paragraphs("\n".join(lines)) if len(p.split()) > PARAGRAPH_WORDS]
    assert not long, f"README paragraphs over {PARAGRAPH_WORDS} words: {long}"
    assert "://" not in "\n".join(lines), "README names nothing outside the repository"


def _links(path: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for link in _links(page):
            if "://" in link or link.startswith("mailto:"):
                continue
            target, _, anchor = link.partition("#")
            file = (page.parent / target).resolve() if target else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
            elif anchor and file.suffix == ".md":
                headings = [_anchor(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)]
                if anchor not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_readme():
    linked = {(ROOT / link.partition("#")[0]).resolve() for link in _links(ROOT / "README.md")}
    orphans = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages README does not link: {orphans}"


def _console_steps(text: str) -> list[tuple[str, list[str]]]:
    """The commands of README's console block, each with the output lines shown under it."""
    block = re.search(r"^```console\n(.*?)^```", text, re.S | re.M).group(1)
    steps: list[tuple[str, list[str]]] = []
    lines = iter(block.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):  # a continued line, run as the shell would
                command += "\n" + next(lines)
            steps.append((command, []))
        else:
            steps[-1][1].append(line)
    return steps


def test_readme_doctor_example_runs_as_shown():
    """README's one-minute example, run: each command's exit code is the one its output shows, and every output
    line shown is a line of the real output, in order (README may leave lines out)."""
    steps = _console_steps((ROOT / "README.md").read_text())
    eagle3lab = str(Path(sys.executable).with_name("eagle3lab"))
    script = "".join(command.replace(".venv/bin/eagle3lab", eagle3lab) + '\necho "@@exit $?"\n' for command, _ in steps)
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    runs = out.stdout.split("@@exit ")
    assert len(runs) == len(steps) + 1, out.stdout + out.stderr
    for i, (command, shown) in enumerate(steps):
        real = runs[i].split("\n", 1)[1] if i else runs[i]  # each run after the first starts with its exit code
        code = int(runs[i + 1].split("\n", 1)[0])
        lines = iter(real.splitlines())
        for line in shown:
            assert any(line == got for got in lines), f"{command[:60]}...: {line!r} not in its output:\n{real}"
        for line in shown:
            if m := re.match(r"exit (\d+):", line):
                assert int(m.group(1)) == code, f"{command[:60]}...: exits {code}, README shows {line!r}"


def test_notebooks_run_in_dag_order_on_the_project_kernel():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    # the stage runner's notebooks are numbered; the grid's cells and the stages reading them (their own commands) not
    stages = [name for name, stage in dvc.items() if "pipeline.stages" in stage.get("cmd", "")]
    notebooks = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert [p.stem for p in notebooks] == [f"{i:02d}_{s}" for i, s in enumerate(stages, 1)]
    for path in [*notebooks, *sorted((NOTEBOOKS / "cells").glob("*.ipynb"))]:
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


def _package_imports() -> dict[str, set[str]]:
    """Each eagle3lab module -> the eagle3lab modules it imports (at the top or inside a function)."""
    src = ROOT / "src"
    names = {
        ".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (src / "eagle3lab").rglob("*.py")
    }
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in names else base)
        graph[name] = {m for m in found if m in names} - {name}
    return graph


def test_no_import_cycles_between_modules():
    graph = _package_imports()
    done, cycles = set(), []

    def visit(name, path):
        if name in path:
            cycles.append(" -> ".join(path[path.index(name) :] + [name]))
            return
        if name in done:
            return
        for dep in sorted(graph[name]):
            visit(dep, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_an_engine_folder_imports_no_other_engine():
    engines = sorted(p.name for p in (ROOT / "src/eagle3lab/engines").iterdir() if (p / "__init__.py").exists())
    assert {"sglang", "vllm", "llamacpp"} <= set(engines)
    for name, deps in _package_imports().items():
        parts = name.split(".")
        if parts[:2] == ["eagle3lab", "engines"] and len(parts) > 2 and parts[2] in engines:
            others = {
                d for d in deps if d.split(".")[2:3] and d.split(".")[1] == "engines" and d.split(".")[2] in engines
            }
            foreign = sorted(d for d in others if d.split(".")[2] != parts[2])
            assert not foreign, f"{name} imports another engine: {foreign}"


def test_papermill_reads_every_declared_parameter():
    """Papermill parses the parameters cell itself: a comment it misreads (an `=` in it, say) loses the parameter."""
    from papermill.translators import PythonTranslator

    from eagle3lab.pipeline.stages import declared_parameters

    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cell = next(c for c in nbformat.read(path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
        assert [p.name for p in PythonTranslator.inspect(cell)] == list(declared_parameters(path)), path.name
