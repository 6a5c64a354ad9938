import json

import nbformat
import pytest
import yaml

from eagle3lab import paths
from eagle3lab.pipeline import stages


def make_notebook(path, params_src, body_src):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell(params_src)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body_src)]
    nbformat.write(nb, path)


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    for name in ("ROOT", "NOTEBOOKS", "REPORTS", "PARAMS"):
        monkeypatch.setattr(
            paths,
            name,
            tmp_path / {"ROOT": "", "NOTEBOOKS": "notebooks", "REPORTS": "reports", "PARAMS": "params.yaml"}[name],
        )
    make_notebook(
        tmp_path / "notebooks" / "07_echo.ipynb",
        "target = 'x'\nsize = 1\n",
        "import json, os\njson.dump({'target': target, 'size': size, 'cwd': os.getcwd()}, open('echo.json', 'w'))",
    )
    # a second stage that reads the shared keys too: a `common` key is one that several stages read
    make_notebook(tmp_path / "notebooks" / "06_peer.ipynb", "target = 'x'\nseed = 0\n", "")
    return tmp_path


def write_params(repo, params):
    (repo / "params.yaml").write_text(yaml.safe_dump(params))


def test_runs_with_shared_and_stage_values_in_repo_root(repo):
    make_notebook(repo / "notebooks" / "08_seeded.ipynb", "seed = 0\n", "")
    write_params(repo, {"common": {"target": "smollm2", "seed": 3}, "echo": {"size": 5}})
    out = stages.run_stage("echo")
    assert out == repo / "reports" / "07_echo.ipynb"
    echoed = json.loads((repo / "echo.json").read_text())
    assert echoed == {"target": "smollm2", "size": 5, "cwd": str(repo)}
    # the executed copy has outputs recorded by papermill (only the shared keys echo declares: no seed); the source
    # notebook stays clean
    assert nbformat.read(out, as_version=4).metadata["papermill"]["parameters"] == {"target": "smollm2", "size": 5}


def test_unknown_key_is_an_error_naming_file_section_key_and_the_closest_name(repo):
    write_params(repo, {"common": {"target": "t"}, "echo": {"size": 5, "sizee": 6}})
    with pytest.raises(
        stages.StageError, match=r"params.yaml: section 'echo': key\(s\) \['sizee' \(did you mean 'size'\?\)\]"
    ):
        stages.run_stage("echo")
    assert not (repo / "echo.json").exists()


def test_a_shared_key_no_stage_declares_is_an_error(repo, capsys):
    """A stage takes only the shared keys it declares: a misspelled one would silently leave the default."""
    write_params(repo, {"common": {"target": "t", "sise": 2}, "echo": {}})
    assert stages.main(["echo"]) == 1
    err = capsys.readouterr().err
    assert f"{repo / 'params.yaml'}: section 'common': key(s) ['sise' (did you mean 'size'?)]" in err
    assert not (repo / "echo.json").exists()


def test_a_key_in_common_and_in_a_stage_section_is_an_error_naming_both_whichever_stage_runs(repo, capsys):
    """The stage's value would win in silence; the check runs before any stage, not only the one that reads it."""
    write_params(repo, {"common": {"target": "t"}, "echo": {"size": 5}, "peer": {"target": "u"}})
    assert stages.main(["echo"]) == 1
    err = capsys.readouterr().err
    assert "key 'target' is set in section 'common' ('t') and in section 'peer' ('u'): keep one of the two" in err
    assert not (repo / "echo.json").exists()


def test_a_shared_key_that_one_stage_reads_belongs_in_that_stage_section(repo):
    write_params(repo, {"common": {"target": "t", "size": 5}, "echo": {}})
    with pytest.raises(stages.StageError, match="section 'common': key 'size' is read by stage 'echo' only: move it"):
        stages.run_stage("echo")
    assert not (repo / "echo.json").exists()


def test_a_misspelled_or_malformed_section_is_an_error_and_other_tools_sections_are_accepted(repo):
    write_params(repo, {"common": {"target": "t"}, "echo": {"size": 5}, "ecoh": {"size": 6}, "xyz": {}})
    with pytest.raises(stages.StageError) as raised:
        stages.run_stage("echo")
    assert "params.yaml: unknown section(s) ['ecoh' (did you mean 'echo'?), 'xyz']" in str(raised.value)
    assert "a stage's (peer, echo)" in str(raised.value) and "'sglang'" in str(raised.value)
    write_params(repo, {"common": ["target"], "echo": {"size": 5}})
    with pytest.raises(stages.StageError, match="section 'common' should be a mapping of keys, got list"):
        stages.run_stage("echo")
    write_params(
        repo, {"common": {"target": "t"}, "echo": {"size": 5}, **{name: {"any": 1} for name in stages.OTHER_SECTIONS}}
    )
    stages.run_stage("echo")
    assert json.loads((repo / "echo.json").read_text())["size"] == 5


def test_missing_parameter_is_an_error(repo):
    write_params(repo, {"echo": {"size": 5}})
    with pytest.raises(stages.StageError, match=r"needs parameter\(s\) \['target'\]"):
        stages.run_stage("echo")


def test_missing_section_and_unknown_stage(repo):
    write_params(repo, {"common": {"target": "t"}})
    with pytest.raises(stages.StageError, match="no section 'echo'"):
        stages.run_stage("echo")
    with pytest.raises(stages.StageError, match="no notebook for stage 'nope'.*known stages: echo, peer"):
        stages.run_stage("nope")


