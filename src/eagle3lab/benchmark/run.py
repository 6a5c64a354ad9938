"""`eagle3lab bench`: the baseline, drafts (EAGLE3 or SGLang's wrong-flag EAGLE path) and HF peers on the same
prompts in one run: accept length, tokens/s, speedups, identical-output rate, per-position acceptance, time split."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass, replace

import torch

from eagle3lab.benchmark.engine_choice import eager_option, engine_option
from eagle3lab.benchmark.prompts import Prompt, load_prompts
from eagle3lab.benchmark.systems import (
    DEFAULT_DRAFT,
    PEERS,
    System,
    build_systems,
    config_label,
    eos_ids,
    parse_system_config,
    run_peer,
)
from eagle3lab.benchmark.table import render_rows
from eagle3lab.decoding.config import BASELINE
from eagle3lab.decoding.engine import MODES
from eagle3lab.decoding.generation import Generation
from eagle3lab.devices import DEVICE_HELP, resolve_device
from eagle3lab.io import InputError
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import option

DEFAULT_CONFIGS = ("1,0,0,0", "1,3,1,4", "1,5,1,6")
DTYPES = ("float32", "bfloat16", "float16")


def split_list(text: str) -> list[str]:
    """A comma-separated option value as a list ("none" and blanks dropped)."""
    return [t for t in (s.strip() for s in text.split(",")) if t and t != "none"]


@dataclass
class BenchSettings:
    """Every `bench` option, and `run_benchmark`'s keywords: the CLI is generated from these fields (one home for the
    defaults and their help); lists given on the command line as one comma-separated value are split by the CLI."""

    target: str = option(DEFAULT_TARGET, "target spec, model folder or HF id")
    sets: list[str] = option(
        ("mtbench",),
        "comma-separated evaluation sets (mtbench, humaneval, gsm8k)",
        type=split_list,
        metavar="SETS",
        exclusive="prompts",
    )
    prompts_file: str | None = option(
        None,
        "JSONL with id, optional set, and prompt or conversations",
        flag="--prompts",
        metavar="PROMPTS",
        exclusive="prompts",
    )
    limit: int | None = option(None, "prompts per set")
    max_new_tokens: int = option(128, "tokens generated per prompt")
    configs: list[str] = option(
        DEFAULT_CONFIGS,
        "bs,steps,topk,ndraft[@threshold]; 1,0,0,0 = baseline; @0.3 = adaptive: stop below draft confidence 0.3 "
        f"(default {' '.join(DEFAULT_CONFIGS)})",
    )
    drafts: list[str] | None = option(
        None, f"draft folders (default: {DEFAULT_DRAFT})", flag="--draft", metavar="DRAFT"
    )
    modes: list[str] = option(
        ("eagle3",),
        "eagle3 and/or eagle (SGLang's wrong-flag path), comma-separated (default eagle3)",
        type=split_list,
        metavar="MODES",
    )
    peers: list[str] = option(
        PEERS, f"comma-separated HF peers, or 'none' (default {','.join(PEERS)})", type=split_list, metavar="PEERS"
    )
    temperature: float = option(0.0, "sampling temperature (0: greedy)")
    repeats: int = option(1, "runs per prompt and system; times are medians")
    dtype: str = option("float32", "model dtype", choices=DTYPES)
    threads: int | None = option(None, "torch threads (default: torch's)")
    prompt_lookup_tokens: int = option(10, "tokens hf-prompt-lookup proposes per step")
    seed: int = option(0, "sampling seed")
    device: str = option("auto", f"where models run: {DEVICE_HELP}")
    engine: str = engine_option(
        "the project's engine",
        "a real server per config: chain configs 1,k,1,k+1, and for llamacpp 1,k,1,k+1@p with p its "
        "--spec-draft-p-min; with --peers the local baseline and HF generate run beside it",
    )
    eager: bool = eager_option()
    output: str | None = option(None, "write the JSON result here")


@torch.inference_mode()
def logit_gap(model, ids: list[int], reference: list[int], other: list[int]) -> dict | None:
    """Where `other` first departs from `reference`: index and the target's logit gap between the two tokens there
    (a tiny gap means a near-tie flipped by rounding, not an engine bug). None when one is a prefix of the other."""
    index = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if index is None:
        return None
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids + reference[:index]], device=device)).logits[0, -1].float()
    return {"index": index, "logit_gap": float(logits[reference[index]] - logits[other[index]])}


def median_run(runs: list[Generation]) -> Generation:
    """The repeat with the median wall time (its own time split)."""
    ordered = sorted(runs, key=lambda g: g.time_total)
    return ordered[(len(ordered) - 1) // 2]


def _aggregate(set_name: str, system: System, runs: list[dict], baseline_tps: float, hf_tps: float | None) -> dict:
    gens: list[Generation] = [r["gen"] for r in runs]
    tokens = sum(g.completion_tokens for g in gens)
    seconds = sum(g.time_total for g in gens)
    verifies = sum(g.verify_count for g in gens)
    speculative = system.engine is not None and system.engine.draft is not None
    depth = max((g.depth for g in gens), default=0)
    accepted = [a for g in gens for a in g.accepted]
    tps = tokens / seconds if seconds > 0 else 0.0
    return {
        "set": set_name,
        "system": system.name,
        "config": system.config,
        "draft": system.draft,
        "mode": system.mode,
        "threshold": system.threshold,
        "prompts": len(gens),
        "completion_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tps,
        "accept_length": (sum(g.completion_tokens - 1 for g in gens) / verifies) if speculative and verifies else 1.0,
        "sglang_accept_length": (tokens / verifies) if speculative and verifies else None,
        "verify_count": verifies if system.peer is None else None,
        "speedup_vs_baseline": tps / baseline_tps if baseline_tps else None,
        "speedup_vs_hf_generate": tps / hf_tps if hf_tps else None,
        "identical_rate": sum(r["identical"] for r in runs) / len(runs) if runs else None,
        "divergences": [dict(id=r["id"], **r["divergence"]) for r in runs if r["divergence"]],
        "position_acceptance": [sum(a >= d for a in accepted) / len(accepted) for d in range(1, depth + 1)]
        if accepted
        else [],
        "time_split": None
        if system.peer
        else {
            part: sum(getattr(g, f"time_{part}") for g in gens) / seconds if seconds else 0.0
            for part in ("prefill", "draft", "verify", "other")
        },
    }


def _run_prompt(target, prompt: Prompt, systems: list[System], settings: dict, bar) -> list[dict]:
    """Every system on one prompt, `repeats` times interleaved (so drift hits all alike); per-system records."""
    outputs: list[list[Generation]] = [[] for _ in systems]
    for r in range(settings["repeats"]):
        for i, system in enumerate(systems):
            seed = settings["seed"] + r
            if system.peer:
                g = run_peer(
                    target.model,
                    system.peer,
                    prompt.ids,
                    settings["max_new_tokens"],
                    settings["temperature"],
                    settings["eos"],
                    seed,
                    settings["prompt_lookup_tokens"],
                )
            else:
                g = system.engine.generate(prompt.ids, settings["max_new_tokens"], settings["temperature"], seed=seed)
            outputs[i].append(g)
            bar.update(1)
            bar.set_postfix_str(f"{prompt.set}/{prompt.id} {system.name} {system.config} {g.tokens_per_s:.1f} tok/s")
    reference = outputs[0][0].tokens
    records = []
    for system, runs in zip(systems, outputs):
        identical = runs[0].tokens == reference
        records.append(
            {
                "set": prompt.set,
                "id": prompt.id,
                "system": system.name,
                "config": system.config,
                "gen": median_run(runs),
                "identical": identical,
                "divergence": None if identical else logit_gap(target.model, prompt.ids, reference, runs[0].tokens),
                "times": [g.time_total for g in runs],
            }
        )
    return records


def _rows(prompts: list[Prompt], systems: list[System], per_prompt: list[dict]) -> list[dict]:
    """One row per set and system; speedups against the baseline (system 0) and hf-generate of the same set."""
    rows = []
    for set_name in dict.fromkeys(p.set for p in prompts):
        grouped = [
            [r for r in per_prompt if r["set"] == set_name and r["system"] == s.name and r["config"] == s.config]
            for s in systems
        ]
        tps = []
        for runs in grouped:
            seconds = sum(r["gen"].time_total for r in runs)
            tps.append(sum(r["gen"].completion_tokens for r in runs) / seconds if seconds else 0.0)
        hf = next((i for i, s in enumerate(systems) if s.peer == "hf-generate"), None)
        for system, runs in zip(systems, grouped):
            rows.append(_aggregate(set_name, system, runs, tps[0], tps[hf] if hf is not None else None))
    return rows


def _meta(target, prompts: list[Prompt], settings: dict) -> dict:
    return {
        "target": getattr(target, "spec", str(target)),
        "device": str(next(target.model.parameters()).device),
        "max_new_tokens": settings["max_new_tokens"],
        "temperature": settings["temperature"],
        "repeats": settings["repeats"],
        "threads": torch.get_num_threads(),
        "sets": list(dict.fromkeys(p.set for p in prompts)),
        "prompts": len(prompts),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _check(s: BenchSettings) -> None:
    if s.repeats < 1 or s.max_new_tokens < 1:
        raise InputError("--repeats and --max-new-tokens must be >= 1")
    if not s.modes or any(m not in MODES for m in s.modes):
        raise InputError(f"--modes: expected eagle3 and/or eagle, got {','.join(s.modes)!r}")
    for p in s.peers:
        if p not in PEERS:
            raise InputError(f"--peers: unknown peer '{p}' (known: {', '.join(PEERS)})")


def run_benchmark(target=None, settings: BenchSettings | None = None, *, progress: bool = True, **options) -> dict:
    """Run every system on every prompt. `settings` (default `BenchSettings()`), with any of its fields given as
    keywords in `options` in place of its own; `target` is a spec for `load_target` (loaded on the settings' device)
    or an already loaded Target (used where it is), by default the settings' spec. Returns {"meta", "rows",
    "per_prompt"}; see `to_dataframe`."""
    from tqdm.auto import tqdm

    from eagle3lab.models.target import load_target

    s = replace(settings or BenchSettings(), **options)
    _check(s)
    configs = list(dict.fromkeys([BASELINE.label] + [config_label(*parse_system_config(c)) for c in s.configs]))
    if s.threads:
        torch.set_num_threads(s.threads)
    torch_dtype = getattr(torch, s.dtype)
    target = s.target if target is None else target
    if isinstance(target, str):
        target = load_target(target, dtype=torch_dtype, device=resolve_device(s.device))
    eos = eos_ids(target)
    prompts = load_prompts(target.tokenizer, s.sets, s.prompts_file, s.limit)
    drafts = list(s.drafts) if s.drafts else [DEFAULT_DRAFT]
    systems = build_systems(target, configs, drafts, s.modes, s.peers, eos, torch_dtype)
    run = dict(
        repeats=s.repeats,
        seed=s.seed,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        eos=eos,
        prompt_lookup_tokens=s.prompt_lookup_tokens,
    )
    per_prompt: list[dict] = []
    with tqdm(total=len(prompts) * len(systems) * s.repeats, disable=not progress, desc="bench", unit="gen") as bar:
        for prompt in prompts:
            per_prompt += _run_prompt(target, prompt, systems, run, bar)
    meta = _meta(target, prompts, run) | {
        "dtype": s.dtype,
        "configs": configs,
        "drafts": [str(d) for d in drafts] if len(configs) > 1 else [],
        "modes": list(s.modes),
        "peers": list(s.peers),
    }
    return {
        "meta": meta,
        "rows": _rows(prompts, systems, per_prompt),
        "per_prompt": [
            {k: v for k, v in r.items() if k != "gen"}
            | {k: v for k, v in r["gen"].summary().items() if k not in ("config", "mode")}
            | {"tokens": r["gen"].tokens}
            for r in per_prompt
        ],
    }


def lossless_rows(timed: dict, float32: dict, system: str) -> list[dict]:
    """Prompt by prompt, `system`'s output against the baseline's: in float32 (a different text is an engine bug),
    and in the timed run's dtype, where a different text is a near-tie flipped by rounding: the answer token where
    it departs and the target's logit gap there. `float32` is run_benchmark's result on the same prompts."""
    dtype = timed["meta"]["dtype"]
    timed_rows = {(r["set"], r["id"], r["config"]): r for r in timed["per_prompt"] if r["system"] == system}
    rows = []
    for r in float32["per_prompt"]:
        if r["system"] != system:
            continue
        there = timed_rows.get((r["set"], r["id"], r["config"])) or {}
        departs = there.get("divergence") or {}
        rows.append(
            {
                "set": r["set"],
                "id": r["id"],
                "config": r["config"],
                "identical_float32": r["identical"],
                f"identical_{dtype}": there.get("identical"),
                "departs_at": departs.get("index"),
                "logit_gap": departs.get("logit_gap"),
            }
        )
    return rows


def to_dataframe(result: dict):
    """The aggregated rows as a pandas DataFrame (one row per set, system and config)."""
    import pandas as pd

    return pd.DataFrame(result["rows"])


def format_table(result: dict) -> str:
    return render_rows(result["rows"])
