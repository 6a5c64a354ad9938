"""The openai backend: async HTTP (eagle3lab.serving.client) to one or several OpenAI-compatible servers (SGLang, vLLM,
`transformers serve`), least-loaded choice among healthy servers, bounded concurrency, retries with backoff. The chat
API applies the served model's own chat template, so the prompts are those the local backend builds (greedy fp32
vLLM answers matched the local engine's, checked by hand)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from eagle3lab.regen.batching import TurnResult
from eagle3lab.regen.conversation import Conversation
from eagle3lab.regen.errors import NoServerError, RegenError
from eagle3lab.regen.files import RunFiles
from eagle3lab.regen.inputs import Job, PromptLength
from eagle3lab.regen.progress import Progress
from eagle3lab.serving.client import AsyncServerClient, ServerError, json_object, normalize_url


@dataclass
class _Server:
    url: str
    inflight: int = 0
    down_until: float = 0.0


class ServerPool:
    """Least-loaded choice among servers that are not cooling down after a connection failure (data parallel)."""

    def __init__(self, addresses: list[str], cooldown: float = 5.0):
        if not addresses:
            raise RegenError("the openai backend needs at least one --server-address HOST:PORT")
        self.servers = [_Server(normalize_url(a)) for a in addresses]
        self.cooldown = cooldown
        self._rr = itertools.count()

    def pick(self) -> _Server:
        now = time.monotonic()
        healthy = [s for s in self.servers if s.down_until <= now] or self.servers
        turn = next(self._rr)
        return min(healthy, key=lambda s: (s.inflight, (self.servers.index(s) - turn) % len(self.servers)))

    def mark_down(self, server: _Server) -> None:
        server.down_until = time.monotonic() + self.cooldown


class RequestFailed(Exception):
    pass


class OpenAIClient:
    """Chat requests spread over a ServerPool through eagle3lab.serving.client (one AsyncServerClient per server),
    retried with exponential backoff on connection failures, timeouts, 408, 429 and 5xx."""

    def __init__(
        self,
        addresses: list[str],
        *,
        model: str | None,
        timeout: float = 600.0,
        retries: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
    ):
        self.pool = ServerPool(addresses)
        self.model, self.timeout, self.retries = model, timeout, retries
        self.backoff, self.max_backoff = backoff, max_backoff
        self.clients: dict[str, AsyncServerClient] = {}  # one per server and event loop: opened by `async with`
        self._stack: contextlib.AsyncExitStack | None = None

    async def __aenter__(self):
        self._stack = contextlib.AsyncExitStack()
        for server in self.pool.servers:
            client = AsyncServerClient(server.url, timeout=self.timeout, model=self.model)
            self.clients[server.url] = await self._stack.enter_async_context(client)
        return self

    async def __aexit__(self, *exc):
        await self._stack.aclose()
        self.clients, self._stack = {}, None

    async def check(self) -> tuple[str, int | None]:
        """Fail fast, with a clear message, when no server answers; return the model name to request and the
        context the servers serve it with (None when they do not say)."""
        async with self:
            model = await self._check()
            return model, await self._served_context()

    async def _check(self) -> str:
        up, problems = [], []
        for server in self.pool.servers:
            try:
                await self.clients[server.url].check()
                up.append(server)
            except httpx.HTTPError as e:
                problems.append(f"{server.url} ({type(e).__name__}: {e})")
                self.pool.mark_down(server)
        if not up:
            raise NoServerError(
                "no regeneration server is reachable: " + "; ".join(problems) + ". Start one first, e.g. "
                "`transformers serve MODEL_DIR --port PORT`, `python -m vllm.entrypoints.openai.api_server --model "
                "MODEL_DIR --port PORT` or `python -m sglang.launch_server --model-path MODEL --port PORT`, then pass "
                "--server-address HOST:PORT"
            )
        if self.model is None:
            try:
                self.model = await self.clients[up[0].url].discover_model()
            except ServerError as e:
                raise RegenError(f"{e} (or pass --model NAME)") from None
        return self.model

    async def _served_context(self) -> int | None:
        """The smallest `max_model_len` the servers list for the model in /v1/models (vLLM and SGLang do;
        `transformers serve` does not); servers found down by the check are left to the run's retries."""
        found = []
        for server in self.pool.servers:
            if server.down_until > time.monotonic():
                continue
            try:
                response = await self.clients[server.url].http.get("/v1/models", timeout=10.0)
                cards = json_object(response).get("data") or []
            except (httpx.HTTPError, ServerError):
                continue
            found += [
                c["max_model_len"]
                for c in cards
                if isinstance(c, dict) and c.get("id") == self.model and isinstance(c.get("max_model_len"), int)
            ]
        return min(found, default=None)

    async def complete(
        self, messages: list[dict], max_tokens: int, temperature: float, sampling: dict | None = None
    ) -> TurnResult:
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            server = self.pool.pick()
            server.inflight += 1
            try:
                done = await self.clients[server.url].chat(
                    messages, max_tokens=max_tokens, temperature=temperature, sampling=sampling
                )
            except httpx.TransportError as e:  # connection refused/reset, timeouts: retry elsewhere
                self.pool.mark_down(server)
                last = f"{server.url}: {type(e).__name__}: {e}"
                continue
            except ServerError as e:
                if e.status is None or (e.status not in (408, 429) and e.status < 500):
                    raise RequestFailed(str(e)) from None  # the request or the answer is wrong: retrying won't help
                last = str(e)
                continue
            finally:
                server.inflight -= 1
            return TurnResult(done.text, done.finish_reason, done.completion_tokens or 0)
        raise RequestFailed(f"gave up after {self.retries + 1} attempts; last: {last}")


