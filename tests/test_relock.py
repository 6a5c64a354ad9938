"""`python -m eagle3lab.pipeline.relock`: dvc.lock takes the current code only when two smoke roots are equal, and
only the code entries change."""

import hashlib
import json
import subprocess
import sys

import pytest

from eagle3lab import paths
from eagle3lab.io import EXIT_BAD_INPUT
from eagle3lab.pipeline import relock

LOCK = """schema: '2.0'
stages:
  survey:
    cmd: python -m eagle3lab.pipeline.stages survey
    deps:
    - path: data
      hash: md5
      md5: 20d83e6a15178802965033ec28210235.dir
      size: 195980278
      nfiles: 20
    - path: src/eagle3lab/a.py
      hash: md5
      md5: {a_md5}
      size: {a_size}
    - path: src/eagle3lab/gone.py
      hash: md5
      md5: 0cc8cdfd7d9838d9cc2dd34ef27be0d6
      size: 3
    params:
      params.yaml:
        common:
          seed: 0
    outs:
    - path: metrics/survey.json
      hash: md5
      md5: 7daea450b13f585ac4eeaee3aabfc600
      size: 12
"""
DVC_YAML = """stages:
  survey:
    cmd: python -m eagle3lab.pipeline.stages survey
    deps:
      - data
      - src/eagle3lab/a.py
      - src/eagle3lab/b.py  # a module the stage imports since
    params: [common]
    outs:
      - metrics/survey.json
"""


def smoke_root(folder, accept_length):
    (folder / "artifacts").mkdir(parents=True)
    (folder / "metrics").mkdir()
    (folder / "notebooks").symlink_to(paths.ROOT / "notebooks")
    # the one locked stage's output (DVC_YAML's survey)
    (folder / "metrics" / "survey.json").write_text(json.dumps({"accept_length": accept_length, "seconds": 3.0}))
    return folder


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "src" / "eagle3lab").mkdir(parents=True)
    (root / "src" / "eagle3lab" / "a.py").write_text("A = 1\n")
    (root / "src" / "eagle3lab" / "b.py").write_text("B = 2\n")
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "dvc.lock").write_text(LOCK.format(a_md5="e8ca53efcd64ceff17fc8b4e67ff43b3", a_size=3))
    (root / "params.yaml").write_text("common:\n  seed: 0\n")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)
    monkeypatch.setattr(paths, "ROOT", root)
    return root


def test_equal_smoke_roots_relock_the_code_entries_only(repo, tmp_path, capsys):
    before, after = smoke_root(tmp_path / "before", 1.41), smoke_root(tmp_path / "after", 1.41)
    assert relock.main([str(before), str(after)]) == 0
    a = (repo / "src" / "eagle3lab" / "a.py").read_bytes()
    b = (repo / "src" / "eagle3lab" / "b.py").read_bytes()
    expected = LOCK.format(a_md5=hashlib.md5(a).hexdigest(), a_size=len(a)).replace(
        """    - path: src/eagle3lab/gone.py
      hash: md5
      md5: 0cc8cdfd7d9838d9cc2dd34ef27be0d6
      size: 3
""",
        f"""    - path: src/eagle3lab/b.py
      hash: md5
      md5: {hashlib.md5(b).hexdigest()}
      size: {len(b)}
""",
    )
    assert (repo / "dvc.lock").read_text() == expected  # data, params and outputs as they were, in DVC's layout
    out = capsys.readouterr().out
    assert "dvc.lock records 3 new entries (code, empty params)" in out and "src/eagle3lab/gone.py" in out
    assert (
        "modified"
        not in subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=repo, capture_output=True, text=True).stdout
    )  # dvc itself finds the code it runs unchanged


def test_a_differing_output_refuses_and_leaves_the_lock(repo, tmp_path, capsys):
    before, after = smoke_root(tmp_path / "before", 1.41), smoke_root(tmp_path / "after", 1.42)
    lock = (repo / "dvc.lock").read_text()
    assert relock.main([str(before), str(after)]) == 1
    assert "relock refused: 1 of" in capsys.readouterr().out
    assert (repo / "dvc.lock").read_text() == lock


def test_a_stage_named_to_rerun_is_neither_compared_nor_relocked(repo, tmp_path, capsys):
    before, after = smoke_root(tmp_path / "before", 1.41), smoke_root(tmp_path / "after", 1.42)
    lock = (repo / "dvc.lock").read_text()
    assert relock.main([str(before), str(after), "--rerun", "survey"]) == 0
    assert (repo / "dvc.lock").read_text() == lock  # its old code stays locked: DVC reruns it
    out = capsys.readouterr().out
    assert "0 smoke outputs equal" in out and "left as locked, to rerun: survey" in out


