"""`eagle3lab tune`: which steps/topk/ndraft (and adaptive threshold) make this draft pay on this machine.

Measures the draft's acceptance profile once (traced deep chain and wide tree), takes the forward costs (measured
here, prefill included, or read from a JSON file), predicts the speedup of every valid shape up to a bound on the
benchmark's own requests (its prompts' lengths and the tokens generated for them, prefill included; `predict`),
benchmarks the predicted top few beside the baseline and HF generate, and prints the ranked table predicted vs
measured, the winner's SGLang launch flags (checked by the doctor) or "do not speculate" when nothing beats the
baseline.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from eagle3lab.benchmark.costs import measure_forward_costs, read_costs
from eagle3lab.benchmark.engine_choice import eager_option, engine_option
from eagle3lab.benchmark.predict import rank_predictions
from eagle3lab.benchmark.profile import CHAIN_DEPTH, TREE_TOPK, measure_profile
from eagle3lab.benchmark.prompts import load_prompts
from eagle3lab.benchmark.run import DTYPES, run_benchmark, split_list
from eagle3lab.benchmark.systems import eos_ids, load_bench_draft, parse_system_config
from eagle3lab.benchmark.table import DO_NOT_SPECULATE, Column, render_rows
from eagle3lab.devices import DEVICE_HELP, resolve_device
from eagle3lab.io import InputError
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import option
from eagle3lab.paths import ARTIFACTS


@dataclass
class TuneSettings:
    """Every `tune` option; the CLI is generated from these fields (one home for the defaults and their help)."""

    draft: str = option(help="draft folder (SGLang format)")
    target: str = option(DEFAULT_TARGET, "target spec, model folder or HF id")
    sets: str = option("mtbench", "comma-separated evaluation sets (mtbench, humaneval, gsm8k)")
    prompts: str | None = option(None, "JSONL with id, optional set, and prompt or conversations (instead of --sets)")
    limit: int = option(8, "prompts per set, for the profile and the benchmark")
    max_new_tokens: int = option(96, "tokens generated per prompt")
    costs: str | None = option(
        None, "JSON with target_step, verify {k: s}, draft_step[, other, prefill] (default: measure)"
    )
    top: int = option(3, "best predicted shapes to benchmark (0: predict only, the best prediction wins)")
    max_steps: int = option(CHAIN_DEPTH, "deepest draft to consider (and to profile)")
    max_topk: int = option(TREE_TOPK, "widest branching to consider (and to profile)")
    max_ndraft: int = option(32, "most tokens verified per round to consider")
    repeats: int = option(1, "benchmark runs per prompt and system; times are medians")
    dtype: str = option("float32", "model dtype", choices=DTYPES)
    threads: int | None = option(None, "torch threads (default: torch's)")
    device: str = option("auto", f"where models run: {DEVICE_HELP}")
    engine: str = engine_option(
        "the project's engine: trees, adaptive drafting",
        "chains 1,k,1,k+1 with k up to --max-steps, and for llamacpp p-min 0, 0.5, 0.8: costs and acceptance "
        "measured on real servers",
    )
    eager: bool = eager_option()
    output: str = option(str(ARTIFACTS / "tune.json"), "write the JSON result here")


def _measured(rows: list[dict], label: str) -> dict:
    """Speedups of one benchmarked config: per set, and the median over sets."""
    mine = [r for r in rows if r["config"] == label and r["draft"]]
    per_set = {r["set"]: r["speedup_vs_baseline"] for r in mine}
    vs_hf = {r["set"]: r["speedup_vs_hf_generate"] for r in mine}
    return {
        "measured_speedup": statistics.median(per_set.values()) if per_set else None,
        "measured_per_set": per_set,
        "measured_vs_hf_per_set": vs_hf,
        "measured_accept_length": statistics.median(r["accept_length"] for r in mine) if mine else None,
    }


def predicted_vs_measured(predictions: list[dict], rows: list[dict]) -> list[dict]:
    """Each prediction with its benchmark measurement (rows of `run_benchmark`), best measured first."""
    found = [p | _measured(rows, p["label"]) for p in predictions]
    return sorted(found, key=lambda r: -(r["measured_speedup"] or 0.0))


def launch_flags(target: str, draft: str, label: str) -> tuple[list[str], dict]:
    """The SGLang launch line for a tuned shape and the doctor's verdict on it (import late: the doctor is heavy)."""
    from eagle3lab.doctor.diagnosis import diagnose
    from eagle3lab.engines.sglang.launch import launch_command
    from eagle3lab.models.target import resolve

    config, _ = parse_system_config(label)
    command = launch_command(
        str(resolve(target)),
        port=30000,
        draft=draft,
        algorithm="EAGLE3",
        steps=config.steps,
        topk=config.topk,
        num_draft_tokens=config.num_draft_tokens,
    )
    report = diagnose(launch=command, draft=draft)
    return command, report.to_dict()


