"""`python -m eagle3lab.pipeline.carry`: on a toy DVC repository of three stages in a chain (the middle one a foreach
of two items, so four cells), it runs only what changed, in DVC's order, within a budget, and records each cell it
ran. The first run is made once; every other test works on its own copy of its result."""

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from eagle3lab import paths
from eagle3lab.pipeline import carry, machine, repro_log

CELLS = ["first", "middle@x", "middle@y", "last"]
FAR_TOO_LONG = 500.0  # minutes: a fake record no toy cell comes near, nor the budgets below
STALE = 77.0  # minutes: a fake record that fits a budget of 100; a cell that runs replaces it


def _python(code: str) -> str:
    return f'python -c "import pathlib as p; {code}"'


PIPELINE = {
    "stages": {
        "first": {
            "cmd": _python("p.Path('a.txt').write_text(p.Path('in.txt').read_text().strip())"),
            "deps": ["in.txt"],
            "outs": ["a.txt"],
        },
        "middle": {
            "foreach": ["x", "y"],
            "do": {
                "cmd": _python("p.Path('b-${item}.txt').write_text(p.Path('a.txt').read_text())"),
                "deps": ["a.txt"],
                "outs": ["b-${item}.txt"],
            },
        },
        "last": {  # fails when the first input says so
            "cmd": _python(
                "t = p.Path('b-x.txt').read_text() + p.Path('b-y.txt').read_text(); "
                "exit('told to fail') if 'fail' in t else p.Path('c.txt').write_text(t)"
            ),
            "deps": ["b-x.txt", "b-y.txt"],
            "outs": ["c.txt"],
        },
    }
}


def _git(root, *args):
    command = ["git", "-c", "user.name=toy", "-c", "user.email=toy@example.invalid", *args]
    return subprocess.run(command, cwd=root, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """The toy repository, committed, after carry's first run (no budget): its root, exit code and output."""
    root = tmp_path_factory.mktemp("toy") / "repo"
    root.mkdir()
    (root / "dvc.yaml").write_text(yaml.safe_dump(PIPELINE, sort_keys=False))
    (root / "in.txt").write_text("hello\n")
    _git(root, "init", "-q")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=root, check=True)
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "toy")
    output = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(output):
        patch.setattr(paths, "ROOT", root)
        code = carry.main([])
    return root, code, output.getvalue()


@pytest.fixture
def repo(first_run, tmp_path, monkeypatch):
    """A copy of the toy repository after its first run, as paths.ROOT."""
    root = shutil.copytree(first_run[0], tmp_path / "repo", symlinks=True)
    monkeypatch.setattr(paths, "ROOT", root)
    return root


def _records(root, names=CELLS) -> dict[str, dict]:
    return {name: json.loads(carry.record_path(root, name).read_text()) for name in names}


def _locked(root) -> dict:
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"]


def _fake_record(root, name, minutes):
    record = json.loads(carry.record_path(root, name).read_text()) | {"minutes": minutes}
    carry.record_path(root, name).write_text(json.dumps(record))


def test_a_first_run_runs_every_cell_in_order_and_records_each(first_run):
    root, code, output = first_run
    assert code == 0, output
    assert re.findall(r"^\[\d/4\] (\S+): done in", output, re.M) == CELLS
    assert sorted(p.name for p in (root / "metrics" / "cells").iterdir()) == sorted(f"{n}.json" for n in CELLS)
    head = _git(root, "rev-parse", "--short", "HEAD")
    for name, record in _records(root).items():
        assert record["cell"] == name and record["minutes"] >= 0 and record["started"] <= record["ended"]
        assert (record["commit"], record["uncommitted_changes"]) == (head, False)
        assert record["machine"]["cpu"] == machine.cpu_model()
        assert record["machine"]["auto_dtype"] in ("float32", "bfloat16")
    assert set(_locked(root)) == set(CELLS)
    assert (root / "c.txt").read_text() == "hellohello"


