"""Scaling curves and the break-even arithmetic of speculative decoding.

Accept length tau against training-set size n is fitted with a saturating power law
    tau(n) = a - b * n**(-c)        (a: the ceiling, c: how fast more data stops helping)
with uncertainty from a bootstrap over prompts (refit on resampled per-prompt accept lengths): each parameter gets
its interval, or "not identified" with the reason. Three parameters need at least four sizes (three leave no
residual); a few sizes close together rarely pin the ceiling down: when bootstrap refits push `a` to the bound the
config allows, the curve is a log-law extrapolation in disguise, and `ceiling_identified` says so. The model-free
summary of the measured range is the gain per doubling: the least-squares slope of accept length against log2(size),
with its bootstrap interval.
The measured per-forward costs turn tau into a speedup (Leviathan et al.; REFERENCE.md):
    speedup(tau) = tau * t_target / (t_verify + steps * t_draft + t_other)
so break-even is tau* = round cost / t_target, and the fit inverted gives the data size that reaches it; past the
largest size measured, only when the ceiling is identified (otherwise the answer is "beyond the data"). Each engine
has its own costs (the local engine's from `tune`, a served engine's from its `tune --engine` calibration), so its own
break-even accept length, read off the one curve measured in the local engine.
Drafts trained elsewhere (another machine or recipe) sit beside the curve as labelled points, never in the fit.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import curve_fit

from eagle3lab.io import InputError

BEYOND = "beyond the data"
OUT_OF_REACH = "out of this shape's reach"  # more accept length than a round of its draft steps can give
LEVEL = 0.9  # every bootstrap interval of stage 05 (fit, break-even, paired differences)
MIN_SIZES = 4  # three parameters and one residual
EXPONENT_BOUNDS = (0.01, 3.0)
EXTRAPOLATION = 10  # the furthest past the largest size measured a fit's size is reported (identified ceiling only)
AT_BOUND = 0.05  # a parameter is not identified when more of its bootstrap refits than this sit at a bound
SPEEDUPS = (1.0, 1.5, 2.0)  # break-even and the targets the data are read off for


def saturating(n, a, b, c):
    return a - b * np.power(n, -c)


def speedup_label(speedup: float) -> str:
    """How tables and figures name a speedup target: 1x is break-even."""
    return "break-even" if speedup == 1 else f"{speedup:g}x"


def quantiles(values, level: float = LEVEL, method: str = "linear") -> tuple[float, float]:
    """The central `level` interval of bootstrap draws."""
    return tuple(float(x) for x in np.quantile(values, [(1 - level) / 2, (1 + level) / 2], method=method))


@dataclass
class ScalingFit:
    a: float
    b: float
    c: float
    sizes: list[float]
    taus: list[float]
    ceiling_identified: bool  # False: the data do not show where accept length saturates
    gain_per_doubling: float  # accept length gained per doubling of data, over the measured sizes
    gain_per_doubling_interval: tuple[float, float]  # 90% bootstrap interval over prompts
    intervals: dict[str, tuple[float, float]]  # a, b, c: 90% bootstrap intervals (empty without refits)
    not_identified: dict[str, str]  # parameter -> why the data do not pin it down; identified ones are absent
    boot: np.ndarray | None = None  # [R, 3] bootstrap parameter draws

    def predict(self, n) -> np.ndarray:
        return saturating(np.asarray(n, dtype=float), self.a, self.b, self.c)

    def band(self, n, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise bootstrap interval of the fitted curve."""
        n = np.asarray(n, dtype=float)
        if self.boot is None or len(self.boot) < 2:
            y = self.predict(n)
            return y, y
        curves = np.stack([saturating(n, *p) for p in self.boot])
        lo, hi = np.quantile(curves, [(1 - level) / 2, (1 + level) / 2], axis=0)
        return lo, hi

    def size_for(self, tau: float) -> float:
        """Training-set size at which the fitted curve reaches tau (inf when tau is at or above the ceiling)."""
        return size_for(tau, self.a, self.b, self.c)

    def size_for_interval(self, tau: float, level: float = LEVEL) -> tuple[float, float]:
        if self.boot is None:
            s = self.size_for(tau)
            return s, s
        # draws that never reach tau are inf: pick draws rather than interpolate between them (inf - inf)
        return quantiles([size_for(tau, *p) for p in self.boot], level, method="nearest")

    def reported(self, size: float) -> float | str:
        """A size read off this fit as a table shows it (`fitted_size`)."""
        return fitted_size(size, self.ceiling_identified, self.sizes)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("boot")
        return d


def size_for(tau: float, a: float, b: float, c: float) -> float:
    if tau >= a or b <= 0 or c <= 0:
        return math.inf
    return float(((a - tau) / b) ** (-1.0 / c))


