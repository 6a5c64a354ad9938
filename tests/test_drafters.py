"""Drafter kinds behind one interface: the registries name every kind, the kind of a draft is read in one place, and
no shared layer imports a kind's folder or branches on a kind's name."""

import ast
import json
from pathlib import Path

import pytest

from eagle3lab import drafters
from eagle3lab.drafters import CHECKS, DRAFTERS, checks, drafter, kinds, named_by
from eagle3lab.drafters.base import Drafter, DrafterChecks, DrafterTools
from eagle3lab.drafters.tools import TOOLS, tools_of
from eagle3lab.paths import ROOT

PACKAGE = ROOT / "src" / "eagle3lab"
# what a kind is and how its artifact is checked; what the later layers do with a trained draft
REGISTRIES = {PACKAGE / "drafters" / name for name in ("__init__.py", "tools.py")}
PARTS = ((DRAFTERS, Drafter), (CHECKS, DrafterChecks), (TOOLS, DrafterTools))


def test_every_kind_has_every_part_of_the_interface_under_its_own_name():
    for registry, base in PARTS:
        assert registry.keys() == drafters.KINDS.keys() and drafters.DEFAULT in registry
        for name, part in registry.items():
            assert isinstance(part, base) and part.name == name
            # every method of the part is the kind's own, or a default the interface gives on purpose
            for method, body in vars(base).items():
                if callable(body) and not method.startswith("_"):
                    own = getattr(type(part), method) is not body
                    assert own or _returns_a_default(body), f"{name}: {base.__name__}.{method}"
    assert drafter("dflash") is DRAFTERS["dflash"] and checks("eagle3") is CHECKS["eagle3"]


def _returns_a_default(function) -> bool:
    """A base method that returns a value (a default) rather than raising NotImplementedError."""
    import inspect

    return "NotImplementedError" not in inspect.getsource(function)


@pytest.mark.parametrize(
    "draft, kind",
    [
        ("drafts/smollm2-dflash-2200", "dflash"),
        ("drafts/smollm2-original-6960", "eagle3"),
        ("drafts/does-not-exist", drafters.DEFAULT),
    ],
)
def test_the_kind_of_a_draft_is_read_from_its_config(draft, kind):
    assert kinds.kind_of(ROOT / draft) == kind and tools_of(ROOT / draft).name == kind


def test_a_gguf_says_its_kind_by_its_architecture(tmp_path):
    assert kinds.kind_of_gguf("dflash") == "dflash" and kinds.kind_of_gguf("eagle3") == "eagle3"
    assert kinds.kind_of(tmp_path / "not-a-file.gguf") == drafters.DEFAULT  # unreadable: EAGLE-3's family


def test_a_launch_line_names_its_kind_through_each_engine_s_name_for_it():
    from eagle3lab.doctor.reading import parse_launch

    vllm = parse_launch(
        """vllm serve org/m --speculative-config '{"method": "dflash", "model": "d", "num_speculative_tokens": 3}'"""
    )
    llama = parse_launch("llama-server -m t.gguf -md d.gguf --spec-type draft-dflash")
    sglang = parse_launch(
        "python -m sglang.launch_server --model-path m --speculative-algorithm EAGLE3 --speculative-draft-model-path d"
    )
    assert named_by(vllm).name == named_by(llama).name == "dflash" and named_by(sglang).name == "eagle3"


def _imports(path: Path) -> set[str]:
    return _imported_by(path.read_text())


def _imported_by(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_only_the_registries_import_a_kind_s_folder():
    for kind in drafters.KINDS:
        folder = PACKAGE / "drafters" / kind
        importers = {
            path
            for path in PACKAGE.rglob("*.py")
            if not path.is_relative_to(folder)
            and any(name.startswith(f"eagle3lab.drafters.{kind}") for name in _imports(path))
        }
        assert importers <= REGISTRIES, f"{kind}: {sorted(str(p.relative_to(PACKAGE)) for p in importers)}"


def test_no_notebook_imports_a_kind_s_folder():
    """The pipeline's notebooks reach a kind through the registries (drafters.tools.tools_of, or the benchmark
    functions that ask it), as the shared layers do."""
    importers = []
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            lines = "".join(cell["source"]).splitlines()
            code = "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))  # IPython magics
            names = _imported_by(code) if cell["cell_type"] == "code" else set()
            importers += [
                f"{notebook.name}: {name}"
                for name in names
                if any(name.startswith(f"eagle3lab.drafters.{kind}") for kind in drafters.KINDS)
            ]
    assert not importers, importers


def test_no_shared_layer_branches_on_a_kind_s_name():
    """No `== "dflash"` outside the drafters folder. An engine's or a finding's table keyed by a kind is a mapping,
    not a branch; EAGLE-3's name is also an algorithm's and the local engine's mode's (the seeds' EAGLE vs EAGLE3), so
    the kinds checked are the others."""
    others = set(drafters.KINDS) - {drafters.DEFAULT}
    branching = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "drafters"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                constants = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                if others & set(constants):
                    branching.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not branching, branching