def test_record_files_of_other_dvc_files_stages_are_distinct_and_flat(tmp_path):
    names = ["sub/dvc.yaml:train@draft-0350-seed1", "sub_dvc.yaml_train@draft-0350-seed1"]
    files = [carry.record_path(tmp_path, name) for name in names]
    assert len(set(files)) == 2 and all(f.parent == tmp_path / carry.CELLS for f in files)


def test_a_second_run_has_nothing_to_run(repo, capsys):
    before = _records(repo)
    assert carry.main([]) == 0
    assert "nothing to run" in capsys.readouterr().out
    assert _records(repo) == before


def test_cells_whose_outputs_are_merely_absent_are_not_planned(repo):
    (repo / "b-x.txt").unlink()
    (repo / "c.txt").unlink()
    assert carry.planned_cells(repo) == []


def test_a_cell_that_never_ran_is_planned_even_where_its_inputs_are_absent(repo):
    pipeline = yaml.safe_load((repo / "dvc.yaml").read_text())
    pipeline["stages"]["middle"]["foreach"].append("z")
    (repo / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (repo / "a.txt").unlink()  # the first cell's output, absent from this checkout; its inputs are unchanged
    assert carry.planned_cells(repo) == ["middle@z"]


def test_a_changed_cell_whose_inputs_are_absent_is_planned_as_in_a_fresh_clone(repo):
    pipeline = yaml.safe_load((repo / "dvc.yaml").read_text())
    pipeline["stages"]["middle"]["do"]["cmd"] += "  # changed"
    (repo / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    (repo / "a.txt").unlink()
    assert carry.planned_cells(repo) == CELLS[1:]


def test_an_edited_first_input_plans_it_and_everything_downstream(repo):
    (repo / "in.txt").write_text("changed\n")
    cells = carry.plan(repo)
    assert [cell.name for cell in cells] == CELLS
    assert all(cell.estimate.source.startswith("its last run") for cell in cells)


def test_named_stages_or_cells_narrow_the_plan_in_its_order(repo, capsys):
    (repo / "in.txt").write_text("changed\n")
    assert [cell.name for cell in carry.plan(repo, ["last", "middle"])] == ["middle@x", "middle@y", "last"]
    assert [cell.name for cell in carry.plan(repo, ["middle@y"])] == ["middle@y"]
    (repo / "in.txt").write_text("hello\n")
    assert carry.main(["middle"]) == 0
    assert "nothing to run among middle" in capsys.readouterr().out


def test_a_cell_whose_estimate_exceeds_the_budget_is_not_started(repo, capsys):
    (repo / "in.txt").write_text("changed\n")
    _fake_record(repo, "first", STALE)
    _fake_record(repo, "middle@x", FAR_TOO_LONG)
    left, locked = _records(repo, CELLS[1:]), _locked(repo)
    assert carry.main(["--budget", "100"]) == carry.EXIT_CELLS_LEFT
    out = capsys.readouterr().out
    assert "stopping before middle@x: its estimate, 500.0 min" in out
    assert re.findall(r"^  (\S+): estimate", out, re.M) == CELLS[1:]  # what is left, in plan order
    assert _records(repo)["first"]["minutes"] != STALE  # the one that fitted ran
    assert _records(repo, CELLS[1:]) == left
    assert _locked(repo)["first"] != locked["first"] and _locked(repo)["middle@x"] == locked["middle@x"]


def test_an_unestimated_cell_starts_only_with_allow_unestimated(repo, capsys):
    # Trailing spaces: the first cell reruns, its output comes out the same, so DVC skips the cells after it.
    (repo / "in.txt").write_text("hello   \n")
    carry.record_path(repo, "first").unlink()
    before, locked = _records(repo, CELLS[1:]), _locked(repo)
    assert carry.main(["--budget", "100"]) == carry.EXIT_CELLS_LEFT
    assert "stopping before first: it has no estimate" in capsys.readouterr().out
    assert _locked(repo) == locked and not carry.record_path(repo, "first").exists()
    assert carry.main(["--budget", "100", "--allow-unestimated"]) == 0
    out = capsys.readouterr().out
    assert "first: no estimate (no record in metrics/cells/ nor a line in metrics/repro.log), started without" in out
    assert re.findall(r"^\[\d/4\] (\S+): DVC did not run it", out, re.M) == CELLS[1:]
    assert carry.record_path(repo, "first").exists() and _records(repo, CELLS[1:]) == before


def test_a_failing_cell_exits_1_and_the_cells_before_it_keep_their_records_and_lock(repo, capsys):
    (repo / "in.txt").write_text("fail\n")
    for name in CELLS:
        _fake_record(repo, name, STALE)
    locked = _locked(repo)
    assert carry.main([]) == 1
    assert "cell last failed" in capsys.readouterr().err
    records, relocked = _records(repo), _locked(repo)
    assert [name for name in CELLS if records[name]["minutes"] != STALE] == CELLS[:3]
    assert [name for name in CELLS if relocked[name] != locked[name]] == CELLS[:3]
    assert [cell.name for cell in carry.plan(repo)] == ["last"]  # the next sitting starts at the failed cell


def test_dry_prints_the_plan_with_estimates_and_etas_and_runs_nothing(repo, capsys):
    (repo / "in.txt").write_text("changed\n")
    _fake_record(repo, "middle@y", FAR_TOO_LONG)
    before, locked = _records(repo), _locked(repo)
    assert carry.main(["--dry", "--budget", "100"]) == 0
    out = capsys.readouterr().out
    planned = r"^\[\d/4\] (\S+): estimate ~[\d.]+ min \(its last run, [\d-]+\), ETA \d\d:\d\d$"
    assert re.findall(planned, out, re.M) == CELLS
    assert "--budget 100 would stop before middle@y: its estimate, 500.0 min" in out
    assert (_records(repo), _locked(repo), (repo / "a.txt").read_text()) == (before, locked, "hello")


def test_an_estimate_falls_back_to_the_reference_runs_log_and_names_its_cpu(repo):
    (repo / "metrics" / "repro.log").write_text(
        "# make repro began 2026-12-06T01:06:34Z at d73a438 on 2 cores: Elsewhere CPU 9000\n"
        "# unix_start 1796519195\n"
        "# stage  ended  minutes\n"
        "first  2026-12-06T01:07:42Z  12.5\n"
    )
    reference, here = carry.reference_run(repo / repro_log.LOG), machine.cpu_model()
    carry.record_path(repo, "first").unlink()
    first = carry.estimate(repo, "first", reference, here)
    assert first.minutes == 12.5
    assert "metrics/repro.log, 2026-12-06 at d73a438, on Elsewhere CPU 9000" in first.source
    unknown = carry.estimate(repo, "other@z", reference, here)
    assert unknown.minutes is None and str(unknown).startswith("no estimate")


def test_a_grid_cell_that_never_ran_is_estimated_by_the_longest_recorded_cell_of_its_stage(repo, capsys):
    """A new cell of a grid (middle@z, say) has no record of its own: its stage's cells that ran say what to expect,
    and a sitting re-estimates each cell as the ones before it finish."""
    _fake_record(repo, "middle@x", 3.0)
    _fake_record(repo, "middle@y", 7.0)
    new = carry.estimate(repo, "middle@z", None, machine.cpu_model())
    assert new.minutes == 7.0 and new.source == "the longest of 2 recorded cell(s) of middle, middle@y"
    assert carry.estimate(repo, "middle@x", None, machine.cpu_model()).minutes == 3.0  # its own record first
    for name in ("middle@x", "middle@y", "last"):
        carry.record_path(repo, name).unlink()
    (repo / "in.txt").write_text("again\n")
    assert carry.main(["--budget", "100"]) == 3  # middle@x has no estimate yet: without --allow-unestimated, stop
    assert "stopping before middle@x: it has no estimate" in capsys.readouterr().out
    assert carry.main(["--budget", "100", "--allow-unestimated"]) == 0
    out = capsys.readouterr().out
    assert "middle@x: no estimate" in out  # nothing of its stage recorded yet
    assert re.search(r"middle@y: estimate ~[\d.]+ min \(the longest of 1 recorded cell\(s\) of middle, middle@x\)", out)


def test_a_budget_of_no_minutes_is_bad_input(capsys):
    assert carry.main(["--budget", "0"]) == 2
    assert "--budget 0" in capsys.readouterr().err


def test_a_record_missing_a_field_its_readers_use_is_named(repo):
    path = carry.record_path(repo, "first")
    record = json.loads(path.read_text())
    del record["machine"]["auto_dtype"]
    path.write_text(json.dumps(record))
    with pytest.raises(carry.InputError, match=r"first\.json: machine: missing field 'auto_dtype'"):
        carry.cell_records(repo / carry.CELLS)


def test_a_checkout_is_uncommitted_when_code_changed_not_when_the_pipeline_wrote_its_lock_and_records(tmp_path):
    """A sitting's cells rewrite dvc.lock and add records and answers as they finish: the cells after them still ran
    the committed code. An edited tracked file elsewhere is an uncommitted change."""
    root = tmp_path / "repo"
    for path in ("dvc.lock", "metrics/cells/a.json", "answers/train-000.jsonl", "src/code.py"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("1\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "toy")
    for path in ("dvc.lock", "metrics/cells/a.json", "answers/train-000.jsonl"):
        (root / path).write_text("2\n")
    assert machine.commit(root).uncommitted is False
    (root / "src" / "code.py").write_text("2\n")
    assert machine.commit(root).uncommitted is True and str(machine.commit(root)).endswith("(uncommitted changes)")


def test_with_commit_each_finished_cell_is_committed_alone_before_the_next_starts(repo, monkeypatch, capsys):
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "toy")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "toy@example.invalid")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the first run")
    (repo / "in.txt").write_text("again\n")
    (repo / "notes.txt").write_text("the user's own work in progress")
    assert carry.main(["--commit"]) == 0
    assert re.findall(r"^\[\d/4\] (\S+): done in [\d.]+ min, committed as \w+", capsys.readouterr().out, re.M) == CELLS
    log = _git(repo, "log", "--format=%s", "-4").splitlines()[::-1]
    assert [line.split(",")[0] for line in log] == [f"carry: cell {name}" for name in CELLS]
    assert all(f"on {machine.cpu_model()} (" in line for line in log)
    first = _git(repo, "show", "--name-only", "--format=", "HEAD~3").split()
    assert sorted(first) == ["dvc.lock", "metrics/cells/first.json"]  # a.txt is cached (the first run ignored it)
    locked = yaml.safe_load(_git(repo, "show", "HEAD~3:dvc.lock"))["stages"]
    assert locked["first"]["outs"][0]["path"] == "a.txt" and "last" in locked  # the lock as DVC wrote it then
    status = _git(repo, "status", "--porcelain", "--", "in.txt", "notes.txt")
    assert status.splitlines() == ["M in.txt", "?? notes.txt"]  # the checkout's own changes stay uncommitted


def test_a_missing_restorable_input_is_rebuilt_before_a_cell_reads_it_unless_a_planned_cell_writes_it(
    repo, monkeypatch
):
    rebuilt = []

    def restore(root):
        rebuilt.append(root)
        (root / "a.txt").write_text("hello")

    monkeypatch.setattr(carry, "RESTORABLE", {"a.txt": restore})
    (repo / "a.txt").unlink()
    unknown = carry.Estimate(None, "none")
    cells = {name: carry.Cell(name, unknown) for name in CELLS}
    assert carry.restore_inputs(repo, [cells["first"], cells["middle@x"]]) == []  # `first` writes it
    assert carry.restore_inputs(repo, [cells["last"]]) == []  # `last` does not read it
    assert carry.restore_inputs(repo, [cells["middle@x"]]) == ["a.txt"] and rebuilt == [repo]
    assert carry.restore_inputs(repo, [cells["middle@y"]]) == [] and rebuilt == [repo]  # it is there now
