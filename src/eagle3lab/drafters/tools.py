"""The registry of the drafter kinds' tools (drafters.base.DrafterTools: export, tune, llama.cpp serving), the
benchmark layer's part of the interface (drafters/__init__.py holds training's, drafters.checks the doctor's)."""

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
