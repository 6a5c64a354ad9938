"""The data bet's forecast, tested on scales it never saw: accept length against training conversations, read from the
grid's draft records (metrics/drafts/NAME.json: every training seed of every scale, per prompt).

A curve that fits the scales it was fitted on says little about the next one: the forms here are judged by how well
they predict. Each is fitted on the scales below a held-out one and predicts it:
- `log-line`: tau = p + q ln n, a constant gain per doubling, no ceiling;
- `power-gain`: tau - 1 = k n^e, a straight line in log-log, no ceiling;
- `saturating`: tau = a - b n^-c, stage 05's form (`benchmark.scaling`), a ceiling below the chain's.
The form is chosen by its forecast error on the fitting scales alone (each scale from the ones below it, rolling
origin), so the held-out scale's backtest stays a test. Every interval is a bootstrap over the units that vary, drawn
together: the prompts (the same resample at every scale, so scales stay paired) and each scale's training seeds. The
verdict on a backtest (the measured value inside the predicted interval or not) is read under several bootstrap seeds:
`borderline` where it depends on the seed.

The chosen form, fitted on every scale measured, then answers the seeds' question per engine: the conversations at
which it reaches that engine's break-even accept length, and whether ten times the largest scale would get there. Both
are projections past the data and labelled so. The accept length each engine needs comes from the grid's cost cells
(`benchmark.timed_costs`: every timing kept), so break-even's interval carries timing noise too, and each engine's two
cells, measured in separate processes, show whether it holds from one measurement to the next.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eagle3lab.benchmark.pooled_costs import POOLED, needed, pooled_need, tau_draws
from eagle3lab.benchmark.scaling import EXPONENT_BOUNDS, LEVEL, quantiles
from eagle3lab.benchmark.timed_costs import TimedCosts
from eagle3lab.io import InputError, require

ALL = "all"  # every prompt of the evaluation set, beside each set
DATA_BET = 10  # the seeds' plan: ten times the data
REACH = 10  # the furthest past the largest scale measured a forecast is read (a projection, labelled so)
BEYOND_CURVE = "beyond what this curve can say"
BELOW_CURVE = "at or below the smallest scale measured"


# The saturating form's exponents tried: for each, `a` and `b` are a linear least-squares fit, so every bootstrap draw
# is fitted at once (curve_fit took 30 ms a draw, 12 minutes a forecast on 2 cores), to a grid as fine as the
# bootstrap's own spread warrants.
EXPONENTS = np.geomspace(*EXPONENT_BOUNDS, 600)


def _linear(features: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Least-squares coefficients [draws, features] of every row of ys [draws, points] on features [points, k]."""
    return ys @ np.linalg.pinv(features).T


def _log_line(sizes, ys, targets, ceiling):
    beta = _linear(np.stack([np.ones_like(sizes), np.log(sizes)], axis=1), ys)
    return beta[:, :1] + beta[:, 1:] * np.log(targets)


def _power_gain(sizes, ys, targets, ceiling):
    with np.errstate(invalid="ignore", divide="ignore"):  # NaN where a draw reads an accept length at or below 1
        beta = _linear(np.stack([np.ones_like(sizes), np.log(sizes)], axis=1), np.log(ys - 1))
        return 1 + np.exp(beta[:, :1] + beta[:, 1:] * np.log(targets))


def _saturating(sizes, ys, targets, ceiling):
    """tau = a - b n^-c with b >= 0 and a at most the chain's ceiling, by least squares over EXPONENTS."""
    best_error = np.full(len(ys), np.inf)
    best = np.zeros((3, len(ys)))  # a, b, c of each draw
    for c in EXPONENTS:
        u = sizes ** (-c)
        a, b = _linear(np.stack([np.ones_like(u), -u], axis=1), ys).T
        capped = a > ceiling  # the bound: a at the ceiling, b refitted
        b = np.where(capped, (ceiling - ys) @ u / (u @ u), b)
        a = np.where(capped, ceiling, a)
        flat = b < 0  # no gain with data: the mean
        a, b = np.where(flat, ys.mean(axis=1), a), np.where(flat, 0.0, b)
        error = ((a[:, None] - b[:, None] * u - ys) ** 2).sum(axis=1)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best = np.where(better, np.stack([a, b, np.full_like(a, c)]), best)
    a, b, c = (row[:, None] for row in best)
    return a - b * np.power(targets, -c)


