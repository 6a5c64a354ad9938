"""Draft-tree bookkeeping for the engine: the proposal tree of one round, its pruning to `num_draft_tokens`, its
attention mask, the verification walk (greedy and lossless sampling) and the target-cache rollback afterwards.

A chain is a tree whose nodes each have one child. Node 0 is the root (the last emitted token, not yet in the
target cache); nodes are in creation order, so every parent precedes its children, and each node's children are in
proposal order (best draft score first), so a child's index in `children[parent]` is its sibling rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    children: list[list[int]]
    proposal: list[torch.Tensor | None]  # per node: the draft distribution it was sampled from (sampled chain only)
    confidence: list[float] = field(default_factory=list)  # per node: the draft's cumulative probability (root 1)

    @classmethod
    def root(cls) -> DraftTree:
        return cls(tokens=[-1], parents=[-1], depths=[0], children=[[]], proposal=[None], confidence=[1.0])

    def add(self, parent: int, token: int, proposal: torch.Tensor | None = None, confidence: float = 1.0) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append([])
        self.proposal.append(proposal)
        self.confidence.append(confidence)
        self.children[parent].append(len(self.tokens) - 1)
        return len(self.tokens) - 1

    def rank(self, node: int) -> int:
        """0-based rank of `node` among its siblings (0 = the draft's best)."""
        return self.children[self.parents[node]].index(node)


def prune(tree: DraftTree, scores: list[float], num_draft_tokens: int) -> DraftTree:
    """Keep the root and the num_draft_tokens - 1 best-scored nodes (ties to the older node, so the kept set holds
    every kept node's parent: a child never scores above its parent)."""
    ranked = sorted(range(1, len(scores)), key=lambda i: (-scores[i], i))
    keep = [0] + sorted(ranked[: num_draft_tokens - 1])
    new_index = {old: new for new, old in enumerate(keep)}
    pruned = DraftTree(
        tokens=[tree.tokens[old] for old in keep],
        parents=[new_index[tree.parents[old]] if old else -1 for old in keep],
        depths=[tree.depths[old] for old in keep],
        children=[[] for _ in keep],
        proposal=[None] * len(keep),
        confidence=[tree.confidence[old] for old in keep],
    )
    for new in sorted(range(1, len(keep)), key=lambda j: (-scores[keep[j]], keep[j])):  # best score first
        pruned.children[pruned.parents[new]].append(new)
    return pruned


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[q, kv] bool (True = may attend) -> the [1, 1, q, kv] additive mask transformers passes through unchanged."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def tree_mask(tree: DraftTree, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Each node attends to the n cached positions and to its own ancestors (itself included)."""
    size = len(tree.tokens)
    allowed = torch.zeros(size, n + size, dtype=torch.bool)
    allowed[:, :n] = True
    for node in range(size):
        a = node
        while a != -1:
            allowed[node, n + a] = True
            a = tree.parents[a]
    return additive_mask(allowed.to(device), dtype)


def keep_cache_positions(cache, prefix: int, rows: list[int]) -> None:
    """Roll the target cache back to its first `prefix` positions plus the new positions `prefix + rows`.

    Contiguous rows (a chain) are a crop; otherwise (a tree path) the accepted positions are gathered in order.
    """
    contiguous = rows == list(range(len(rows)))
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True):
            continue
        if contiguous:
            layer.keys = layer.keys[:, :, : prefix + len(rows)]
            layer.values = layer.values[:, :, : prefix + len(rows)]
        else:
            index = torch.tensor(list(range(prefix)) + [prefix + r for r in rows], device=layer.keys.device)
            layer.keys = layer.keys.index_select(2, index)
            layer.values = layer.values.index_select(2, index)


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Follow the target's argmax down the tree; the accepted node indices and the bonus token."""
    best = logits.argmax(-1).tolist()
    path: list[int] = []
    node = 0
    while True:
        child = next((c for c in tree.children[node] if tree.tokens[c] == best[node]), None)
        if child is None:
            return path, best[node]
        path.append(child)
        node = child


def verify_sampled(
    tree: DraftTree, logits: torch.Tensor, temperature: float, d2t: torch.Tensor, gen: torch.Generator
) -> tuple[list[int], int]:
    """Walk the tree accepting by rejection sampling, so every emitted token is distributed as softmax(logits / T):
    a sampled child (chain) by Leviathan's rule against its proposal q, deterministic children (tree) as point-mass
    proposals tried in turn against the residual."""
    path: list[int] = []
    node = 0

    def coin() -> float:
        return float(torch.rand((), generator=gen, device=gen.device))

    while True:
        p = torch.softmax(logits[node] / temperature, -1)
        children = tree.children[node]
        accepted = None
        if children and tree.proposal[children[0]] is not None:
            # Leviathan et al.: accept x ~ q with prob min(1, p(x)/q(x)), else sample max(p - q, 0) renormalised.
            child = children[0]
            q = torch.zeros_like(p)
            q[d2t] = tree.proposal[child]
            token = tree.tokens[child]
            if coin() * float(q[token]) < float(p[token]):
                accepted = child
            else:
                residual = (p - q).clamp_(min=0)
                p = residual if float(residual.sum()) > 0 else p
        else:
            for child in children:
                token = tree.tokens[child]
                if coin() * float(p.sum()) < float(p[token]):
                    accepted = child
                    break
                p[token] = 0.0
        if accepted is None:
            return path, int(torch.multinomial(p, 1, generator=gen))
        path.append(accepted)
        node = accepted
