"""The set-up step runner: a long build or install shows its progress on stderr and names its failure."""

import sys

from eagle3lab.serving.processes import run_step


def test_a_step_prints_each_tenth_of_a_build_and_each_package(capsys):
    script = "; ".join(
        [*(f"print('[{i}/40] Building CXX object')" for i in range(1, 41)), "print('Collecting torch==2.13.0')"]
    )
    code, tail = run_step([sys.executable, "-c", script], "build x")
    said = capsys.readouterr().err.splitlines()
    assert code == 0 and tail.endswith("Collecting torch==2.13.0")
    assert said[0] == "build x ..." and said[-1].startswith("build x: done in ")
    percents = [line.split(": ")[1].split()[0] for line in said if "%" in line]
    assert percents == ["2%", "12%", "22%", "32%", "42%", "52%", "62%", "72%", "82%", "92%"]
    assert any(line.startswith("build x: Collecting torch==2.13.0") for line in said)


def test_a_failing_step_returns_its_code_and_last_lines(capsys):
    code, tail = run_step([sys.executable, "-c", "import sys; print('a'); sys.exit('no compiler')"], "build y")
    assert code == 1 and tail.splitlines() == ["a", "no compiler"]
