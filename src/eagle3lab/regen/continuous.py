"""transformers' own continuous batching (paged KV cache; CUDA graphs and flash attention on GPUs) behind the same
submit/run interface as batching.BatchGenerator, so the local backend can use either.

The library runs its decode loop in a background thread; this class feeds it requests, waits for finished ones and
hands them to `on_finish`, which may submit the next turn of the conversation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from eagle3lab.regen.batching import PREFILL_TOKENS, TurnResult, eos_ids

PAGE_TOKENS = 256  # tokens per KV-cache page (the library's default)
POLL_S = 1.0  # how long one wait for a finished request lasts before checking that the library's thread still runs


class ContinuousError(RuntimeError):
    """The library's generation thread died or failed a request."""


class ContinuousGenerator:
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
        cache_tokens: int = 65536,
        step_tokens: int = PREFILL_TOKENS,
    ):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.max_new_tokens, self.temperature, self.seed = (
            batch_size,
            max_new_tokens,
            temperature,
            seed,
        )
        self.max_context = max_context or model.config.max_position_embeddings
        self.cache_tokens, self.step_tokens = cache_tokens, step_tokens
        self.eos = eos_ids(model, tokenizer)
        self._waiting: list[tuple[object, list[int]]] = []
        self._handles: dict[str, object] = {}
        self._ids = itertools.count()
        self._manager = None

    def submit(self, handle, prompt: list[int]) -> None:
        if self._manager is None:
            self._waiting.append((handle, list(prompt)))
            return
        request_id = f"r{next(self._ids)}"
        self._handles[request_id] = handle
        # the context bound of BatchGenerator: prompt + answer never exceed max_context
        budget = min(self.max_new_tokens, self.max_context - len(prompt))
        self._manager.add_request(list(prompt), request_id=request_id, max_new_tokens=budget)

    def _configs(self):
        from transformers import ContinuousBatchingConfig, GenerationConfig

        greedy = self.temperature <= 0
        generation = GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else self.temperature,
            top_k=None,
            top_p=None,
            eos_token_id=sorted(self.eos),
            pad_token_id=self.tokenizer.pad_token_id,
        )
        # The KV cache holds cache_tokens (the max_batch_tokens budget of BatchGenerator); left unset, the library sizes
        # it to 90% of free memory: the whole RAM of a CPU machine. Requests that do not fit wait for free pages.
        config = ContinuousBatchingConfig(
            page_size=PAGE_TOKENS,
            num_blocks=-(-self.cache_tokens // PAGE_TOKENS) + self.batch_size,  # + a partly used last page per row
            max_batch_tokens=self.step_tokens,
            max_requests_per_batch=self.batch_size,
            seed=self.seed,
        )
        return generation, config

    def run(self, on_finish: Callable[[object, TurnResult], None], on_tokens: Callable[[int], None] = lambda n: None):
        generation, config = self._configs()
        with self.model.continuous_batching_context_manager(
            generation_config=generation, continuous_batching_config=config
        ) as manager:
            self._manager = manager
            try:
                for handle, prompt in self._waiting:
                    self.submit(handle, prompt)
                self._waiting.clear()
                self._drain(manager, on_finish, on_tokens)
            finally:
                self._manager = None

    def _drain(self, manager, on_finish, on_tokens) -> None:
        while self._handles:
            out = manager.get_result(timeout=POLL_S)
            if out is None:
                if not manager.is_running():
                    raise ContinuousError("transformers' continuous batching thread stopped with requests pending")
                continue
            if not out.is_finished():
                continue
            if out.error:
                raise ContinuousError(f"transformers' continuous batching failed request {out.request_id}: {out.error}")
            handle = self._handles.pop(out.request_id)
            tokens = list(out.generated_tokens)
            on_tokens(len(tokens))
            on_finish(handle, self._result(tokens))

    def _result(self, tokens: list[int]) -> TurnResult:
        stopped = bool(tokens) and tokens[-1] in self.eos
        text = self.tokenizer.decode(tokens[:-1] if stopped else tokens, skip_special_tokens=True)
        return TurnResult(text, "stop" if stopped else "length", len(tokens), list(tokens))
