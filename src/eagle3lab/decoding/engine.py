"""Speculative decoding engine: an HF Llama target with its KV cache and an EAGLE-3 draft with its own cache.

- Chain drafting (topk 1) and tree drafting (topk > 1) with SGLang's three knobs: `steps` (depth), `topk`
  (branching) and `num_draft_tokens` (tokens verified per target forward, the root included).
- Greedy verification, and sampling whose output distribution is exactly the target's: chain drafts are sampled
  from the draft and accepted by Leviathan rejection sampling (residual over the full target vocab); tree drafts are
  the draft's top-k and are accepted by sequential rejection with point-mass proposals (SGLang's "target only" rule).
- `mode="eagle"` reproduces SGLang's wrong-flag path (`--speculative-algorithm EAGLE` with an EAGLE-3 draft): the
  draft receives the target's final hidden state (width H, so `project` skips fc) and the target's head, cut to the
  first `draft_vocab_size` rows, replaces the draft's lm_head. `mode="eagle3"` feeds the aux layers through fc.
- Adaptive drafting (EAGLE-2's dynamic idea): with `threshold` > 0 a chain stops, and a tree stops growing, where
  the draft's own cumulative probability of a node falls below it. The decision depends on the draft state only, never
  on a sampled token, so verification stays lossless.
- Device-aware: inputs, masks, indices and the sampling generator live on the target's device; timings are
  CUDA-synchronised (`eagle3lab.devices.clock`).
- The baseline (config 1,0,0,0) runs the same prefill and target-step code without a draft, so speedups compare
  like with like.

Draft position convention (as in EAGLE/SGLang): draft position t holds (target feature of token t, token t+1) and
predicts token t+2; a tree node at depth d sits at draft position n-1+d and target position n+d, where n is the
number of tokens in the target cache and the root (last emitted token) sits at target position n.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from eagle3lab.decoding.config import BASELINE, SpecConfig
from eagle3lab.decoding.generation import Generation, Round
from eagle3lab.decoding.tree import DraftTree, keep_cache_positions, prune, tree_mask, verify_greedy, verify_sampled
from eagle3lab.devices import clock, seeded_generator
from eagle3lab.models.target import AuxCapture, aux_hidden_indices

if TYPE_CHECKING:
    from eagle3lab.models.draft import Eagle3Draft

MODES = ("eagle3", "eagle")


def emit(result: Generation, eos, tokens: list[int], max_new_tokens: int) -> bool:
    """Append tokens to `result` up to an EOS token or the length limit; True when generation is over (every engine's
    rule, the chain's and the block's)."""
    for t in tokens:
        result.tokens.append(t)
        if t in eos:
            result.finished_by = "eos"
            return True
        if len(result.tokens) >= max_new_tokens:
            return True
    return False


class SpecEngine:
    """Batch-1 speculative (or plain, for the baseline config) decoding of one HF Llama target.

    `generate(prompt_ids, max_new_tokens, temperature)` returns a `Generation`. At temperature 0 the output equals
    plain greedy decoding token for token (up to floating-point ties); at temperature > 0 each token is distributed
    exactly as the target's softmax(logits / T). `threshold` (0 = off) is the adaptive-drafting cut on the draft's
    cumulative probability of a node.
    """

    def __init__(
        self,
        model,
        draft: Eagle3Draft | None = None,
        config: SpecConfig | str = BASELINE,
        *,
        mode: str = "eagle3",
        eos_token_ids=(),
        threshold: float = 0.0,
    ):
        self.config = SpecConfig.parse(config) if isinstance(config, str) else config
        self.config.validate()
        if mode not in MODES:
            raise ValueError(f"mode '{mode}': expected one of {MODES}")
        if not self.config.is_baseline and draft is None:
            raise ValueError(f"config {self.config.label} speculates and needs a draft model")
        if not 0.0 <= threshold < 1.0:
            raise ValueError(f"threshold {threshold}: expected a draft probability in [0, 1)")
        self.model = model
        self.decoder = model.model
        parameter = next(model.parameters())
        self.dtype, self.device = parameter.dtype, parameter.device
        self.mode = mode
        self.threshold = threshold
        self.log_threshold = math.log(threshold) if threshold > 0 else -math.inf
        self.draft = None if self.config.is_baseline else draft
        self.eos = {int(t) for t in (eos_token_ids or ())}
        self.aux_indices = None
        if self.draft is not None:
            self.draft_dtype = next(self.draft.parameters()).dtype
            vocab = torch.arange(self.draft.config.draft_vocab_size, device=self.device)
            self.d2t = self.draft.draft_to_target(vocab).long()
            self.draft_vocab_to_target = self.d2t.tolist()
            if mode == "eagle3":
                self.aux_indices = aux_hidden_indices(model.config.num_hidden_layers, self.draft.config.aux_layer_ids)
            else:
                # SGLang's EAGLE path hands the draft the target's head; the draft vocab takes its first rows.
                self.eagle_head = model.lm_head.weight[: self.draft.config.draft_vocab_size].to(self.draft_dtype)

    def _tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, device=self.device)

    # ---- model calls -------------------------------------------------------------------------------------------

    def _target(self, ids: list[int], start: int, cache, capture, mask=None, depths=None, last_only=False):
        """One target forward; returns fp32 logits [T or 1, V] and the draft features [T, 3H or H] (or None)."""
        positions = self._tensor(
            [[start + d for d in depths]] if depths is not None else [range(start, start + len(ids))]
        )
        out = self.decoder(
            input_ids=self._tensor([ids]), position_ids=positions, attention_mask=mask, cache=cache, use_cache=True
        )
        hidden = out.last_hidden_state[0]
        logits = self.model.lm_head(hidden[-1:] if last_only else hidden).float()
        if capture is not None:
            return logits, capture.concat()[0]
        return logits, (hidden if self.draft is not None and self.mode == "eagle" else None)

    def _draft(self, ids: list[int], hidden: torch.Tensor, positions: list[int], dcache, mask=None):
        """One draft forward; returns fp32 draft-vocab logits [T, Vd] and the out hidden [T, H] for the next step."""
        logits, out = self.draft(
            self._tensor([ids]), hidden[None], self._tensor([positions]), cache=dcache, attn_mask=mask
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

    def _draft_round(self, logits0, hidden0, n: int, dcache, temperature: float, gen) -> DraftTree:
        """Propose a chain or a tree from the draft's prediction at the root; leaves the draft cache at length n."""
        tree = self._draft_chain if self.config.topk == 1 else self._draft_tree
        result = tree(logits0, hidden0, n, dcache, temperature, gen)
        dcache.crop(n)
        return result

    def _draft_chain(self, logits, hidden, n: int, dcache, temperature: float, gen) -> DraftTree:
        """Causal masks, one token per step. The confidence is the draft's top probability (at T=1) multiplied along
        the chain: a function of the draft state only, so stopping on it keeps sampling lossless."""
        tree, node, confidence = DraftTree.root(), 0, 1.0
        for step in range(self.config.steps):
            confidence *= float(torch.softmax(logits, -1).max())
            if confidence < self.threshold:
                break
            if temperature > 0:
                q = torch.softmax(logits / temperature, -1)
                node = tree.add(node, self.draft_vocab_to_target[int(torch.multinomial(q, 1, generator=gen))], q)
            else:
                node = tree.add(node, self.draft_vocab_to_target[int(logits.argmax())])
            tree.confidence[node] = confidence
            if step + 1 < self.config.steps:
                logits, out = self._draft([tree.tokens[node]], hidden[None], [n + step], dcache)
                logits, hidden = logits[0], out[0]
        return tree

    def _draft_tree(self, logits0, hidden0, n: int, dcache, temperature: float, gen) -> DraftTree:
        """EAGLE-2 / SGLang: expand the k best nodes of each depth by their k best children; rank every node by its
        cumulative draft log-probability and verify the best num_draft_tokens - 1 (plus the root). Children whose
        cumulative probability is below the threshold are never created, so the tree may stop growing early."""
        k = self.config.topk
        tree, scores = DraftTree.root(), [0.0]
        frontier: list[int] = []
        frontier_hidden = hidden0[None]
        in_cache: list[int] = []  # tree nodes whose keys are in the draft cache, in cache order
        ancestors: dict[int, set[int]] = {0: set()}
        logits = logits0[None]
        for step in range(self.config.steps):
            if step:
                logits, frontier_hidden = self._draft(
                    [tree.tokens[f] for f in frontier],
                    frontier_hidden,
                    [n - 1 + step] * len(frontier),
                    dcache,
                    self._draft_mask(frontier, in_cache, ancestors, n),
                )
                in_cache += frontier
            parents = frontier or [0]
            logp, ids = torch.log_softmax(logits, -1).topk(k)
            cumulative = (logp + self._tensor([scores[p] for p in parents])[:, None]).flatten()
            kept = (cumulative >= self.log_threshold).nonzero().flatten()
            if not len(kept):
                break
            ids = ids.flatten().tolist()
            created = {}
            for index, score in zip(kept.tolist(), cumulative[kept].tolist()):
                parent = parents[index // k]
                created[index] = tree.add(parent, self.draft_vocab_to_target[ids[index]], None, math.exp(score))
                ancestors[created[index]] = ancestors[parent] | {created[index]}
                scores.append(score)
            best = kept[cumulative[kept].topk(min(k, len(kept))).indices].tolist()
            frontier = [created[b] for b in best]
            frontier_hidden = frontier_hidden[[b // k for b in best]]
        return prune(tree, scores, self.config.num_draft_tokens)

    def _draft_mask(self, frontier: list[int], in_cache: list[int], ancestors: dict, n: int) -> torch.Tensor:
        """The frontier attends to the context, to its cached ancestors and to itself."""
        m = len(frontier)
        allowed = torch.zeros(m, n + len(in_cache) + m, dtype=torch.bool)
        allowed[:, :n] = True
        for r, node in enumerate(frontier):
            for c, cached in enumerate(in_cache):
                allowed[r, n + c] = cached in ancestors[node]
            allowed[r, n + len(in_cache) + r] = True
        return allowed.to(self.device)

    def _tree_mask(self, tree: DraftTree, n: int) -> torch.Tensor:
        return tree_mask(tree, n, self.dtype, self.device)

    # ---- verification ------------------------------------------------------------------------------------------

    def _verify(self, tree: DraftTree, logits: torch.Tensor, temperature: float, gen) -> tuple[list[int], int]:
        """Walk the tree from the root; return the accepted node indices and the bonus token."""
        if temperature <= 0:
            return verify_greedy(tree, logits)
        return verify_sampled(tree, logits, temperature, self.d2t, gen)

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
            gen = seeded_generator(self.device, seed if seed is not None else random.randrange(2**63))
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
        t0 = clock(self.device)
        if capture:
            capture.__enter__()
        try:
            self._run(prompt, max_new_tokens, temperature, gen, cache, capture, result)
        finally:
            if capture:
                capture.__exit__(None, None, None)
        result.time_total = clock(self.device) - t0
        return result

    def _run(self, prompt, max_new_tokens, temperature, gen, cache, capture, result: Generation) -> None:
        t = clock(self.device)
        logits, features = self._target(prompt, 0, cache, capture, last_only=True)
        root = self._pick(logits[-1], temperature, gen)
        result.time_prefill = clock(self.device) - t
        if emit(result, self.eos, [root], max_new_tokens):
            return
        if self.draft is None:
            self._run_plain(root, len(prompt), max_new_tokens, temperature, gen, cache, result)
        else:
            self._run_speculative(prompt, root, features, max_new_tokens, temperature, gen, cache, capture, result)

    def _run_plain(self, root, n, max_new_tokens, temperature, gen, cache, result: Generation) -> None:
        while True:
            t = clock(self.device)
            logits, _ = self._target([root], n, cache, None)
            result.time_verify += clock(self.device) - t
            result.verify_count += 1
            n += 1
            root = self._pick(logits[-1], temperature, gen)
            if emit(result, self.eos, [root], max_new_tokens):
                return

    def _run_speculative(self, prompt, root, features, max_new_tokens, temperature, gen, cache, capture, result):
        n = len(prompt)
        t = clock(self.device)
        dcache = self.draft.new_cache()
        dlogits, dhidden = self._draft_extend(prompt[1:] + [root], features, 0, dcache)
        result.time_draft += clock(self.device) - t
        while True:
            t = clock(self.device)
            tree = self._draft_round(dlogits, dhidden, n, dcache, temperature, gen)
            tree.tokens[0] = root
            t_mid = clock(self.device)
            result.time_draft += t_mid - t
            chain = all(d == i for i, d in enumerate(tree.depths))  # a chain (or a lone root) needs no tree mask
            logits, features = self._target(
                tree.tokens,
                n,
                cache,
                capture,
                mask=None if chain else self._tree_mask(tree, n),
                depths=None if chain else tree.depths,
            )
            result.time_verify += clock(self.device) - t_mid
            result.verify_count += 1
            path, bonus = self._verify(tree, logits, temperature, gen)
            result.accepted.append(len(path))
            if result.rounds is not None:
                result.rounds.append(
                    Round(
                        tree.tokens[1:], tree.depths[1:], tree.confidence[1:], len(path), [tree.rank(p) for p in path]
                    )
                )
            rows = [0] + path
            keep_cache_positions(cache, n, rows)
            new_tokens = [tree.tokens[r] for r in path] + [bonus]
            if emit(result, self.eos, new_tokens, max_new_tokens):
                return
            t = clock(self.device)
            dlogits, dhidden = self._draft_extend(new_tokens, features[rows], n, dcache)
            result.time_draft += clock(self.device) - t
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
    threshold: float = 0.0,
) -> Generation:
    """One-call convenience over `SpecEngine`."""
    engine = SpecEngine(model, draft, config, mode=mode, eos_token_ids=eos_token_ids, threshold=threshold)
    return engine.generate(prompt_ids, max_new_tokens, temperature, seed, trace)