def test_a_new_dependency_that_is_not_code_needs_a_run(repo, tmp_path, capsys):
    (repo / "dvc.yaml").write_text(DVC_YAML.replace("      - data\n", "      - data\n      - artifacts/mixture\n"))
    before, after = smoke_root(tmp_path / "before", 1.41), smoke_root(tmp_path / "after", 1.41)
    assert relock.main([str(before), str(after)]) == 2
    assert "new dependencies ['artifacts/mixture'] need a run" in capsys.readouterr().err


def test_a_new_cell_is_left_to_run_and_only_the_locked_stages_outputs_are_compared(repo, tmp_path, capsys):
    """A grid stage added since the lock: relock records the locked stages' code and names the cells that need a
    run; what the new cells wrote (declared or not, and in either root) proves nothing about the locked stages, while
    an output of a locked stage that only AFTER holds still refuses."""
    grid = DVC_YAML + (
        "  answers:\n    foreach: ${answers}\n    do:\n      cmd: python -m eagle3lab.pipeline.answers ${key}\n"
        "      outs:\n        - metrics/answers/${key}.json\n"
    )
    (repo / "dvc.yaml").write_text(grid)
    (repo / "params.yaml").write_text("common:\n  seed: 0\nanswers:\n  train-000: {}\n  train-001: {}\n")
    before, after = smoke_root(tmp_path / "before", 1.41), smoke_root(tmp_path / "after", 1.41)
    for root, prompts in ((before, 3), (after, 8)):  # the smoke plan's cells changed between the two roots
        (root / "metrics" / "answers").mkdir()
        (root / "metrics" / "answers" / "tiny-000.json").write_text(json.dumps({"prompts": prompts}))
    (after / "artifacts" / "grid").mkdir()
    (after / "artifacts" / "grid" / "cache.jsonl").write_text("{}\n")  # a new cell's undeclared working file
    assert relock.main([str(before), str(after)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "2 cell(s) never ran and need a run (make carry): answers@train-000, answers@train-001" in out
    assert "answers@" not in (repo / "dvc.lock").read_text()
    # once a cell of the grid stage is locked, every smoke cell of that stage is compared, whatever its name
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=after, check=True)
    (after / "dvc.yaml").write_text(grid)
    (after / "params.yaml").write_text("common:\n  seed: 0\nanswers:\n  tiny-000: {}\n")  # the smoke plan's cell
    lock = (repo / "dvc.lock").read_text()
    (repo / "dvc.lock").write_text(
        lock + "  answers@train-000:\n    cmd: python -m eagle3lab.pipeline.answers train-000\n    outs:\n"
        "    - path: metrics/answers/train-000.json\n      hash: md5\n      md5: 99914b932bd37a50b983c5e7c90ae93b\n"
        "      size: 2\n"
    )
    assert relock.main([str(before), str(after)]) == 1
    assert "metrics/answers/tiny-000.json: prompts: 3 != 8" in capsys.readouterr().out
    (repo / "dvc.lock").write_text(lock)
    (after / "metrics" / "survey.json").unlink()  # a locked stage's output that only one root holds
    assert relock.main([str(before), str(after)]) == 1
    assert "metrics/survey.json: only in A" in capsys.readouterr().out


def test_a_new_parameter_is_recorded_only_where_its_value_is_empty(repo, tmp_path, capsys):
    (repo / "dvc.yaml").write_text(DVC_YAML.replace("params: [common]", "params: [common, cells.survey]"))
    (repo / "params.yaml").write_text("common:\n  seed: 0\ncells:\n  survey: {}\n")
    before, after = smoke_root(tmp_path / "before", 1.41), smoke_root(tmp_path / "after", 1.41)
    assert relock.main([str(before), str(after)]) == 0
    assert "params.yaml:cells.survey" in capsys.readouterr().out
    status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=repo, capture_output=True, text=True).stdout
    assert "cells.survey" not in status  # DVC finds the new, empty parameter recorded
    (repo / "params.yaml").write_text("common:\n  seed: 0\ncells:\n  survey: {original_scales: [140]}\n")
    lock = (repo / "dvc.lock").read_text()
    (repo / "dvc.lock").write_text(lock.replace("        cells.survey: {}\n", ""))
    assert relock.main([str(before), str(after)]) == EXIT_BAD_INPUT
    assert (repo / "dvc.lock").read_text() == lock.replace("        cells.survey: {}\n", "")  # left as it was
    assert (
        "stage 'survey': new parameter cells.survey = {'original_scales': [140]} needs a run" in capsys.readouterr().err
    )
