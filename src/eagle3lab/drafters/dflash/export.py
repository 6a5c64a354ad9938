"""A DFlash draft as a GGUF for llama.cpp: the pinned tree's own converter (`--target-model-dir`, its DFlashModel
class), then the file checked against the draft's config and the target's GGUF, field by field, for the traps that
load without an error: layer ids off by one, a block size other than the folder's, a missing mask token (it then
drafts nothing), a causal block, a width other than the target's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eagle3lab.drafters.dflash.config import ARCHITECTURE, DFlashConfig
from eagle3lab.engines.llamacpp.gguf import default_output, gguf_facts, run_converter
from eagle3lab.engines.llamacpp.gguf_file import read_header
from eagle3lab.io import InputError
from eagle3lab.models.checkpoint import DraftFormatError

ARCH = "dflash"
# config.json's fields as the GGUF holds them for llama.cpp: the one map the export's check and the doctor read
GGUF_KEYS = {
    "hidden_size": f"{ARCH}.embedding_length",
    "block_size": f"{ARCH}.block_size",
    "target_layer_ids": f"{ARCH}.target_layers",  # each + 1: GGUF ids count a layer's input
    "mask_token_id": "tokenizer.ggml.mask_token_id",
}
# the rest of what from_hf reads, by GGUF key
_OTHER_KEYS = {
    "is_causal": f"{ARCH}.attention.causal",
    "intermediate_size": f"{ARCH}.feed_forward_length",
    "num_attention_heads": f"{ARCH}.attention.head_count",
    "num_key_value_heads": f"{ARCH}.attention.head_count_kv",
    "head_dim": f"{ARCH}.attention.key_length",
    "num_hidden_layers": f"{ARCH}.block_count",
    "max_position_embeddings": f"{ARCH}.context_length",
    "rms_norm_eps": f"{ARCH}.attention.layer_norm_rms_epsilon",
    "rope_theta": f"{ARCH}.rope.freq_base",
}


def gguf_config(path: Path, num_target_layers: int | None = None) -> DFlashConfig:
    """The DFlash config llama.cpp serves a GGUF as, refused for the traps a config.json is (DFlashConfig.from_hf):
    no block size (llama.cpp then takes 16), no mask token, a causal block, ids past the last but one layer
    of a `num_target_layers`-layer target (None: the GGUF does not say, so ids are not bounded here)."""
    header = read_header(path)
    fields = header.fields
    if fields.get("general.architecture") != ARCH:
        raise DraftFormatError(f"{path}: general.architecture {fields.get('general.architecture')!r}, not {ARCH!r}")
    cfg = {name: fields[key] for name, key in {**GGUF_KEYS, **_OTHER_KEYS}.items() if key in fields}
    dflash = {name: cfg.pop(name) for name in ("target_layer_ids", "mask_token_id") if name in cfg}
    if "target_layer_ids" in dflash:
        dflash["target_layer_ids"] = [i - 1 for i in dflash["target_layer_ids"]]
    cfg["architectures"], cfg["dflash_config"] = [ARCHITECTURE], dflash
    cfg["vocab_size"] = fields.get(f"{ARCH}.vocab_size") or header.lengths.get("tokenizer.ggml.tokens")
    cfg["num_target_layers"] = num_target_layers or max(dflash.get("target_layer_ids", []), default=0) + 2
    return DFlashConfig.from_hf({k: v for k, v in cfg.items() if v is not None}, str(path))


def trained_mismatches(path: Path, served: DFlashConfig, trained: DFlashConfig) -> list[str]:
    """Where the GGUF serves (gguf_config) other values than the draft folder was trained with."""
    return [
        f"{path}: {key} serves {name} {getattr(served, name)!r}, the draft was trained with {getattr(trained, name)!r}"
        for name, key in GGUF_KEYS.items()
        if getattr(served, name) != getattr(trained, name)
    ]


def gguf_mismatches(path: Path, config: DFlashConfig, target: dict) -> list[str]:
    """What the exported GGUF says that the draft was not trained as, or that does not fit the target GGUF
    (gguf_facts); empty: it serves as trained."""
    try:
        served = gguf_config(path, config.num_target_layers)
    except DraftFormatError as e:
        return [str(e)]
    problems = trained_mismatches(path, served, config)
    if served.hidden_size != target["embedding_length"]:
        problems.append(
            f"{path}: {GGUF_KEYS['hidden_size']} {served.hidden_size} != the target's {target['embedding_length']}"
        )
    return problems


def export_dflash_gguf(draft: str | os.PathLike, target_spec: str, out: str | os.PathLike | None = None) -> Path:
    """Convert a DFlash draft folder (z-lab layout) to a GGUF for `target_spec`; checked, written to a temporary
    name and renamed, so a killed or failed export leaves nothing a server would load."""
    from eagle3lab.models.target import embedded_gguf, resolve

    if not (Path(draft) / "config.json").is_file():
        raise InputError(f"DFlash draft {draft}: no config.json (eagle3lab train --drafter dflash writes the folder)")
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