def fitted_size(size: float, ceiling_identified: bool, sizes: list[float]) -> float | str:
    """What to report for a data size read off a fit of `sizes`: the size itself inside the measured range, or up to
    a decade past it when the ceiling is identified; BEYOND otherwise. Past the data with the ceiling unidentified,
    the extrapolation follows the bound the config allows, not the data (the reference run's 22-180 conversations
    gave "8.3e+15 conversations for 2x"); and an identified ceiling's bootstrap draws near it read off sizes like
    1.2e+15 (the run of 22-2,200), which two decades of data cannot vouch for."""
    return size if size <= max(sizes) * (EXTRAPOLATION if ceiling_identified else 1) else BEYOND


def _fit_params(sizes, taus, ceiling):
    sizes, taus = np.asarray(sizes, float), np.asarray(taus, float)
    # start: ceiling a bit above the best point, half the gap closed per decade
    a0 = min(max(taus.max() + 0.3, 1.01), ceiling)
    p0 = [a0, max(a0 - taus.min(), 1e-3) * sizes.min() ** 0.3, 0.3]
    params, _ = curve_fit(
        saturating,
        sizes,
        taus,
        p0=p0,
        bounds=([1.0, 0.0, EXPONENT_BOUNDS[0]], [ceiling, np.inf, EXPONENT_BOUNDS[1]]),
        maxfev=20000,
    )
    return params


def gain_per_doubling(sizes, taus) -> float:
    """Least-squares slope of accept length against log2(size)."""
    return float(np.polyfit(np.log2(np.asarray(sizes, float)), np.asarray(taus, float), 1)[0])


def _at_bound(values, bound: float) -> np.ndarray:
    return np.isclose(values, bound, rtol=1e-3, atol=0.0)


def not_identified(sizes: list[float], draws: np.ndarray, ceiling: float) -> dict[str, str]:
    """Each parameter the data do not pin down, with the reason. A parameter is identified when the bootstrap refits
    keep it clear of its bounds (all but AT_BOUND of them); a single fit can land inside the bound on data that only
    show a log-law. `b` trades off against `a` and `c`: it is identified only with both."""
    if len(sizes) < MIN_SIZES:
        reason = f"{len(sizes)} scales for 3 parameters (needs at least {MIN_SIZES})"
        return dict.fromkeys("abc", reason)
    if len(draws) < 2:
        return dict.fromkeys("abc", f"{len(draws)} bootstrap refits converged (needs at least 2)")
    reasons = {}
    at_ceiling = _at_bound(draws[:, 0], ceiling).mean()
    if at_ceiling > AT_BOUND:
        reasons["a"] = f"ceiling: {at_ceiling:.0%} of bootstrap refits hit the bound the config allows ({ceiling:g})"
    at_bounds = (_at_bound(draws[:, 2], EXPONENT_BOUNDS[0]) | _at_bound(draws[:, 2], EXPONENT_BOUNDS[1])).mean()
    if at_bounds > AT_BOUND:
        reasons["c"] = f"exponent: {at_bounds:.0%} of bootstrap refits hit its bounds {EXPONENT_BOUNDS}"
    if reasons:
        reasons["b"] = f"scale: trades off against the unidentified {' and '.join(sorted(reasons))}"
    return reasons


def fit_scaling(sizes, per_prompt_taus, *, ceiling: float, boot: int = 200, seed: int = 0) -> ScalingFit:
    """Fit tau(n) from per-prompt accept lengths measured at each size (a list of arrays, same prompts per size).

    `ceiling` is the largest accept length the draft config allows (steps + 1 for a chain). Needs >= 3 sizes to fit
    at all, and MIN_SIZES for its parameters to be identified (`not_identified` says which are not, and why).
    """
    sizes = [float(s) for s in sizes]
    if len(sizes) < 3:
        raise ValueError(f"a 3-parameter scaling fit needs at least 3 data sizes, got {len(sizes)}")
    matrix = np.asarray([np.asarray(t, float) for t in per_prompt_taus])  # [sizes, prompts]
    means = matrix.mean(axis=1)
    a, b, c = _fit_params(sizes, means, ceiling)
    rng = np.random.default_rng(seed)
    draws, slopes = [], []
    for _ in range(boot):
        resampled = matrix[:, rng.integers(0, matrix.shape[1], matrix.shape[1])].mean(axis=1)
        slopes.append(gain_per_doubling(sizes, resampled))
        try:
            draws.append(_fit_params(sizes, resampled, ceiling))
        except RuntimeError:  # a resample the optimiser cannot fit: skip it rather than bias the band
            continue
    slope = gain_per_doubling(sizes, means)
    draws = np.asarray(draws).reshape(-1, 3)
    unknown = not_identified(sizes, draws, ceiling)
    return ScalingFit(
        a=float(a),
        b=float(b),
        c=float(c),
        sizes=sizes,
        taus=[float(m) for m in means],
        ceiling_identified="a" not in unknown,
        gain_per_doubling=slope,
        gain_per_doubling_interval=quantiles(slopes) if slopes else (slope, slope),
        intervals={p: quantiles(draws[:, i]) for i, p in enumerate("abc")} if len(draws) else {},
        not_identified=unknown,
        boot=draws if len(draws) else None,
    )


