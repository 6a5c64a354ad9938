"""`eagle3lab bench`: the baseline, drafts (EAGLE3 or SGLang's wrong-flag EAGLE path) and HF peers on the same
prompts in one run: accept length, tokens/s, speedups, identical-output rate, per-position acceptance, time split.
Also the per-forward cost helpers the scaling notebook's speedup model uses."""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3lab.decoding.config import BASELINE, SpecConfig
from eagle3lab.decoding.engine import Generation, SpecEngine, keep_cache_positions
from eagle3lab.io import InputError, read_jsonl, require, write_json
from eagle3lab.paths import ARTIFACTS

DEFAULT_DRAFT = ARTIFACTS / "drafts" / "final"
DEFAULT_CONFIGS = ("1,0,0,0", "1,3,1,4", "1,5,1,6")
PEERS = ("hf-generate", "hf-prompt-lookup")


@dataclass
class Prompt:
    id: str
    set: str
    messages: list[dict]
    ids: list[int]


@dataclass
class System:
    """One thing that generates: the baseline, a draft under a config and mode, or an HF peer."""

    name: str
    config: str  # "1,0,0,0" for the baseline and peers
    draft: str | None = None
    mode: str | None = None
    engine: SpecEngine | None = None
    peer: str | None = None


# ---- prompts -----------------------------------------------------------------------------------------------------


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _prompt_messages(record: dict, where: str) -> list[dict]:
    from eagle3lab.data.sources import sharegpt_turns

    if "prompt" in record:
        return [{"role": "user", "content": require(record, "prompt", where, str)}]
    if "conversations" not in record:
        raise InputError(f"{where}: needs a field 'prompt' (one user message) or 'conversations'")
    turns = sharegpt_turns(require(record, "conversations", where, list), where)
    while turns and turns[-1]["role"] == "assistant":  # generate the next assistant turn
        turns.pop()
    if not any(t["role"] == "user" for t in turns):
        raise InputError(f"{where}: field 'conversations' has no user turn")
    return turns


def load_prompts(tokenizer, sets=None, prompts_file=None, limit: int | None = None) -> list[Prompt]:
    """Evaluation-set prompts (first user turn, chat template applied) or a JSONL file's, `limit` per set."""
    out: list[Prompt] = []
    if prompts_file is not None:
        path = Path(prompts_file)
        if not path.exists():
            raise InputError(f"{path}: prompts file not found")
        seen: dict[str, int] = {}
        for i, record in enumerate(read_jsonl(path)):
            where = f"{path}: record {i + 1}"
            rid = require(record, "id", where, (str, int))
            name = record.get("set", path.stem)
            if not isinstance(name, str):
                raise InputError(f"{where}: field 'set' should be a string")
            if limit is not None and seen.get(name, 0) >= limit:
                continue
            seen[name] = seen.get(name, 0) + 1
            messages = _prompt_messages(record, where)
            out.append(Prompt(str(rid), name, messages, encode_chat(tokenizer, messages)))
        if not out:
            raise InputError(f"{path}: no prompts")
        return out
    from eagle3lab.data.sources import EVALUATION_SETS

    for name in sets or ("mtbench",):
        if name not in EVALUATION_SETS:
            raise InputError(f"--sets: unknown set '{name}' (known: {', '.join(EVALUATION_SETS)})")
        records = EVALUATION_SETS[name]()
        for record in records[:limit] if limit is not None else records:
            messages = [{"role": "user", "content": record.prompt}]
            out.append(Prompt(record.id, name, messages, encode_chat(tokenizer, messages)))
    return out


# ---- peers -------------------------------------------------------------------------------------------------------


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
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **kwargs)
    elapsed = time.perf_counter() - t0
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


# ---- divergence --------------------------------------------------------------------------------------------------


@torch.inference_mode()
def logit_gap(model, ids: list[int], reference: list[int], other: list[int]) -> dict | None:
    """Where `other` first departs from `reference`: index and the target's logit gap between the two tokens there
    (a tiny gap means a near-tie flipped by rounding, not an engine bug). None when one is a prefix of the other."""
    index = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if index is None:
        return None
    logits = model(torch.tensor([ids + reference[:index]])).logits[0, -1].float()
    return {"index": index, "logit_gap": float(logits[reference[index]] - logits[other[index]])}


# ---- the benchmark -----------------------------------------------------------------------------------------------


