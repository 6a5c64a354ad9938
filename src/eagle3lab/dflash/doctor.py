"""The doctor's rules for a DFlash draft, run instead of EAGLE-3's (docs/dflash.md, the format and its silent traps):
the config as the engine reads it (the folder's config.json; for llama.cpp the GGUF's header) refused for the traps
DFlashConfig.from_hf knows, its width, vocabulary and layers against the target, the method that runs it, and the
draft length, k = block_size - 1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from eagle3lab.dflash.config import ARCHITECTURE, DFlashConfig
from eagle3lab.dflash.export import GGUF_KEYS, gguf_config, trained_mismatches
from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch, fix_flags
from eagle3lab.models.checkpoint import DraftFormatError

# the method that runs a DFlash draft, as each engine's launch reader names it (Launch.algorithm)
METHODS = {"vllm": "DFLASH", "llamacpp": "DRAFT-DFLASH", "sglang": "DFLASH"}
EXPORT_FIX = "export the folder again: python -m eagle3lab.dflash export DRAFT_FOLDER --target TARGET (checked)"
RETRAIN_FIX = (
    "serve the draft with the target it was trained for, or train one for this one (python -m eagle3lab.dflash train)"
)


def check_dflash(
    launch: Launch | None, draft: DraftInfo | None, target: TargetInfo | None, gguf: str | None = None
) -> list[Finding]:
    """Every DFlash rule the inputs allow. `draft`: the draft folder; `gguf`: the draft GGUF llama.cpp serves, whose
    header is then what is checked (the folder, when given, says what it was trained as)."""
    source = Path(gguf) if gguf else draft.path / "config.json"
    config, findings = _served_config(draft, gguf, source)
    if config is not None and target is not None:
        findings += _against_target(config, target, source)
    if launch is not None:
        findings += _method(launch, source)
        if config is not None:
            findings += _draft_length(launch, config)
    return findings


def _refused(source: Path, error: DraftFormatError, fix: str) -> Finding:
    ev = [str(error), "DFlashConfig.from_hf refuses what vLLM and llama.cpp load without an error (docs/dflash.md)"]
    if source.suffix == ".gguf":
        ev.append("llama.cpp reads " + ", ".join(f"{name} from {key}" for name, key in GGUF_KEYS.items()))
    return Finding("dflash_config", ERROR, str(error).removeprefix(f"{source}: "), ev, fix=fix)


def _served_config(
    draft: DraftInfo | None, gguf: str | None, source: Path
) -> tuple[DFlashConfig | None, list[Finding]]:
    """The config the engine serves (None: refused), and the findings on reading it and on the GGUF against the
    folder it was exported from."""
    folder = draft if draft is not None and draft.kind == "dflash" else None
    try:
        trained = DFlashConfig.from_hf(folder.config, str(folder.path / "config.json")) if folder else None
    except DraftFormatError as e:
        return None, [_refused(folder.path / "config.json", e, _folder_fix(folder))]
    findings = [] if folder is None or gguf or "block_size" in folder.config else [_block_size_nested(folder)]
    try:
        config = gguf_config(source) if gguf else trained
    except DraftFormatError as e:
        return None, [*findings, _refused(source, e, EXPORT_FIX)]
    if gguf and trained:
        findings += _against_folder(source, config, trained, folder)
    summary = (
        f"block_size {config.block_size} ({config.drafted} drafted), mask_token_id {config.mask_token_id}, "
        f"target_layer_ids {config.target_layer_ids}, hidden {config.hidden_size}, vocab {config.vocab_size}"
    )
    ok = Finding("dflash_config", OK, "the DFlash config has none of the format's traps", [f"{source}: {summary}"])
    return config, [*findings, ok]


def _against_folder(source: Path, served: DFlashConfig, trained: DFlashConfig, folder: DraftInfo) -> list[Finding]:
    wrong = trained_mismatches(source, served, trained)
    if not wrong:
        fields = ", ".join(GGUF_KEYS.values())
        return [Finding("gguf", OK, f"the GGUF serves what {folder.path} was trained as", [f"{source}: {fields}"])]
    return [Finding("gguf", ERROR, w.removeprefix(f"{source}: "), [w], fix=EXPORT_FIX) for w in wrong]


def _folder_fix(folder: DraftInfo) -> str:
    """The field to write, for the traps a config.json can be mended in."""
    cfg, path = folder.config, folder.path / "config.json"
    nested = cfg.get("dflash_config") or {}
    if cfg.get("is_causal") or nested.get("causal"):
        return f'"is_causal": false in {path} (and no dflash_config.causal): the block attends both ways'
    if cfg.get("block_size", nested.get("block_size")) is None:
        return f'"block_size": BLOCK at the top level of {path}: the block size the draft was trained with'
    if "mask_token_id" not in nested:
        return f'"dflash_config": {{"mask_token_id": ID}} in {path}: the token the draft was trained with'
    return f"{path}: each field as the draft was trained (python -m eagle3lab.dflash train writes one that passes)"


def _block_size_nested(folder: DraftInfo) -> Finding:
    """from_hf takes dflash_config's block_size; llama.cpp's converter reads only the top-level one."""
    path, block = folder.path / "config.json", folder.config["dflash_config"]["block_size"]
    return Finding(
        "dflash_config",
        WARNING,
        "block_size only inside dflash_config: llama.cpp's converter reads it only at the top level",
        [f"{path}: no top-level block_size", "a GGUF converted from it drafts blocks of 16, without a warning"],
        fix=f'"block_size": {block} at the top level of {path}',
    )


def _against_target(config: DFlashConfig, target: TargetInfo, source: Path) -> list[Finding]:
    """The draft fuses the target's states at the target's width and drafts with its embedding and head."""
    ev = [
        f"{source}: hidden {config.hidden_size}, vocab {config.vocab_size}, target_layer_ids {config.target_layer_ids}",
        f"target {target.source}: {target.num_layers} layers, hidden {target.hidden_size}, vocab {target.vocab_size}",
    ]
    wrong = []
    if config.hidden_size != target.hidden_size:
        wrong.append(f"the draft is {config.hidden_size} wide, the target {target.hidden_size}")
    if target.vocab_size is not None and config.vocab_size != target.vocab_size:
        wrong.append(f"vocab_size {config.vocab_size} != the target's {target.vocab_size}")
    try:  # the format's one rule for the layers (config.py), against this target's depth
        replace(config, num_target_layers=target.num_layers).checked(str(source))
    except DraftFormatError as e:
        last = target.num_layers - 1 in config.target_layer_ids
        why = "llama.cpp captures no output of the last layer (an assert at load)" if last else "no such target layer"
        wrong.append(f"{str(e).removeprefix(f'{source}: ')}: {why}")
    if not wrong:
        return [Finding("dflash_target", OK, "the draft fits the target: width, vocabulary and layers", ev)]
    return [Finding("dflash_target", ERROR, w, ev, fix=RETRAIN_FIX) for w in wrong]


def _method(launch: Launch, source: Path) -> list[Finding]:
    right = METHODS[launch.engine]
    ev = [f"{launch.source}: {launch.describe('algorithm')}", f"draft {source}: a DFlash draft ({ARCHITECTURE})"]
    if launch.algorithm == right:
        return [Finding("algorithm", OK, f"DFlash draft served with {right}", ev)]
    if launch.algorithm is None and source.suffix == ".gguf":
        why = "llama.cpp infers draft-dflash from the GGUF's general.architecture when no --spec-type is given"
        return [Finding("algorithm", OK, "no --spec-type: llama.cpp runs the GGUF as DFlash", [*ev, why])]
    why = [f"only the {right.lower()} method drafts a block of mask tokens in one pass from the target's states"]
    if launch.algorithm == "EAGLE3" and source.suffix == ".gguf":
        why.append("draft-eagle3 loads a DFlash GGUF and drafts nothing, without a complaint")
    title = f"{launch.describe('algorithm')}: the DFlash draft is not run as DFlash"
    return [Finding("algorithm", ERROR, title, ev + why, fix=fix_flags(launch, algorithm=right))]


def _draft_length(launch: Launch, config: DFlashConfig) -> list[Finding]:
    """k should be block_size - 1: the block (anchor + k mask slots) attends both ways, so another length is not the
    block the draft was trained on, and no engine says so. A k below it written on the line is a truncated block,
    a shape `tune` may choose (a warning); a default or a longer block is an error."""
    if launch.engine == "sglang":
        return []  # SGLang's DFlash block flags are not read here
    # llama.cpp drafts --spec-draft-n-max tokens (3 by default) also when it infers the type from the GGUF
    k = launch.num_steps if launch.speculative else (launch.spec_config or {}).get("n_max")
    want = config.drafted
    ev = [
        f"{launch.source}: {launch.describe('num_steps')}",
        f"block_size {config.block_size}: anchor + {want} drafted",
    ]
    if k == want:
        return [Finding("spec_params", OK, f"the draft length {k} is block_size - 1", ev)]
    fix = fix_flags(launch, num_steps=want)
    if k is None:  # vLLM's: llama.cpp always has one
        why = "vLLM refuses to start without it: a DFlash config has no n_predict to fall back on"
        title = f"no draft length: {launch.flag('num_steps')} is missing"
        return [Finding("spec_params", ERROR, title, [*ev, why], fix=fix)]
    if k > want and launch.engine == "llamacpp":
        why = f"llama.cpp clamps it to {want} and says so in its log only"
        return [Finding("spec_params", WARNING, f"draft length {k} > block_size - 1 = {want}", [*ev, why], fix=fix)]
    if 1 <= k < want and "default" not in ev[0]:  # written on the line: a shape `tune` may choose, not a default
        why = (
            f"the engine drafts a truncated block, the anchor and {k} masks, not the whole block it was trained on: "
            f"its acceptance is the truncated block's (`python -m eagle3lab.dflash acceptance --ks {k}`), which "
            "`python -m eagle3lab.dflash tune` measures and may choose"
        )
        return [Finding("spec_params", WARNING, f"draft length {k} < block_size - 1 = {want}", [*ev, why], fix=fix)]
    why = (
        f"the engine drafts a block of {k} + 1 slots and every slot attends to the whole block: "
        "not the block the draft was trained on, and no warning says so"
    )
    return [Finding("spec_params", ERROR, f"draft length {k} != block_size - 1 = {want}", [*ev, why], fix=fix)]
