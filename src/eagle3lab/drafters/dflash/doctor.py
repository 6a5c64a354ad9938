"""The doctor's rules for a DFlash draft, run instead of EAGLE-3's (docs/dflash.md, the format and its silent traps):
the config as the engine reads it (the folder's config.json; for llama.cpp the GGUF's header) refused for the traps
DFlashConfig.from_hf knows, its width, vocabulary and layers against the target, the method that runs it, and the
draft length, k = block_size - 1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch, fix_flags
from eagle3lab.drafters.dflash.config import ARCHITECTURE, DFlashConfig, default_target_layers
from eagle3lab.drafters.dflash.export import GGUF_KEYS, gguf_config, trained_mismatches
from eagle3lab.models.checkpoint import DraftFormatError

# the method that runs a DFlash draft, as each engine's launch reader names it (Launch.algorithm)
METHODS = {"vllm": "DFLASH", "llamacpp": "DRAFT-DFLASH", "sglang": "DFLASH"}
EXPORT_FIX = "export the folder again: eagle3lab export DRAFT_FOLDER --target TARGET (checked)"
RETRAIN_FIX = (
    "serve the draft with the target it was trained for, or train one for this one (eagle3lab train --drafter dflash)"
)
# what the runtime judgment (doctor.probe.judge_accept_length) says of a DFlash draft, from the traps measured on
# real servers (docs/doctor.md, DFlash drafts)
DFLASH_CAUSES = (
    "usual causes for a DFlash draft: a mask_token_id other than the one it was trained with, a method other than "
    'DFlash (vLLM without "method" runs it as a plain draft model), or a draft for another target'
)
VLLM_NO_AUX = (
    "vLLM hands the draft the target's final state instead of the fused layers: /health answers, and the first "
    "request fails an assertion in the proposer (HTTP 500, engine dead)"
)
DFLASH_WEAK = [
    "a DFlash draft gains mostly from its first slot: the committed drafts/smollm2-dflash-2200 accepts 1.07 (vLLM) "
    "and 1.10 (llama.cpp) on these probes, 1.17 offline",
    "traps that leave the first slot alone serve as much as the intact draft (target layers off by one, a causal "
    "block, a draft length other than block_size - 1): this accept length cannot tell them apart; the checks before "
    "launch do",
]


def check_dflash(
    launch: Launch | None, draft: DraftInfo | None, target: TargetInfo | None, gguf: str | None = None
) -> list[Finding]:
    """Every DFlash rule the inputs allow. `draft`: the draft folder; `gguf`: the draft GGUF llama.cpp serves, whose
    header is then what is checked (the folder, when given, says what it was trained as)."""
    source = Path(gguf) if gguf else draft.path / "config.json"
    config, findings = _served_config(draft, gguf, source)
    if config is not None and target is not None:
        findings += _against_target(config, target, source) + _unlikely(config, target, source)
    if draft is not None and draft.kind == "dflash" and not gguf:
        findings += _vllm_reads(draft)
    if launch is not None:
        findings += _method(launch, source)
        if config is not None:
            findings += _draft_length(launch, config)
    return findings


def dflash_method_fix(launch: Launch | None) -> str | None:
    """The launch line with the engine's DFlash method, when it names another (None: it is right, or unknown)."""
    if launch is None or launch.engine not in METHODS or launch.algorithm == METHODS[launch.engine]:
        return None
    if launch.algorithm is None and launch.engine == "llamacpp":
        return None  # llama.cpp infers draft-dflash from the GGUF
    return fix_flags(launch, algorithm=METHODS[launch.engine])


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
    try:
        config = gguf_config(source) if gguf else trained
    except DraftFormatError as e:
        return None, [_refused(source, e, EXPORT_FIX)]
    findings = _against_folder(source, config, trained, folder) if gguf and trained else []
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
    blocks = {cfg.get("block_size"), nested.get("block_size")} - {None}
    if len(blocks) != 1:  # none, or two that differ
        return (
            f'"block_size": BLOCK at the top level and in dflash_config of {path}: the block the draft was trained on'
        )
    if "mask_token_id" not in nested:
        return f'"dflash_config": {{"mask_token_id": ID}} in {path}: the token the draft was trained with'
    return f"{path}: each field as the draft was trained (eagle3lab train --drafter dflash writes one that passes)"


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