def _eos_ids(target) -> list[int]:
    ids = []
    for source in (getattr(target.model.generation_config, "eos_token_id", None), target.tokenizer.eos_token_id):
        for t in source if isinstance(source, (list, tuple)) else [source]:
            if t is not None and int(t) not in ids:
                ids.append(int(t))
    return ids


def _systems(target, configs, drafts, modes, peers, eos, dtype) -> list[System]:
    from eagle3lab.models.draft import load_draft

    parsed = [SpecConfig.parse(c) for c in configs]
    systems = [System("baseline", BASELINE.label, engine=SpecEngine(target.model, None, BASELINE, eos_token_ids=eos))]
    systems += [System(p, BASELINE.label, peer=p) for p in peers]
    speculative = [c for c in parsed if not c.is_baseline]
    if not speculative:
        return systems
    for path in drafts:
        path = Path(path)
        if not (path / "config.json").exists():
            hint = (
                " (the pipeline's final draft: run `dvc repro` or `eagle3lab train` first)"
                if path == DEFAULT_DRAFT
                else ""
            )
            raise InputError(
                f"--draft {path}: no draft there{hint}; pass --draft PATH to an SGLang-format draft folder"
            )
        draft = load_draft(path, target=target.model, dtype=dtype).eval()
        for mode in modes:
            for config in speculative:
                name = path.name if mode == "eagle3" else f"{path.name} [EAGLE]"
                engine = SpecEngine(target.model, draft, config, mode=mode, eos_token_ids=eos)
                systems.append(System(name, config.label, draft=str(path), mode=mode, engine=engine))
    return systems


