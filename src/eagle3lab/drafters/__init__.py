"""Drafter kinds behind one interface (drafters.base): EAGLE-3 (drafters/eagle3/) and the DFlash block drafter
(drafters/dflash/). drafters.kinds names them and reads a draft's kind; two registries import
them: this one for training (`drafter`), drafters.trained for every later layer (the doctor's checks; acceptance,
bench, export, tune and serving).
The shared machinery asks these registries and never names a kind; a new kind is a folder, a line in drafters.kinds
and one in each registry.

Two registries, because a stage depends on every module its code may import, function-level imports
included (pipeline.stages.code_deps): training's stage does not depend on the doctor's or the benchmark's code, and no
registry imports the layer that calls it. Each registry imports its kinds' doors by name; each door imports its
machinery inside its methods, so nothing here imports torch."""

from __future__ import annotations

from eagle3lab.drafters import eagle3
from eagle3lab.drafters.base import Drafter
from eagle3lab.drafters.dflash import kind as dflash
from eagle3lab.drafters.kinds import DEFAULT, KINDS, kind_of

DRAFTERS = {"eagle3": eagle3.DRAFTER, "dflash": dflash.DRAFTER}  # a key per drafters.kinds.KINDS key (a test)
__all__ = ["DEFAULT", "KINDS", "drafter", "drafter_of"]


def drafter(kind: str) -> Drafter:
    """The training side of a kind, by name."""
    if kind not in DRAFTERS:
        from eagle3lab.io import InputError

        raise InputError(f"drafter {kind!r}: one of {', '.join(DRAFTERS)}")
    return DRAFTERS[kind]


def drafter_of(draft) -> Drafter:
    """The training side of a draft folder's or GGUF's kind (drafters.kinds.kind_of)."""
    return drafter(kind_of(draft))
