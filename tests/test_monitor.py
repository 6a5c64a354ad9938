"""The progress monitor reads a run's files: finished runs, live runs in another process, and killed runs."""

import json
import os
import signal
import subprocess
import sys
import time

from eagle3lab.regen import monitor
from eagle3lab.regen.run import regenerate


def write_input(path, n, bad=0):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"r{i}", "conversations": [{"role": "user", "content": f"question {i}"}]}) + "\n")
        for _ in range(bad):
            f.write('{"id": "bad"\n')
    return path


def test_count_lines_ignores_torn_tail(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"id": 1}\n{"id": 2}\n{"id": 3, "x"')
    assert monitor.count_lines(p) == 2
    assert monitor.count_lines(tmp_path / "missing.jsonl") == 0


def test_finished_run(tmp_path, tiny_target, capsys):
    inp = write_input(tmp_path / "in.jsonl", 5, bad=2)
    out = tmp_path / "out.jsonl"
    regenerate(inp, out, target=tiny_target, dtype="float32", max_new_tokens=4, progress_bar=False)
    snap = monitor.snapshot(out)
    assert (snap.success, snap.errors, snap.skipped, snap.total, snap.status) == (5, 0, 2, 7, "finished")
    assert snap.tokens_per_s > 0 and snap.elapsed > 0
    assert monitor.main([str(out), "--input", str(inp)]) == 0
    line = capsys.readouterr().out
    assert "[finished] records 7/7 (100.0%)" in line and "ok 5" in line and "skipped 2" in line and "tok/s" in line


def test_missing_output_is_a_clear_error(tmp_path, capsys):
    assert monitor.main([str(tmp_path / "nothing.jsonl")]) == 2
    assert "no such regeneration output" in capsys.readouterr().err


def test_live_run_in_another_process_then_killed(tmp_path, tiny_target, capsys):
    inp = write_input(tmp_path / "in.jsonl", 2000)  # far more than the run can finish while the test watches
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eagle3lab.cli",
            "regen",
            "--input",
            str(inp),
            "--output",
            str(out),
            "--target",
            tiny_target,
            *["--dtype", "float32", "--batch-size", "1", "--max-new-tokens", "24", "--no-progress"],
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while monitor.count_lines(out) < 2:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the run wrote nothing in 120 s"
            time.sleep(0.05)
        snap = monitor.snapshot(out)
        while snap.eta is None:  # the sidecar is rewritten about once a second: more under load, beside other work
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, f"no rate in the sidecar in 120 s: {snap}"
            time.sleep(0.2)
            snap = monitor.snapshot(out)
        assert snap.status == "running" and snap.total == 2000 and 2 <= snap.done < 2000
        assert snap.tokens_per_s > 0 and snap.eta is not None and snap.eta > 0
        assert monitor.main([str(out), "--follow", "--max-wait", "0"]) == 0
        assert "[running]" in capsys.readouterr().out
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    snap = monitor.snapshot(out)
    assert snap.status == "dead" and snap.done < 2000
    assert monitor.main([str(out), "--follow"]) == 1  # a dead writer ends --follow at once
