"""Speculative decoding engine: an HF Llama target with its KV cache and an EAGLE-3 draft with its own cache.

- Chain drafting (topk 1) and tree drafting (topk > 1) with SGLang's three knobs: `steps` (depth), `topk`
  (branching) and `num_draft_tokens` (tokens verified per target forward, the root included).
- Greedy verification, and sampling whose output distribution is exactly the target's: chain drafts are sampled
  from the draft and accepted by Leviathan rejection sampling (residual over the full target vocab); tree drafts are
  the draft's top-k and are accepted by sequential rejection with point-mass proposals (SGLang's "target only" rule).
- `mode="eagle"` reproduces SGLang's wrong-flag path (`--speculative-algorithm EAGLE` with an EAGLE-3 draft): the
  draft receives the target's final hidden state (width H, so `project` skips fc) and the target's head, cut to the
  first `draft_vocab_size` rows, replaces the draft's lm_head. `mode="eagle3"` feeds the aux layers through fc.
- The baseline (config 1,0,0,0) runs the same prefill and target-step code without a draft, so speedups compare
  like with like.

Draft position convention (as in EAGLE/SGLang): draft position t holds (target feature of token t, token t+1) and
predicts token t+2; a tree node at depth d sits at draft position n-1+d and target position n+d, where n is the
number of tokens in the target cache and the root (last emitted token) sits at target position n.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from eagle3lab.decoding.config import BASELINE, SpecConfig
from eagle3lab.models.target import AuxCapture, aux_hidden_indices

if TYPE_CHECKING:
    from eagle3lab.models.draft import Eagle3Draft

MODES = ("eagle3", "eagle")


@dataclass
class Generation:
    """One generation's output and metrics."""

    config: str
    mode: str
    prompt_tokens: int
    tokens: list[int]  # completion token ids (the EOS that stopped it included)
    finished_by: str  # "eos" or "length"
    verify_count: int = 0  # target forwards after the prefill (SGLang's spec_verify_ct)
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted by each verify forward
    depth: int = 0  # draft depth (steps); per-position acceptance has this many entries
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0
    rounds: list[tuple[list[int], int]] | None = None  # with trace=True: (proposed draft tokens, accepted) per verify

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)

    @property
    def accept_length(self) -> float:
        """Tokens per target verify forward: accepted drafts + the bonus token (1.0 when nothing is ever accepted).

        The token sampled from the prefill is not a verify's output, so it is not counted; SGLang's
        `completion_tokens / spec_verify_ct` (`sglang_accept_length`) counts it and reads slightly higher.
        """
        return (self.completion_tokens - 1) / self.verify_count if self.verify_count else 1.0

    @property
    def sglang_accept_length(self) -> float:
        return self.completion_tokens / self.verify_count if self.verify_count else 1.0

    @property
    def position_acceptance(self) -> list[float]:
        """Fraction of verify forwards that accepted at least d draft tokens, for d = 1..depth."""
        n = len(self.accepted)
        return [sum(a >= d for a in self.accepted) / n if n else 0.0 for d in range(1, self.depth + 1)]

    @property
    def time_other(self) -> float:
        return max(self.time_total - self.time_prefill - self.time_draft - self.time_verify, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.time_total if self.time_total > 0 else 0.0

    def summary(self) -> dict:
        return {
            "config": self.config,
            "mode": self.mode,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finished_by": self.finished_by,
            "verify_count": self.verify_count,
            "accept_length": self.accept_length,
            "sglang_accept_length": self.sglang_accept_length,
            "position_acceptance": self.position_acceptance,
            "tokens_per_s": self.tokens_per_s,
            "time_total": self.time_total,
            "time_prefill": self.time_prefill,
            "time_draft": self.time_draft,
            "time_verify": self.time_verify,
            "time_other": self.time_other,
        }


@dataclass
class _Tree:
    """Draft proposals of one round. Node 0 is the root (the last emitted token, not yet in the target cache);
    nodes are in creation order, so every parent precedes its children."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    children: list[list[int]]  # per node, in proposal order (best score first)
    proposal: list[torch.Tensor | None]  # per node: the draft distribution it was sampled from (sampled chain only)


def keep_cache_positions(cache, prefix: int, rows: list[int]) -> None:
    """Roll the target cache back to its first `prefix` positions plus the new positions `prefix + rows`.

    Contiguous rows (a chain) are a crop; otherwise (a tree path) the accepted positions are gathered in order.
    """
    contiguous = rows == list(range(len(rows)))
    index = None if contiguous else torch.tensor(list(range(prefix)) + [prefix + r for r in rows])
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", True):
            continue
        if contiguous:
            layer.keys = layer.keys[:, :, : prefix + len(rows)]
            layer.values = layer.values[:, :, : prefix + len(rows)]
        else:
            layer.keys = layer.keys.index_select(2, index)
            layer.values = layer.values.index_select(2, index)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[q, kv] bool (True = may attend) -> the [1, 1, q, kv] additive mask transformers passes through unchanged."""
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class SpecEngine:
    """Batch-1 speculative (or plain, for the baseline config) decoding of one HF Llama target.

    `generate(prompt_ids, max_new_tokens, temperature)` returns a `Generation`. At temperature 0 the output equals
    plain greedy decoding token for token (up to floating-point ties); at temperature > 0 each token is distributed
    exactly as the target's softmax(logits / T).
    """

    def __init__(
        self,
        model,
        draft: Eagle3Draft | None = None,
        config: SpecConfig | str = BASELINE,
        *,
        mode: str = "eagle3",
        eos_token_ids=(),
    ):
        self.config = SpecConfig.parse(config) if isinstance(config, str) else config
        self.config.validate()
        if mode not in MODES:
            raise ValueError(f"mode '{mode}': expected one of {MODES}")
        if not self.config.is_baseline and draft is None:
            raise ValueError(f"config {self.config.label} speculates and needs a draft model")
        self.model = model
        self.decoder = model.model
        self.dtype = next(model.parameters()).dtype
        self.mode = mode
        self.draft = None if self.config.is_baseline else draft
        self.eos = {int(t) for t in (eos_token_ids or ())}
        self.aux_indices = None
        if self.draft is not None:
            self.draft_dtype = next(self.draft.parameters()).dtype
            self.d2t = self.draft.draft_to_target(torch.arange(self.draft.config.draft_vocab_size)).long()
            self.draft_vocab_to_target = self.d2t.tolist()
            if mode == "eagle3":
                self.aux_indices = aux_hidden_indices(model.config.num_hidden_layers, self.draft.config.aux_layer_ids)
            else:
                # SGLang's EAGLE path hands the draft the target's head; the draft vocab takes its first rows.
                self.eagle_head = model.lm_head.weight[: self.draft.config.draft_vocab_size].to(self.draft_dtype)

    # ---- model calls -------------------------------------------------------------------------------------------

    def _target(self, ids: list[int], start: int, cache, capture, mask=None, depths=None, last_only=False):
        """One target forward; returns fp32 logits [T or 1, V] and the draft features [T, 3H or H] (or None)."""
        positions = torch.tensor(
            [[start + d for d in depths]] if depths is not None else [range(start, start + len(ids))]
        )
        out = self.decoder(
            input_ids=torch.tensor([ids]), position_ids=positions, attention_mask=mask, cache=cache, use_cache=True
        )
        hidden = out.last_hidden_state[0]
        logits = self.model.lm_head(hidden[-1:] if last_only else hidden).float()
        if capture is not None:
            return logits, capture.concat()[0]
        return logits, (hidden if self.draft is not None and self.mode == "eagle" else None)

    def _draft(self, ids: list[int], hidden: torch.Tensor, positions: list[int], dcache, mask=None):
        """One draft forward; returns fp32 draft-vocab logits [T, Vd] and the out hidden [T, H] for the next step."""
        logits, out = self.draft(
            torch.tensor([ids]), hidden[None], torch.tensor([positions]), cache=dcache, attn_mask=mask
        )
        if self.mode == "eagle":
            logits = F.linear(self.draft.norm(out), self.eagle_head)
        return logits[0].float(), out[0]

    def _draft_extend(self, ids: list[int], features: torch.Tensor, start: int, dcache):
        """Feed the draft the newly accepted tokens with the target features of their predecessors."""
        hidden = self.draft.project(features.to(self.draft_dtype))
        logits, out = self._draft(ids, hidden, list(range(start, start + len(ids))), dcache)
        return logits[-1], out[-1]

    # ---- token selection ---------------------------------------------------------------------------------------

    @staticmethod
    def _pick(logits: torch.Tensor, temperature: float, gen) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        return int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))

    # ---- drafting ----------------------------------------------------------------------------------------------

    def _draft_round(self, logits0, hidden0, n: int, dcache, temperature: float, gen) -> _Tree:
        """Propose a chain or a tree from the draft's prediction at the root; leaves the draft cache at length n."""
        steps, k = self.config.steps, self.config.topk
        d2t = self.draft_vocab_to_target
        tree = _Tree(tokens=[-1], parents=[-1], depths=[0], children=[[]], proposal=[None])

        def add(parent: int, draft_id: int, proposal=None) -> int:
            tree.tokens.append(d2t[draft_id])
            tree.parents.append(parent)
            tree.depths.append(tree.depths[parent] + 1)
            tree.children.append([])
            tree.proposal.append(proposal)
            tree.children[parent].append(len(tree.tokens) - 1)
            return len(tree.tokens) - 1

        if k == 1:  # chain: causal masks everywhere, no tree bookkeeping
            logits, hidden, node = logits0, hidden0, 0
            for step in range(steps):
                if temperature > 0:
                    q = torch.softmax(logits / temperature, -1)
                    node = add(node, int(torch.multinomial(q, 1, generator=gen)), q)
                else:
                    node = add(node, int(logits.argmax()))
                if step + 1 < steps:
                    logits, out = self._draft([tree.tokens[node]], hidden[None], [n + step], dcache)
                    logits, hidden = logits[0], out[0]
            dcache.crop(n)
            return tree

        # Tree (EAGLE-2 / SGLang): expand the k best nodes of each depth by their k best children; rank every node by
        # its cumulative draft log-probability and verify the best num_draft_tokens - 1 (plus the root).
        scores = [0.0]
        logp, ids = torch.log_softmax(logits0, -1).topk(k)
        frontier = [add(0, i) for i in ids.tolist()]
        scores += logp.tolist()
        frontier_hidden = hidden0.expand(k, -1)
        in_cache: list[int] = []  # tree nodes whose keys are in the draft cache, in cache order
        ancestors = {node: {node} for node in frontier}
        for step in range(1, steps):
            allowed = torch.zeros(k, n + len(in_cache) + k, dtype=torch.bool)
            allowed[:, :n] = True
            for r, node in enumerate(frontier):
                for c, cached in enumerate(in_cache):
                    allowed[r, n + c] = cached in ancestors[node]
                allowed[r, n + len(in_cache) + r] = True
            logits, out = self._draft(
                [tree.tokens[f] for f in frontier], frontier_hidden, [n - 1 + step] * k, dcache, allowed
            )
            in_cache += frontier
            logp, ids = torch.log_softmax(logits, -1).topk(k)
            cumulative = logp + torch.tensor([scores[f] for f in frontier])[:, None]
            created = []
            for r, parent in enumerate(frontier):
                for i in ids[r].tolist():
                    created.append(add(parent, i))
                    ancestors[created[-1]] = ancestors[parent] | {created[-1]}
            scores += cumulative.flatten().tolist()
            best = cumulative.flatten().topk(k).indices.tolist()
            frontier = [created[b] for b in best]
            frontier_hidden = out[[b // k for b in best]]
        dcache.crop(n)
        return self._prune(tree, scores)

    def _prune(self, tree: _Tree, scores: list[float]) -> _Tree:
        """Keep the root and the num_draft_tokens - 1 best-scored nodes (ties to the older node, so the kept set holds
        every kept node's parent: a child never scores above its parent)."""
        ranked = sorted(range(1, len(scores)), key=lambda i: (-scores[i], i))
        keep = [0] + sorted(ranked[: self.config.num_draft_tokens - 1])
        new_index = {old: new for new, old in enumerate(keep)}
        pruned = _Tree(tokens=[], parents=[], depths=[], children=[[] for _ in keep], proposal=[None] * len(keep))
        for old in keep:
            pruned.tokens.append(tree.tokens[old])
            pruned.depths.append(tree.depths[old])
            parent = new_index[tree.parents[old]] if old else -1
            pruned.parents.append(parent)
        # children in proposal order: best score first
        for new in sorted(range(1, len(keep)), key=lambda j: (-scores[keep[j]], keep[j])):
            pruned.children[pruned.parents[new]].append(new)
        return pruned

    def _tree_mask(self, tree: _Tree, n: int) -> torch.Tensor:
        size = len(tree.tokens)
        allowed = torch.zeros(size, n + size, dtype=torch.bool)
        allowed[:, :n] = True
        for node in range(size):
            a = node
            while a != -1:
                allowed[node, n + a] = True
                a = tree.parents[a]
        return additive_mask(allowed, self.dtype)

    # ---- verification ------------------------------------------------------------------------------------------

    def _verify(self, tree: _Tree, logits: torch.Tensor, temperature: float, gen) -> tuple[list[int], int]:
        """Walk the tree from the root; return the accepted node indices and the bonus token."""
        path: list[int] = []
        node = 0
        if temperature <= 0:
            best = logits.argmax(-1).tolist()
            while True:
                child = next((c for c in tree.children[node] if tree.tokens[c] == best[node]), None)
                if child is None:
                    return path, best[node]
                path.append(child)
                node = child
        while True:
            p = torch.softmax(logits[node] / temperature, -1)
            children = tree.children[node]
            accepted = None
            if children and tree.proposal[children[0]] is not None:
                # Leviathan et al.: accept x ~ q with prob min(1, p(x)/q(x)), else sample max(p - q, 0) renormalised.
                child = children[0]
                q = torch.zeros_like(p)
                q[self.d2t] = tree.proposal[child]
                token = tree.tokens[child]
                if float(torch.rand((), generator=gen)) * float(q[token]) < float(p[token]):
                    accepted = child
                else:
                    residual = (p - q).clamp_(min=0)
                    p = residual if float(residual.sum()) > 0 else p
            else:
                # Deterministic proposals: each child is a point-mass proposal tried in turn against the residual.
                for child in children:
                    token = tree.tokens[child]
                    if float(torch.rand((), generator=gen)) * float(p.sum()) < float(p[token]):
                        accepted = child
                        break
                    p[token] = 0.0
            if accepted is None:
                return path, int(torch.multinomial(p, 1, generator=gen))
            path.append(accepted)
            node = accepted

    # ---- generation --------------------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(
        self, prompt_ids, max_new_tokens: int, temperature: float = 0.0, seed: int | None = None, trace: bool = False
    ) -> Generation:
        from transformers import DynamicCache

        prompt = [int(t) for t in (prompt_ids.flatten().tolist() if torch.is_tensor(prompt_ids) else prompt_ids)]
        if not prompt:
            raise ValueError("empty prompt")
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        gen = None
        if temperature > 0:
            gen = torch.Generator().manual_seed(seed if seed is not None else random.randrange(2**63))
        result = Generation(
            config=self.config.label,
            mode=self.mode if self.draft is not None else "baseline",
            prompt_tokens=len(prompt),
            tokens=[],
            finished_by="length",
            depth=self.config.steps,
            rounds=[] if trace else None,
        )
        cache = DynamicCache(config=self.model.config)
        capture = AuxCapture(self.model, self.aux_indices) if self.aux_indices else None
        t0 = time.perf_counter()
        if capture:
            capture.__enter__()
        try:
            self._run(prompt, max_new_tokens, temperature, gen, cache, capture, result)
        finally:
            if capture:
                capture.__exit__(None, None, None)
        result.time_total = time.perf_counter() - t0
        return result

    def _emit(self, result: Generation, tokens: list[int], max_new_tokens: int) -> bool:
        """Append tokens up to EOS / the length limit; True when generation is over."""
        for t in tokens:
            result.tokens.append(t)
            if t in self.eos:
                result.finished_by = "eos"
                return True
            if len(result.tokens) >= max_new_tokens:
                return True
        return False

    def _run(self, prompt, max_new_tokens, temperature, gen, cache, capture, result: Generation) -> None:
        clock = time.perf_counter
        t = clock()
        logits, features = self._target(prompt, 0, cache, capture, last_only=True)
        root = self._pick(logits[-1], temperature, gen)
        result.time_prefill = clock() - t
        n = len(prompt)
        if self._emit(result, [root], max_new_tokens):
            return

        if self.draft is None:
            while True:
                t = clock()
                logits, _ = self._target([root], n, cache, capture)
                result.time_verify += clock() - t
                result.verify_count += 1
                n += 1
                root = self._pick(logits[-1], temperature, gen)
                if self._emit(result, [root], max_new_tokens):
                    return

        t = clock()
        dcache = self.draft.new_cache()
        dlogits, dhidden = self._draft_extend(prompt[1:] + [root], features, 0, dcache)
        result.time_draft += clock() - t
        while True:
            t = clock()
            tree = self._draft_round(dlogits, dhidden, n, dcache, temperature, gen)
            tree.tokens[0] = root
            t_mid = clock()
            result.time_draft += t_mid - t
            chain = self.config.topk == 1
            logits, features = self._target(
                tree.tokens,
                n,
                cache,
                capture,
                mask=None if chain else self._tree_mask(tree, n),
                depths=None if chain else tree.depths,
            )
            result.time_verify += clock() - t_mid
            result.verify_count += 1
            path, bonus = self._verify(tree, logits, temperature, gen)
            result.accepted.append(len(path))
            if result.rounds is not None:
                result.rounds.append((tree.tokens[1:], len(path)))
            rows = [0] + path
            keep_cache_positions(cache, n, rows)
            new_tokens = [tree.tokens[r] for r in path] + [bonus]
            if self._emit(result, new_tokens, max_new_tokens):
                return
            t = clock()
            dlogits, dhidden = self._draft_extend(new_tokens, features[rows], n, dcache)
            result.time_draft += clock() - t
            n += len(rows)
            root = bonus


def generate(
    model,
    prompt_ids,
    max_new_tokens: int,
    *,
    draft=None,
    config: SpecConfig | str = BASELINE,
    mode: str = "eagle3",
    temperature: float = 0.0,
    eos_token_ids=(),
    seed: int | None = None,
    trace: bool = False,
) -> Generation:
    """One-call convenience over `SpecEngine`."""
    engine = SpecEngine(model, draft, config, mode=mode, eos_token_ids=eos_token_ids)
    return engine.generate(prompt_ids, max_new_tokens, temperature, seed, trace)
