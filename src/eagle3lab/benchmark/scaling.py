"""Scaling curves and the break-even arithmetic of speculative decoding.

Accept length tau against training-set size n is fitted with a saturating power law
    tau(n) = a - b * n**(-c)        (a: the ceiling, c: how fast more data stops helping)
with uncertainty from a bootstrap over prompts (refit on resampled per-prompt accept lengths). A few sizes close
together rarely pin the ceiling down: when bootstrap refits push `a` to the bound the config allows, the curve is
a log-law extrapolation in disguise, and `ceiling_identified` says so. The model-free summary of the measured range is
the gain per doubling: the least-squares slope of accept length against log2(size), with its bootstrap interval.
The measured per-forward costs turn tau into a speedup (Leviathan et al.; REFERENCE.md):
    speedup(tau) = tau * t_target / (t_verify + steps * t_draft + t_other)
so break-even is tau* = round cost / t_target, and the fit inverted gives the data size that reaches it; past the
largest size measured, only when the ceiling is identified (otherwise the answer is "beyond the data").
Drafts trained elsewhere (another machine or recipe) sit beside the curve as labelled points, never in the fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import curve_fit

from eagle3lab.io import InputError

BEYOND = "beyond the data"


def saturating(n, a, b, c):
    return a - b * np.power(n, -c)


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
    boot: np.ndarray | None = None  # [R, 3] bootstrap parameter draws

    def predict(self, n) -> np.ndarray:
        return saturating(np.asarray(n, dtype=float), self.a, self.b, self.c)

    def band(self, n, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
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

    def size_for_interval(self, tau: float, level: float = 0.9) -> tuple[float, float]:
        if self.boot is None:
            s = self.size_for(tau)
            return s, s
        sizes = np.array([size_for(tau, *p) for p in self.boot])
        return tuple(float(x) for x in np.quantile(sizes, [(1 - level) / 2, (1 + level) / 2]))

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
    """What to report for a data size read off a fit of `sizes`: the size itself inside the measured range, or past
    it when the ceiling is identified and the fit reaches the accept length at all; BEYOND otherwise. Past the data
    with the ceiling unidentified, the extrapolation follows the bound the config allows, not the data (the reference
    run's 22-180 conversations gave "8.3e+15 conversations for 2x")."""
    return size if size <= max(sizes) or (ceiling_identified and math.isfinite(size)) else BEYOND


def _fit_params(sizes, taus, ceiling):
    sizes, taus = np.asarray(sizes, float), np.asarray(taus, float)
    # start: ceiling a bit above the best point, half the gap closed per decade
    a0 = min(max(taus.max() + 0.3, 1.01), ceiling)
    p0 = [a0, max(a0 - taus.min(), 1e-3) * sizes.min() ** 0.3, 0.3]
    params, _ = curve_fit(
        saturating, sizes, taus, p0=p0, bounds=([1.0, 0.0, 0.01], [ceiling, np.inf, 3.0]), maxfev=20000
    )
    return params


def gain_per_doubling(sizes, taus) -> float:
    """Least-squares slope of accept length against log2(size)."""
    return float(np.polyfit(np.log2(np.asarray(sizes, float)), np.asarray(taus, float), 1)[0])


def _ceiling_identified(draws: list, ceiling: float) -> bool:
    """The data pin the ceiling down when resampled prompts keep it clear of the config's bound (95% of the
    bootstrap refits); a single fit can land inside the bound on data that only show a log-law."""
    return bool(draws) and float(np.quantile([d[0] for d in draws], 0.95)) < ceiling * (1 - 1e-3)


def fit_scaling(sizes, per_prompt_taus, *, ceiling: float, boot: int = 200, seed: int = 0) -> ScalingFit:
    """Fit tau(n) from per-prompt accept lengths measured at each size (a list of arrays, same prompts per size).

    `ceiling` is the largest accept length the draft config allows (steps + 1 for a chain). Needs >= 3 sizes.
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
    interval = tuple(float(x) for x in np.quantile(slopes, [0.05, 0.95])) if slopes else (slope, slope)
    return ScalingFit(
        a=float(a),
        b=float(b),
        c=float(c),
        sizes=sizes,
        taus=[float(m) for m in means],
        ceiling_identified=_ceiling_identified(draws, ceiling),
        gain_per_doubling=slope,
        gain_per_doubling_interval=interval,
        boot=np.asarray(draws) if draws else None,
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
                "ceiling a": fit.a,
                "exponent c": fit.c,
                "records for break-even": fit.reported(fit.size_for(cost.break_even_tau)),
                "90% interval": tuple(map(fit.reported, fit.size_for_interval(cost.break_even_tau))),
                "records for 2x": fit.reported(fit.size_for(cost.tau_for_speedup(2))),
                "largest measured": matrix.index.max(),
                "accept length there": largest_tau,
                "predicted speedup there": float(cost.speedup(largest_tau)),
            }
        )
    return fits, points, rows


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
