"""The registry of the drafter kinds' tools (drafters.base.DrafterTools): what the later layers do with a trained
draft, scoring it offline, benchmarking and decoding with it, exporting, tuning and serving it. drafters/__init__.py
is the other registry: what a kind is (its trainer) and how its artifact is checked (the doctor's facts).

Two registries, because a registry imports every kind's door and each door reaches the layer it serves: the doctor
asks the first and the benchmark layer (which runs the doctor on tuned flags) the second, so neither import runs in a
circle. The doors import their machinery inside their methods: nothing here imports torch."""

from __future__ import annotations

from eagle3lab.drafters.base import DrafterTools
from eagle3lab.drafters.dflash.tools import TOOLS as DFLASH
from eagle3lab.drafters.eagle3.tools import TOOLS as EAGLE3
from eagle3lab.drafters.kinds import kind_of

TOOLS = {"eagle3": EAGLE3, "dflash": DFLASH}  # a key per drafters.kinds.KINDS key (a test)


def tools(kind: str) -> DrafterTools:
    return TOOLS[kind]


def tools_of(draft) -> DrafterTools:
    """The tools of a draft folder's or GGUF's kind (drafters.kinds.kind_of)."""
    return tools(kind_of(draft))
