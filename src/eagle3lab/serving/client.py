"""The one HTTP client for OpenAI-compatible and SGLang servers (SGLang, vLLM, `transformers serve`): model discovery
through /v1/models, SGLang's native /generate with the OpenAI chat API as the fallback, /server_info, and the
per-request meta_info that carries speculation counts.

Accept length follows SGLang (REFERENCE.md): completion_tokens / spec_verify_ct, bonus token included. A response
without spec_verify_ct means the server does not speculate: that is "no accept length" (None), never 1.0.

`ServerClient` is synchronous (doctor, SGLang benchmark, server start-up); `AsyncServerClient` is its asyncio twin
for many requests in flight (regeneration). Both build requests and read answers through the same functions below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from eagle3lab.io import RunFailed

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")  # SGLang's name, then the one older releases use


class ServerError(RunFailed):
    """A server answered wrongly (HTTP status, not JSON, missing fields), or its process failed; the message says
    which URL and shows the answer. `status` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def normalize_url(address: str) -> str:
    """`host:port` or a URL -> `http://host:port` without a trailing slash."""
    address = address.rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def accept_length(completion_tokens: int | None, verify_ct: int | None) -> float | None:
    """Tokens per verify step, bonus included; None when the server reported no verify steps (not speculating)."""
    return completion_tokens / verify_ct if completion_tokens is not None and verify_ct else None


@dataclass
class Completion:
    """One answer, from /generate or /v1/chat/completions."""

    text: str
    completion_tokens: int | None  # None: the server did not say
    verify_ct: int | None  # meta_info.spec_verify_ct; None: the server does not speculate
    finish_reason: str
    api: str  # "generate" or "chat"
    meta: dict | None  # SGLang's meta_info, when the server sends it
    seconds: float = 0.0
    token_ids: list[int] | None = None  # the generated ids, from servers that return them (vLLM's completions)

    @property
    def accept_length(self) -> float | None:
        return accept_length(self.completion_tokens, self.verify_ct)


# ---- requests and answers: shared by both clients ---------------------------------------------------------------


