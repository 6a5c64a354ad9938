"""Start a model server as a child process, wait until GET /health answers, and stop its whole process group after:
SGLang on GPUs, `transformers serve` (a real OpenAI-compatible server, also on a CPU) for tests and benchmarks. Also
the one runner of a long set-up step (an engine's build or environment), with its progress on stderr."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from eagle3lab.serving.client import ServerClient, ServerError


def _progress(line: str) -> str | None:
    """What a set-up step's output line says of its progress: make's `[ 42%]` or ninja's `[120/287]` as a percent,
    pip's collected and installed packages; None for other lines."""
    step = re.match(r"\[\s*(\d+)%\]|\[(\d+)/(\d+)\]", line)
    if step:
        return f"{int(step.group(1)) if step.group(1) else 100 * int(step.group(2)) // int(step.group(3))}%"
    return line.strip()[:100] if line.startswith(("Collecting ", "Installing collected", "Successfully")) else None


def run_step(cmd: list, what: str, *, cwd: Path | None = None) -> tuple[int, str]:
    """Run one set-up step, printing `what` with each tenth of a build or each pip package to stderr, and the time
    it took (a build or an install here takes minutes and says nothing else). Returns (exit code, its last lines)."""
    print(f"{what} ...", file=sys.stderr, flush=True)
    start, shown, lines = time.monotonic(), -10, []
    with subprocess.Popen(
        [str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd
    ) as proc:
        for line in proc.stdout:
            lines = (lines + [line.rstrip()])[-15:]
            said = _progress(line)
            percent = int(said[:-1]) if said and said.endswith("%") and said[:-1].isdigit() else None
            if said and (percent is None or percent >= shown + 10):
                shown = percent if percent is not None else shown
                print(f"{what}: {said} ({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    print(f"{what}: done in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    return proc.returncode, "\n".join(lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(url: str) -> bool:
    """Something already accepts connections at the URL's host and port."""
    parts = httpx.URL(url)
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((parts.host, parts.port or 80)) == 0


def popen_in_own_session(cmd: list[str], log, env: dict | None = None) -> subprocess.Popen:
    """Start a server process in its own process group (os.killpg stops it with every worker it starts), its output
    to the open file `log`."""
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
    )


@dataclass
class Server:
    url: str
    process: subprocess.Popen  # or what start_server's `popen` returns: pid, poll(), wait(), returncode
    log_path: Path
    info: dict | None = None  # /server_info (or the older /get_server_info) when the server has one
    started_s: float = 0.0


def log_tail(path: str | os.PathLike, lines: int = 30) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the whole process group (SGLang forks scheduler and detokenizer workers), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _server_info(client: ServerClient) -> dict | None:
    """/server_info when the server has one (SGLang); a failure here must not stop a healthy server's use."""
    try:
        return client.server_info()[0]
    except httpx.HTTPError:
        return None


@contextlib.contextmanager
def start_server(
    cmd: list[str],
    url: str,
    timeout: float = 900.0,
    *,
    log_path: str | os.PathLike | None = None,
    poll: float = 0.1,
    stop_grace: float = 30.0,
    env: dict | None = None,
    popen=popen_in_own_session,
):
    """Start `cmd` in its own process group with its output streamed to `log_path` (a temp file by default), wait
    until GET url/health answers 200, yield a `Server`, and kill the process group on exit. `popen` starts the
    process (the tests fork vLLM servers: serving.forkserver). `poll`: a start is seen at most this late (a llama.cpp
    start takes about half a second here; make test starts about fifty servers)."""
    url = url.rstrip("/")
    if port_in_use(url):  # else the health check would find the other server healthy and benchmark it
        raise ServerError(f"{url}: the port is in use; pick another port or stop the server that holds it")
    if log_path is None:
        fd, log_path = tempfile.mkstemp(prefix="server-", suffix=".log")
        os.close(fd)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = popen(cmd, log, env)
        except OSError as e:
            raise ServerError(f"cannot start `{shlex.join(cmd)}`: {e}") from None
        try:
            with ServerClient(url, timeout=10.0) as client:
                while not client.healthy():
                    if proc.poll() is not None:
                        raise ServerError(
                            f"`{shlex.join(cmd)}` exited with code {proc.returncode} before {url}/health "
                            f"answered; last lines of {log_path}:\n{log_tail(log_path)}"
                        )
                    if time.monotonic() - t0 > timeout:
                        raise ServerError(
                            f"`{shlex.join(cmd)}` did not answer {url}/health within {timeout:.0f} s; "
                            f"last lines of {log_path}:\n{log_tail(log_path)}"
                        )
                    time.sleep(poll)
                info = _server_info(client)
            yield Server(url, proc, log_path, info, time.monotonic() - t0)
        finally:
            _stop(proc, stop_grace)


def transformers_serve_command(
    model_dir: str | os.PathLike, port: int, dtype: str = "auto", device: str = "auto"
) -> list[str]:
    """`transformers serve` on 127.0.0.1; `device` as eagle3lab.devices reads it (auto: CUDA when present)."""
    from eagle3lab.devices import resolve_device  # torch: only this start needs it (engine set-up checks do not)

    exe = Path(sys.executable).with_name("transformers")
    return [
        str(exe) if exe.exists() else "transformers",
        "serve",
        str(model_dir),
        "--device",
        str(resolve_device(device)),
        "--dtype",
        dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
