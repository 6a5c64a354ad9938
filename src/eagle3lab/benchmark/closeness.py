"""Does the survey's closeness score pick the data that trains the better draft (issue 65)?

Each point (a data source, or a slice of one) has signals measured on its own records (`answer_nll`: the target's NLL of
the point's answers, the survey's closeness score; `prompt_nll`, `answer_length`, the prompts' duplicate rate, ...),
each an estimate sum(value) / sum(weight) over per-record columns, and drafts trained on its data under several training
seeds, each scored by exact offline accept length on every evaluation prompt. Per signal and prompt set, the rank
correlation across points of the signal's estimate with the points' mean accept length, with the exact permutation
p-value (`comparisons.rank_correlation`: how little a handful of points can show) and a bootstrap interval of rho whose
every draw resamples all the units that vary at once: the evaluation prompts (the same resample for every draft, so the
points stay paired by prompt), each point's training seeds, and each point's scored records.

The interval holds measurement noise only: the points are the points, so "shown" says that noise cannot flip rho's sign
(`noise_verdict`), and the p-value says how easily chance orders this few points as well: a correlation is shown only
where both hold. The survey's score is the bet named before any draft ran, so its p-value stands alone; the other
signals are a search for a better predictor, so theirs are Holm-adjusted over the signals searched in each set
(`p_adjusted`): with several tries, one of them clears 0.05 by chance more often than 5% of the time. The verdict is
read under several bootstrap seeds, "borderline" where it depends on the seed (as `benchmark.pairs` reads its
differences).
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy.stats import rankdata

from eagle3lab.benchmark.comparisons import ALL_SETS, rank_correlation, verdict
from eagle3lab.benchmark.forecast import Curve
from eagle3lab.benchmark.scaling import LEVEL, quantiles
from eagle3lab.io import InputError, require

# The seeds' bet: the closer a source's answers are to the target's own (the lower their NLL under it), the more a
# draft trained on them accepts. The other signals are tested without a bet on their direction.
EXPECTED_SIGN = {"answer_nll": -1}
LEAST_POINTS = 3  # rank_correlation's least: below it no ranking says anything
ALPHA = 0.05  # the permutation p-value a shown rank correlation needs (7 points: |rho| >= 0.79)


def _signals(points: dict[str, dict]) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Point -> signal -> its per-record (values, weights), each checked to hold records to estimate from."""
    out = {}
    for name, record in points.items():
        out[name] = {}
        for signal, columns in require(record, "signals", f"point {name}", dict).items():
            where = f"point {name}: signals.{signal}"
            value = np.asarray(require(columns, "per_record_value", where, list), float)
            weight = np.asarray(require(columns, "per_record_weight", where, list), float)
            if len(value) != len(weight):
                raise InputError(f"{where}: {len(value)} per_record_value but {len(weight)} per_record_weight")
            if not weight.sum():
                raise InputError(f"{where}: no records (or none with weight) to estimate it from")
            out[name][signal] = (value, weight)
    return out


def _per_prompt(draft: dict, name: str) -> dict[tuple[str, str], float]:
    """A draft's accept length per prompt (set, id), each row checked for the fields read here."""
    rows = require(require(draft, "acceptance", f"draft {name}", dict), "per_prompt", f"draft {name}: acceptance", list)
    values = {}
    for i, row in enumerate(rows):
        where = f"draft {name}: acceptance.per_prompt[{i}]"
        prompt = (require(row, "set", where, str), require(row, "id", where, str))
        if prompt in values:
            raise InputError(f"{where}: prompt {prompt} appears more than once")
        values[prompt] = float(require(row, "accept_length", where, (int, float)))
    return values


def _accept(points: dict[str, dict], drafts: list[dict]) -> tuple[dict[str, np.ndarray], list[tuple[str, str]]]:
    """Per point with drafts, its [seeds, prompts] accept lengths, and the prompts (set, id) every draft was scored
    on, in the first draft's order: the drafts must share their prompts for the bootstrap to pair them."""
    by_point: dict[str, list[list[float]]] = {name: [] for name in points}
    prompts, first, sources = None, None, {}
    for draft in drafts:
        name = require(draft, "name", "draft record", str)
        sources[name] = require(draft, "source", f"draft {name}")
        if sources[name] not in points:
            raise InputError(f"draft {name}: field 'source': {sources[name]!r} is not a point ({sorted(points)})")
        values = _per_prompt(draft, name)
        if prompts is None:
            prompts, first = list(values), name
        if set(values) != set(prompts):
            raise InputError(f"draft {name}: acceptance.per_prompt: its prompts differ from draft {first}'s")
        by_point[sources[name]].append([values[p] for p in prompts])
    for draft in drafts:  # a replicate pooled with another point's seeds would blur both points
        repeats = draft.get("replicate_of")
        if repeats in sources and sources[repeats] != draft["source"]:
            raise InputError(
                f"draft {draft['name']}: field 'source': {draft['source']!r}, but {repeats}'s is "
                f"{sources[repeats]!r} (it is a replicate of {repeats})"
            )
    return {name: np.array(rows) for name, rows in by_point.items() if rows}, prompts or []


