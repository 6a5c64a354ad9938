"""Start vLLM servers as forks of a process that has already imported vLLM's API server. A fresh
`python -m vllm.entrypoints.openai.api_server` spends about 11 s of CPU importing before it reads its arguments; a fork
starts there. The forked server then runs the launch line's own module, arguments and environment, in its own session
like a server started with `start_new_session`: os.killpg stops it and the engine core it spawns (vLLM's CPU platform
spawns that one afresh, so it imports as usual). make test starts 13 vLLM servers this way; serving does not.

This file runs on both sides and imports the standard library only. `Forkserver` (eagle3lab's side) starts it under
vLLM's python, which has no eagle3lab. Variables read while importing (OMP_NUM_THREADS, HF_HUB_OFFLINE) take their
value from the environment the fork server starts with; each server's own environment is set before its module runs.

    python -P forkserver.py SOCKET MODULE   # import MODULE, print `ready`, fork a server per request on SOCKET
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

MAX_REQUEST = 1 << 20  # a request is the command line and its environment: a few KiB


class ForkedProcess:
    """A server forked by the fork server: subprocess.Popen's pid, poll(), wait() and returncode (negative: the
    signal that ended it). The fork server, its parent, reaps it and sends its exit status on this connection."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None

    def poll(self) -> int | None:
        return self.wait(0.0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self.conn.settimeout(timeout)
            try:
                message = self.conn.recv(MAX_REQUEST)
            except (TimeoutError, BlockingIOError):
                if timeout == 0.0:
                    return None
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout) from None
            # an empty read: the fork server was killed (it kills its servers before it ends otherwise)
            self.returncode = json.loads(message)["exit"] if message else -signal.SIGKILL
            self.conn.close()
        return self.returncode


class Forkserver:
    """Forks servers of `module` from one `python` that imported it once. Started on the first popen(), with
    `environment`; close() ends it, and it kills the servers still running."""

    def __init__(self, python: str | os.PathLike, module: str, environment: dict):
        self.python, self.module, self.environment = str(python), module, dict(environment)
        self.process: subprocess.Popen | None = None
        self.folder: Path | None = None
        self._lock = threading.Lock()

    def popen(self, cmd: list[str], log, env: dict | None = None) -> ForkedProcess:
        """Start `cmd` (`python -m module ...`) as a fork, its output to the open file `log`; the same contract as
        serving.processes.popen_in_own_session."""
        if list(cmd[:3]) != [self.python, "-m", self.module]:
            raise ValueError(f"the fork server runs `{self.python} -m {self.module}`, not `{' '.join(cmd[:3])}`")
        self._start()
        request = {"argv": [str(c) for c in cmd[3:]], "env": dict(env or self.environment), "cwd": os.getcwd()}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.connect(str(self.folder / "socket"))
        socket.send_fds(conn, [json.dumps(request).encode()], [log.fileno()])
        reply = conn.recv(MAX_REQUEST)
        if not reply:
            raise OSError(f"the fork server died; its log: {self.folder / 'forkserver.log'}")
        return ForkedProcess(conn, json.loads(reply)["pid"])

    def _start(self) -> None:
        with self._lock:
            if self.process is not None:
                return
            self.folder = Path(tempfile.mkdtemp(prefix="eagle3lab-forkserver-"))
            with open(self.folder / "forkserver.log", "wb") as log:
                self.process = subprocess.Popen(
                    [self.python, "-P", __file__, str(self.folder / "socket"), self.module],
                    stdin=subprocess.PIPE,  # closed by close() or our exit: the fork server then exits
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=self.environment,
                )
            if self.process.stdout.readline().strip() != b"ready":  # once the module is imported; EOF if it fails
                log = (self.folder / "forkserver.log").read_text(errors="replace")[-3000:]
                self.close()
                raise OSError(f"the fork server for {self.module} did not start; its log:\n{log}")

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()
            shutil.rmtree(self.folder, ignore_errors=True)


# ---- the fork server (runs under the engine's python) ---------------------------------------------------------------


def _run_server(request: dict, log_fd: int, module: str) -> None:
    """In the fork: become the launch line's process and run its module; never returns."""
    code = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [module, *request["argv"]]  # run_module puts the module's file first, as `python -m` does
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(socket_path: str, module: str) -> None:
    __import__(module)  # what every fork shares
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path)
    listener.listen()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 1)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    # the fork keeps none of the server's ends: a client sees EOF only when the server itself is gone
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for end in (listener, conn, *children.values()):
                        end.close()
                    os.close(wake_read)
                    os.close(wake_write)
                    _run_server(json.loads(message), fds[0], module)
                os.close(fds[0])
                children[pid] = conn
                conn.send(json.dumps({"pid": pid}).encode())
            elif key.fileobj == wake_read:
                os.read(wake_read, 4096)
                _reap(children)
            elif not os.read(sys.stdin.fileno(), 4096):
                # eagle3lab's side closed our stdin or died: no server outlives the fork server unseen
                for pid in children:
                    for kill in (os.killpg, os.kill):  # its group (engine core too), or itself before its setsid()
                        with contextlib.suppress(ProcessLookupError):
                            kill(pid, signal.SIGKILL)
                while children:
                    _reap(children, block=True)
                return


def _reap(children: dict, block: bool = False) -> None:
    while children:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        if not pid:
            return
        conn = children.pop(pid)
        with contextlib.suppress(OSError):
            conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
        conn.close()


if __name__ == "__main__":
    serve(*sys.argv[1:3])
