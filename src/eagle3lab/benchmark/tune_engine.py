"""`eagle3lab tune --engine vllm`: the draft length for a draft in a real serving engine, from that engine's own
measurements, or "do not speculate".

vLLM drafts chains (config 1,k,1,k+1). Calibration serves the tune prompts three times, each on a fresh server: the
target alone (the cost of a plain step, per generated token), and the draft at k=1 and at the deepest k (the cost of
a round, per drafted round; a round is one target verify of k+1 tokens plus k draft forwards, so its cost is taken
as linear in k between the two). The deepest server's per-position counters give the draft's acceptance at every
shallower k too, since a chain's position i is only reached through positions 0..i-1. Then, for each k,

    predicted speedup(k) = tau(k) * t_step / t_round(k),    tau(k) = 1 + sum_{i<k} accepted_i / rounds

(Leviathan et al.; REFERENCE.md). The top few predicted go through `bench --engine` on fresh servers beside the
engine's baseline, and the measured winner gets its launch line, checked by the doctor.
"""

from __future__ import annotations

import shlex
import statistics
from pathlib import Path

from eagle3lab.benchmark.served import make_engine, run_served_benchmark
from eagle3lab.benchmark.table import Column, render_rows
from eagle3lab.benchmark.tune import DO_NOT_SPECULATE
from eagle3lab.decoding.config import BASELINE
from eagle3lab.io import InputError
from eagle3lab.models.target import resolve


def chain(k: int) -> str:
    return f"1,{k},1,{k + 1}"