def _median_run(runs: list[Generation]) -> Generation:
    """The repeat with the median wall time (its own time split), tokens from the first repeat."""
    ordered = sorted(runs, key=lambda g: g.time_total)
    return ordered[(len(ordered) - 1) // 2]


def _aggregate(
    set_name: str, system: System, runs: list[dict], baseline_tps: float | None, hf_tps: float | None
) -> dict:
    gens: list[Generation] = [r["gen"] for r in runs]
    tokens = sum(g.completion_tokens for g in gens)
    seconds = sum(g.time_total for g in gens)
    verifies = sum(g.verify_count for g in gens)
    speculative = system.engine is not None and system.engine.draft is not None
    depth = max((g.depth for g in gens), default=0)
    accepted = [a for g in gens for a in g.accepted]
    tps = tokens / seconds if seconds > 0 else 0.0
    row = {
        "set": set_name,
        "system": system.name,
        "config": system.config,
        "draft": system.draft,
        "mode": system.mode,
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
    return row


def run_benchmark(
    target="smollm2-135m-instruct",
    *,
    sets=("mtbench",),
    prompts_file=None,
    limit: int | None = None,
    max_new_tokens: int = 128,
    configs=DEFAULT_CONFIGS,
    drafts=None,
    modes=("eagle3",),
    peers=PEERS,
    temperature: float = 0.0,
    repeats: int = 1,
    dtype: str = "float32",
    seed: int = 0,
    threads: int | None = None,
    prompt_lookup_tokens: int = 10,
    progress: bool = True,
) -> dict:
    """Run every system on every prompt, interleaved per prompt so drift hits all alike. `target` is a spec for
    `load_target` or an already loaded Target. Returns {"meta", "rows", "per_prompt"}; see `to_dataframe`."""
    from tqdm.auto import tqdm

    from eagle3lab.models.target import load_target

    if repeats < 1 or max_new_tokens < 1:
        raise InputError("--repeats and --max-new-tokens must be >= 1")
    for p in peers:
        if p not in PEERS:
            raise InputError(f"--peers: unknown peer '{p}' (known: {', '.join(PEERS)})")
    configs = list(dict.fromkeys([BASELINE.label] + [SpecConfig.parse(c).label for c in configs]))
    if threads:
        torch.set_num_threads(threads)
    torch_dtype = getattr(torch, dtype)
    if isinstance(target, str):
        target = load_target(target, dtype=torch_dtype)
    eos = _eos_ids(target)
    prompts = load_prompts(target.tokenizer, sets, prompts_file, limit)
    systems = _systems(target, configs, list(drafts) if drafts else [DEFAULT_DRAFT], modes, peers, eos, torch_dtype)

    per_prompt: list[dict] = []
    bar = tqdm(total=len(prompts) * len(systems) * repeats, disable=not progress, desc="bench", unit="gen")
    for prompt in prompts:
        outputs: dict[int, list[Generation]] = {i: [] for i in range(len(systems))}
        for r in range(repeats):
            for i, system in enumerate(systems):
                if system.peer:
                    g = run_peer(
                        target.model,
                        system.peer,
                        prompt.ids,
                        max_new_tokens,
                        temperature,
                        eos,
                        seed + r,
                        prompt_lookup_tokens,
                    )
                else:
                    g = system.engine.generate(prompt.ids, max_new_tokens, temperature, seed=seed + r)
                outputs[i].append(g)
                bar.update(1)
                if progress:
                    bar.set_postfix_str(
                        f"{prompt.set}/{prompt.id} {system.name} {system.config} {g.tokens_per_s:.1f} tok/s"
                    )
        reference = outputs[0][0].tokens
        for i, system in enumerate(systems):
            first = outputs[i][0]
            gen = _median_run(outputs[i])
            identical = first.tokens == reference
            divergence = None if identical else logit_gap(target.model, prompt.ids, reference, first.tokens)
            per_prompt.append(
                {
                    "set": prompt.set,
                    "id": prompt.id,
                    "system": system.name,
                    "config": system.config,
                    "gen": gen,
                    "identical": identical,
                    "divergence": divergence,
                    "times": [g.time_total for g in outputs[i]],
                }
            )
    bar.close()

    rows = []
    for set_name in dict.fromkeys(p.set for p in prompts):
        grouped = {}
        for i, system in enumerate(systems):
            grouped[i] = [
                r
                for r in per_prompt
                if r["set"] == set_name and r["system"] == system.name and r["config"] == system.config
            ]
        tps = {}
        for i, runs in grouped.items():
            tokens = sum(r["gen"].completion_tokens for r in runs)
            seconds = sum(r["gen"].time_total for r in runs)
            tps[i] = tokens / seconds if seconds else 0.0
        hf = next((i for i, s in enumerate(systems) if s.peer == "hf-generate"), None)
        for i, system in enumerate(systems):
            rows.append(_aggregate(set_name, system, grouped[i], tps[0], tps[hf] if hf is not None else None))

    meta = {
        "target": getattr(target, "spec", str(target)),
        "dtype": dtype,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "sets": list(dict.fromkeys(p.set for p in prompts)),
        "prompts": len(prompts),
        "configs": configs,
        "drafts": [str(d) for d in (drafts or [DEFAULT_DRAFT])] if len(configs) > 1 else [],
        "modes": list(modes),
        "peers": list(peers),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return {
        "meta": meta,
        "rows": rows,
        "per_prompt": [
            {k: v for k, v in r.items() if k != "gen"}
            | {k: v for k, v in r["gen"].summary().items() if k not in ("config", "mode")}
            | {"tokens": r["gen"].tokens}
            for r in per_prompt
        ],
    }


def to_dataframe(result: dict):
    """The aggregated rows as a pandas DataFrame (one row per set, system and config)."""
    import pandas as pd

    return pd.DataFrame(result["rows"])


def format_table(result: dict) -> str:
    def num(v, fmt):
        return format(v, fmt) if v is not None else "-"

    header = f"{'set':<10} {'system':<24} {'config':<9} {'accept':>6} {'tok/s':>7} {'x base':>6} {'x HF':>6} {'ident':>5}  per-position acceptance"
    lines = [header, "-" * len(header)]
    for r in result["rows"]:
        acc = " ".join(f"{a:.2f}" for a in r["position_acceptance"])
        lines.append(
            f"{r['set']:<10} {r['system'][:24]:<24} {r['config']:<9} {r['accept_length']:>6.2f} {r['tokens_per_s']:>7.1f} "
            f"{num(r['speedup_vs_baseline'], '6.2f')} {num(r['speedup_vs_hf_generate'], '6.2f')} "
            f"{num(r['identical_rate'], '5.2f')}  {acc}"
        )
        if r["time_split"] and r["draft"]:
            split = ", ".join(f"{k} {v:.0%}" for k, v in r["time_split"].items())
            lines.append(f"{'':<10} {'':<24} time: {split}")
        for d in r["divergences"][:3]:
            lines.append(
                f"{'':<10} {'':<24} diverges on {d['id']} at token {d['index']}, logit gap {d['logit_gap']:.3g}"
            )
    return "\n".join(lines)


# ---- per-forward costs for the speedup model --------------------------------------------------------------------


@torch.inference_mode()
def measure_forward_costs(
    model, draft=None, *, context: int = 200, ks=(1, 2, 4, 8, 16), repeats: int = 7, topk: int = 1, seed: int = 0
) -> dict:
    """Median seconds of: a target decode step (1 token), a target verify of k tokens, and (with a draft) one draft
    step of `topk` tokens, each on a `context`-token cache rolled back after every call."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=gen)
    cache = DynamicCache(config=model.config)
    model.model(input_ids=ids, cache=cache, use_cache=True)

    def timed(fn):
        times = []
        for _ in range(repeats + 1):  # the first call warms up
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def verify(k):
        new = torch.randint(0, vocab, (1, k), generator=gen)
        out = model.model(
            input_ids=new, position_ids=torch.arange(context, context + k)[None], cache=cache, use_cache=True
        )
        model.lm_head(out.last_hidden_state)
        keep_cache_positions(cache, context, [])

    costs = {
        "context": context,
        "target_step": timed(lambda: verify(1)),
        "verify": {int(k): timed(lambda k=k: verify(k)) for k in ks},
    }
    if draft is not None:
        dtype = next(draft.parameters()).dtype
        dcache = draft.new_cache()
        h = draft.config.hidden_size
        draft(
            ids[:, 1:],
            torch.randn(1, context - 1, h, generator=gen).to(dtype),
            torch.arange(context - 1)[None],
            cache=dcache,
        )

        def step():
            tokens = torch.randint(0, vocab, (1, topk), generator=gen)
            mask = (
                None
                if topk == 1
                else torch.cat(
                    [torch.ones(topk, dcache.length, dtype=torch.bool), torch.eye(topk, dtype=torch.bool)], 1
                )
            )
            draft(
                tokens,
                torch.randn(1, topk, h, generator=gen).to(dtype),
                torch.full((1, topk), dcache.length),
                cache=dcache,
                attn_mask=mask,
            )
            dcache.crop(context - 1)

        costs["draft_step"] = timed(step)
        costs["draft_topk"] = topk
    return costs


# ---- CLI ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3lab bench", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--sets", default="mtbench", help="comma-separated evaluation sets (mtbench, humaneval, gsm8k)")
    src.add_argument("--prompts", type=Path, help="JSONL with id, optional set, and prompt or conversations")
    p.add_argument("--target", default="smollm2-135m-instruct", help="target spec, model folder or HF id")
    p.add_argument("--limit", type=int, help="prompts per set")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--configs", nargs="+", default=list(DEFAULT_CONFIGS), help="bs,steps,topk,ndraft; 1,0,0,0 = baseline"
    )
    p.add_argument("--draft", nargs="+", type=Path, help=f"draft folders (default: {DEFAULT_DRAFT})")
    p.add_argument("--modes", default="eagle3", help="eagle3 and/or eagle (SGLang's wrong-flag path), comma-separated")
    p.add_argument("--peers", default=",".join(PEERS), help="comma-separated HF peers, or 'none'")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--repeats", type=int, default=1, help="runs per prompt and system; times are medians")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--prompt-lookup-tokens", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, help="write the JSON result here")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _split(text: str) -> list[str]:
    return [t for t in (s.strip() for s in text.split(",")) if t and t != "none"]


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    modes = _split(args.modes)
    bad = [m for m in modes if m not in ("eagle3", "eagle")]
    try:
        if bad or not modes:
            raise InputError(f"--modes: expected eagle3 and/or eagle, got {args.modes!r}")
        result = run_benchmark(
            args.target,
            sets=None if args.prompts else _split(args.sets),
            prompts_file=args.prompts,
            limit=args.limit,
            max_new_tokens=args.max_new_tokens,
            configs=args.configs,
            drafts=args.draft,
            modes=modes,
            peers=_split(args.peers),
            temperature=args.temperature,
            repeats=args.repeats,
            dtype=args.dtype,
            seed=args.seed,
            threads=args.threads,
            prompt_lookup_tokens=args.prompt_lookup_tokens,
            progress=not args.quiet,
        )
    except (InputError, ValueError) as e:
        print(f"eagle3lab bench: {e}", file=sys.stderr)
        return 2
    print(format_table(result))
    if args.output:
        write_json(args.output, result)
        print(f"wrote {args.output}")
    return 0
