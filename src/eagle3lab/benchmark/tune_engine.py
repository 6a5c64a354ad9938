"""`eagle3lab tune --engine vllm|llamacpp`: the draft shape for a draft in a real serving engine, from that engine's
own measurements, or "do not speculate".

The served engines draft chains (config 1,k,1,k+1; llama.cpp also stops a chain below a draft probability, its
p-min, written 1,k,1,k+1@p), fixed when the server starts. So tune serves the tune prompts on one fresh server per
shape (k from 1 to --max-steps, times P_MIN_GRID where the engine has p-min) and one for the target alone, then
splits the prompts in two: every other prompt calibrates, the rest check. On the calibration half it reads the
engine's cost of a plain step (per generated token), its cost of a round for each shape (per drafted round: one
target verify plus the draft forwards; on vLLM's CPU build it is not linear in k, so each shape is measured), and the
draft's accept length for each shape (the engine's own counters). Then

    predicted speedup = tau * t_step / t_round    (Leviathan et al.; REFERENCE.md)

(with p-min, steps that draft nothing make it the calibration half's tok/s over the baseline's)

and the accept length 2x would need, 2 t_round / t_step. The held-out half measures every k against the engine's
baseline on prompts the model never saw; the measured winner gets its launch line, checked by the doctor, or the
decision is "do not speculate" when no k beats the baseline.
"""

from __future__ import annotations

import shlex
import statistics
from pathlib import Path

from eagle3lab.benchmark.engine_choice import make_engine
from eagle3lab.benchmark.served import THRESHOLDS, chain_shape, run_served_benchmark
from eagle3lab.benchmark.table import DO_NOT_SPECULATE, Column, render_rows
from eagle3lab.decoding.config import BASELINE
from eagle3lab.io import InputError

P_MIN_GRID = (0.0, 0.5, 0.8)  # llama.cpp's --spec-draft-p-min values tried (0: draft all k tokens every round)


def chain(k: int, threshold: float = 0.0) -> str:
    return f"1,{k},1,{k + 1}" + (f"@{threshold:g}" if threshold else "")


def bench_settings(tune_settings, configs: list[str], peers=()):
    """`bench --engine`'s settings (BenchSettings) for the tune prompts and draft (TuneSettings)."""
    from eagle3lab.benchmark.run import BenchSettings, split_list

    s = tune_settings
    return BenchSettings(
        target=s.target,
        sets=[] if s.prompts else split_list(s.sets),
        prompts_file=s.prompts,
        limit=s.limit,
        max_new_tokens=s.max_new_tokens,
        configs=configs,
        drafts=[s.draft],
        peers=list(peers),
        repeats=s.repeats,
        dtype=s.dtype,
        device=s.device,
        engine=s.engine,
        eager=s.eager,
    )


def split_prompts(per_prompt: list[dict]) -> tuple[set, set]:
    """The calibration half (every other prompt, in benchmark order) and the held-out half, as (set, id) keys."""
    keys = list(dict.fromkeys((r["set"], r["id"]) for r in per_prompt))
    if len(keys) < 2:
        raise InputError(f"tune in an engine needs at least 2 prompts (one calibrates, one checks); got {len(keys)}")
    return set(keys[0::2]), set(keys[1::2])


def _totals(per_prompt: list[dict], system: str, config: str, keys: set) -> dict:
    """Tokens, seconds, rounds and accepted-per-position of one server over the prompts in `keys`."""
    mine = [r for r in per_prompt if (r["system"], r["config"]) == (system, config) and (r["set"], r["id"]) in keys]
    width = max((len(r["per_position"]) for r in mine), default=0)
    return {
        "tokens": sum(r["completion_tokens"] for r in mine),
        "seconds": sum(r["seconds"] for r in mine),
        "rounds": sum(r["drafts"] or 0 for r in mine),
        "accepted": sum(r["accepted"] or 0 for r in mine),
        "per_position": [sum(r["per_position"][i] for r in mine if i < len(r["per_position"])) for i in range(width)],
    }


def _draft_shapes(measured: dict, system: str) -> dict[str, tuple[int, float]]:
    """The draft's served configs and their (k, threshold), shallowest first."""
    configs = {r["config"] for r in measured["per_prompt"] if r["system"] == system}
    shapes = {c: chain_shape(c, measured["meta"]["engine"]) for c in configs}
    return dict(sorted(shapes.items(), key=lambda item: item[1]))


