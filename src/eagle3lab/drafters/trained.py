"""The registry of what is asked of a trained draft, by kind: the doctor's checks of it (drafters.base.DrafterChecks)
and the tools that score, benchmark, export, tune and serve it (drafters.base.DrafterTools). drafters/__init__.py is
training's registry; this is every later layer's.

Two registries, not one, because a stage depends on every module its code may import (pipeline.stages.code_deps):
training's stage must not depend on the doctor's and the benchmark's code. The doors imported here import their
machinery inside their methods, so the torch-free doctor stays torch-free."""

from __future__ import annotations

from eagle3lab.drafters.base import DrafterChecks, DrafterTools
from eagle3lab.drafters.dflash.checks import CHECKS as DFLASH_CHECKS
from eagle3lab.drafters.dflash.tools import TOOLS as DFLASH_TOOLS
from eagle3lab.drafters.eagle3.checks import CHECKS as EAGLE3_CHECKS
from eagle3lab.drafters.eagle3.tools import TOOLS as EAGLE3_TOOLS
from eagle3lab.drafters.kinds import DEFAULT, kind_of

CHECKS = {"eagle3": EAGLE3_CHECKS, "dflash": DFLASH_CHECKS}  # a key per drafters.kinds.KINDS key (a test)
TOOLS = {"eagle3": EAGLE3_TOOLS, "dflash": DFLASH_TOOLS}  # a key per drafters.kinds.KINDS key (a test)


def checks(kind: str) -> DrafterChecks:
    return CHECKS[kind]


def checks_of(draft) -> DrafterChecks:
    """The checks of a draft folder's or GGUF's kind (drafters.kinds.kind_of)."""
    return checks(kind_of(draft))


def named_by(launch) -> DrafterChecks:
    """The kind whose name a launch line asks its engine for (its method, spec type or algorithm); EAGLE-3's family
    when none does."""
    return next((kind for kind in CHECKS.values() if kind.names_this_kind(launch)), CHECKS[DEFAULT])


def tools(kind: str) -> DrafterTools:
    return TOOLS[kind]


def tools_of(draft) -> DrafterTools:
    """The tools of a draft folder's or GGUF's kind (drafters.kinds.kind_of)."""
    return tools(kind_of(draft))
