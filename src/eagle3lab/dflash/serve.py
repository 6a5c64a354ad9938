"""A DFlash draft timed in each engine against that engine's own baseline, on the benchmark's prompts: vLLM (method
`dflash`, k = block_size - 1), llama.cpp (`--spec-type draft-dflash`, the GGUF `export` writes) through the served
benchmark (`benchmark.served`: identical-output rate, the server's accept-length counters, tokens/s), and the local
engine (`dflash.engine` against plain greedy decoding, same prompts, same process).

    python -m eagle3lab.dflash bench DRAFT --engine local|vllm|llamacpp [--sets mtbench --limit 4 ...]"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from eagle3lab.benchmark.run import BenchSettings
from eagle3lab.benchmark.served import run_served_benchmark
from eagle3lab.dflash.config import DFlashConfig
from eagle3lab.engines.llamacpp.server import LlamaCpp
from eagle3lab.models.checkpoint import read_json
from eagle3lab.paths import cache_dir

SPEC_TYPE = "draft-dflash"  # llama.cpp's name for it; draft-eagle3 would load the file and draft nothing


@dataclass
class DFlashLlamaCpp(LlamaCpp):
    """llama-server with a DFlash draft: the folder exported to GGUF once (by content), then `-md` with llama.cpp's
    DFlash speculative type."""

    spec_type: str = SPEC_TYPE

    def launch_command(self, target, *, port: int, draft=None, k: int = 0, threshold: float = 0.0) -> list[str]:
        from eagle3lab.dflash.export import export_dflash_gguf
        from eagle3lab.engines.llamacpp.gguf import folder_digest

        cmd = super().launch_command(target, port=port)
        if draft is None:
            return cmd
        gguf = cache_dir() / "gguf" / f"{Path(draft).name}-dflash-{folder_digest(draft, self.target_spec)}.gguf"
        if not gguf.exists():
            gguf.parent.mkdir(parents=True, exist_ok=True)
            export_dflash_gguf(draft, self.target_spec, gguf)
        return cmd + ["-md", str(gguf), "--spec-type", self.spec_type, "--spec-draft-n-max", str(k)]


def block_config(draft) -> str:
    """The chain label the benchmark tables use for a block of this draft: 1,k,1,k+1 with k drafted tokens."""
    drafted = DFlashConfig.from_hf(read_json(Path(draft) / "config.json"), f"{draft}/config.json").drafted
    return f"1,{drafted},1,{drafted + 1}"


def served(settings: BenchSettings, draft) -> dict:
    """The served benchmark of the draft and the engine's baseline ({"meta", "rows", "per_prompt"})."""
    from eagle3lab.engines.registry import served_engine

    if settings.engine == "vllm":
        engine = served_engine("vllm", dtype=settings.dtype, compile=not settings.eager, device="cpu")
        engine = replace(engine, method="dflash")
    else:
        engine = DFlashLlamaCpp(target_spec=settings.target)
    run = replace(settings, drafts=[str(draft)], configs=["1,0,0,0", block_config(draft)], peers=[])
    return run_served_benchmark(run, engine=engine)


def local(settings: BenchSettings, draft) -> dict:
    """The local engine: plain greedy and the DFlash block engine on the same prompts, `repeats` runs each (median
    time), with each prompt's identical-output check."""
    from transformers import AutoTokenizer

    from eagle3lab.benchmark.prompts import load_prompts
    from eagle3lab.decoding.engine import SpecEngine
    from eagle3lab.dflash.engine import DFlashEngine
    from eagle3lab.dflash.model import load_dflash
    from eagle3lab.models.target import load_target, resolve

    dtype = getattr(torch, settings.dtype)
    target = load_target(settings.target, dtype=dtype)
    eos = [target.tokenizer.eos_token_id]
    tokenizer = AutoTokenizer.from_pretrained(resolve(settings.target))
    prompts = load_prompts(tokenizer, settings.sets, settings.prompts_file, settings.limit)
    engines = {
        "baseline": SpecEngine(target.model, eos_token_ids=eos),
        Path(draft).name: DFlashEngine(target.model, load_dflash(draft, dtype), eos_token_ids=eos),
    }
    rows, base = [], {}
    for name, engine in engines.items():
        engine.generate(prompts[0].ids, 8)  # warm-up
        tokens = seconds = verifies = 0
        identical = []
        for prompt in prompts:
            runs = sorted(
                (engine.generate(prompt.ids, settings.max_new_tokens) for _ in range(settings.repeats)),
                key=lambda g: g.time_total,
            )
            out = runs[(len(runs) - 1) // 2]
            base.setdefault(prompt.id, out.tokens)
            identical.append(out.tokens == base[prompt.id])
            tokens, seconds, verifies = (
                tokens + out.completion_tokens,
                seconds + out.time_total,
                verifies + out.verify_count,
            )
        rows.append(
            {
                "engine": "local",
                "system": name,
                "prompts": len(prompts),
                "tokens_per_s": tokens / seconds,
                "accept_length": (tokens - len(prompts)) / verifies if verifies else 1.0,
                "identical_rate": statistics.mean(identical),
            }
        )
    for row in rows:
        row["speedup_vs_baseline"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return {"rows": rows}
