"""Greedy block speculative decoding of an HF Llama target with a DFlash draft, batch 1 (the local engine's DFlash
path; `decoding.engine.SpecEngine` runs the baseline and EAGLE-3).

A round: the draft drafts k tokens (`block_size - 1` unless told fewer) in one forward from the anchor (the last
emitted token) and k mask tokens; the target verifies the anchor and the drafts in one forward; the longest run of
drafts equal to the target's own greedy choices is accepted, plus the target's token after it. The target's features
of the accepted positions become the draft's new context. Each emitted token is the target's greedy choice, so the
output equals plain greedy decoding (up to floating-point ties: tests/test_dflash.py checks it on SmolLM2 in
float32)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eagle3lab.decoding.engine import emit
from eagle3lab.decoding.generation import Generation
from eagle3lab.decoding.tree import keep_cache_positions
from eagle3lab.devices import clock
from eagle3lab.drafters.dflash.model import DFlashDraft, block_mask
from eagle3lab.models.draft import DraftCache
from eagle3lab.models.target import AuxCapture


def target_indices(draft: DFlashDraft) -> list[int]:
    """HF hidden_states indices of the draft's target layers (id i is layer i's output, hidden_states[i + 1])."""
    return [i + 1 for i in draft.config.target_layer_ids]


class DFlashEngine:
    def __init__(self, model, draft: DFlashDraft, *, eos_token_ids=(), drafted: int | None = None):
        """`drafted`: the tokens a round drafts, k (default block_size - 1); a smaller k truncates the block to the
        anchor and k masks, as vLLM and llama.cpp do (docs/dflash.md, "The serving shape")."""
        self.model, self.draft = model, draft
        self.drafted = draft.config.drafted if drafted is None else drafted
        if not 1 <= self.drafted <= draft.config.drafted:
            size = draft.config.block_size
            raise ValueError(f"drafted {self.drafted}: a block of {size} drafts 1 to {size - 1} tokens")
        self.device = next(model.parameters()).device
        self.embed = model.get_input_embeddings().weight
        self.head = model.lm_head.weight
        self.eos = {int(t) for t in eos_token_ids}
        self.label = f"dflash block {draft.config.block_size}, k {self.drafted}"

    def _tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, device=self.device)

    def _target(self, ids: list[int], start: int, cache, capture) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy choices after each of `ids` [T] and the draft's features of them [T, K*H]."""
        positions = self._tensor([range(start, start + len(ids))])
        out = self.model.model(input_ids=self._tensor([ids]), position_ids=positions, cache=cache, use_cache=True)
        return self.model.lm_head(out.last_hidden_state[0]).argmax(-1), capture.concat()[0]

    def _extend(self, caches: list[DraftCache], features, start: int) -> list:
        """Each layer's context keys and values with the new positions' appended (EAGLE-3's growing KV cache)."""
        positions = self._tensor([range(start, start + features.shape[0])])
        new = self.draft.context(features[None], positions)
        return [cache.append(k, v) for cache, (k, v) in zip(caches, new, strict=True)]

    def _draft(self, anchor: int, n: int, context) -> list[int]:
        """The block's drafts: the anchor at position n, `drafted` mask tokens after it."""
        size = 1 + self.drafted
        ids = self._tensor([[anchor] + [self.draft.config.mask_token_id] * (size - 1)])
        positions = self._tensor([range(n, n + size)])
        mask = block_mask(self._tensor([n]), n, size)[None]
        out = self.draft(F.embedding(ids, self.embed), positions, context, mask)
        return F.linear(out[0, 1:], self.head.to(out.dtype)).argmax(-1).tolist()

    @torch.inference_mode()
    def generate(self, prompt_ids, max_new_tokens: int) -> Generation:
        from transformers import DynamicCache

        prompt = [int(t) for t in prompt_ids]
        if not prompt or max_new_tokens < 1:
            raise ValueError("an empty prompt or max_new_tokens < 1")
        result = Generation(self.label, "dflash", len(prompt), [], "length", depth=self.drafted)
        cache = DynamicCache(config=self.model.config)
        start = clock(self.device)
        with AuxCapture(self.model, target_indices(self.draft)) as capture:
            choices, features = self._target(prompt, 0, cache, capture)
            anchor, n = int(choices[-1]), len(prompt)
            result.time_prefill = clock(self.device) - start
            done = emit(result, self.eos, [anchor], max_new_tokens)
            caches = [DraftCache() for _ in self.draft.layers]
            while not done:
                t = clock(self.device)
                context = self._extend(caches, features, n - features.shape[0])
                drafts = self._draft(anchor, n, context)
                t_mid = clock(self.device)
                result.time_draft += t_mid - t
                choices, block_features = self._target([anchor] + drafts, n, cache, capture)
                result.time_verify += clock(self.device) - t_mid
                result.verify_count += 1
                greedy = choices.tolist()
                accepted = 0
                while accepted < len(drafts) and drafts[accepted] == greedy[accepted]:
                    accepted += 1
                result.accepted.append(accepted)
                keep_cache_positions(cache, n, list(range(accepted + 1)))  # the anchor and the accepted drafts
                features = block_features[: accepted + 1]
                n += accepted + 1
                anchor = greedy[accepted]
                done = emit(result, self.eos, drafts[:accepted] + [anchor], max_new_tokens)
        result.time_total = clock(self.device) - start
        return result