def calibration_from(measured: dict, draft) -> dict:
    """The engine's step cost, and the draft's round cost and accept length for every shape it was served with, read
    off the calibration half of a `bench --engine` result (the baseline and `draft` at several shapes)."""
    system, per_prompt = Path(draft).name, measured["per_prompt"]
    calibration, _ = split_prompts(per_prompt)
    base = _totals(per_prompt, "baseline", BASELINE.label, calibration)
    if not base["tokens"]:
        raise InputError("calibration: the benchmark has no baseline run (the target alone) to compare against")
    shapes = _draft_shapes(measured, system)
    if not shapes:
        raise InputError(f"calibration: the benchmark served no draft named {system}")
    totals = {label: _totals(per_prompt, system, label, calibration) for label in shapes}
    for label, t in totals.items():
        if not t["rounds"]:
            raise InputError(f"calibration: the draft at {label} drafted no round (the engine did not speculate)")
    round_s = {label: t["seconds"] / t["rounds"] for label, t in totals.items()}
    accept = {label: 1.0 + t["accepted"] / t["rounds"] for label, t in totals.items()}
    # with p-min some steps do not draft: rounds undercount the steps, so the speedup reads tokens and seconds
    tokens_per_s = {label: t["tokens"] / t["seconds"] for label, t in totals.items()}
    # per position from the deepest chain without p-min: every position is drafted in every round there
    deepest_label = max(shapes, key=lambda c: (shapes[c][1] == 0.0, shapes[c][0]))
    deepest = totals[deepest_label]
    return {
        "engine": measured["meta"]["engine"],
        "engine_settings": measured["meta"]["engine_settings"],
        "prompts": len(calibration),
        "step_s": base["seconds"] / base["tokens"],
        "shapes": shapes,
        "round_s": round_s,
        "accept_length": accept,
        "tokens_per_s": tokens_per_s,
        "deepest": deepest_label,
        "position_acceptance": [a / deepest["rounds"] for a in deepest["per_position"]],
        "rounds": deepest["rounds"],
        "servers": measured["meta"]["servers"],
    }


def predict(cal: dict, offline: dict[int, float] | None = None) -> list[dict]:
    """Every calibrated draft shape, best predicted first. `offline` ({k: accept length}, a drafter's exact offline
    acceptance at k, as DFlash's tune gives): predict tau_offline(k) * t_step / t_round(k), the engine's costs with
    the offline acceptance, instead of the calibration's own tokens/s."""
    out = []
    for label, round_s in cal["round_s"].items():
        k, threshold = cal["shapes"][label]
        tau = cal["accept_length"][label]
        out.append({"label": label, "k": k, "threshold": threshold, "accept_length": tau, "round_s": round_s})
        # break-even and 2x: the accept length at which a round's tokens pay for its cost once and twice over
        # tau * t_step / t_round where every step drafts; measured throughput where p-min skips some
        out[-1] |= {"speedup": cal["tokens_per_s"][label] * cal["step_s"], "tau_for_2x": 2 * round_s / cal["step_s"]}
        if offline is not None:
            if k not in offline:
                raise InputError(f"predict: no offline accept length at k={k} (have k = {sorted(offline)})")
            out[-1] |= {"offline_accept_length": offline[k], "speedup": offline[k] * cal["step_s"] / round_s}
    return sorted(out, key=lambda p: -p["speedup"])


def _held_out(per_prompt: list[dict], system: str, label: str, keys: set) -> dict:
    """One shape against the baseline on the held-out prompts."""
    base, mine = (_totals(per_prompt, s, c, keys) for s, c in (("baseline", BASELINE.label), (system, label)))
    if not (mine["seconds"] and base["seconds"] and base["tokens"]):
        return {"measured_speedup": None, "measured_accept_length": None}
    return {
        "measured_speedup": (mine["tokens"] / mine["seconds"]) / (base["tokens"] / base["seconds"]),
        "measured_accept_length": 1.0 + mine["accepted"] / mine["rounds"] if mine["rounds"] else None,
    }


def _all_prompts(rows: list[dict], label: str, system: str) -> dict:
    """Medians over sets, every prompt counted: against the engine's baseline and HF generate."""
    mine = [r for r in rows if r["config"] == label and r["system"] == system and r["engine"] != "local"]

    def median(key: str) -> float | None:
        values = [r[key] for r in mine]
        return statistics.median(values) if values and None not in values else None

    return {"all_speedup": median("speedup_vs_baseline"), "measured_vs_hf": median("speedup_vs_hf_generate")}


