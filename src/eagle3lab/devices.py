"""One device setting for every command and stage: `auto` (CUDA when present, else the CPU), `cpu`, `cuda`, `cuda:N`.

Everything that takes a model also takes a device through this module, so the rule for `auto` (and for which
GPU a torchrun rank uses) lives in one place.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import time

import torch

from eagle3lab.io import InputError

DEVICE_HELP = "auto (CUDA when present, else CPU), cpu, cuda or cuda:N"


class DeviceError(InputError):
    pass


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch.device for a setting. Under torchrun, `auto`/`cuda` mean this rank's own GPU (LOCAL_RANK)."""
    if isinstance(spec, torch.device):
        return spec
    text = (spec or "auto").strip().lower()
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise DeviceError(f"device {spec!r}: expected {DEVICE_HELP}")
    if text == "cpu" or (text == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DeviceError(f"device {spec!r}: CUDA is not available on this machine (torch {torch.__version__})")
    if text in ("auto", "cuda"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    index = int(text.split(":")[1])
    if index >= torch.cuda.device_count():
        raise DeviceError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s) here")
    return torch.device(text)


@functools.cache  # read once a process: training asks at every step
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux lists them (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                (frozenset(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), frozenset()
            )
    except OSError:
        return frozenset()


def native_bf16_cpu() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX). Without it bf16 is emulated: on a 2-core
    AVX2 EPYC, torch's bf16 GEMM ran at 10 GFLOP/s against 59 in fp32, and llama.cpp regenerated at 60 tok/s from a
    bf16 GGUF against 80 from the f32 one (`eagle3lab regen bench`)."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def amx_bf16_cpu() -> bool:
    """Whether torch multiplies bf16 on AMX tiles here (oneDNN does where the VM grants them): its GEMM at the
    model's MLP shape ran at 1,380-1,524 GFLOP/s on a 2-core AMX Xeon, against 410 on an AVX-512 BF16 EPYC."""
    return "amx_bf16" in cpu_flags()


DTYPE_HELP = "auto (bfloat16 where bf16 arithmetic is native: CUDA, a CPU with AVX-512 BF16 or AMX; else float32)"


def resolve_dtype(spec: str, device: str | torch.device = "auto") -> str:
    """A model dtype setting as a torch dtype name: `auto` is bfloat16 where `device` computes bf16 natively, float32
    elsewhere (emulated bf16 cost 6x in torch's GEMM, native_bf16_cpu); any other name is returned as it is."""
    if spec != "auto":
        return spec
    native = resolve_device(device).type == "cuda" or native_bf16_cpu()
    return "bfloat16" if native else "float32"


def synchronize(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device | str) -> float:
    """perf_counter() after the device's queued work is done: the only honest timer for GPU code."""
    synchronize(device)
    return time.perf_counter()


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Mixed precision by device type (bf16/fp16 on CUDA or CPU); a null context for fp32 or None."""
    device = torch.device(device)
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def seeded_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """A seeded torch.Generator on `device` (sampling on the GPU needs a generator of the same device)."""
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed)
    return generator
