"""A DFlash draft as a GGUF for llama.cpp: the pinned tree's own converter (`--target-model-dir`, its DFlashModel
class), then the file checked against the draft's config and the target's GGUF, field by field, for the traps that
load without an error: layer ids off by one, a missing block size (llama.cpp then drafts blocks of 16) or mask token
(it then drafts nothing), a causal block, a width other than the target's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eagle3lab.dflash.config import DFlashConfig
from eagle3lab.engines.llamacpp.gguf import default_output, gguf_facts, run_converter
from eagle3lab.engines.llamacpp.gguf_file import read_header
from eagle3lab.io import InputError

ARCH = "dflash"


def gguf_mismatches(path: Path, config: DFlashConfig, target: dict) -> list[str]:
    """What the exported GGUF says that the draft was not trained as (empty: it serves as trained)."""
    fields = read_header(path).fields
    wanted = {
        "general.architecture": ARCH,
        f"{ARCH}.target_layers": [i + 1 for i in config.target_layer_ids],  # GGUF ids: a layer's input
        f"{ARCH}.block_size": config.block_size,
        "tokenizer.ggml.mask_token_id": config.mask_token_id,
        f"{ARCH}.embedding_length": target["embedding_length"],
    }
    problems = [f"{path}: {k} is {fields.get(k)!r}, expected {v!r}" for k, v in wanted.items() if fields.get(k) != v]
    if fields.get(f"{ARCH}.attention.causal"):
        problems.append(f"{path}: {ARCH}.attention.causal is true: the block would not attend both ways")
    return problems


def export_dflash_gguf(draft: str | os.PathLike, target_spec: str, out: str | os.PathLike | None = None) -> Path:
    """Convert a DFlash draft folder (z-lab layout) to a GGUF for `target_spec`; checked, written to a temporary
    name and renamed, so a killed or failed export leaves nothing a server would load."""
    from eagle3lab.models.target import embedded_gguf, resolve

    if not (Path(draft) / "config.json").is_file():
        raise InputError(f"DFlash draft {draft}: no config.json (python -m eagle3lab.dflash train writes the folder)")
    config = DFlashConfig.from_hf(json.loads((Path(draft) / "config.json").read_text()), f"{draft}/config.json")
    out = Path(out) if out else default_output(draft)
    partial = out.with_name(out.name + ".partial")
    args = [draft, "--target-model-dir", resolve(target_spec), "--outtype", "bf16", "--outfile", partial]
    try:
        run_converter(args, f"DFlash draft {draft}")
        problems = gguf_mismatches(partial, config, gguf_facts(embedded_gguf(target_spec)))
    except InputError:
        partial.unlink(missing_ok=True)
        raise
    if problems:
        partial.unlink()
        raise InputError("\n".join(problems))
    partial.replace(out)
    return out