@dataclass
class CostModel:
    """Per-round costs in seconds, measured on one machine in one run."""

    t_target: float  # one plain decode step of the target (batch 1)
    t_verify: float  # one target forward over the draft tokens of a round
    t_draft: float  # one draft step
    steps: int  # draft steps per round
    t_other: float = 0.0  # sampling, bookkeeping, cache rollback

    @property
    def round_cost(self) -> float:
        return self.t_verify + self.steps * self.t_draft + self.t_other

    def speedup(self, tau):
        return np.asarray(tau, dtype=float) * self.t_target / self.round_cost

    @property
    def break_even_tau(self) -> float:
        return self.round_cost / self.t_target

    def tau_for_speedup(self, speedup: float) -> float:
        return speedup * self.break_even_tau


def cost_model_from_throughput(baseline_tok_s: float, spec_tok_s: float, tau: float, steps: int) -> CostModel:
    """Back out the round cost from an observed (baseline, speculative) throughput pair at accept length tau.

    The seeds measured 90 tok/s plain and 82.3 tok/s at tau 2.1: a round costs tau / 82.3 s against a 1/90 s
    target step, so break-even needs tau = 90 * 2.1 / 82.3 = 2.30.
    """
    t_target = 1.0 / baseline_tok_s
    round_cost = tau / spec_tok_s
    return CostModel(t_target=t_target, t_verify=round_cost, t_draft=0.0, steps=steps)


def projected_tau_after_more_data(fit: ScalingFit, tau_now: float, factor: float, at_size: float) -> float:
    """Carry our fitted relative gain from `factor` x more data over to another system's measured tau.

    An assumption, stated in the figure: the other system's curve has the same shape (relative improvement
    per data multiple) as ours at the same position on the curve.
    """
    gain = float(fit.predict(at_size * factor) / fit.predict(at_size))
    return tau_now * gain


def fit_sets(per_prompt, cost: CostModel, *, ceiling: float, boot: int, seed: int):
    """Fit accept length against data size for each prompt set of `per_prompt` (a DataFrame with set, id, records,
    accept_length; one draft per size) and read off break-even and 2x. Returns (fits, points, summary rows)."""
    fits, points, rows = {}, {}, []
    for set_name, group in per_prompt.groupby("set"):
        matrix = group.pivot_table(index="records", columns="id", values="accept_length").sort_index()
        fit = fit_scaling(matrix.index.tolist(), matrix.values.tolist(), ceiling=ceiling, boot=boot, seed=seed)
        fits[set_name], points[set_name] = fit, list(zip(matrix.index, matrix.mean(axis=1)))
        largest_tau = float(matrix.mean(axis=1).iloc[-1])
        rows.append(
            {
                "set": set_name,
                "gain per doubling": fit.gain_per_doubling,
                "90% interval (gain)": fit.gain_per_doubling_interval,
                "ceiling identified": fit.ceiling_identified,
                **{f"{p} [90% CI]": describe_parameter(fit.to_json(), p) for p in "abc"},
                "records for break-even": fit.reported(fit.size_for(cost.break_even_tau)),
                "90% interval": tuple(map(fit.reported, fit.size_for_interval(cost.break_even_tau))),
                "records for 2x": fit.reported(fit.size_for(cost.tau_for_speedup(2))),
                "largest measured": matrix.index.max(),
                "accept length there": largest_tau,
                "predicted speedup there": float(cost.speedup(largest_tau)),
            }
        )
    return fits, points, rows


def describe_parameter(fit: dict, name: str) -> str:
    """A fitted parameter (of `ScalingFit.to_json()`) as tables show it: its value and interval, or why the data do
    not identify it."""
    unknown = fit.get("not_identified")
    if unknown is None:  # a scaling.json from before the reasons were recorded: only the ceiling's verdict
        unknown = {} if fit["ceiling_identified"] else {"a": "ceiling (no reason recorded)"}
    if reason := unknown.get(name):
        return f"not identified: {reason}"
    interval = fit.get("intervals", {}).get(name)
    return f"{fit[name]:.3g}" + (" [{:.3g}, {:.3g}]".format(*interval) if interval else "")


