"""Predicted speedup of every draft shape from an acceptance profile and the forward costs (`tune`'s model).

Accept length, closed form: a node at depth d and sibling rank r on an accepted parent is accepted with probability
p(d, r) = a_d * rho_r; a node's acceptance probability is the product along its path, and the expected accept length
of a verified tree is 1 + the sum of its nodes' probabilities (siblings are disjoint events). The tree is SGLang's:
each depth expands the topk most probable nodes by their topk children, and the num_draft_tokens - 1 most probable
nodes are verified. A chain (topk 1) gives 1 + sum_d prod_{i<=d} a_i.

Speed: `scaling.CostModel`, speedup = tau * t_target / (t_verify(ndraft) + steps * t_draft + t_other).

Adaptive chains (stop where the draft's cumulative confidence falls below a threshold) are predicted from the deep
chain's traced rounds instead: each round is cut where its confidence falls below the threshold, its accepted count
capped at the cut, and its cost is that of the shorter verify and the draft steps it really took.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

from eagle3lab.benchmark.costs import verify_cost
from eagle3lab.benchmark.profile import AcceptanceProfile
from eagle3lab.benchmark.scaling import CostModel
from eagle3lab.decoding.config import SpecConfig, valid_configs

THRESHOLDS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


@dataclass
class Prediction:
    config: str  # bs,steps,topk,ndraft
    threshold: float  # adaptive drafting cut (0 = off)
    accept_length: float
    speedup: float  # predicted tokens/s over the baseline's
    tokens_per_s: float

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


def predict(config: SpecConfig, profile: AcceptanceProfile, costs: dict) -> Prediction:
    tau = accept_length(profile.depth, profile.rank, config)
    model = cost_model(costs, config, costs.get("other", profile.other))
    return Prediction(config.label, 0.0, tau, float(model.speedup(tau)), tau / model.round_cost)


def predict_adaptive(steps: int, threshold: float, profile: AcceptanceProfile, costs: dict) -> Prediction:
    """A chain of up to `steps` tokens cut at `threshold`, replayed on the deep chain's traced rounds."""
    other = costs.get("other", profile.other)
    tokens = seconds = 0.0
    for confidence, accepted in profile.chain_rounds:
        m = sum(c >= threshold for c in confidence[:steps])  # cumulative confidence only falls: a prefix
        tokens += min(accepted, m) + 1
        seconds += verify_cost(costs, m + 1) + min(m + 1, steps) * costs["draft_step"] + other
    tps = tokens / seconds if seconds else 0.0
    rounds = len(profile.chain_rounds)
    label = SpecConfig(1, steps, 1, steps + 1).label
    return Prediction(label, threshold, tokens / rounds if rounds else 1.0, tps * costs["target_step"], tps)


def rank_predictions(
    profile: AcceptanceProfile, costs: dict, *, max_steps: int, max_topk: int, max_ndraft: int, thresholds=THRESHOLDS
) -> list[Prediction]:
    """Every valid shape up to the bounds (closed form), plus adaptive chains, best predicted speedup first."""
    found = [predict(c, profile, costs) for c in valid_configs(max_steps, max_topk, max_ndraft)]
    if profile.chain_rounds:
        found += [predict_adaptive(s, t, profile, costs) for s in range(1, max_steps + 1) for t in thresholds]
    return sorted(found, key=lambda p: (-p.speedup, p.label))
