"""Continuous batching for a HF causal LM on one device: the local backend's decode loop on the CPU (`engine: auto`;
transformers' paged continuous batching, regen/continuous.py, ran at half its speed there: see regen/local.py).

Measured alternatives that did not pay off here (`eagle3lab regen bench`, 64 ShareGPT prompts, batch 32, bf16): a
preallocated KV cache written in place plus a grouped one-token attention ran at 204-208 tok/s against 218-225 tok/s
for this plain version; strided cache views cost as many copies as the concatenation they replaced.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from eagle3lab.devices import seeded_generator

PREFILL_TOKENS = 4096  # padded prompt tokens per prefill forward: bounds the activation memory of a prefill


@dataclass
class TurnResult:
    text: str
    finish_reason: str  # "stop" (end of turn) or "length" (max new tokens or the context)
    new_tokens: int
    token_ids: list[int] = field(default_factory=list)  # the generated ids, the stop token included (local engine)


def eos_ids(model, tokenizer) -> set[int]:
    """Every token that ends an answer: the tokenizer's and generation config's EOS and ChatML's <|im_end|>."""
    ids = set()
    for value in (
        tokenizer.eos_token_id,
        getattr(model.generation_config, "eos_token_id", None),
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
    ):
        if isinstance(value, int) and value != tokenizer.unk_token_id:
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    return ids


@dataclass(order=True)
class _Request:
    sort_key: tuple
    handle: object = field(compare=False)
    prompt: array = field(compare=False)


@dataclass
class _Row:
    handle: object
    prompt_len: int
    generated: list[int]


