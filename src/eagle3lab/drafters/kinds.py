"""The drafter kinds by name, and the one reader of a draft's kind: its config.json's architectures, or its GGUF's
general.architecture. Nothing here imports a kind: every layer may read a kind, the doctor's torch-free reads too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Kind:
    architectures: tuple[str, ...]  # config.json architectures that mark a folder as this kind
    gguf_architecture: str  # general.architecture of the GGUF its export writes


KINDS = {
    "eagle3": Kind(("LlamaForCausalLMEagle3",), "eagle3"),
    "dflash": Kind(("DFlashDraftModel",), "dflash"),
}
# A folder that names no registered architecture is read as EAGLE-3's family: EAGLE-3 drafts under other names, and
# EAGLE-1/2 drafts, whose mistakes the EAGLE-3 kind's doctor checks know.
DEFAULT = "eagle3"


def kind_of_config(config: dict) -> str:
    """The kind a draft's config.json names."""
    names = set(config.get("architectures") or [])
    return next((name for name, kind in KINDS.items() if names & set(kind.architectures)), DEFAULT)


def kind_of_gguf(architecture: str | None) -> str:
    """The kind whose export writes this GGUF general.architecture."""
    return next((name for name, kind in KINDS.items() if kind.gguf_architecture == architecture), DEFAULT)


def kind_of(draft) -> str:
    """The kind of a draft folder (its config.json) or a draft .gguf (its header); DEFAULT when neither says."""
    path = Path(draft)
    if path.suffix == ".gguf":
        from eagle3lab.engines.llamacpp.gguf_file import read_header

        try:
            return kind_of_gguf(read_header(path).fields.get("general.architecture"))
        except (OSError, ValueError):
            return DEFAULT
    if not (path / "config.json").is_file():
        return DEFAULT
    from eagle3lab.models.checkpoint import DraftFormatError, read_json

    try:
        return kind_of_config(read_json(path / "config.json"))
    except DraftFormatError:
        return DEFAULT