def _load(settings: TuneSettings):
    """Target, draft, and the prompts of the profile and the benchmark."""
    from eagle3lab.models.target import load_target

    if settings.dtype not in DTYPES or min(settings.max_steps, settings.max_topk, settings.max_ndraft - 1) < 1:
        raise InputError(f"--dtype one of {DTYPES}; --max-steps, --max-topk >= 1 and --max-ndraft >= 2 ({settings})")
    if settings.threads:
        torch.set_num_threads(settings.threads)
    dtype = getattr(torch, settings.dtype)
    target = load_target(settings.target, dtype=dtype, device=resolve_device(settings.device))
    draft = load_bench_draft(settings.draft, target, dtype)
    sets = None if settings.prompts else split_list(settings.sets)
    return target, draft, sets, load_prompts(target.tokenizer, sets, settings.prompts, settings.limit)


def prefill_lengths(lengths: list[int]) -> list[int]:
    """The prompt lengths to measure prefill at: the shortest, the median and the longest of the benchmark's."""
    ordered = sorted(lengths)
    return sorted({ordered[0], ordered[len(ordered) // 2], ordered[-1]}) if ordered else []


def _costs(settings: TuneSettings, target, draft, other_per_round: float, requests: list[tuple[int, int]]) -> dict:
    """Forward costs from --costs, or measured here: every verify width up to --max-ndraft on a cache as long as the
    typical one while decoding (median prompt plus half the generation), and the prefill of the requests' prompts."""
    if settings.costs:
        costs = read_costs(settings.costs)
        if "prefill" not in costs:
            print(
                f"eagle3lab tune: {settings.costs} has no prefill costs: prefill ignored, predictions cover decoding "
                "alone (they read high on short generations)",
                file=sys.stderr,
            )
    else:
        lengths = [n for n, _ in requests]
        context = statistics.median_low(lengths) + statistics.median_low([g for _, g in requests]) // 2
        costs = measure_forward_costs(
            target.model,
            draft,
            context=context,
            ks=range(1, settings.max_ndraft + 1),
            prefill_lengths=prefill_lengths(lengths),
        )
        costs["source"] = "measured"
    costs.setdefault("other", other_per_round)
    return costs


def _requests(profile, prompts, max_new_tokens: int) -> list[tuple[int, int]]:
    """What the benchmark times: each prompt's length and the tokens the profile's greedy chain generated for it
    (the baseline generates the same; both stop at EOS), else max_new_tokens."""
    return profile.requests() or [(len(p.ids), max_new_tokens) for p in prompts]


def tune(settings: TuneSettings, progress: bool = True) -> dict:
    """The whole tuning run; returns the JSON result (see `main` for what is printed)."""
    target, draft, sets, prompts = _load(settings)
    profile = measure_profile(
        target.model,
        draft,
        [p.ids for p in prompts],
        settings.max_new_tokens,
        eos_ids(target),
        settings.max_steps,
        max(settings.max_topk, 2),
    )
    requests = _requests(profile, prompts, settings.max_new_tokens)
    costs = _costs(settings, target, draft, profile.other, requests)
    ranked = rank_predictions(
        profile,
        costs,
        max_steps=settings.max_steps,
        max_topk=settings.max_topk,
        max_ndraft=settings.max_ndraft,
        requests=requests,
    )
    chosen = [p for p in ranked if p.speedup > 1.0][: max(settings.top, 1)]
    result = {
        "settings": asdict(settings),
        "profile": profile.to_json(),
        "costs": costs,
        "requests": _describe(requests, costs),
        "predictions": [p.to_json() for p in ranked],
        "benchmark": None,
        "ranked": [],
        "winner": None,
        "decision": DO_NOT_SPECULATE,
        "launch": None,
        "doctor": None,
    }
    if not chosen:  # nothing is predicted to beat the baseline: no benchmark can make a case for speculating
        return result
    if settings.top == 0:  # predict only: the caller benchmarks the prediction beside its own configs
        return _decide(result, chosen[0].to_json(), chosen[0].speedup, settings)
    bench = run_benchmark(
        target,
        sets=sets,
        prompts_file=settings.prompts,
        limit=settings.limit,
        max_new_tokens=settings.max_new_tokens,
        configs=[p.label for p in chosen],
        drafts=[settings.draft],
        peers=("hf-generate",),
        repeats=settings.repeats,
        dtype=settings.dtype,
        progress=progress,
    )
    result["benchmark"] = bench
    result["ranked"] = predicted_vs_measured([p.to_json() for p in chosen], bench["rows"])
    best = result["ranked"][0]
    return _decide(result, best, best["measured_speedup"] or 0.0, settings)


def _describe(requests: list[tuple[int, int]], costs: dict) -> dict:
    """What the predictions assume: the requests (mean lengths) and whether prefill is in the model."""
    n = len(requests)
    return {
        "count": n,
        "prompt_tokens_mean": sum(p for p, _ in requests) / n if n else 0.0,
        "generated_tokens_mean": sum(g for _, g in requests) / n if n else 0.0,
        "prefill": "prefill" in costs,
    }


def _decide(result: dict, best: dict, speedup: float, settings: TuneSettings) -> dict:
    """Speculate with `best` only when it beats the baseline; then its launch flags and the doctor's verdict."""
    if speedup > 1.0:
        result["winner"] = best
        result["decision"] = best["label"]
        result["launch"], result["doctor"] = launch_flags(settings.target, settings.draft, best["label"])
    return result


RANK_COLUMNS = (
    Column("config", "label", 14, left=True),
    Column("accept", "accept_length", 6, ".2f"),
    Column("predicted", "speedup", 9, ".2f"),
    Column("decode", "decode_speedup", 6, ".2f"),
    Column("measured", "measured_speedup", 8, ".2f"),
    Column("meas. acc", "measured_accept_length", 9, ".2f"),
)


def format_result(result: dict) -> str:
    """The ranked table (predicted vs measured), then the decision and the winner's launch flags."""
    rows = result["ranked"] or result["predictions"][:5]
    lines = [render_rows(rows, RANK_COLUMNS, details=False), _model_line(result.get("requests"))]
    for r in result["ranked"]:
        per_set = ", ".join(f"{s} {v:.2f}x" for s, v in r["measured_per_set"].items())
        vs_hf = ", ".join(f"{s} {v:.2f}x" for s, v in r["measured_vs_hf_per_set"].items() if v)
        lines.append(f"  {r['label']}: vs baseline {per_set}; vs HF generate {vs_hf}")
    if result["winner"] is None:
        lines.append(f"decision: {DO_NOT_SPECULATE} (no shape beats the baseline on this machine)")
        return "\n".join(lines)
    winner = result["winner"]
    lines.append(f"decision: {winner['label']} (threshold {winner['threshold']:g}; 0 = SGLang's fixed shape)")
    lines.append("SGLang launch: " + " ".join(result["launch"]))
    summary = result["doctor"]["summary"]
    lines.append(f"doctor: {summary} (exit {result['doctor']['exit_code']})")
    return "\n".join(lines)


def _model_line(requests: dict | None) -> str:
    """What "predicted" means: whole requests with prefill, or decoding alone ("decode" is always decoding alone)."""
    if not requests or not requests["prefill"]:
        return "predicted: decoding alone (no prefill costs), like the decode column"
    return (
        f"predicted: whole requests, prefill included ({requests['count']} prompts of "
        f"{requests['prompt_tokens_mean']:.0f} tokens, {requests['generated_tokens_mean']:.0f} generated, on average); "
        "decode: decoding alone"
    )
