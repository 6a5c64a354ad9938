"""The registry of the drafter kinds' facts for the doctor (drafters.base.DrafterChecks), the doctor layer's part of
the interface (drafters/__init__.py holds training's, drafters.tools the benchmark layer's)."""

from __future__ import annotations

from eagle3lab.drafters.base import DrafterChecks
from eagle3lab.drafters.dflash.checks import CHECKS as DFLASH
from eagle3lab.drafters.eagle3.checks import CHECKS as EAGLE3
from eagle3lab.drafters.kinds import DEFAULT, kind_of

CHECKS = {"eagle3": EAGLE3, "dflash": DFLASH}  # a key per drafters.kinds.KINDS key (a test)


def checks(kind: str) -> DrafterChecks:
    return CHECKS[kind]


def checks_of(draft) -> DrafterChecks:
    """The checks of a draft folder's or GGUF's kind (drafters.kinds.kind_of)."""
    return checks(kind_of(draft))


def named_by(launch) -> DrafterChecks:
    """The kind whose name a launch line asks its engine for (its method, spec type or algorithm); EAGLE-3's family
    when none does."""
    return next((kind for kind in CHECKS.values() if kind.names_this_kind(launch)), CHECKS[DEFAULT])
