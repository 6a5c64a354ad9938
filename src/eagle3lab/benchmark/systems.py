"""What a benchmark compares: the baseline, a draft under a config, mode and adaptive threshold, or an HF peer
(`generate` greedy or prompt-lookup), each timed the same way on the same device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3lab.decoding.config import BASELINE, SpecConfig
from eagle3lab.decoding.engine import SpecEngine
from eagle3lab.decoding.generation import Generation
from eagle3lab.devices import clock
from eagle3lab.io import InputError, folder_argument
from eagle3lab.paths import ARTIFACTS

DEFAULT_DRAFT = ARTIFACTS / "drafts" / "final"
PEERS = ("hf-generate", "hf-prompt-lookup")


@dataclass
class System:
    """One thing that generates: the baseline, a draft under a config and mode, or an HF peer."""

    name: str
    config: str  # "1,0,0,0" for the baseline and peers
    draft: str | None = None
    mode: str | None = None
    engine: SpecEngine | None = None
    peer: str | None = None
    threshold: float = 0.0


@torch.inference_mode()
def run_peer(
    model,
    peer: str,
    ids: list[int],
    max_new_tokens: int,
    temperature: float,
    eos: list[int],
    seed: int,
    prompt_lookup_tokens: int = 10,
) -> Generation:
    """HF `generate` greedy (or sampling), or HF prompt-lookup decoding, timed like our engine."""
    kwargs = dict(max_new_tokens=max_new_tokens, eos_token_id=eos or None, pad_token_id=eos[0] if eos else None)
    kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else kwargs.update(
        do_sample=False, temperature=None, top_p=None, top_k=None
    )
    if peer == "hf-prompt-lookup":
        kwargs["prompt_lookup_num_tokens"] = prompt_lookup_tokens
    elif peer != "hf-generate":
        raise ValueError(f"unknown peer '{peer}' (known: {', '.join(PEERS)})")
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    inputs = torch.tensor([ids], device=device)
    t0 = clock(device)
    out = model.generate(inputs, attention_mask=torch.ones_like(inputs), **kwargs)
    elapsed = clock(device) - t0
    tokens = out[0, len(ids) :].tolist()
    finished = "eos" if tokens and tokens[-1] in eos else "length"
    return Generation(
        config=BASELINE.label,
        mode=peer,
        prompt_tokens=len(ids),
        tokens=tokens,
        finished_by=finished,
        time_total=elapsed,
    )


def eos_ids(target) -> list[int]:
    ids = []
    for source in (getattr(target.model.generation_config, "eos_token_id", None), target.tokenizer.eos_token_id):
        for t in source if isinstance(source, (list, tuple)) else [source]:
            if t is not None and int(t) not in ids:
                ids.append(int(t))
    return ids


def check_draft_folders(folders, flag: str = "--draft") -> list[Path]:
    """The draft folders a command names, each checked before any model loads (eagle3lab.io.folder_argument, under
    the command's own `flag`); the pipeline's final draft, the default, says how to make it when it is absent."""
    checked = []
    for folder in folders:
        try:
            checked.append(folder_argument(folder, flag))
        except InputError as e:
            made_by = " (the pipeline's final draft: run `dvc repro` or `eagle3lab train` first)"
            raise InputError(f"{e}{made_by if Path(folder) == DEFAULT_DRAFT else ''}") from None
    return checked


def load_bench_draft(path, target, dtype: torch.dtype, flag: str = "--draft"):
    """An SGLang-format draft folder on the target's device, or an InputError naming the folder by `flag`."""
    from eagle3lab.models.draft import load_draft

    (path,) = check_draft_folders([path], flag)
    try:
        draft = load_draft(path, target=target.model, dtype=dtype)
    except Exception as e:  # any unreadable file or shape mismatch: name the folder, keep the cause
        raise InputError(f"{flag} {path}: the draft does not load for this target: {e}") from e
    return draft.to(next(target.model.parameters()).device).eval()


def parse_system_config(text: str) -> tuple[SpecConfig, float]:
    """`bs,steps,topk,ndraft` or `bs,steps,topk,ndraft@threshold` (adaptive drafting below that draft confidence)."""
    shape, _, threshold = str(text).partition("@")
    config = SpecConfig.parse(shape)
    try:
        value = float(threshold) if threshold else 0.0
    except ValueError:
        raise InputError(f"config '{text}': the threshold after '@' should be a number in [0, 1)") from None
    if not 0.0 <= value < 1.0 or (value and config.is_baseline):
        raise InputError(f"config '{text}': the threshold after '@' should be in [0, 1), on a speculative config")
    return config, value


def config_label(config: SpecConfig, threshold: float) -> str:
    return f"{config.label}@{threshold:g}" if threshold else config.label


def build_systems(target, configs, drafts, modes, peers, eos, dtype) -> list[System]:
    """The baseline first (speedups are against it), then the peers, then every draft x mode x config."""
    parsed = [parse_system_config(c) for c in configs]
    systems = [System("baseline", BASELINE.label, engine=SpecEngine(target.model, None, BASELINE, eos_token_ids=eos))]
    systems += [System(p, BASELINE.label, peer=p) for p in peers]
    speculative = [(c, t) for c, t in parsed if not c.is_baseline]
    if not speculative:
        return systems
    for path in drafts:
        draft = load_bench_draft(path, target, dtype)
        name = Path(path).name
        for mode in modes:
            for config, threshold in speculative:
                engine = SpecEngine(target.model, draft, config, mode=mode, eos_token_ids=eos, threshold=threshold)
                label = name if mode == "eagle3" else f"{name} [EAGLE]"
                systems.append(
                    System(label, config_label(config, threshold), str(path), mode, engine, threshold=threshold)
                )
    return systems
