"""Benchmark a running server: every prompt greedy, `concurrency` requests in flight, through SGLang's native
`/generate` (accept length from `meta_info.spec_verify_ct`) or, for servers without it (e.g. `transformers serve`),
the OpenAI chat API. Rows are shaped like `eagle3lab.benchmark.run`'s, so both engines fit one table; `accept_length`
is SGLang's definition, completion_tokens / spec_verify_ct (bonus token included), as bench's `sglang_accept_length`.
"""

from __future__ import annotations

import collections
import platform
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from eagle3lab.engines.sglang.launch import parse_config
from eagle3lab.io import InputError
from eagle3lab.serving.client import Completion, ServerClient, ServerError, accept_length


@dataclass
class _Prompt:
    id: str
    set: str
    messages: list[dict] | None = None
    text: str | None = None
    input_ids: list[int] | None = None


def _as_prompt(p, i: int, default_set: str) -> _Prompt:
    """A str (one user message), a dict (id, set, and messages / prompt / text / input_ids) or a bench.Prompt."""
    if isinstance(p, str):
        return _Prompt(str(i), default_set, messages=[{"role": "user", "content": p}])
    if not isinstance(p, dict):  # bench.Prompt: chat-templated ids for /generate, messages for the chat API
        return _Prompt(str(p.id), p.set, messages=p.messages, input_ids=list(p.ids))
    where = f"prompt {i}"
    messages = p.get("messages") or ([{"role": "user", "content": p["prompt"]}] if "prompt" in p else None)
    prompt = _Prompt(str(p.get("id", i)), p.get("set", default_set), messages, p.get("text"), p.get("input_ids"))
    if prompt.messages is None and prompt.text is None and prompt.input_ids is None:
        raise InputError(f"{where}: needs one of 'messages', 'prompt', 'text', 'input_ids'")
    return prompt


@dataclass
class _Result:
    prompt: _Prompt
    completion: Completion


@dataclass
class _Runner:
    """Sends prompts through one ServerClient: /generate when the server has it (chat messages are templated with
    the tokenizer), else the chat API; the first answer fixes which."""

    client: ServerClient
    max_new_tokens: int
    api: str | None = None  # "generate" or "chat"
    tokenizer: object = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, prompt: _Prompt) -> _Result:
        with self._lock:
            api = self.api
        done = self._generate(prompt, probing=api is None) if api in (None, "generate") else None
        if done is None:
            if prompt.messages is None:
                raise InputError(f"prompt {prompt.id}: the chat API needs messages (this server has no /generate)")
            done = self.client.chat(prompt.messages, max_tokens=self.max_new_tokens)
            if done.completion_tokens is None:
                raise ServerError(f"{self.client.url}/v1/chat/completions: no usage.completion_tokens in the answer")
        with self._lock:
            self.api = done.api
        return _Result(prompt, done)

    def _generate(self, prompt: _Prompt, probing: bool) -> Completion | None:
        text = prompt.text
        if prompt.input_ids is None and text is None:
            if self.tokenizer is None:
                if probing:  # chat messages and no tokenizer: only the chat API can template them
                    return None
                raise InputError(f"prompt {prompt.id}: chat messages for /generate need a tokenizer")
            # /generate takes raw text: apply the chat template here
            text = self.tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
        done = self.client.generate(text=text, input_ids=prompt.input_ids, max_new_tokens=self.max_new_tokens)
        if done is None and not probing:
            raise ServerError(f"{self.client.url}/generate: gone (HTTP 404/405) after answering before")
        return done


def _row(set_name: str, system: str, config: str, draft, results: list[_Result], wall: float) -> dict:
    done = [r.completion for r in results]
    tokens = sum(c.completion_tokens for c in done)
    seconds = sum(c.seconds for c in done)
    # no spec_verify_ct means the server did not speculate: that is "no accept length", not 1.0
    speculative = bool(done) and all(c.verify_ct is not None for c in done)
    verify_count = sum(c.verify_ct for c in done) if speculative else None
    accept = accept_length(tokens, verify_count)
    return {
        "set": set_name,
        "system": system,
        "config": config,
        "draft": draft,
        "mode": "sglang",
        "prompts": len(results),
        "completion_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,  # per request, as bench.py's batch-1 rows
        "throughput_tok_s": tokens / wall if wall > 0 else 0.0,  # all concurrent requests together
        "accept_length": accept,
        "sglang_accept_length": accept,
        "verify_count": verify_count,
        "speedup_vs_baseline": None,
        "speedup_vs_hf_generate": None,
        "identical_rate": None,
        "divergences": [],
        "position_acceptance": [],
        "time_split": None,
        "api": done[0].api if done else None,
    }


def bench_server(
    url: str,
    prompts,
    max_new_tokens: int,
    concurrency: int = 1,
    *,
    system: str = "sglang",
    config: str | None = None,
    draft: str | None = None,
    model: str | None = None,
    tokenizer=None,
    default_set: str = "prompts",
    timeout: float = 600.0,
    transport=None,
) -> dict:
    """Send every prompt (greedy, `max_new_tokens`) with `concurrency` requests in flight; returns
    {"meta", "rows", "per_prompt"} like `bench.run_benchmark`, one row per prompt set."""
    if max_new_tokens < 1 or concurrency < 1:
        raise InputError("max_new_tokens and concurrency must be >= 1")
    items = [_as_prompt(p, i, default_set) for i, p in enumerate(prompts)]
    if not items:
        raise InputError("no prompts to send")
    config = config or f"{concurrency},0,0,0"
    with ServerClient(url, timeout=timeout, model=model, transport=transport) as client:
        runner = _Runner(client, max_new_tokens, tokenizer=tokenizer)
        results, walls = [], collections.defaultdict(float)
        by_set = collections.defaultdict(list)
        for p in items:
            by_set[p.set].append(p)
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for set_name, group in by_set.items():
                t0 = time.perf_counter()
                # the very first request goes alone: it settles which API the server speaks
                first = [runner.run(group[0])] if runner.api is None else []
                results += first + list(pool.map(runner.run, group[len(first) :]))
                walls[set_name] = time.perf_counter() - t0
    rows = [_row(s, system, config, draft, [r for r in results if r.prompt.set == s], walls[s]) for s in by_set]
    meta = {
        "url": client.url,
        "api": runner.api,
        "model": client.model,
        "max_new_tokens": max_new_tokens,
        "concurrency": concurrency,
        "prompts": len(items),
        "sets": list(by_set),
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return {"meta": meta, "rows": rows, "per_prompt": [_per_prompt(r, system, config) for r in results]}


def _per_prompt(result: _Result, system: str, config: str) -> dict:
    done = result.completion
    return {
        "set": result.prompt.set,
        "id": result.prompt.id,
        "system": system,
        "config": config,
        "completion_tokens": done.completion_tokens,
        "seconds": done.seconds,
        "tokens_per_s": done.completion_tokens / done.seconds if done.seconds > 0 else 0.0,
        "spec_verify_ct": done.verify_ct,
        "accept_length": done.accept_length,
        "text": done.text,
    }


def add_speedups(rows: list[dict]) -> list[dict]:
    """Fill speedup_vs_baseline from the no-draft row (steps 0) of the same set and batch size (in place)."""

    def key(r):
        bs, steps, *_ = parse_config(r["config"])
        return r["set"], bs, steps == 0

    base = {key(r)[:2]: r["tokens_per_s"] for r in rows if key(r)[2]}
    for r in rows:
        b = base.get(key(r)[:2])
        r["speedup_vs_baseline"] = r["tokens_per_s"] / b if b else None
    return rows