SEED_RANGE = 2**31 - 1  # request seeds in [0, INT32_MAX): every server reads those (llama-server: -1 is random)


def sampling_fields(temperature: float, seed: int, key: str, turn: int) -> dict:
    """What a sampled request states beyond its temperature: the whole distribution (top_p 1 overrides a server
    default from the model's generation_config: vLLM, SGLang, llama-server's GGUF metadata) and a seed of its own,
    from the run's seed, the conversation and the turn, so a rerun asks for the same draws whatever the order the
    requests run in, and no two requests share one stream of draws. Greedy requests state nothing more."""
    if temperature <= 0:
        return {}
    digest = hashlib.sha256(f"{seed}:{key}:{turn}".encode()).digest()
    return {"top_p": 1.0, "seed": int.from_bytes(digest[:8], "big") % SEED_RANGE}


async def run_openai(
    jobs: list[Job],
    client: OpenAIClient,
    lengths: PromptLength,
    *,
    concurrency: int,
    temperature: float,
    seed: int,
    generation: dict,
    files: RunFiles,
    progress: Progress,
    max_consecutive_errors: int,
    alive: Callable[[], bool] = lambda: True,
) -> bool:
    """Returns False when the run was aborted because too many records in a row failed (servers gone). `alive`: False
    once the server is known gone (its process exited), so no further job starts only to fail its retries."""
    pending = iter(jobs)
    state = {"consecutive": 0, "aborted": False}

    async def one(job: Job) -> None:
        conv = Conversation(job)
        try:
            while conv.next_user() is not None:
                messages = conv.prompt_messages()
                if not lengths.fits(len(lengths.ids(messages))):
                    conv.history.pop()
                    break
                sampling = sampling_fields(temperature, seed, job.key, len(conv.turns))
                result = await client.complete(messages, lengths.max_new_tokens, temperature, sampling)
                conv.add(result)
                progress.add_tokens(result.new_tokens)
        except RequestFailed as e:
            files.write_error(
                {"id": job.key, "source_id": job.source_id, "line": job.line, "turn": len(conv.turns), "error": str(e)}
            )
            progress.record("error")
            state["consecutive"] += 1
            if state["consecutive"] >= max_consecutive_errors:
                state["aborted"] = True
            return
        state["consecutive"] = 0
        files.write_ok(conv.output(generation))
        progress.record("ok")

    async def worker() -> None:
        for job in pending:  # a shared iterator: each job goes to exactly one worker
            if state["aborted"] or not alive():
                return
            await one(job)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return not state["aborted"]