def engine_cost_model(tuned: dict, steps: int) -> tuple[str, CostModel]:
    """A served engine's per-round costs from its `tune --engine` calibrations (benchmark.json's `<engine>.tuned`:
    draft -> result): the plain step and the round of the chain without p-min of `steps` drafts, or else the deepest
    one calibrated below it (else the shallowest), each the median over the drafts calibrated (one engine and shape:
    their costs differ by noise). Returns (the shape's label, its costs)."""
    calibrations = [t["calibration"] for t in tuned.values() if t.get("calibration")]
    chains = {label: k for cal in calibrations for label, (k, p_min) in cal["shapes"].items() if not p_min}
    if not chains:
        raise InputError("metrics/benchmark.json: tuned.*.calibration.shapes: no chain without p-min was calibrated")
    below = [label for label, k in chains.items() if k <= steps]
    label = max(below, key=chains.get) if below else min(chains, key=chains.get)
    return label, CostModel(
        t_target=statistics.median(cal["step_s"] for cal in calibrations),
        t_verify=statistics.median(cal["round_s"][label] for cal in calibrations if label in cal["round_s"]),
        t_draft=0.0,  # the calibration times whole rounds: verify and draft steps together
        steps=chains[label],
    )


def served_costs(benchmark: dict, engines: tuple[str, ...], steps: int) -> tuple[dict, dict]:
    """Each served engine's (shape, costs) by name, from benchmark.json's `<engine>.tuned` calibrations; and the
    engines left out, name -> why."""
    costs, absent = {}, {}
    for name in engines:
        tuned = (benchmark.get(name) or {}).get("tuned") or {}
        if any(t.get("calibration") for t in tuned.values()):
            costs[name] = engine_cost_model(tuned, steps)
        else:
            absent[name] = f"metrics/benchmark.json has no `{name}.tuned` calibration (stage 04 tuned no draft there)"
    return costs, absent


def records_needed(fits: dict, costs: dict[str, tuple[str, CostModel]]) -> list[dict]:
    """For each engine (its shape and costs), set and speedup of SPEEDUPS: the accept length that engine needs and the
    training conversations at which the set's fit reaches it, with the bootstrap interval, as `fitted_size` reports
    them (OUT_OF_REACH past the steps + 1 tokens a round of the shape can accept)."""
    rows = []
    for engine, (shape, cost) in costs.items():
        for set_name, fit in fits.items():
            for speedup in SPEEDUPS:
                tau = cost.tau_for_speedup(speedup)
                reach = tau <= cost.steps + 1
                rows.append(
                    {
                        "engine": engine,
                        "shape": shape,
                        "set": set_name,
                        "speedup": speedup,
                        "accept_length": tau,
                        "records": fit.reported(fit.size_for(tau)) if reach else OUT_OF_REACH,
                        "interval": list(map(fit.reported, fit.size_for_interval(tau))) if reach else None,
                    }
                )
    return rows


def labelled_points(rows: list[dict], config: str, provenances: dict, fits: dict) -> list[dict]:
    """Drafts trained elsewhere, beside the fitted curves (never in them: another machine and recipe trained them).
    `provenances`: draft folder -> its provenance record (`pipeline.gpu_adopt.read_provenance`), None for a draft
    without one (no data size to place it at: left out). `rows`: stage 04's benchmark of the final draft, where the
    third-party drafts run beside it. Each point: training conversations and tokens, accept length per set at
    `config`, and what that set's fit predicts at that size."""
    points = []
    for folder, record in provenances.items():
        if record is None:
            continue
        name = Path(folder).name
        measured = {r["set"]: r["accept_length"] for r in rows if r["system"] == name and r["config"] == config}
        if not measured:
            raise InputError(
                f"metrics/benchmark.json: no row of third-party draft '{name}' at config {config} (the sweep's): "
                f"add {config} to benchmark.configs in params.yaml"
            )
        data = record["data"]
        points.append(
            {
                "draft": name,
                "responses": data["responses"],
                "conversations": data["conversations"],
                "tokens": data["tokens_trained"],
                "hardware": record["hardware"],
                "accept_length": measured,
                "fit_there": {s: float(fits[s].predict(data["conversations"])) for s in measured if s in fits},
            }
        )
    return points


def tuned_cost_model(tune_result: dict) -> CostModel | None:
    """The round cost `tune` predicted for its chosen config (adaptive ones included: their mean round), as a
    CostModel; None when the answer was not to speculate."""
    winner = tune_result.get("winner")
    if not winner:
        return None
    steps = int(winner["config"].split(",")[1])
    baseline_tok_s = 1.0 / tune_result["costs"]["target_step"]
    return cost_model_from_throughput(baseline_tok_s, winner["tokens_per_s"], winner["accept_length"], steps)