def generate_body(text: str | None, input_ids: list[int] | None, max_new_tokens: int, temperature: float) -> dict:
    body: dict[str, Any] = {"sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens}}
    if input_ids is not None:
        body["input_ids"] = list(input_ids)
    elif text is not None:
        body["text"] = text
    else:
        raise ValueError("/generate needs text or input_ids")
    return body


def chat_body(
    model: str, messages: list[dict], max_tokens: int, temperature: float, sampling: dict | None = None
) -> dict:
    """`sampling`: further OpenAI sampling fields (top_p, seed) a sampled request states rather than leave to the
    server's defaults."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature, "stream": False}
    return body | (sampling or {})


def json_object(response: httpx.Response) -> dict:
    """The JSON object of a 200 answer, else ServerError naming the URL, the status and the start of the body."""
    where = response.request.url
    if response.status_code != 200:
        raise ServerError(f"{where}: HTTP {response.status_code}: {response.text[:300]}", response.status_code)
    try:
        body = response.json()
    except ValueError:
        raise ServerError(f"{where}: not JSON: {response.text[:300]}") from None
    if isinstance(body, list) and body and isinstance(body[0], dict):  # /generate answers a batch with a list
        body = body[0]
    if not isinstance(body, dict):
        raise ServerError(f"{where}: expected a JSON object, got {type(body).__name__}")
    return body


def _int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _finish(reason) -> str:
    """SGLang spells finish_reason {"type": "length", ...}; OpenAI servers a plain string."""
    return str(reason.get("type") if isinstance(reason, dict) else reason or "stop")


def read_generate(body: dict, where: str) -> Completion:
    meta = body.get("meta_info")
    if not isinstance(meta, dict) or _int_or_none(meta.get("completion_tokens")) is None:
        raise ServerError(f"{where}: no meta_info.completion_tokens in {str(body)[:200]}")
    return Completion(
        text=body.get("text") or "",
        completion_tokens=int(meta["completion_tokens"]),
        verify_ct=_int_or_none(meta.get("spec_verify_ct")),
        finish_reason=_finish(meta.get("finish_reason")),
        api="generate",
        meta=meta,
    )


def read_chat(body: dict, where: str) -> Completion:
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"] or ""
    except (KeyError, IndexError, TypeError) as e:
        raise ServerError(f"{where}: unexpected response (no {e}): {str(body)[:200]}") from None
    # SGLang may attach its meta_info to OpenAI answers; without it speculation cannot be measured here
    meta = body.get("meta_info") or choice.get("meta_info")
    meta = meta if isinstance(meta, dict) else None
    return Completion(
        text=text,
        completion_tokens=_int_or_none((body.get("usage") or {}).get("completion_tokens")),
        verify_ct=_int_or_none(meta.get("spec_verify_ct")) if meta else None,
        finish_reason=_finish(choice.get("finish_reason")),
        api="chat",
        meta=meta,
    )


def read_completion(body: dict, where: str) -> Completion:
    """A /v1/completions answer; vLLM adds the generated `token_ids` when asked (`return_token_ids`)."""
    try:
        choice = body["choices"][0]
        text = choice["text"] or ""
    except (KeyError, IndexError, TypeError) as e:
        raise ServerError(f"{where}: unexpected response (no {e}): {str(body)[:200]}") from None
    ids = choice.get("token_ids")
    return Completion(
        text=text,
        completion_tokens=_int_or_none((body.get("usage") or {}).get("completion_tokens")),
        verify_ct=None,
        finish_reason=_finish(choice.get("finish_reason")),
        api="completions",
        meta=None,
        token_ids=[int(t) for t in ids] if isinstance(ids, list) else None,
    )


def first_model(body: dict, where: str) -> str:
    """The first model id of a /v1/models answer."""
    models = body.get("data") or []
    if not models or not isinstance(models[0], dict) or not models[0].get("id"):
        raise ServerError(f"{where} lists no model: pass the model name")
    return str(models[0]["id"])


def _timeout(timeout: float, connect: float) -> httpx.Timeout:
    return httpx.Timeout(timeout, connect=min(timeout, connect))


# ---- the clients -------------------------------------------------------------------------------------------------


class ServerClient:
    """One server, synchronous; safe to share between threads (httpx.Client is)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        model: str | None = None,
        transport=None,
    ):
        self.url = normalize_url(url)
        self.model = model
        self.http = httpx.Client(base_url=self.url, timeout=_timeout(timeout, connect_timeout), transport=transport)

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def healthy(self, timeout: float = 5.0) -> bool:
        try:
            return self.http.get("/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def server_info(self) -> tuple[dict | None, str | None]:
        """SGLang's server args and state, and the path that answered; (None, None) from servers without it.
        Transport errors (an unreachable server) propagate as httpx.HTTPError."""
        for path in SERVER_INFO_PATHS:
            response = self.http.get(path)
            try:
                return json_object(response), path
            except ServerError:
                continue
        return None, None

    def discover_model(self) -> str:
        """The model to name in chat requests: the one given, else the first of /v1/models."""
        if self.model is None:
            self.model = first_model(json_object(self.http.get("/v1/models")), f"{self.url}/v1/models")
        return self.model

    def generate(
        self, *, text: str | None = None, input_ids: list[int] | None = None, max_new_tokens: int, temperature=0.0
    ) -> Completion | None:
        """POST /generate (SGLang's native API, with meta_info); None when the server has no /generate."""
        t0 = time.perf_counter()
        response = self.http.post("/generate", json=generate_body(text, input_ids, max_new_tokens, temperature))
        seconds = time.perf_counter() - t0
        if response.status_code in (404, 405):
            return None
        completion = read_generate(json_object(response), f"{self.url}/generate")
        completion.seconds = seconds
        return completion

    def timed_post(self, path: str, body: dict, read) -> Completion:
        """POST `body` to `path`; the answer read by `read(json, where)`, with the request's wall time."""
        t0 = time.perf_counter()
        response = self.http.post(path, json=body)
        seconds = time.perf_counter() - t0
        completion = read(json_object(response), f"{self.url}{path}")
        completion.seconds = seconds
        return completion

    def chat(self, messages: list[dict], *, max_tokens: int, temperature: float = 0.0) -> Completion:
        body = chat_body(self.discover_model(), messages, max_tokens, temperature)
        return self.timed_post("/v1/chat/completions", body, read_chat)

    def complete(self, input_ids: list[int], *, max_tokens: int, temperature: float = 0.0) -> Completion:
        """POST /v1/completions with the prompt as token ids (exactly the ids another engine is given), asking for
        the generated ids back (vLLM's `return_token_ids`; servers without it leave `token_ids` None)."""
        body = {
            "model": self.discover_model(),
            "prompt": list(input_ids),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "return_token_ids": True,
        }
        return self.timed_post("/v1/completions", body, read_completion)

    def metrics(self) -> str:
        """GET /metrics: the server's Prometheus text (vLLM's speculation counters live there)."""
        response = self.http.get("/metrics")
        if response.status_code != 200:
            raise ServerError(f"{self.url}/metrics: HTTP {response.status_code}", response.status_code)
        return response.text


class AsyncServerClient:
    """One server, for asyncio: open with `async with` (an httpx client belongs to one event loop)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        model: str | None = None,
        transport=None,
    ):
        self.url = normalize_url(url)
        self.model = model
        self._settings = dict(base_url=self.url, timeout=_timeout(timeout, connect_timeout), transport=transport)
        self.http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> AsyncServerClient:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # concurrency is the caller's
        self.http = httpx.AsyncClient(limits=limits, **self._settings)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.http.aclose()
        self.http = None

    async def check(self, timeout: float = 5.0) -> None:
        """Raise httpx.HTTPError unless GET /health (or, for servers without it, /v1/models) answers 200."""
        response = await self.http.get("/health", timeout=timeout)
        if response.status_code != 200:
            response = await self.http.get("/v1/models", timeout=timeout)
        response.raise_for_status()

    async def discover_model(self) -> str:
        if self.model is None:
            response = await self.http.get("/v1/models", timeout=10.0)
            self.model = first_model(json_object(response), f"{self.url}/v1/models")
        return self.model

    async def chat(
        self, messages: list[dict], *, max_tokens: int, temperature: float = 0.0, sampling: dict | None = None
    ) -> Completion:
        """One chat request. httpx.TransportError (refused, reset, timed out) and ServerError (with .status) tell
        the caller whether to retry."""
        body = chat_body(await self.discover_model(), messages, max_tokens, temperature, sampling)
        t0 = time.perf_counter()
        response = await self.http.post("/v1/chat/completions", json=body)
        seconds = time.perf_counter() - t0
        completion = read_chat(json_object(response), f"{self.url}/v1/chat/completions")
        completion.seconds = seconds
        return completion
