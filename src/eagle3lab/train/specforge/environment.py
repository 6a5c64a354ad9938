"""SpecForge's pinned environment. The `specforge` wheel pins transformers 5.8.1 (ours is 5.24), torch 2.11 and
SGLang, so its trainer runs from its own virtual environment, built once by `make specforge` into the per-user cache:
the torch of our own environment (the CPU build here), `specforge` without its dependencies, and what its offline
trainer imports. SGLang, triton, wandb, yunchang and flash-attn serve online capture, GPU kernels and tracking only.

    python -m eagle3lab.train.specforge.environment setup   # build the environment (idempotent)
    python -m eagle3lab.train.specforge.environment where   # print its python, or how to get it
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from importlib.metadata import version
from pathlib import Path

from eagle3lab.environments import setup_or_where
from eagle3lab.io import InputError, command
from eagle3lab.paths import cache_dir
from eagle3lab.serving.processes import run_step

SPECFORGE = "specforge==0.2.0"
REQUIREMENTS = (
    "transformers==5.8.1",  # the wheel's own pin
    "tokenizers==0.22.2",  # these two: what pip resolves for transformers 5.8.1
    "huggingface-hub==1.33.0",
    "datasets==5.2.0",
    "accelerate==1.15.0",
    "safetensors==0.8.0",
    "pydantic==2.14.4",
    "pyyaml==6.0.4",
    "tqdm==4.70.1",
    "numpy==2.4.6",
    "psutil==7.2.2",
)
READY = ".eagle3lab-ready"  # written last: an environment without it is half-built and gets rebuilt
SETUP_HINT = "run `make specforge` (or `python -m eagle3lab.train.specforge.environment setup`)"
SHIM = Path(__file__).with_name("cpu_shim.py")  # SpecForge's entry point here, with the CPU workarounds


class EnvironmentMissing(InputError):
    """SpecForge's environment is not there; the message names the command that builds it."""


def torch_requirement() -> str:
    """The torch of our own environment (the Makefile's TORCH_SPEC), so pip takes the same build, not a CUDA one."""
    return f"torch=={version('torch').split('+')[0]}"


def pins() -> list[str]:
    return [SPECFORGE, torch_requirement(), *REQUIREMENTS]


def env_dir() -> Path:
    return cache_dir() / "trainers" / SPECFORGE.replace("==", "-")


def python_path() -> Path:
    """The environment's python, or EnvironmentMissing naming the command that builds it."""
    ready = env_dir() / READY
    if not ready.exists() or ready.read_text().split() != pins():
        raise EnvironmentMissing(f"SpecForge ({SPECFORGE}) is not set up in {env_dir()}: {SETUP_HINT}")
    return env_dir() / "bin" / "python"


def shim_command(*args) -> list[str]:
    """`python -P cpu_shim.py ARGS` in the environment (-P: the shim's folder, ours, stays off sys.path)."""
    return [str(python_path()), "-P", str(SHIM), *map(str, args)]


def _run(cmd: list, what: str) -> None:
    code, tail = run_step(cmd, f"SpecForge setup: {what}")
    if code:
        raise EnvironmentMissing(f"SpecForge setup: {what} failed (exit {code}):\n{tail}")


def setup() -> Path:
    """Build the environment once; a ready one is kept, a half-built or outdated one is rebuilt."""
    env = env_dir()
    with contextlib.suppress(EnvironmentMissing):
        return python_path()
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    python = env / "bin" / "python"
    _run([sys.executable, "-m", "venv", env], "creating the virtual environment")
    pip = [python, "-m", "pip", "install", "--progress-bar", "off"]  # a line per package
    _run(pip + ["--upgrade", "pip"], "upgrading pip")
    _run(pip + [torch_requirement()], f"installing {torch_requirement()}")
    _run(pip + ["--no-deps", SPECFORGE], f"installing {SPECFORGE} without its dependencies")
    _run(pip + list(REQUIREMENTS), "installing what its offline trainer imports")
    _run([python, "-P", SHIM, "check"], "importing its offline trainer with the CPU workarounds")
    (env / READY).write_text(" ".join(pins()) + "\n")
    return python


@command("eagle3lab specforge")
def main(argv: list[str] | None = None) -> int:
    prog = "python -m eagle3lab.train.specforge.environment"
    return setup_or_where(prog, __doc__.splitlines()[0], setup, python_path, argv)


if __name__ == "__main__":
    sys.exit(main())