def test_notebook_without_parameters_cell(repo):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, repo / "notebooks" / "08_bare.ipynb")
    write_params(repo, {"bare": {}})
    with pytest.raises(stages.StageError, match="no cell tagged 'parameters'"):
        stages.run_stage("bare")


def test_failing_cell_fails_the_stage_with_its_error(repo):
    make_notebook(repo / "notebooks" / "09_boom.ipynb", "size = 1\n", "raise ValueError(f'bad size {size}')")
    write_params(repo, {"boom": {"size": 2}})
    with pytest.raises(stages.StageError, match="stage 'boom' failed in cell .*ValueError: bad size 2"):
        stages.run_stage("boom")
    assert not (repo / "reports" / "09_boom.ipynb").exists()  # no half-written report a later run could trust
    assert stages.main(["boom"]) == 1


@pytest.mark.parametrize(
    "params_file", [paths.PARAMS, *sorted((paths.ROOT / "params").glob("*.yaml"))], ids=lambda p: p.name
)
def test_every_params_file_passes_the_checks_of_every_stage(params_file):
    params = stages.load_params(params_file)
    for stage, notebook in stages.stage_notebooks().items():
        assert (
            stages.stage_parameters(stage, notebook, params, params_file).keys()
            == stages.declared_parameters(notebook).keys()
        )


def test_notebooks_parameters_cells_hold_the_values_of_params_yaml():
    """Run alone in JupyterLab, a notebook computes what its stage computes: its parameters cell (parsed with ast)
    holds exactly params.yaml's `common` keys it declares and its section."""
    params = stages.load_params(paths.PARAMS)
    for stage, notebook in stages.stage_notebooks().items():
        declared = stages.declared_parameters(notebook)
        expected = {k: v for k, v in params["common"].items() if k in declared} | params[stage]
        assert declared == expected, notebook.name


def test_dvc_yaml_lists_exactly_the_package_files_each_stage_runs():
    """A module a stage imports (even inside a function) but dvc.yaml omits would let an edit skip the rerun; an
    extra one would rerun stages for nothing."""
    dvc = yaml.safe_load((paths.ROOT / "dvc.yaml").read_text())
    for name, stage in dvc["stages"].items():
        stage = stage.get("do", stage)  # a grid's cells: the foreach's template
        listed = sorted(d for d in stage["deps"] if d.startswith("src/"))
        module = stage["cmd"].split()[2].removeprefix("eagle3lab.")  # python -m eagle3lab.MODULE ...
        runs = (
            stages.code_deps(stages.notebook_for(name)) if module == "pipeline.stages" else stages.module_deps(module)
        )
        assert listed == runs, name


def test_code_deps_follow_imports_inside_functions(tmp_path, monkeypatch):
    package = tmp_path / "src" / "eagle3lab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "stages.py").write_text("from eagle3lab.io import x\n")
    (package / "io.py").write_text("x = 1\n")
    (package / "a.py").write_text("def f():\n    from .b import g\n    return g\n")
    (package / "b.py").write_text(
        "from pathlib import Path\nTABLE = Path(__file__).with_name('t.yaml')\n"
        'EXE = Path(__file__).with_name("absent")\n'
    )
    (package / "t.yaml").write_text("")
    (package / "unused.py").write_text("")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%matplotlib inline\nfrom eagle3lab import a")])
    nbformat.write(nb, tmp_path / "01_x.ipynb")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    assert stages.code_deps(tmp_path / "01_x.ipynb", package) == [
        f"src/eagle3lab/{f}" for f in ["__init__.py", "a.py", "b.py", "io.py", "stages.py", "t.yaml"]
    ]


def test_a_dvc_experiment_copy_is_the_root_its_stages_read(tmp_path):
    """dvc exp run --temp / --queue runs each stage in a copy elsewhere, naming it in DVC_ROOT: params.yaml, metrics
    and artifacts must be the copy's, not the workspace's the editable install points at."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "EAGLE3LAB_ROOT"} | {"DVC_ROOT": str(tmp_path)}
    printed = subprocess.run(
        [sys.executable, "-c", "from eagle3lab import paths; print(paths.PARAMS)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert printed == str(tmp_path.resolve() / "params.yaml")
    assert paths.ROOT / "params.yaml" == paths.PARAMS != tmp_path / "params.yaml"  # without it: the checkout


def test_repro_log_holds_each_stage_make_repro_ran_and_the_total(tmp_path, monkeypatch):
    from eagle3lab.pipeline import repro_log

    log = tmp_path / "repro.log"
    monkeypatch.delenv(repro_log.ENV, raising=False)
    repro_log.begin(log)
    repro_log.stage("by_hand", 60.0)  # no make repro around it: not logged
    monkeypatch.setenv(repro_log.ENV, str(log))
    repro_log.stage("regenerate", 90.0)
    repro_log.end(log)
    lines = log.read_text().splitlines()
    assert lines[0].startswith("# make repro began") and "cores" in lines[0]
    stages = [line.split() for line in lines if not line.startswith("#")]
    assert [(s[0], s[2]) for s in stages] == [("regenerate", "1.5")]
    assert lines[-1].startswith("# make repro ended") and lines[-1].endswith("minutes in all")
