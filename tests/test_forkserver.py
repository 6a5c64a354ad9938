"""The fork server (serving.forkserver) on a module of our own: each run is a fork in its own session, with its
command line, environment and directory; what it spawns is a fork too and dies with it; the preloaded modules and the
frozen heap come from the fork server."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3lab.serving.forkserver import Forkserver

# A module for the fork server to run: it prints what its process sees, then exits with a code, waits to be killed,
# or spawns (multiprocessing's spawn, as vLLM starts its engine core) a child that does the same. It imports
# echo_late only once it runs, as vLLM's server imports its engine core: the fork server preloads it.
ECHO = """
import gc, json, multiprocessing, os, sys, time

if __name__ == "echo_server":
    print("imported")  # only the fork server imports it so: a line before its `ready`

def facts():
    import echo_late
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "mark": os.environ.get("MARK"), "pid": os.getpid(),
                      "parent": os.getppid(), "late": echo_late.IMPORTED_IN, "frozen": gc.get_freeze_count() > 0}),
          flush=True)

def run(what):
    facts()
    time.sleep(600) if what == "wait" else sys.exit(int(what))

if __name__ == "__main__":
    if sys.argv[1] != "spawn":
        run(sys.argv[1])
    facts()
    child = multiprocessing.get_context("spawn").Process(target=run, args=(sys.argv[2],))
    child.start()
    child.join()
    print(json.dumps({"exitcode": child.exitcode}), flush=True)
"""


@pytest.fixture
def echo_forks(tmp_path, monkeypatch):
    """A fork server of ECHO (under our python), and the folder its servers run in."""
    (tmp_path / "echo_server.py").write_text(ECHO)
    (tmp_path / "echo_late.py").write_text("import os\nIMPORTED_IN = os.getpid()\n")
    forks = Forkserver(sys.executable, "echo_server", dict(os.environ, PYTHONPATH=str(tmp_path)), ("echo_late",))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    yield forks
    forks.close()


def echo(forks, log: Path, *args: str, **env):
    with open(log, "wb") as out:
        return forks.popen([sys.executable, "-m", "echo_server", *args], out, dict(os.environ, **env))


def printed(log: Path) -> list[dict]:
    """The whole lines printed so far (a line still being written is left for the next read)."""
    return [json.loads(line) for line in log.read_text().split("\n")[:-1]]


def test_the_fork_server_runs_the_launch_line_as_a_fork_in_its_own_session(echo_forks, tmp_path):
    with pytest.raises(ValueError, match="the fork server runs .* -m echo_server"):
        echo_forks.popen([sys.executable, "-m", "http.server"], None)
    exits = echo(echo_forks, tmp_path / "exits.log", "3", "--x", MARK="a")
    assert exits.wait(30) == 3 and exits.poll() == 3
    [seen] = printed(tmp_path / "exits.log")
    assert seen == {"argv": ["3", "--x"], "cwd": str(tmp_path / "work"), "mark": "a", "pid": exits.pid} | {
        "parent": echo_forks.process.pid,  # a fork: no new interpreter, no import
        "late": echo_forks.process.pid,  # preloaded by the fork server, not imported again
        "frozen": True,  # the fork server's heap, which the fork's collections skip
    }
    waits = echo(echo_forks, tmp_path / "waits.log", "wait")
    with pytest.raises(subprocess.TimeoutExpired):
        waits.wait(0.5)
    assert waits.poll() is None and os.getpgid(waits.pid) == waits.pid  # its own process group, like Popen's
    os.killpg(waits.pid, signal.SIGKILL)
    assert waits.wait(30) == -signal.SIGKILL
    left = echo(echo_forks, tmp_path / "left.log", "wait")
    echo_forks.close()
    assert echo_forks.process.returncode == 0  # its stdin closed: it ends, and no server it forked outlives it
    assert left.wait(0) == -signal.SIGKILL and not Path(f"/proc/{left.pid}").exists()


def test_a_fork_server_that_cannot_import_its_module_says_why(tmp_path):
    (tmp_path / "broken_server.py").write_text("print('imported half')\nraise RuntimeError('no such engine')\n")
    forks = Forkserver(sys.executable, "broken_server", dict(os.environ, PYTHONPATH=str(tmp_path)))
    with open(tmp_path / "x.log", "wb") as log, pytest.raises(OSError, match="did not start(?s:.*)no such engine"):
        forks.popen([sys.executable, "-m", "broken_server"], log)


def test_what_a_forked_server_spawns_is_a_fork_too_and_dies_with_it(echo_forks, tmp_path):
    server = echo(echo_forks, tmp_path / "spawns.log", "spawn", "5", MARK="c")
    assert server.wait(60) == 0
    facts, child, ended = printed(tmp_path / "spawns.log")
    assert child["parent"] == echo_forks.process.pid != facts["pid"]  # forked by the fork server, not spawned
    assert child["mark"] == "c" and child["cwd"] == str(tmp_path / "work")
    assert ended == {"exitcode": 5}  # the server sees its child's exit code

    server = echo(echo_forks, tmp_path / "kill.log", "spawn", "wait")
    deadline = time.monotonic() + 60
    while len(printed(tmp_path / "kill.log")) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    child = printed(tmp_path / "kill.log")[1]["pid"]
    os.killpg(server.pid, signal.SIGKILL)  # as a test kills a vLLM server: its group, where the child is not
    assert server.wait(30) == -signal.SIGKILL
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists()  # it died with the server