def tune_from_benchmark(bench: dict, settings, draft, offline: dict | None = None, engine=None) -> dict:
    """The decision from a `bench --engine` run of the baseline and `draft` at several k (tune's own, or stage
    04's): predictions from the calibration half (with `offline` acceptance, see `predict`) beside the held-out
    measurement, best measured first; speculate only when the best beats the engine's baseline, with its launch line
    (from `engine`, default the settings' own) and the doctor's verdict."""
    cal = calibration_from(bench, draft)
    system, (_, held_out) = Path(draft).name, split_prompts(bench["per_prompt"])
    predictions = predict(cal, offline)
    ranked = sorted(
        (
            p
            | _held_out(bench["per_prompt"], system, p["label"], held_out)
            | _all_prompts(bench["rows"], p["label"], system)
            for p in predictions
        ),
        key=lambda r: -(r["measured_speedup"] or 0.0),
    )
    result = {"engine": cal["engine"], "calibration": cal, "held_out_prompts": len(held_out), "ranked": ranked}
    result |= {"predicted_best": predictions[0]["label"] if predictions else None}
    result |= {"benchmark": bench, "winner": None, "decision": DO_NOT_SPECULATE, "launch": None, "doctor": None}
    best = ranked[0] if ranked else None
    if best and (best["measured_speedup"] or 0.0) > 1.0:
        result["winner"], result["decision"] = best, best["label"]
        if cal["engine"] != "local":  # our own engine has no launch line
            launch = launch_line(settings, draft, best["k"], best["threshold"], engine)
            result["launch"], result["doctor"] = launch
    return result


def tune_in_engine(settings) -> dict:
    """The whole run (TuneSettings with `engine` set): the baseline and every shape (k = 1..--max-steps, times
    P_MIN_GRID where the engine has p-min) on fresh servers, then the decision."""
    if settings.max_steps < 1:
        raise InputError(f"--max-steps {settings.max_steps}: the engine needs a draft length of at least 1")
    thresholds = P_MIN_GRID if settings.engine in THRESHOLDS else (0.0,)
    configs = [BASELINE.label] + [chain(k, p) for k in range(1, settings.max_steps + 1) for p in thresholds]
    bench = run_served_benchmark(bench_settings(settings, configs, peers=("hf-generate",)))
    return tune_from_benchmark(bench, settings, settings.draft)


def launch_line(settings, draft, k: int, threshold: float = 0.0, engine=None) -> tuple[list[str], dict]:
    """The engine's launch line for `draft` at k (and p-min), and the doctor's verdict on it (import late: the doctor
    is heavy). `settings`: TuneSettings or BenchSettings (engine, dtype, compile mode, target); `engine`: one
    configured otherwise (DFlash's)."""
    from eagle3lab.doctor.diagnosis import diagnose

    engine = engine or make_engine(settings)
    command = engine.launch_command(engine.model(settings.target), port=8000, draft=draft, k=k, threshold=threshold)
    return command, diagnose(launch=command, draft=draft).to_dict()


COLUMNS = (
    Column("config", "label", 9, left=True),
    Column("accept", "accept_length", 6, ".2f"),
    Column("offline", "offline_accept_length", 7, ".2f"),
    Column("round ms", "round_ms", 8, ".1f"),
    Column("predicted", "speedup", 9, ".2f"),
    Column("2x needs", "tau_for_2x", 8, ".2f"),
    Column("measured", "measured_speedup", 8, ".2f"),
    Column("meas. acc", "measured_accept_length", 9, ".2f"),
    Column("all x base", "all_speedup", 10, ".2f"),
    Column("all x HF", "measured_vs_hf", 8, ".2f"),
)


def format_engine_result(result: dict) -> str:
    """The calibration, the ranked table (predicted vs measured), then the decision and the winner's launch line."""
    cal = result["calibration"]
    acceptance = " ".join(f"{a:.2f}" for a in cal["position_acceptance"])
    rows = [r | {"round_ms": r["round_s"] * 1e3} for r in result["ranked"]]
    lines = [
        f"{result['engine']}: calibrated on {cal['prompts']} prompts, measured on the other "
        f"{result['held_out_prompts']}; plain step {cal['step_s'] * 1e3:.1f} ms/token; per-position acceptance "
        f"{acceptance} ({cal['deepest']}, {cal['rounds']} rounds)",
        render_rows(rows, COLUMNS, details=False),
    ]
    if result.get("predicted_best"):
        lines.append(f"predicted best: {result['predicted_best']}")
    if result["winner"] is None:
        lines.append(f"decision: {DO_NOT_SPECULATE} (no draft length beats {result['engine']}'s own baseline here)")
        return "\n".join(lines)
    winner = result["winner"]
    lines.append(f"decision: {result['decision']} (k={winner['k']}, threshold {winner['threshold']:g})")
    if result["launch"]:
        lines.append(f"{result['engine']} launch: {shlex.join(result['launch'])}")
        lines.append(f"doctor: {result['doctor']['summary']} (exit {result['doctor']['exit_code']})")
    return "\n".join(lines)
