"""A DFlash draft timed in each engine against that engine's own baseline, on the benchmark's prompts: vLLM (method
`dflash`), llama.cpp (`--spec-type draft-dflash`, the GGUF `export` writes) through the served benchmark
(`benchmark.served`: identical-output rate, the server's accept-length counters, tokens/s), and the local engine
(`dflash.engine` against plain greedy decoding, same prompts, same process); at k = block_size - 1 unless `ks` says.
Both give `bench --engine`'s {"meta", "rows", "per_prompt"}, which `tune` calibrates from (`dflash.tune`).

    eagle3lab bench --draft DFLASH_DRAFT --engine local|vllm|llamacpp [--sets mtbench --limit 4 ...]"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from eagle3lab.benchmark.run import BenchSettings, median_run
from eagle3lab.benchmark.served import run_served_benchmark
from eagle3lab.drafters.dflash.config import drafted_by
from eagle3lab.engines.llamacpp.server import LlamaCpp
from eagle3lab.paths import cache_dir

SPEC_TYPE = "draft-dflash"  # llama.cpp's name for it; draft-eagle3 would load the file and draft nothing


@dataclass
class DFlashLlamaCpp(LlamaCpp):
    """llama-server with a DFlash draft: the folder exported to GGUF once (by content), then `-md` with llama.cpp's
    DFlash speculative type."""

    spec_type: str = SPEC_TYPE

    def launch_command(self, target, *, port: int, draft=None, k: int = 0, threshold: float = 0.0) -> list[str]:
        from eagle3lab.drafters.dflash.export import export_dflash_gguf
        from eagle3lab.engines.llamacpp.gguf import folder_digest

        cmd = super().launch_command(target, port=port)
        if draft is None:
            return cmd
        gguf = cache_dir() / "gguf" / f"{Path(draft).name}-dflash-{folder_digest(draft, self.target_spec)}.gguf"
        if not gguf.exists():
            gguf.parent.mkdir(parents=True, exist_ok=True)
            export_dflash_gguf(draft, self.target_spec, gguf)
        return cmd + ["-md", str(gguf), "--spec-type", self.spec_type, "--spec-draft-n-max", str(k)]


def dflash_engine(settings: BenchSettings):
    """The served engine that runs a DFlash draft: vLLM with method dflash, or llama-server with draft-dflash."""
    from eagle3lab.engines.registry import served_engine

    if settings.engine == "vllm":
        engine = served_engine("vllm", dtype=settings.dtype, compile=not settings.eager, device="cpu")
        return replace(engine, method="dflash")
    return DFlashLlamaCpp(target_spec=settings.target)


def served(settings: BenchSettings, draft, ks=None) -> dict:
    """The served benchmark of the draft at each k of `ks` (default the whole block) and the engine's baseline
    ({"meta", "rows", "per_prompt"})."""
    from eagle3lab.benchmark.tune_engine import chain

    configs = ["1,0,0,0"] + [chain(k) for k in ks or [drafted_by(draft)]]
    run = replace(settings, drafts=[str(draft)], configs=configs, peers=[])
    return run_served_benchmark(run, engine=dflash_engine(settings))


def _timed(engine, prompts, settings: BenchSettings, system: str, config: str, base: dict) -> list[dict]:
    """Each prompt through one local engine, `repeats` runs (the median-time one kept), as `bench --engine`'s
    per-prompt rows plus its identical-output check against `base` (the baseline's tokens, filled on its run)."""
    engine.generate(prompts[0].ids, 8)  # warm-up
    out = []
    for prompt in prompts:
        g = median_run([engine.generate(prompt.ids, settings.max_new_tokens) for _ in range(settings.repeats)])
        base.setdefault(prompt.id, g.tokens)
        depth = max(g.depth, 0)
        out.append(
            {
                "set": prompt.set,
                "id": prompt.id,
                "system": system,
                "config": config,
                "engine": "local",
                "completion_tokens": g.completion_tokens,
                "seconds": g.time_total,
                "accept_length": g.accept_length,
                "per_position": [sum(a > i for a in g.accepted) for i in range(depth)],
                "drafts": g.verify_count if depth else None,
                "accepted": sum(g.accepted) if depth else None,
                "identical": g.tokens == base[prompt.id],
            }
        )
    return out


def local(settings: BenchSettings, draft, ks=None) -> dict:
    """The local engine: plain greedy and the DFlash block engine at each k of `ks` (default the whole block) on the
    same prompts, `repeats` runs each (median time), with each prompt's identical-output check."""
    from transformers import AutoTokenizer

    from eagle3lab.benchmark.prompts import load_prompts
    from eagle3lab.benchmark.tune_engine import chain
    from eagle3lab.decoding.engine import SpecEngine
    from eagle3lab.drafters.dflash.engine import DFlashEngine
    from eagle3lab.drafters.dflash.model import load_dflash
    from eagle3lab.models.target import load_target, resolve

    dtype = getattr(torch, settings.dtype)
    target = load_target(settings.target, dtype=dtype)
    eos = [target.tokenizer.eos_token_id]
    tokenizer = AutoTokenizer.from_pretrained(resolve(settings.target))
    prompts = load_prompts(tokenizer, settings.sets, settings.prompts_file, settings.limit)
    block, name = load_dflash(draft, dtype), Path(draft).name
    systems = [("baseline", "1,0,0,0", SpecEngine(target.model, eos_token_ids=eos))] + [
        (name, chain(k), DFlashEngine(target.model, block, eos_token_ids=eos, drafted=k))
        for k in ks or [block.config.drafted]
    ]
    base, per_prompt = {}, []
    for system, config, engine in systems:
        per_prompt += _timed(engine, prompts, settings, system, config, base)
    meta = {"engine": "local", "engine_settings": {"dtype": settings.dtype}, "servers": [], "prompts": len(prompts)}
    return {"meta": meta, "rows": _local_rows(per_prompt), "per_prompt": per_prompt}


def _local_rows(per_prompt: list[dict]) -> list[dict]:
    """One row per system and config over every prompt, its speedup against the baseline's tok/s."""
    rows = []
    for system, config in dict.fromkeys((r["system"], r["config"]) for r in per_prompt):
        mine = [r for r in per_prompt if (r["system"], r["config"]) == (system, config)]
        tokens, seconds = sum(r["completion_tokens"] for r in mine), sum(r["seconds"] for r in mine)
        rounds = sum(r["drafts"] or 0 for r in mine)
        rows.append(
            {
                "engine": "local",
                "system": system,
                "config": config,
                "prompts": len(mine),
                "tokens_per_s": tokens / seconds,
                "accept_length": (tokens - len(mine)) / rounds if rounds else 1.0,
                "identical_rate": statistics.mean(r["identical"] for r in mine),
            }
        )
    for row in rows:
        row["speedup_vs_baseline"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows
