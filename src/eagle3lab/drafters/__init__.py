"""Drafter kinds behind one interface (drafters.base): EAGLE-3 (drafters/eagle3/) and the DFlash block drafter
(drafters/dflash/). drafters.kinds names them and reads a draft's kind. Two registries import the kinds' doors: this
one, what a kind is and how its artifact is checked (`drafter`: its trainer; `checks`: the doctor's facts), and
drafters.tools, what the later layers do with a trained draft (acceptance, bench, generate, export, tune, serving).
The shared machinery asks these registries and never names a kind; a new kind is a folder, a line in drafters.kinds
and one in each registry's tables.

Why two: a registry reaches every layer its doors serve, so the doctor, which the benchmark layer runs on tuned
flags, must not ask the registry that reaches the benchmark layer (an import circle; tests/test_repo.py). Each door
imports its machinery inside its methods, so nothing here imports torch (the doctor's static checks stay
torch-free)."""

from __future__ import annotations

from eagle3lab.drafters import eagle3
from eagle3lab.drafters.base import Drafter, DrafterChecks
from eagle3lab.drafters.dflash import kind as dflash
from eagle3lab.drafters.dflash.checks import CHECKS as DFLASH_CHECKS
from eagle3lab.drafters.eagle3.checks import CHECKS as EAGLE3_CHECKS
from eagle3lab.drafters.kinds import DEFAULT, KINDS, kind_of

# a key per drafters.kinds.KINDS key in each (a test)
DRAFTERS = {"eagle3": eagle3.DRAFTER, "dflash": dflash.DRAFTER}
CHECKS = {"eagle3": EAGLE3_CHECKS, "dflash": DFLASH_CHECKS}
__all__ = ["DEFAULT", "KINDS", "checks", "checks_of", "drafter", "drafter_of", "named_by"]


def drafter(kind: str) -> Drafter:
    """The training side of a kind, by name."""
    if kind not in DRAFTERS:
        from eagle3lab.io import InputError

        raise InputError(f"drafter {kind!r}: one of {', '.join(DRAFTERS)}")
    return DRAFTERS[kind]


def drafter_of(draft) -> Drafter:
    """The training side of a draft folder's or GGUF's kind (drafters.kinds.kind_of)."""
    return drafter(kind_of(draft))


def checks(kind: str) -> DrafterChecks:
    return CHECKS[kind]


def checks_of(draft) -> DrafterChecks:
    """The doctor's facts of a draft folder's or GGUF's kind (drafters.kinds.kind_of)."""
    return checks(kind_of(draft))


def named_by(launch) -> DrafterChecks:
    """The kind whose name a launch line asks its engine for (its method, spec type or algorithm); EAGLE-3's family
    when none does."""
    return next((kind for kind in CHECKS.values() if kind.names_this_kind(launch)), CHECKS[DEFAULT])
