"""Start a model server as a child process, wait until GET /health answers, and stop its whole process group after:
SGLang on GPUs, `transformers serve` (a real OpenAI-compatible server, also on a CPU) for tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
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

from eagle3lab.devices import resolve_device
from eagle3lab.serving.client import ServerClient, ServerError


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


@dataclass
class Server:
    url: str
    process: subprocess.Popen
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
    poll: float = 0.5,
    stop_grace: float = 30.0,
    env: dict | None = None,
):
    """Start `cmd` in its own process group with its output streamed to `log_path` (a temp file by default), wait
    until GET url/health answers 200, yield a `Server`, and kill the process group on exit."""
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
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
            )
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
