"""A draft's acceptance profile, measured once from traced greedy runs: per depth from a deep chain (how often the
draft's best token is accepted, given the path to its parent was), per sibling rank from a wide tree (how often the
accepted child is the draft's 2nd, 3rd ... choice, relative to its 1st), plus the deep chain's rounds themselves
(confidence and accepted count), from which adaptive drafting is predicted, the engine's per-round overhead, and each
prompt's length and generated length (greedy, so the baseline's too: it may stop at EOS before max_new_tokens)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from eagle3lab.decoding.config import SpecConfig, max_draft_tokens
from eagle3lab.decoding.engine import SpecEngine
from eagle3lab.decoding.generation import Generation

CHAIN_DEPTH = 6  # deeper chain positions of today's drafts are accepted < 1% of the time
TREE_TOPK = 4
TREE_DEPTH = 2  # with 2 steps every depth-1 node is expanded, so rank statistics are unbiased at depths 1 and 2


@dataclass
class AcceptanceProfile:
    depth: list[float]  # a_d, d = 1..D: P(draft's best child accepted | parent accepted), from the deep chain
    rank: list[float]  # rho_r, r = 0..K-1: P(rank-r child accepted) / P(rank-0 child accepted), from the tree
    chain_rounds: list[tuple[list[float], int]]  # deep chain: (cumulative confidence per position, accepted)
    other: float  # seconds per round outside the draft and target forwards (sampling, bookkeeping, rollback)
    prompts: int
    prompt_tokens: list[int] = field(default_factory=list)  # per prompt (empty in profiles from before they were kept)
    generated_tokens: list[int] = field(default_factory=list)  # per prompt, by the deep chain (EOS included)

    def to_json(self) -> dict:
        return asdict(self)

    def requests(self) -> list[tuple[int, int]]:
        """(prompt tokens, generated tokens) of each traced prompt: the requests `predict` times."""
        return list(zip(self.prompt_tokens, self.generated_tokens))

    @classmethod
    def from_json(cls, data: dict) -> AcceptanceProfile:
        data = dict(data)
        data["chain_rounds"] = [(list(c), int(a)) for c, a in data["chain_rounds"]]
        return cls(**data)


def depth_acceptance(accepted: list[int], depth: int) -> list[float]:
    """a_d = P(accepted >= d | accepted >= d - 1) over chain rounds."""
    reach = [sum(a >= d for a in accepted) for d in range(depth + 1)]
    return [reach[d] / reach[d - 1] if reach[d - 1] else 0.0 for d in range(1, depth + 1)]


def rank_acceptance(paths: list[list[int]], topk: int) -> list[float]:
    """rho_r from the sibling ranks of accepted nodes (all depths pooled), relative to rank 0."""
    counts = [0] * topk
    for ranks in paths:
        for r in ranks:
            counts[r] += 1
    return [c / counts[0] if counts[0] else 0.0 for c in counts]


def _overhead(gens: list[Generation]) -> float:
    verifies = sum(g.verify_count for g in gens)
    return sum(g.time_other for g in gens) / verifies if verifies else 0.0


def measure_profile(
    target_model, draft, prompts: list[list[int]], max_new_tokens: int, eos=(), depth=CHAIN_DEPTH, topk=TREE_TOPK
) -> AcceptanceProfile:
    """Greedy traced runs of a `depth`-deep chain and a `topk`-wide tree of `draft` on `prompts` (token ids)."""
    chain = SpecEngine(target_model, draft, SpecConfig(1, depth, 1, depth + 1), eos_token_ids=eos)
    tree_shape = SpecConfig(1, TREE_DEPTH, topk, max_draft_tokens(TREE_DEPTH, topk))
    tree = SpecEngine(target_model, draft, tree_shape, eos_token_ids=eos)
    chain_runs = [chain.generate(p, max_new_tokens, trace=True) for p in prompts]
    tree_runs = [tree.generate(p, max_new_tokens, trace=True) for p in prompts]
    rounds = [r for g in chain_runs for r in g.rounds]
    return AcceptanceProfile(
        depth=depth_acceptance([r.accepted for r in rounds], depth),
        rank=rank_acceptance([r.ranks for g in tree_runs for r in g.rounds], topk),
        chain_rounds=[(r.confidence, r.accepted) for r in rounds],
        other=_overhead(chain_runs),
        prompts=len(prompts),
        prompt_tokens=[len(p) for p in prompts],
        generated_tokens=[g.completion_tokens for g in chain_runs],
    )
