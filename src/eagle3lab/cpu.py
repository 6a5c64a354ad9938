"""This machine's CPU as Linux describes it, and the math-library setting that follows from it.

No torch here: the package sets MKL's code path as it is imported, and MKL reads it once, at its first product.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

MKL_ENV = "MKL_CBWR"


@functools.cache  # read once a process: training asks at every step
def cpu_fields(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields (vendor_id, model name, flags, ...); empty where there is no such file."""
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux lists them (empty elsewhere)."""
    return frozenset(cpu_fields().get("flags", "").split())


def cpu_model() -> str:
    """The CPU's name, for the line that says where a figure was measured."""
    return cpu_fields().get("model name") or platform.processor() or platform.machine()


def mkl_code_path(vendor: str, flags: frozenset[str]) -> str | None:
    """The MKL_CBWR value for a CPU, or None to leave MKL its own choice. On an AMD CPU with AVX2 and no AVX-512, MKL's
    default float32 kernels for a few rows are slow: the target's output layer took 22.9 ms for 2 rows against 9.1
    for one, so verifying 2 drafted tokens cost 1.72x a step and no draft paid (0.86x); on MKL's AVX2 kernels, 13.7
    ms, 1.02x a step and 1.22x (docs/hardware.md). Only the kind measured is changed."""
    if vendor == "AuthenticAMD" and "avx2" in flags and "avx512f" not in flags:
        return "AVX2"
    return None


def set_mkl_code_path() -> None:
    """Put this CPU's MKL_CBWR in the environment (child processes, the served engines, inherit it); a value already
    set is kept."""
    path = mkl_code_path(cpu_fields().get("vendor_id", ""), cpu_flags())
    if path:
        os.environ.setdefault(MKL_ENV, path)
