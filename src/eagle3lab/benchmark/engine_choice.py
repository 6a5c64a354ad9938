"""Which engine a benchmark or tune runs in: `local` (our own engine, in-process) or a served engine from the
registry, with the settings its launch line takes from the benchmark's."""

from __future__ import annotations

from eagle3lab.devices import resolve_device
from eagle3lab.engines.base import Engine
from eagle3lab.engines.registry import SERVED_TITLES, served_engine
from eagle3lab.io import InputError
from eagle3lab.options import option

ENGINES = ("local", *SERVED_TITLES)


def engine_option(local_help: str, served_help: str):
    """The `engine` field of BenchSettings and TuneSettings: which engine, and what each kind does there."""
    return option("local", f"local ({local_help}), vllm or llamacpp ({served_help})", choices=ENGINES)


def eager_option():
    """The `eager` field of BenchSettings and TuneSettings (vLLM's compile mode)."""
    return option(False, "vllm: --enforce-eager instead of vLLM's default inductor compile")


def make_engine(settings) -> Engine:
    """The engine `settings.engine` names, with the benchmark's dtype and compile mode (vLLM) or target (llama.cpp:
    its GGUF is the wheel's own, so dtype does not apply)."""
    if settings.engine == "vllm":
        device = resolve_device(settings.device).type
        return served_engine("vllm", dtype=settings.dtype, compile=not settings.eager, device=device)
    if settings.engine == "llamacpp":
        return served_engine("llamacpp", target_spec=settings.target)
    raise InputError(f"--engine: expected one of {', '.join(ENGINES)}, got {settings.engine!r}")