class BatchGenerator:
    """Continuous batching for a HF causal LM on one device.

    Rows share one left-padded KV cache. A row that stops (EOS, max new tokens, context) leaves the batch at once;
    waiting requests (longest prompt first, so rows admitted together have similar lengths and little padding) are
    prefilled in groups and merged into the running cache when a quarter of the slots are free, so finished rows never
    cost a forward pass. `on_finish(handle, TurnResult)` may `submit` a follow-up request (the next turn).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 32,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        max_context: int | None = None,
        seed: int = 0,
        max_batch_tokens: int = 65536,
        prefill_tokens: int = PREFILL_TOKENS,
        refill_fraction: float = 0.25,
    ):
        import torch

        self.torch, self.model, self.tokenizer = torch, model, tokenizer
        self.batch_size, self.max_new_tokens, self.temperature = batch_size, max_new_tokens, temperature
        self.max_context = max_context or model.config.max_position_embeddings
        self.max_batch_tokens, self.prefill_tokens = max_batch_tokens, prefill_tokens
        self.refill_at = max(1, int(batch_size * refill_fraction))
        self.device = next(model.parameters()).device
        self.generator = seeded_generator(self.device, seed)
        self.eos = eos_ids(model, tokenizer)
        self._queue: list[_Request] = []
        self._counter = itertools.count()
        self.rows: list[_Row] = []
        self.cache = self.mask = self.pos = self.last = None

    def submit(self, handle, prompt: list[int]) -> None:
        # int32 arrays: a whole dataset of waiting prompts costs 4 bytes a token, not a Python int each
        heapq.heappush(self._queue, _Request((-len(prompt), next(self._counter)), handle, array("i", prompt)))

    def run(self, on_finish: Callable[[object, TurnResult], None], on_tokens: Callable[[int], None] = lambda n: None):
        with self.torch.inference_mode():
            while self._queue or self.rows:
                free = self.batch_size - len(self.rows)
                if self._queue and (not self.rows or free >= min(self.refill_at, len(self._queue))):
                    on_tokens(self._admit(free))
                else:
                    on_tokens(self._step())
                self._retire(on_finish)

    # -- internals --

    def _sample(self, logits):
        torch = self.torch
        if self.temperature <= 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def _forward(self, input_ids, mask, pos, cache):
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1
        )
        return out.logits[:, -1], out.cache

    def _admit(self, free: int) -> int:
        """Pop waiting requests that fit the slot and token budgets, prefill them in groups, merge into the batch;
        return the number of rows admitted (each has its first token)."""
        taken: list[_Request] = []
        width = self.mask.shape[1] if self.mask is not None else 0
        while self._queue and len(taken) < free:
            nxt = self._queue[0]
            new_width = max(width, len(nxt.prompt))
            if (self.rows or taken) and (len(self.rows) + len(taken) + 1) * new_width > self.max_batch_tokens:
                break
            taken.append(heapq.heappop(self._queue))
            width = new_width
        group: list[_Request] = []
        for req in taken:  # already longest-first; cut into prefill groups of bounded padded size
            if group and (len(group) + 1) * len(group[0].prompt) > self.prefill_tokens:
                self._prefill(group)
                group = []
            group.append(req)
        if group:
            self._prefill(group)
        return len(taken)

    def _prefill(self, group: list[_Request]) -> None:
        torch = self.torch
        width = max(len(r.prompt) for r in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for i, r in enumerate(group):
            ids[i, width - len(r.prompt) :] = torch.frombuffer(r.prompt, dtype=torch.int32)
            mask[i, width - len(r.prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, mask, pos, None)
        first = self._sample(logits)
        rows = [_Row(r.handle, len(r.prompt), [int(t)]) for r, t in zip(group, first.tolist())]
        self._merge(rows, cache, mask, pos[:, -1] + 1, first)

    def _merge(self, rows, cache, mask, pos, last) -> None:
        torch = self.torch
        if self.cache is None:
            self.rows, self.cache, self.mask, self.pos, self.last = rows, cache, mask, pos, last
            return
        width = max(self.mask.shape[1], mask.shape[1])

        def pad(t, dim):  # left-pad along `dim` to `width`
            missing = width - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([pad(mine.keys, 2), pad(theirs.keys, 2)], dim=0)
            mine.values = torch.cat([pad(mine.values, 2), pad(theirs.values, 2)], dim=0)
        self.mask = torch.cat([pad(self.mask, 1), pad(mask, 1)], dim=0)
        self.pos = torch.cat([self.pos, pos])
        self.last = torch.cat([self.last, last])
        self.rows += rows

    def _step(self) -> int:
        torch = self.torch
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], dim=1)
        logits, self.cache = self._forward(self.last[:, None], self.mask, self.pos[:, None], self.cache)
        self.last = self._sample(logits)
        self.pos = self.pos + 1
        for row, t in zip(self.rows, self.last.tolist()):
            row.generated.append(int(t))
        return len(self.rows)

    def _finish_reason(self, row: _Row) -> str | None:
        if row.generated[-1] in self.eos:
            return "stop"
        if len(row.generated) >= self.max_new_tokens or row.prompt_len + len(row.generated) >= self.max_context:
            return "length"
        return None

    def _retire(self, on_finish) -> None:
        reasons = [self._finish_reason(r) for r in self.rows]
        if not any(reasons):
            return
        keep = [i for i, reason in enumerate(reasons) if reason is None]
        finished = [(self.rows[i], reasons[i]) for i in range(len(self.rows)) if reasons[i]]
        if keep:
            torch = self.torch
            index = torch.tensor(keep, device=self.device)
            mask = self.mask[index]
            start = int(mask.any(0).nonzero()[0])  # drop columns that are padding for every remaining row
            for layer in self.cache.layers:
                layer.keys = layer.keys[index, :, start:]
                layer.values = layer.values[index, :, start:]
            self.mask, self.pos, self.last = mask[:, start:], self.pos[index], self.last[index]
            self.rows = [self.rows[i] for i in keep]
        else:
            self.rows, self.cache, self.mask, self.pos, self.last = [], None, None, None, None
        for row, reason in finished:
            ids = row.generated[:-1] if reason == "stop" else row.generated
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            on_finish(row.handle, TurnResult(text, reason, len(row.generated), row.generated))
