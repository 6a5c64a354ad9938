"""Stage 05's findings table: every question the pipeline answers, one row each, with the figure, its interval, the
units the interval resamples, how many there were, and a verdict.

Verdicts: "shown" (the interval excludes zero, or the size read off the curve lies inside the measured sizes with its
whole interval), "not shown" (it does not), "out of the data" (the answer would need the curve past the largest
scale trained: an extrapolation, never reported as a finding). README's results read these verdicts."""

from __future__ import annotations

import math

from eagle3lab.benchmark.comparisons import ALL_SETS, verdict
from eagle3lab.benchmark.scaling import LEVEL

OUT_OF_DATA = "out of the data"
FIT_UNIT = "prompts (the fit's bootstrap; seeds averaged per prompt, not resampled)"


def _row(question: str, figure, low, high, unit: str, prompts, seeds, result: str, **more) -> dict:
    return {
        "question": question,
        "figure": figure,
        "low": low,
        "high": high,
        "level": LEVEL,
        "unit": unit,
        "prompts": prompts,
        "seeds": seeds,
        "verdict": result,
        **more,
    }


def _difference_unit(seeds) -> str:
    return "prompts x seeds" if seeds and min(seeds) > 1 else "prompts (one seed: training noise not in the interval)"


# the question each of the plan's other pairings asks (train.plan's `responses`); a recipe lever asks the default
QUESTIONS = {
    "sampled": "sampled (T=0.7) minus greedy (T=0) answers, {scale} conversations",
    "dflash": "DFlash minus EAGLE-3 at equal data and steps, {scale} conversations",
}


def paired_findings(paired: list[dict]) -> list[dict]:
    """Regenerated against original answers (at equal answer tokens), T=0 against T=0.7, each recipe lever against
    the shared recipe at its scale, and DFlash against EAGLE-3 on the same data, over every prompt."""
    rows = []
    for r in paired:
        if r["set"] != ALL_SETS:
            continue
        if r["responses"] == "original":  # asked the seeds' way round: does regenerating beat the originals?
            question = f"regenerated minus original answers, {r['scale']} conversations' answer tokens"
            figure, low, high = -r["difference"], _neg(r["high"]), _neg(r["low"])
        else:
            asked = QUESTIONS.get(r["responses"], "{draft} minus the shared recipe ({partner})")
            question = asked.format(**r)
            figure, low, high = r["difference"], r["low"], r["high"]
        unit = _difference_unit(r.get("seeds"))
        rows.append(_row(question, figure, low, high, unit, r["prompts"], r.get("seeds"), verdict(low, high)))
    return rows


def _neg(x):
    return None if x is None else -x


def beside_findings(beside: list[dict]) -> list[dict]:
    """Each draft trained elsewhere against the pipeline's draft nearest its data size."""
    rows = []
    for r in beside:
        # one row a draft: over every prompt where the sweep paired it, else MT-bench's set means (no all-sets row)
        if r["set"] != (ALL_SETS if r["paired"] else "mtbench"):
            continue
        question = f"{r['draft']} minus the pipeline's {r['pipeline_draft']}"
        unit = _difference_unit(r.get("seeds")) if r["paired"] else "set means (not paired: no interval)"
        rows.append(
            _row(question, r["difference"], r["low"], r["high"], unit, r["prompts"], r.get("seeds"), r["verdict"])
        )
    return rows


def source_finding(rank: dict | None, sources: list[dict]) -> list[dict]:
    """Does the on-policy score (the target's NLL of a source's answers) rank the per-source drafts? The seeds'
    criterion predicts rho = -1; with n points the exact permutation test is the only interval there is."""
    if rank is None:
        return []
    shown = "shown" if rank["p_value"] < 1 - LEVEL and rank["rho"] < 0 else "not shown"
    return [
        _row(
            "on-policy score predicts the per-source draft (Spearman rho, NLL vs accept length)",
            rank["rho"],
            None,
            None,
            f"drafts (exact permutation p = {rank['p_value']:.2f})",
            sources[0]["prompts"] if sources else None,
            sources[0].get("seeds") if sources else None,
            shown,
            points=rank["points"],
        )
    ]


def curve_findings(fits: dict, needed: list[dict], prompts: dict[str, int], seeds: int) -> list[dict]:
    """Per set: accept length gained per doubling of data (shown where its interval excludes zero), and the data each
    engine needs to break even and to reach 1.5x and 2x (shown only inside the measured sizes)."""
    rows = []
    for set_name, fit in fits.items():
        low, high = fit.gain_per_doubling_interval
        rows.append(
            _row(
                f"accept length gained per doubling of data, {set_name}",
                fit.gain_per_doubling,
                low,
                high,
                FIT_UNIT,
                prompts.get(set_name),
                seeds,
                verdict(low, high),
                sizes=[min(fit.sizes), max(fit.sizes)],
            )
        )
    for r in needed:
        records, interval = r["records"], r["interval"] or [None, None]
        inside = isinstance(records, (int, float)) and math.isfinite(records) and records <= max(fits[r["set"]].sizes)
        whole = all(isinstance(x, (int, float)) and math.isfinite(x) for x in interval)
        result = OUT_OF_DATA if not inside else ("shown" if whole else "not shown")  # BEYOND, OUT_OF_REACH: not inside
        rows.append(
            _row(
                f"conversations for {r['speedup']:g}x in {r['engine']} ({r['shape']}), {r['set']}",
                records,
                interval[0],
                interval[1],
                FIT_UNIT,
                prompts.get(r["set"]),
                seeds,
                result,
                accept_length_needed=r["accept_length"],
            )
        )
    return rows