def _bench(tune_settings, configs: list[str], peers=()) -> dict:
    """`bench --engine` on the tune prompts with the tune draft (BenchSettings built from TuneSettings)."""
    from eagle3lab.benchmark.run import BenchSettings, split_list

    s = tune_settings
    bench = BenchSettings(
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
    return run_served_benchmark(bench)


def _totals(per_prompt: list[dict], config: str) -> dict:
    """Tokens, seconds, rounds and accepted-per-position of one config over every prompt."""
    mine = [r for r in per_prompt if r["config"] == config]
    width = max((len(r["per_position"]) for r in mine), default=0)
    return {
        "tokens": sum(r["completion_tokens"] for r in mine),
        "seconds": sum(r["seconds"] for r in mine),
        "rounds": sum(r["drafts"] or 0 for r in mine),
        "per_position": [sum(r["per_position"][i] for r in mine if i < len(r["per_position"])) for i in range(width)],
    }


def calibrate(settings) -> dict:
    """The engine's step and round costs and the draft's per-position acceptance, measured on the tune prompts."""
    deepest = settings.max_steps
    if deepest < 2:
        raise InputError(f"--max-steps {deepest}: calibration needs the draft at k=1 and at a deeper k (>= 2)")
    return calibration_from(_bench(settings, [BASELINE.label, chain(1), chain(deepest)]), settings.draft, deepest)


def calibration_from(measured: dict, draft, deepest: int) -> dict:
    """The calibration read off a `bench --engine` result that holds the baseline and `draft` at k=1 and k=deepest
    (stage 04's benchmark of several k serves as its own calibration)."""
    mine = [r for r in measured["per_prompt"] if r["system"] in ("baseline", Path(draft).name)]
    base, one, deep = (_totals(mine, c) for c in (BASELINE.label, chain(1), chain(deepest)))
    for name, t in (("k=1", one), (f"k={deepest}", deep)):
        if not t["rounds"]:
            raise InputError(f"calibration: the draft at {name} drafted no round (the engine did not speculate)")
    round_1, round_deep = one["seconds"] / one["rounds"], deep["seconds"] / deep["rounds"]
    return {
        "engine": measured["meta"]["engine"],
        "engine_settings": measured["meta"]["engine_settings"],
        "step_s": base["seconds"] / base["tokens"],
        "round_s": {1: round_1, deepest: round_deep},
        "round_s_per_k": (round_deep - round_1) / (deepest - 1),
        "position_acceptance": [a / deep["rounds"] for a in deep["per_position"]],
        "rounds": deep["rounds"],
        "servers": measured["meta"]["servers"],
    }


def predict(cal: dict) -> list[dict]:
    """Every chain length up to the calibrated depth, best predicted first."""
    (k1, round_1), *_ = sorted(cal["round_s"].items())
    out = []
    for k in range(1, len(cal["position_acceptance"]) + 1):
        tau = 1.0 + sum(cal["position_acceptance"][:k])
        round_s = round_1 + (k - k1) * cal["round_s_per_k"]
        out.append({"label": chain(k), "k": k, "accept_length": tau, "round_s": round_s})
        # break-even and 2x: the accept length at which a round's tokens pay for its cost once and twice over
        out[-1] |= {"speedup": tau * cal["step_s"] / round_s, "tau_for_2x": 2 * round_s / cal["step_s"]}
    return sorted(out, key=lambda p: -p["speedup"])


def _measured(rows: list[dict], label: str, system: str) -> dict:
    mine = [r for r in rows if r["config"] == label and r["system"] == system and r["engine"] != "local"]
    return {
        "measured_speedup": statistics.median(r["speedup_vs_baseline"] for r in mine) if mine else None,
        "measured_accept_length": statistics.median(r["accept_length"] for r in mine) if mine else None,
        "measured_vs_hf": statistics.median(r["speedup_vs_hf_generate"] or 0 for r in mine) if mine else None,
    }


def _result(cal: dict) -> dict:
    return {"engine": cal["engine"], "calibration": cal, "predictions": predict(cal), "ranked": [], "benchmark": None}


def _decide(result: dict, predictions: list[dict], bench: dict, settings, draft) -> dict:
    """Predictions beside their measurement in `bench` (best measured first); speculate only when the best beats
    the engine's baseline, with its launch line and the doctor's verdict."""
    system = Path(draft).name
    result["benchmark"] = bench
    result["ranked"] = sorted(
        (p | _measured(bench["rows"], p["label"], system) for p in predictions),
        key=lambda r: -(r["measured_speedup"] or 0.0),
    )
    result |= {"winner": None, "decision": DO_NOT_SPECULATE, "launch": None, "doctor": None}
    best = result["ranked"][0] if result["ranked"] else None
    if best and (best["measured_speedup"] or 0.0) > 1.0:
        result["winner"], result["decision"] = best, best["label"]
        result["launch"], result["doctor"] = launch_line(settings, draft, best["k"])
    return result


def tune_in_engine(settings) -> dict:
    """The whole run (TuneSettings with `engine` set): calibration, predictions, benchmark of the top few, decision."""
    result = _result(calibrate(settings))
    chosen = [p for p in result["predictions"] if p["speedup"] > 1.0][: max(settings.top, 1)]
    if not chosen or settings.top == 0:  # nothing predicted to pay (or predict only): nothing to benchmark
        return _decide(result, [], {"rows": []}, settings, settings.draft)
    bench = _bench(settings, [p["label"] for p in chosen], peers=("hf-generate",))
    return _decide(result, chosen, bench, settings, settings.draft)


def tune_from_benchmark(bench: dict, settings, draft, deepest: int) -> dict:
    """The same decision from a `bench --engine` run that measured `draft` at every k up to `deepest` (stage 04):
    calibrated on k=1 and k=deepest, so the k between them check the model against the measurement."""
    result = _result(calibration_from(bench, draft, deepest))
    return _decide(result, result["predictions"], bench, settings, draft)


def launch_line(settings, draft, k: int) -> tuple[list[str], dict]:
    """The engine's launch line for `draft` at k, and the doctor's verdict on it (import late: the doctor is heavy).
    `settings`: TuneSettings or BenchSettings (engine, dtype, compile mode, target)."""
    from eagle3lab.doctor.diagnosis import diagnose

    command = make_engine(settings).launch_command(resolve(settings.target), port=8000, draft=draft, k=k)
    return command, diagnose(launch=command, draft=draft).to_dict()


COLUMNS = (
    Column("config", "label", 9, left=True),
    Column("accept", "accept_length", 6, ".2f"),
    Column("round ms", "round_ms", 8, ".1f"),
    Column("predicted", "speedup", 9, ".2f"),
    Column("2x needs", "tau_for_2x", 8, ".2f"),
    Column("measured", "measured_speedup", 8, ".2f"),
    Column("meas. acc", "measured_accept_length", 9, ".2f"),
    Column("x HF", "measured_vs_hf", 5, ".2f"),
)


def format_engine_result(result: dict) -> str:
    """The calibration, the ranked table (predicted vs measured), then the decision and the winner's launch line."""
    cal = result["calibration"]
    acceptance = " ".join(f"{a:.2f}" for a in cal["position_acceptance"])
    rows = [r | {"round_ms": r["round_s"] * 1e3} for r in (result["ranked"] or result["predictions"][:5])]
    lines = [
        f"{result['engine']}: plain step {cal['step_s'] * 1e3:.1f} ms/token; round "
        + ", ".join(f"k={k} {s * 1e3:.1f} ms" for k, s in cal["round_s"].items())
        + f"; per-position acceptance {acceptance} ({cal['rounds']} rounds)",
        render_rows(rows, COLUMNS, details=False),
    ]
    if result["winner"] is None:
        lines.append(f"decision: {DO_NOT_SPECULATE} (no draft length beats {result['engine']}'s own baseline here)")
        return "\n".join(lines)
    command = result["launch"]
    lines.append(f"decision: {result['decision']} (k={result['winner']['k']})")
    lines.append(f"{result['engine']} launch: {shlex.join(command)}")
    lines.append(f"doctor: {result['doctor']['summary']} (exit {result['doctor']['exit_code']})")
    return "\n".join(lines)