def _curves(accept: dict[str, np.ndarray], prompts: list[tuple[str, str]], sets) -> dict[str, Curve]:
    """Per requested set, every point's [seeds, prompts of that set] (ALL_SETS: every prompt), as a forecast Curve
    whose draws resample the prompts once for every point and each point's seeds on their own (its `sizes` are the
    points: only their count is read)."""
    curves = {}
    for set_name in sets if accept else ():
        columns = [k for k, (s, _) in enumerate(prompts) if set_name in (ALL_SETS, s)]
        if not columns:
            scored = sorted({s for s, _ in prompts})
            raise InputError(f"sets: {set_name!r}: no draft was scored on a prompt of it (sets scored: {scored})")
        curves[set_name] = Curve(list(accept), [matrix[:, columns] for matrix in accept.values()])
    return curves


def _resampled(value: np.ndarray, weight: np.ndarray, rng: np.random.Generator, boot: int) -> np.ndarray:
    """[boot] estimates of a signal, its records resampled; NaN where a draw picked no weight."""
    picks = rng.integers(0, len(value), (boot, len(value)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return value[picks].sum(axis=1) / weight[picks].sum(axis=1)


def _draws(curves: dict[str, Curve], records: dict, tested: list[str], boot: int, seed: int):
    """One bootstrap seed's draws, all from one generator: per set, [boot, points with drafts] mean accept lengths;
    per tested signal, [boot, every point] estimates. Draw k of one pairs with draw k of the other."""
    rng = np.random.default_rng(seed)
    accept = {set_name: curve.draws(rng, boot) for set_name, curve in curves.items()}
    estimates = {
        signal: np.stack([_resampled(*of_point[signal], rng, boot) for of_point in records.values()], axis=1)
        for signal in tested
    }
    return accept, estimates


def _rhos(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho of each row of x with the same row of y ([draws, points] both); NaN where a row is constant or
    holds a NaN (rho undefined)."""
    rx, ry = rankdata(x, axis=1), rankdata(y, axis=1)
    rx, ry = rx - rx.mean(axis=1, keepdims=True), ry - ry.mean(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(axis=1) / np.sqrt((rx**2).sum(axis=1) * (ry**2).sum(axis=1))


def _interval(draws: np.ndarray) -> dict:
    """The LEVEL interval of the defined draws; the undefined ones (NaN) skipped and counted."""
    defined = draws[~np.isnan(draws)]
    low, high = quantiles(defined) if len(defined) else (None, None)
    return {"low": low, "high": high, "undefined_draws": int(len(draws) - len(defined))}


def _correlation(signal: str, set_name: str, x: np.ndarray, y: np.ndarray, drawn: list[tuple], seeds: list[int]):
    """One signal against one set's accept length across the points with drafts (x, y: the point estimates; drawn:
    each bootstrap seed's ([boot, points] signal draws, [boot, points] accept draws))."""
    expected = EXPECTED_SIGN.get(signal)
    row = {"signal": signal, "set": set_name, "expected_sign": expected, "points": len(x)}
    result = rank_correlation(x, y)
    if result is None:
        if len(x) < LEAST_POINTS:
            why = f"{len(x)} points with drafts: a rank correlation needs at least {LEAST_POINTS}"
        else:
            why = f"{'the signal' if np.ptp(x) == 0 else 'the accept length'} is the same at every point"
        return row | {"rho": None, "p_value": None, "intervals": [], "verdict": "not shown", "agrees": None, "why": why}
    intervals = [{"seed": seed} | _interval(_rhos(xs, ys)) for seed, (xs, ys) in zip(seeds, drawn)]
    said = {verdict(i["low"], i["high"]) for i in intervals}
    noise = said.pop() if len(said) == 1 else "borderline"
    # The bootstrap resamples the measurements, never the points, so a precisely measured but unrelated signal can
    # clear it: the exact permutation p-value (how easily chance orders this few points as well) must clear ALPHA too.
    return row | result | {"intervals": intervals, "noise_verdict": noise, "p_adjusted": result["p_value"]}


def _judged(row: dict) -> dict:
    """The verdict of a row with its (adjusted) p-value, and whether a shown rho has the sign the seeds bet on."""
    row["verdict"] = "not shown" if row["p_adjusted"] >= ALPHA else row["noise_verdict"]
    shown = row["verdict"] == "shown" and row["expected_sign"] is not None
    row["agrees"] = bool(np.sign(row["rho"]) == row["expected_sign"]) if shown else None
    return row


def _holm(rows: list[dict]) -> None:
    """The searched signals' rows of one set, each p-value Holm-adjusted over the rows: the k-th smallest p times the
    rows left (m - k + 1), never below an earlier one, at most 1."""
    adjusted, ordered = 0.0, sorted(rows, key=lambda row: row["p_value"])
    for k, row in enumerate(ordered):
        adjusted = max(adjusted, min(1.0, (len(rows) - k) * row["p_value"]))
        row["p_adjusted"] = adjusted


def _point_rows(points, sets, accept, curves, estimates, records, first) -> list[dict]:
    """Per point: its seeds, each set's mean accept length (None without drafts) and each tested signal's estimate,
    each with the first bootstrap seed's interval (`first`: its draws)."""
    measured, rows = list(accept), []
    for k, name in enumerate(points):
        row = {"name": name, "seeds": len(accept.get(name, ())), "accept_length": dict.fromkeys(sets), "signals": {}}
        for set_name, curve in curves.items() if name in accept else ():
            taus = curve.taus[measured.index(name)]
            low, high = quantiles(first[0][set_name][:, measured.index(name)])
            row["accept_length"][set_name] = {"mean": float(taus.mean()), "low": low, "high": high}
            row["accept_length"][set_name]["prompts"] = taus.shape[1]
        for signal, estimate in estimates[name].items():
            interval = _interval(first[1][signal][:, k])
            row["signals"][signal] = {"estimate": estimate, **interval, "records": len(records[name][signal][0])}
        rows.append(row)
    return rows


def closeness(
    points: dict[str, dict],
    drafts: list[dict],
    *,
    boot: int,
    seeds: list[int],
    sets: tuple[str, ...] = ("mtbench", ALL_SETS),
) -> dict:
    """Each signal that every point has against the mean accept length of the points' drafts, per set in `sets`:
    `points` (per point its seeds, accept lengths and signal estimates with intervals), `correlations` (per signal
    and set: rho, its exact p-value, each bootstrap seed's interval of rho, the verdict under every seed, and whether
    a shown rho has the sign the seeds bet on), `best_predictor` (per set, the shown signal of largest |rho|, or
    None) and `waiting` (the points no draft has trained on yet, left out of every correlation)."""
    if boot < 1 or not seeds:
        raise InputError(f"boot {boot}, seeds {seeds}: a bootstrap needs at least one draw and one seed")
    records = _signals(points)
    everyone = [set(of_point) for of_point in records.values()]
    tested = sorted(set.intersection(*everyone)) if everyone else []
    estimates = {
        name: {s: float(of_point[s][0].sum() / of_point[s][1].sum()) for s in tested}
        for name, of_point in records.items()
    }
    accept, prompts = _accept(points, drafts)
    curves = _curves(accept, prompts, sets)
    drawn = [_draws(curves, records, tested, boot, seed) for seed in seeds]
    columns = [list(points).index(name) for name in accept]  # the points with drafts among every point's
    correlations = []
    for signal, set_name in itertools.product(tested, sets):
        x = np.array([estimates[name][signal] for name in accept])
        y = curves[set_name].means() if curves else np.array([])
        pairs = [(signals[signal][:, columns], means[set_name]) for means, signals in drawn] if curves else []
        correlations.append(_correlation(signal, set_name, x, y, pairs, seeds))
    for set_name in sets:
        _holm([r for r in correlations if r["set"] == set_name and r["expected_sign"] is None and r["rho"] is not None])
    for row in correlations:  # every verdict once, on its p-value as adjusted
        if row["rho"] is not None:
            _judged(row)
    shown = [row for row in correlations if row["verdict"] == "shown"]
    best = {
        set_name: max((r for r in shown if r["set"] == set_name), key=lambda r: abs(r["rho"]), default={}).get("signal")
        for set_name in sets
    }
    return {
        "level": LEVEL,
        "boot": boot,
        "bootstrap_seeds": list(seeds),
        "sets": list(sets),
        "signals": tested,
        "untested": sorted(set.union(*everyone) - set(tested)) if everyone else [],
        "points": _point_rows(points, sets, accept, curves, estimates, records, drawn[0]),
        "correlations": correlations,
        "best_predictor": best,
        "waiting": [name for name in points if name not in accept],
    }
