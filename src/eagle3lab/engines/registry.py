"""The engines, one line each. Adding an engine: one folder with its `ENTRY`, and one line here."""

from __future__ import annotations

from eagle3lab.engines.base import Engine, EngineEntry, EngineMissing
from eagle3lab.engines.llamacpp.entry import ENTRY as LLAMACPP
from eagle3lab.engines.sglang.entry import ENTRY as SGLANG
from eagle3lab.engines.vllm.entry import ENTRY as VLLM

# SGLang last: its launch-line reader takes any line (the doctor reads and probes in this order)
ENGINES: dict[str, EngineEntry] = {e.name: e for e in (VLLM, LLAMACPP, SGLANG)}
SERVED = {name: e for name, e in ENGINES.items() if e.server is not None}  # the engines that run on this machine
SERVED_TITLES = {name: e.title for name, e in SERVED.items()}


def entry_for_launch(argv: list[str]) -> EngineEntry:
    """The engine whose launch line this is."""
    return next(e for e in ENGINES.values() if e.reads(argv))


def served_engine(name: str, **settings) -> Engine:
    """A served engine by name with its settings, or EngineMissing naming the ones there are."""
    if name not in SERVED:
        raise EngineMissing(f"engine {name!r}: not one this machine serves ({', '.join(SERVED)})")
    return SERVED[name].server(**settings)
