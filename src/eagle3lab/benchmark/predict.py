"""Predicted speedup of every draft shape from an acceptance profile and the forward costs (`tune`'s model).

Accept length, closed form: a node at depth d and sibling rank r on an accepted parent is accepted with probability
p(d, r) = a_d * rho_r; a node's acceptance probability is the product along its path, and the expected accept length
of a verified tree is 1 + the sum of its nodes' probabilities (siblings are disjoint events). The tree is SGLang's:
each depth expands the topk most probable nodes by their topk children, and the num_draft_tokens - 1 most probable
nodes are verified. A chain (topk 1) gives 1 + sum_d prod_{i<=d} a_i.

Speed, per request as `eagle3lab bench` times one (prefill, then decoding to EOS or max_new_tokens): the first token
comes from the prefill, the other generated - 1 from rounds of tau tokens each, so over the requests (prompt length n,
generated tokens g)
    baseline    = sum  prefill_target(n) + (g - 1) * t_target
    speculative = sum  prefill_target(n) + prefill_draft(n) + (g - 1) / tau * round_cost
    speedup     = baseline / speculative,  round_cost = t_verify(ndraft) + steps * t_draft + t_other
Without prefill costs (an old costs file) or requests, this is decoding alone, `scaling.CostModel`'s
tau * t_target / round_cost (`decode_speedup`, always reported): the limit of long generations.

Adaptive chains (stop where the draft's cumulative confidence falls below a threshold) are predicted from the deep
chain's traced rounds instead: each round is cut where its confidence falls below the threshold, its accepted count
capped at the cut, and its cost is that of the shorter verify and the draft steps it really took.
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import asdict, dataclass

from eagle3lab.benchmark.costs import prefill_cost, verify_cost
from eagle3lab.benchmark.profile import AcceptanceProfile
from eagle3lab.benchmark.scaling import CostModel
from eagle3lab.decoding.config import SpecConfig, valid_configs
from eagle3lab.io import InputError

THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


@dataclass
class Prediction:
    config: str  # bs,steps,topk,ndraft
    threshold: float  # adaptive drafting cut (0 = off)
    accept_length: float
    speedup: float  # predicted tokens/s over the baseline's, per request (prefill included when the costs have it)
    tokens_per_s: float  # decoding rate after the prefill: tokens per second of rounds
    decode_speedup: float = 0.0  # decoding alone (no prefill): tau * t_target / round cost

    @property
    def label(self) -> str:
        return f"{self.config}@{self.threshold:g}" if self.threshold else self.config

    def to_json(self) -> dict:
        return asdict(self) | {"label": self.label}


def accept_length(depth: list[float], rank: list[float], config: SpecConfig) -> float:
    """Expected tokens per verify of `config` under the profile (see the module docstring)."""
    nodes: list[float] = []
    frontier = [1.0]
    for d in range(config.steps):
        a = depth[d] if d < len(depth) else 0.0
        children = [p * a * (rank[r] if r < len(rank) else 0.0) for p in frontier for r in range(config.topk)]
        nodes += children
        frontier = heapq.nlargest(config.topk, children)
    return 1.0 + sum(heapq.nlargest(config.num_draft_tokens - 1, nodes))


def cost_model(costs: dict, config: SpecConfig, other: float) -> CostModel:
    return CostModel(
        t_target=costs["target_step"],
        t_verify=verify_cost(costs, config.num_draft_tokens),
        t_draft=costs["draft_step"],
        steps=config.steps,
        t_other=other,
    )


def calibrated(cost: CostModel, measured: list[tuple[float, float]]) -> tuple[CostModel, dict]:
    """The cost model scaled to what was measured: `measured` holds (accept length, measured speedup) pairs (stage 04's
    timed rows of one config, one per set); the factor is the median of measured over predicted speedup, and the
    calibrated model's round costs 1/factor as much. Returns it and the calibration: the factor, its range over the
    pairs, and the break-even accept length that range gives (the calibration's error)."""
    ratios = sorted(float(speedup / cost.speedup(tau)) for tau, speedup in measured)
    if not ratios:
        raise InputError("calibration: no measured speedup of this config (stage 04 did not time it)")
    factor = statistics.median(ratios)
    model = CostModel(t_target=cost.t_target, t_verify=cost.round_cost / factor, t_draft=0.0, steps=cost.steps)
    return model, {
        "factor": factor,
        "factor_range": [ratios[0], ratios[-1]],
        "points": len(ratios),
        "break_even_tau": model.break_even_tau,
        "break_even_range": [cost.break_even_tau / ratios[-1], cost.break_even_tau / ratios[0]],
        "uncalibrated_break_even_tau": cost.break_even_tau,
    }


def request_speedup(costs: dict, requests, tau: float, round_cost: float) -> float | None:
    """Baseline over speculative seconds of whole requests ((prompt tokens, generated tokens) pairs; see the module
    docstring); None when no request decodes past its first token."""
    baseline = speculative = 0.0
    for prompt, generated in requests:
        decoded = max(generated - 1, 0)  # the first token comes from the prefill
        prefill = prefill_cost(costs, "target", prompt)
        baseline += prefill + decoded * costs["target_step"]
        speculative += prefill + prefill_cost(costs, "draft", prompt) + decoded / tau * round_cost
    if not any(generated > 1 for _, generated in requests) or speculative <= 0:
        return None
    return baseline / speculative


def _prediction(label, threshold, tau, round_cost, costs, requests) -> Prediction:
    decode = tau * costs["target_step"] / round_cost
    whole = request_speedup(costs, requests, tau, round_cost) if requests and "prefill" in costs else None
    return Prediction(label, threshold, tau, decode if whole is None else whole, tau / round_cost, decode)


def predict(config: SpecConfig, profile: AcceptanceProfile, costs: dict, requests=None) -> Prediction:
    """`requests`: (prompt tokens, generated tokens) of the benchmarked requests (default: the profile's own)."""
    tau = accept_length(profile.depth, profile.rank, config)
    model = cost_model(costs, config, costs.get("other", profile.other))
    requests = profile.requests() if requests is None else requests
    return _prediction(config.label, 0.0, tau, model.round_cost, costs, requests)


def predict_adaptive(
    steps: int, threshold: float, profile: AcceptanceProfile, costs: dict, requests=None
) -> Prediction:
    """A chain of up to `steps` tokens cut at `threshold`, replayed on the deep chain's traced rounds."""
    other = costs.get("other", profile.other)
    tokens = seconds = 0.0
    for confidence, accepted in profile.chain_rounds:
        m = sum(c >= threshold for c in confidence[:steps])  # cumulative confidence only falls: a prefix
        tokens += min(accepted, m) + 1
        seconds += verify_cost(costs, m + 1) + min(m + 1, steps) * costs["draft_step"] + other
    rounds = len(profile.chain_rounds)
    label = SpecConfig(1, steps, 1, steps + 1).label
    if not tokens or not seconds:
        return Prediction(label, threshold, 1.0, 0.0, 0.0, 0.0)
    requests = profile.requests() if requests is None else requests
    return _prediction(label, threshold, tokens / rounds, seconds / rounds, costs, requests)


def rank_predictions(
    profile: AcceptanceProfile,
    costs: dict,
    *,
    max_steps: int,
    max_topk: int,
    max_ndraft: int,
    thresholds=THRESHOLDS,
    requests=None,
) -> list[Prediction]:
    """Every valid shape up to the bounds (closed form), plus adaptive chains, best predicted speedup first;
    `requests` as in `predict`."""
    requests = profile.requests() if requests is None else requests
    found = [predict(c, profile, costs, requests) for c in valid_configs(max_steps, max_topk, max_ndraft)]
    if profile.chain_rounds:
        found += [predict_adaptive(s, t, profile, costs, requests) for s in range(1, max_steps + 1) for t in thresholds]
    return sorted(found, key=lambda p: (-p.speedup, p.label))