@dataclass(frozen=True)
class Form:
    name: str
    least_scales: int  # scales a fit needs
    predictor: object  # (sizes [k], draws [D, k], target sizes [T], ceiling) -> predictions [D, T]

    def predict(self, sizes, ys, target: float, ceiling: float) -> np.ndarray:
        """Each row of ys [draws, scales at `sizes`] fitted and read at `target`: [draws]."""
        return self.curve(sizes, ys, np.array([float(target)]), ceiling)[:, 0]

    def curve(self, sizes, ys, targets: np.ndarray, ceiling: float) -> np.ndarray:
        """Each row of ys fitted and read at every size of `targets`: [draws, targets]."""
        ys = np.atleast_2d(np.asarray(ys, float))
        return self.predictor(np.asarray(sizes, float), ys, np.asarray(targets, float)[None, :], ceiling)


FORMS = {
    form.name: form
    for form in (Form("log-line", 2, _log_line), Form("power-gain", 2, _power_gain), Form("saturating", 3, _saturating))
}


@dataclass
class Curve:
    """One prompt set's accept lengths: tau[scale][seed replicate, prompt], the same prompts at every scale."""

    sizes: list[int]
    taus: list[np.ndarray]

    def means(self) -> np.ndarray:
        return np.array([t.mean() for t in self.taus])

    def draws(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """[count, scales] bootstrap means: prompts resampled once per draw for every scale, seeds per scale (each as
        how often a draw picks it, so a draw's mean is a weighted one)."""
        prompts = self.taus[0].shape[1]
        picked = np.stack([np.bincount(rng.integers(0, prompts, prompts), minlength=prompts) for _ in range(count)])
        out = np.empty((count, len(self.sizes)))
        for s, t in enumerate(self.taus):
            per_seed = t @ picked.T / prompts  # [seeds, count]: each seed's mean over the draw's prompts
            seeds = np.stack([np.bincount(rng.integers(0, len(t), len(t)), minlength=len(t)) for _ in range(count)])
            out[:, s] = (seeds * per_seed.T).sum(axis=1) / len(t)
        return out


def read_records(folder: Path, responses: tuple[str, ...] = ("regenerated",)) -> list[dict]:
    """The grid's EAGLE-3 drafts on these kinds of answers (regenerated: the scale curve) from their records, each
    checked for the fields read here: an InputError names the file and field."""
    drafts = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not valid JSON ({e.msg})") from None
        if require(record, "responses", str(path), str) not in responses or record.get("drafter") != "eagle3":
            continue
        require(record, "records", str(path), int)
        training = require(record, "training", str(path), dict)
        require(training, "stopped_by", f"{path}: training", str)
        acceptance = require(record, "acceptance", str(path), dict)
        for i, row in enumerate(require(acceptance, "per_prompt", f"{path}: acceptance", list)):
            for field, kind in (("set", str), ("id", str), ("accept_length", (int, float))):
                require(row, field, f"{path}: acceptance.per_prompt[{i}]", kind)
        drafts.append(record | {"path": str(path)})
    return drafts


def curves(drafts: list[dict]) -> dict[str, Curve]:
    """Per set (and ALL): each scale's [seeds, prompts] accept lengths. Every draft must hold the same prompts."""
    by_scale: dict[int, list[dict]] = {}
    for draft in drafts:
        by_scale.setdefault(draft["records"], []).append(draft)
    first = drafts[0]
    prompts = [(row["set"], row["id"]) for row in first["acceptance"]["per_prompt"]]
    out = {}
    for name in [ALL, *sorted({s for s, _ in prompts})]:
        wanted = [p for p in prompts if name in (ALL, p[0])]
        taus = []
        for size in sorted(by_scale):
            rows = []
            for draft in by_scale[size]:
                values = {(r["set"], r["id"]): r["accept_length"] for r in draft["acceptance"]["per_prompt"]}
                if set(values) != set(prompts):
                    raise InputError(
                        f"{draft['path']}: acceptance.per_prompt: its prompts differ from {first['path']}'s (drafts "
                        "scored on different evaluation sets cannot share a curve)"
                    )
                rows.append([values[p] for p in wanted])
            taus.append(np.array(rows))
        out[name] = Curve(sorted(by_scale), taus)
    return out


def rolling_errors(curve: Curve, fitted_scales: int, ceiling: float) -> dict[str, list[dict]]:
    """Each form's forecasts of the fitting scales from the ones below them (every form where each can fit), on the
    means: the error by which the form is chosen."""
    means, sizes = curve.means(), curve.sizes
    least = max(form.least_scales for form in FORMS.values())
    return {
        name: [
            {"size": sizes[k], "predicted": p, "measured": float(means[k]), "error": p - float(means[k])}
            for k in range(least, fitted_scales)
            for p in [float(form.predict(sizes[:k], means[:k], sizes[k], ceiling)[0])]
        ]
        for name, form in FORMS.items()
    }


def choose(errors: dict[str, list[dict]]) -> tuple[str | None, str]:
    """The form with the least mean absolute rolling error, and why; None where no scale was forecast."""
    scored = {name: float(np.mean([abs(e["error"]) for e in rows])) for name, rows in errors.items() if rows}
    scored = {name: score for name, score in scored.items() if not math.isnan(score)}
    if not scored:
        return None, f"no fitting scale above the first {max(f.least_scales for f in FORMS.values())} to forecast"
    best = min(scored, key=scored.get)
    said = ", ".join(f"{name} {score:.4f}" for name, score in sorted(scored.items(), key=lambda kv: kv[1]))
    return best, f"least mean absolute error forecasting each fitting scale from those below it ({said})"


def backtest(curve: Curve, held_out: int, ceiling: float, boot: int, seeds: list[int]) -> dict | None:
    """Every form fitted on the scales below `held_out` predicts it: the point forecast, its bootstrap interval, the
    measured value with its own, and the verdict under each bootstrap seed (`inside` where the measured mean lies in
    the predicted interval). None where the held-out scale is not measured or too few scales lie below it."""
    if held_out not in curve.sizes:
        return None
    k = curve.sizes.index(held_out)
    means = curve.means()
    usable = {name: form for name, form in FORMS.items() if k >= form.least_scales}
    forms = {
        name: {"predicted": float(form.predict(curve.sizes[:k], means[:k], held_out, ceiling)[0]), "intervals": []}
        for name, form in usable.items()
    }
    for seed in seeds:
        draws = curve.draws(np.random.default_rng(seed), boot)  # one set of draws for every form: paired forms
        for name, form in usable.items():
            predicted = form.predict(curve.sizes[:k], draws[:, :k], held_out, ceiling)
            interval = quantiles(predicted[~np.isnan(predicted)])
            forms[name]["intervals"].append({"seed": seed, "predicted": interval, "measured": quantiles(draws[:, k])})
    for result in forms.values():
        inside = [i["predicted"][0] <= means[k] <= i["predicted"][1] for i in result["intervals"]]
        result["verdict"] = "inside" if all(inside) else "outside" if not any(inside) else "borderline"
    return {"held_out": held_out, "fitted_on": curve.sizes[:k], "measured": float(means[k]), "forms": forms}


def _first_reaching(curves: np.ndarray, grid: np.ndarray, taus) -> np.ndarray:
    """Per row of curves [draws, grid], the first size of `grid` where it reaches that row's tau (one tau for every
    row, or one per row; inf where it never does)."""
    reached = curves >= np.reshape(taus, (-1, 1))
    return np.where(reached.any(axis=1), grid[reached.argmax(axis=1)], np.inf)


def _reading(size: float, sizes: list[int]) -> float | str:
    """A size read off a forecast as reported: BELOW_CURVE where the smallest scale measured already reaches it;
    BEYOND_CURVE past REACH times the largest, or never reached; past the largest, a projection."""
    if size <= min(sizes):
        return BELOW_CURVE
    return BEYOND_CURVE if size > max(sizes) * REACH else float(size)


def _verdict(low: float, high: float) -> str:
    """Ten times the data against break-even, from the interval of (forecast accept length - accept length needed)."""
    return "reaches" if low >= 0 else "falls short" if high < 0 else "cannot say"


def _stable_verdict(differences: list[np.ndarray], verdict) -> str:
    """`verdict` of each bootstrap seed's interval of differences; `borderline` where the seeds disagree."""
    said = {verdict(*quantiles(d[~np.isnan(d)])) for d in differences}
    return said.pop() if len(said) == 1 else "borderline"


def largest_against_needed(curve: Curve, costs: dict[str, list[TimedCosts]], boot: int, seeds: list[int]) -> dict:
    """What the data measured so far says before any form is chosen: per engine, the largest scale's accept length
    (mean over its seeds and prompts) minus the accept length the engine needs (pooled over its cost cells), with the
    interval of each bootstrap seed's draws (prompts and training seeds against prompts, repeats and cells) and its
    verdict: `past break-even`, `short of it`, `cannot say`, or `borderline` where the bootstrap seed decides."""
    largest = len(curve.sizes) - 1
    measured = [curve.draws(np.random.default_rng(seed), boot)[:, largest] for seed in seeds]
    out = {}
    for engine, cells in costs.items():
        taus = tau_draws(cells, boot, seeds)[POOLED]
        differences = [m - t for m, t in zip(measured, taus)]
        needed_point = pooled_need(cells)
        out[engine] = {
            "conversations": curve.sizes[largest],
            "accept_length": float(curve.means()[largest]),
            "accept_length_needed": needed_point,
            "difference": float(curve.means()[largest]) - needed_point,
            "interval": quantiles(differences[0]),
            "verdict": _stable_verdict(
                differences,
                lambda low, high: "past break-even" if low > 0 else "short of it" if high < 0 else "cannot say",
            ),
        }
    return out


def break_even(
    curve: Curve, form: Form, costs: dict[str, list[TimedCosts]], ceiling: float, boot: int, seeds: list[int]
) -> dict:
    """Per engine, for each of its cost cells and POOLED over them (costs: engine -> its cells' timings), the accept
    length that engine needs to break even and the conversations at which `form`, fitted on every measured scale,
    reaches it, each with its interval (the first bootstrap seed's): each draw pairs a draw of the curve (prompts and
    training seeds) with a draw of the costs (prompts, timing repeats and, pooled, the cells), so the interval carries
    timing noise beside prompt and seed noise. Then the accept length forecast at DATA_BET times the largest scale,
    with the verdict on (forecast - needed) under every bootstrap seed: `reaches` (its interval above zero), `falls
    short` (below), `cannot say` (across it), `borderline` (the verdict changes with the seed). Per engine,
    `agreement` says whether its cells' intervals of conversations overlap. Past the largest scale every reading is a
    projection, labelled so."""
    largest = max(curve.sizes)
    grid = np.geomspace(min(curve.sizes), largest * REACH, 400)
    point = form.curve(curve.sizes, curve.means(), grid, ceiling)
    bet = largest * DATA_BET
    drawn = [curve.draws(np.random.default_rng(seed), boot) for seed in seeds]
    first_curves = form.curve(curve.sizes, drawn[0], grid, ceiling)  # the interval reported is the first seed's
    at_bet = [form.predict(curve.sizes, draws, bet, ceiling) for draws in drawn]
    at_bet_point = float(form.predict(curve.sizes, curve.means(), bet, ceiling)[0])
    at_bet_interval = quantiles(at_bet[0][~np.isnan(at_bet[0])])  # the forecast's own, whatever the engine
    out = {}
    for engine, cells in costs.items():
        taus = {cell.cell: cell.break_even() for cell in cells}
        taus[POOLED] = pooled_need(cells)
        readings, raw = {}, {}
        for name, drawn_taus in tau_draws(cells, boot, seeds).items():
            raw[name] = quantiles(_first_reaching(first_curves, grid, drawn_taus[0]), method="nearest")
            size = float(_first_reaching(point, grid, taus[name])[0])
            readings[name] = {
                "accept_length_needed": taus[name],
                "accept_length_needed_interval": quantiles(drawn_taus[0]),
                "conversations": _reading(size, curve.sizes),
                "interval": [_reading(x, curve.sizes) for x in raw[name]],
                "projected": size > largest,  # past the data: a projection of the form chosen
                "at_data_bet": {
                    "conversations": bet,
                    "accept_length": at_bet_point,
                    "interval": at_bet_interval,
                    "verdict": _stable_verdict([v - t for v, t in zip(at_bet, drawn_taus)], _verdict),
                },
            }
        apart = [raw[cell.cell] for cell in cells]
        out[engine] = {
            "cells": {name: r for name, r in readings.items() if name != POOLED},
            POOLED: readings[POOLED],
            "agreement": {
                "accept_length_needed": [taus[cell.cell] for cell in cells],
                # the measurements agree where their intervals of conversations overlap (inf: never reached)
                "intervals_overlap": max(low for low, _ in apart) <= min(high for _, high in apart)
                if len(apart) > 1
                else None,
            },
        }
    return out


def plateau(drafts: list[dict]) -> list[dict]:
    """Per scale: its seeds, how many the plateau rule stopped (not the step budget), and the passes over its data
    and answer tokens each read (issue 64: every draft to its plateau)."""
    rows = []
    for size in sorted({d["records"] for d in drafts}):
        group = [d for d in drafts if d["records"] == size]
        seen = [d["training"]["answer_tokens_seen"] for d in group]
        rows.append(
            {
                "conversations": size,
                "seeds": len(group),
                "stopped_by_plateau": sum(d["training"]["stopped_by"] == "patience" for d in group),
                "passes": [round(s / d["answer_tokens"], 2) for s, d in zip(seen, group)],
                "answer_tokens_seen": seen,
            }
        )
    return rows


def forecast(
    folder: Path, *, held_out: int, ceiling: float, boot: int, seeds: list[int], costs: dict[str, list[TimedCosts]]
) -> dict:
    """metrics/forecast.json: the plateau table, each engine's accept length needed (`costs`: engine -> its cost
    cells' timings), and per set the curve's means, each form's rolling errors and the chosen form, the backtest of
    `held_out` from the scales below it (None until that scale is measured), the largest scale against each engine's
    need, and each engine's break-even read off the chosen form on every scale."""
    drafts = read_records(folder)
    if not drafts:
        raise InputError(f"{folder}: no record of a draft on regenerated answers (the grid's scale cells)")
    sets = {}
    for name, curve in curves(drafts).items():
        fitted = sum(size < held_out for size in curve.sizes)
        errors = rolling_errors(curve, fitted, ceiling)
        chosen, why = choose(errors)
        sets[name] = {
            "sizes": curve.sizes,
            "seeds": [len(t) for t in curve.taus],
            "means": [float(m) for m in curve.means()],
            "rolling_errors": errors,
            "chosen": chosen,
            "why": why,
            "backtest": backtest(curve, held_out, ceiling, boot, seeds),
            "largest_against_needed": largest_against_needed(curve, costs, boot, seeds),
            "break_even": chosen and break_even(curve, FORMS[chosen], costs, ceiling, boot, seeds),
        }
    return {
        "level": LEVEL,
        "boot": boot,
        "bootstrap_seeds": seeds,
        "plateau": plateau(drafts),
        "costs": {engine: [cell.cell for cell in cells] for engine, cells in costs.items()},
        "needed": needed(costs, boot, seeds),
        "sets": sets,
    }
