"""Run a Python program (`python -m MODULE ...`) as forks of one process that has already imported it: the tests'
vLLM servers and llama.cpp's converter runs; serving does not. A fresh `python -m vllm.entrypoints.openai.api_server`
spends about 11 s of CPU importing before it reads its arguments, and its engine core (spawned: vLLM's CPU platform
forces it) spends 10 more importing again; forks start past both. A fresh convert_hf_to_gguf.py spends about 3 s
importing torch, gguf and its conversion package, of a 5 s run. The fork server also imports what a program imports
only after reading its arguments (`preload`), and freezes its heap, so that no fork imports it again or walks it in
its garbage collections: a forked vLLM start then took 4.1-5.0 CPU-s instead of 7.4-10.2 (three each).

- The program (a server, say): a fork that takes the command line's module, arguments, environment and directory, in
  its own session like a process started with `start_new_session` (os.killpg stops it).
- What it spawns (the engine core): its multiprocessing spawns through the `spawner`, which has the fork server
  fork the spawned program with the spawner's descriptors, environment and directory. The spawner stays the child
  its server knows: it passes signals on and exits with the fork's exit code, and the fork dies when it does, so
  killing the server's group kills the engine core too. Anything else it spawns (the resource tracker) runs as
  asked.

This file runs on both sides and imports the standard library only. `Forkserver` (eagle3lab's side) starts it under
the program's python (vLLM's has no eagle3lab). Variables read while importing (OMP_NUM_THREADS, HF_HUB_OFFLINE) take
their value from the environment the fork server starts with; each fork's own environment is set before its program
runs.

    python -P forkserver.py serve SOCKET MODULE [PRELOAD...]   # import them, print `ready`, fork per request
    forkserver.py spawn SOCKET ARGS...            # the spawner (through a script the fork server writes)
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import multiprocessing
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
from pathlib import Path

MAX_REQUEST = 1 << 20  # a request is the command line and its environment: a few KiB
MAX_FDS = 64  # a spawn passes stdio, the resource tracker's pipe and the spawn pipes
HIGH_FD = 1024  # above every descriptor number a spawn names


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
    """Forks runs of `module` (servers, converters) from one `python` that imported it once, and `preload`: modules
    a run imports only after it has read its arguments, which every fork would otherwise import again. Started on the
    first popen(), with `environment`; close() ends it, and it kills the runs still going."""

    def __init__(self, python: str | os.PathLike, module: str, environment: dict, preload: tuple[str, ...] = ()):
        self.python, self.module, self.environment = str(python), module, dict(environment)
        self.preload = tuple(preload)
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
                    [self.python, "-P", __file__, "serve", str(self.folder / "socket"), self.module, *self.preload],
                    stdin=subprocess.PIPE,  # closed by close() or our exit: the fork server then exits
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=self.environment,
                )
            for line in self.process.stdout:  # `ready` once the module is imported (after what the import printed)
                if line.strip() == b"ready":
                    return
            log = (self.folder / "forkserver.log").read_text(errors="replace")[-3000:]
            self.close()
            self.process = None  # the next popen() tries again, and says why again
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


# ---- the fork server and its spawner (run under the program's python) ------------------------------------------------


def _import_shared(modules: list[str]) -> None:
    """What every fork shares: the modules, imported once, and the heap they made, frozen so that a fork's garbage
    collections skip it (vLLM's engine core collects at start)."""
    for name in modules:
        __import__(name)
    gc.freeze()


def serve(socket_path: str, module: str, preload: list[str]) -> None:
    _import_shared([module, *preload])
    spawner = Path(socket_path).with_name("spawner")
    spawner.write_text(f"#!/bin/sh\nexec '{sys.executable}' -S -P '{__file__}' spawn '{socket_path}' \"$@\"\n")
    spawner.chmod(0o755)
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
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads the pipe from here on: it must not fill
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, MAX_FDS)
                request = json.loads(message)
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
                    if "spawn" in request:
                        _become_spawned(request, fds)
                    else:
                        _become_server(request, fds[0], module, spawner)
                    sys.exit(0)  # out of serve(): the fork ends as `python -m MODULE` does (atexit, exit code)
                for fd in fds:
                    os.close(fd)
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


def _become_server(request: dict, log_fd: int, module: str, spawner: Path) -> None:
    """The launch line's process: its session, output, directory, environment and arguments, then its module."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.close(devnull)
    os.chdir(request["cwd"])
    _take_environment(request["env"])
    multiprocessing.set_executable(str(spawner))  # the processes it spawns are forks of this server too
    sys.argv = [module, *request["argv"]]  # run_module puts the module's file first, as `python -m` does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _become_spawned(request: dict, fds: list[int]) -> None:
    """What multiprocessing spawned (the engine core): the spawner's descriptors under their numbers, its session,
    directory and environment, then the `-c` program. It dies with the spawner, which its server waits on and
    signals."""
    os.setsid()
    lifeline = fcntl.fcntl(fds[-1], fcntl.F_DUPFD, HIGH_FD)
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, HIGH_FD) for fd in fds[:-1]]  # out of the way of the numbers wanted
    for fd in fds:
        os.close(fd)
    for fd, number in zip(moved, request["fds"], strict=True):
        os.dup2(fd, number)
        os.close(fd)
    threading.Thread(target=_die_with_spawner, args=(lifeline,), daemon=True).start()
    os.chdir(request["cwd"])
    _take_environment(request["env"])
    args = request["spawn"]
    at = args.index("-c")
    sys.argv = ["-c", *args[at + 2 :]]
    exec(compile(args[at + 1], "<string>", "exec"), {"__name__": "__main__"})


def _take_environment(env: dict) -> None:
    """Change only what differs: emptying the environment first breaks setproctitle (it finds the memory it writes
    titles into from the original environment), and vLLM's processes would lose their VLLM::EngineCore titles."""
    for name in set(os.environ) - set(env):
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _die_with_spawner(lifeline: int) -> None:
    os.read(lifeline, 1)  # nobody writes: this returns when the spawner has ended, however it ended
    os.killpg(0, signal.SIGKILL)


def spawn(socket_path: str, args: list[str]) -> None:
    """The spawner, the executable a forked server's multiprocessing starts: a spawn of multiprocessing's
    spawn_main (vLLM's engine core) becomes a fork of the fork server, while this process stays the child its server
    knows (pid, exit code, signals forwarded). Anything else (the resource tracker) runs in the interpreter it asked
    for."""
    program = args[args.index("-c") + 1] if "-c" in args else ""
    if "spawn_main(" not in program:
        os.execv(sys.executable, [sys.executable, *args])
    fds = []
    for name in os.listdir("/proc/self/fd"):  # the descriptors multiprocessing passed, and stdio
        with contextlib.suppress(OSError):
            os.fstat(int(name))  # the listing's own descriptor is closed by now
            fds.append(int(name))
    lifeline, keep = os.pipe()  # `keep` stays open here until this process ends
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(socket_path)
    request = {"spawn": args, "env": dict(os.environ), "cwd": os.getcwd(), "fds": fds}
    socket.send_fds(conn, [json.dumps(request).encode()], [*fds, lifeline])
    os.close(lifeline)
    spawned = ForkedProcess(conn, json.loads(conn.recv(MAX_REQUEST))["pid"])
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, lambda received, _: os.kill(spawned.pid, received))
    code = spawned.wait()
    if code < 0:  # end the way it ended
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


if __name__ == "__main__":
    command, socket_path, *args = sys.argv[1:]
    {"serve": lambda: serve(socket_path, args[0], args[1:]), "spawn": lambda: spawn(socket_path, args)}[command]()