def _unlikely(config: DFlashConfig, target: TargetInfo, source: Path) -> list[Finding]:
    """Values that load and serve, yet are probably not what the draft was trained with (warnings: the config is the
    only record of training): layer ids one off the defaults, a mask token the target's own text uses."""
    findings = []
    defaults = default_target_layers(target.num_layers)
    ids = config.target_layer_ids
    if ids != defaults and ids in ([i + 1 for i in defaults], [i - 1 for i in defaults]):
        findings.append(
            Finding(
                "dflash_config",
                WARNING,
                f"target_layer_ids {ids} are the default layers {defaults} shifted by one",
                [
                    f"{source}: target_layer_ids {ids}",
                    "DFlash ids count layer outputs (id i = HF hidden_states[i + 1]); the engines add the 1 themselves",
                    "a draft trained on the defaults then fuses each neighbouring layer's state, without an error",
                ],
                fix=f"target_layer_ids {defaults} in dflash_config, if the draft was trained on the default layers",
            )
        )
    special = {k: target.config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")}
    names = [k for k, v in special.items() if v == config.mask_token_id]
    if names:
        findings.append(
            Finding(
                "dflash_config",
                WARNING,
                f"mask_token_id {config.mask_token_id} is the target's {', '.join(names)}",
                [
                    f"{source}: mask_token_id {config.mask_token_id}; target {target.source}: {special}",
                    "measured with a draft trained with 16: unk (0) drafts nothing (1.01 measured in vLLM and "
                    "llama.cpp), eos (2) serves as well as 16; the trainers pick a token the text does not use",
                ],
                fix="mask_token_id in dflash_config: the token the draft was trained with (the training log says)",
            )
        )
    return findings


def _vllm_reads(folder: DraftInfo) -> list[Finding]:
    """Keys vLLM 0.32 reads from a DFlash config.json that the trainers do not write and from_hf does not read: each
    changes what vLLM runs without an error at start."""
    cfg, path = folder.config, folder.path / "config.json"
    nested, eagle = cfg.get("dflash_config") or {}, cfg.get("eagle_config")
    findings = []
    if False in (nested.get("use_aux_hidden_state"), (eagle or {}).get("use_aux_hidden_state")):
        findings.append(
            Finding(
                "dflash_config",
                ERROR,
                "use_aux_hidden_state false: vLLM skips fc, and the first request kills the engine",
                [f"{path}: use_aux_hidden_state false (dflash_config or eagle_config)", VLLM_NO_AUX],
                fix=f"remove use_aux_hidden_state from {path}",
            )
        )
    eagle = eagle if isinstance(eagle, dict) else {}  # vLLM reads a non-empty one only
    captured = cfg.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    trained = [i + 1 for i in nested.get("target_layer_ids") or []]
    if (captured or eagle) and captured != trained:
        findings.append(
            Finding(
                "dflash_config",
                ERROR,
                f"vLLM captures hidden_states {captured or 'of its EAGLE-3 defaults'}, not the trained {trained}",
                [
                    f"{path}: eagle_aux_hidden_state_layer_ids {captured} (top level or eagle_config), "
                    f"dflash_config.target_layer_ids {nested.get('target_layer_ids')}",
                    "vLLM reads the EAGLE-3 keys first: a top-level list, else a non-empty eagle_config's (its "
                    "defaults when it has none; read from vLLM 0.32's source); dflash_config's ids only without either",
                ],
                fix=f"remove eagle_aux_hidden_state_layer_ids and eagle_config from {path}",
            )
        )
    return findings


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
        why.append("draft-eagle3 starts with a DFlash GGUF; the first request aborts the server (measured)")
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
            f"its acceptance is the truncated block's (`eagle3lab acceptance DRAFT --depths {k}`), "
            "which `eagle3lab tune --draft DRAFT` measures and may choose"
        )
        return [Finding("spec_params", WARNING, f"draft length {k} < block_size - 1 = {want}", [*ev, why], fix=fix)]
    why = (
        f"the engine drafts a block of {k} + 1 slots and every slot attends to the whole block: "
        "not the block the draft was trained on, and no warning says so"
    )
    return [Finding("spec_params", ERROR, f"draft length {k} != block_size - 1 = {want}", [*ev, why], fix=fix)]
