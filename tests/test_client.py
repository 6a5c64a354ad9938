"""eagle3lab.serving.client: the one HTTP client for SGLang / OpenAI-compatible servers, against recorded SGLang
payloads (an httpx MockTransport): model discovery, /generate vs the chat API, /server_info, accept length."""

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from eagle3lab.serving.client import AsyncServerClient, ServerClient, ServerError, accept_length, normalize_url

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def transport(routes: dict, seen: list | None = None) -> httpx.MockTransport:
    """path -> (status, JSON body or text); anything else is a 404."""

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append((request.method, request.url.path, json.loads(request.content) if request.content else None))
        status, body = routes.get(request.url.path, (404, {"detail": "Not Found"}))
        if isinstance(body, str):
            return httpx.Response(status, text=body)
        return httpx.Response(status, json=body)

    return httpx.MockTransport(handler)


def test_normalize_url_and_accept_length_semantics():
    assert normalize_url("127.0.0.1:30000/") == "http://127.0.0.1:30000"
    assert normalize_url("https://h:1") == "https://h:1"
    assert accept_length(64, 30) == pytest.approx(64 / 30)
    assert accept_length(64, 64) == 1.0  # speculating, nothing accepted
    assert accept_length(64, None) is None  # no spec_verify_ct: speculation is off, not 1.0
    assert accept_length(0, 0) is None


def test_generate_reads_meta_info_and_spec_verify_ct():
    seen = []
    routes = {"/generate": (200, fixture("generate_eagle3.json"))}
    with ServerClient("sglang:30000", transport=transport(routes, seen)) as client:
        done = client.generate(input_ids=[1, 2, 3], max_new_tokens=64)
        plain = ServerClient("x", transport=transport({"/generate": (200, fixture("generate_no_spec.json"))}))
        off = plain.generate(text="a", max_new_tokens=64)
    assert seen == [
        ("POST", "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0, "max_new_tokens": 64}})
    ]
    assert (done.api, done.completion_tokens, done.verify_ct) == ("generate", 64, 30)
    assert done.accept_length == pytest.approx(fixture("generate_eagle3.json")["meta_info"]["spec_accept_length"], 1e-3)
    assert off.verify_ct is None and off.accept_length is None and off.completion_tokens == 64


def test_no_generate_is_none_and_errors_name_the_url():
    with ServerClient("http://other:8000", transport=transport({})) as client:
        assert client.generate(text="a", max_new_tokens=8) is None  # not SGLang: the caller falls back to chat
    broken = {"/generate": (500, "CUDA out of memory")}
    with ServerClient("http://s:1", transport=transport(broken)) as client, pytest.raises(ServerError) as err:
        client.generate(text="a", max_new_tokens=8)
    assert "http://s:1/generate: HTTP 500: CUDA out of memory" in str(err.value) and err.value.status == 500
    no_meta = {"/generate": (200, {"text": "hi"})}
    with ServerClient("http://s:1", transport=transport(no_meta)) as client, pytest.raises(ServerError, match="meta"):
        client.generate(text="a", max_new_tokens=8)


def test_chat_discovers_the_model_once():
    seen = []
    routes = {
        "/v1/models": (200, {"object": "list", "data": [{"id": "org/target"}, {"id": "other"}]}),
        "/v1/chat/completions": (200, fixture("chat_completion_plain.json")),
    }
    with ServerClient("http://o:8000", transport=transport(routes, seen)) as client:
        first = client.chat([{"role": "user", "content": "hi"}], max_tokens=16)
        client.chat([{"role": "user", "content": "again"}], max_tokens=16)
    assert [path for _, path, _ in seen] == ["/v1/models", "/v1/chat/completions", "/v1/chat/completions"]
    body = seen[1][2]
    assert body["model"] == "org/target" and body["max_tokens"] == 16 and body["stream"] is False
    assert first.api == "chat" and first.completion_tokens == 64 and first.verify_ct is None
    assert first.text and first.finish_reason
    empty = {"/v1/models": (200, {"data": []})}
    with ServerClient("http://o:1", transport=transport(empty)) as client, pytest.raises(ServerError, match="no model"):
        client.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    given = []
    with ServerClient("http://o:1", model="m", transport=transport(routes, given)) as client:
        client.chat([{"role": "user", "content": "hi"}], max_tokens=4)
    assert [path for _, path, _ in given] == ["/v1/chat/completions"]


def test_server_info_old_path_and_absent():
    info = fixture("server_info_eagle3_fixed.json")
    with ServerClient("http://s", transport=transport({"/get_server_info": (200, info)})) as client:
        assert client.server_info() == (info, "/get_server_info")
    with ServerClient("http://s", transport=transport({})) as client:
        assert client.server_info() == (None, None)
        assert client.healthy() is False


def test_unreachable_server_raises_transport_errors():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    with ServerClient("http://down:1", transport=httpx.MockTransport(refuse)) as client:
        with pytest.raises(httpx.ConnectError):
            client.server_info()
        assert client.healthy() is False


def test_async_client_check_discover_and_chat():
    seen = []
    routes = {
        "/health": (200, {}),
        "/v1/models": (200, {"data": [{"id": "served"}]}),
        "/v1/chat/completions": (200, fixture("chat_completion_plain.json")),
    }

    async def go():
        async with AsyncServerClient("127.0.0.1:9", transport=transport(routes, seen)) as client:
            await client.check()
            return await client.chat([{"role": "user", "content": "hi"}], max_tokens=8, temperature=0.7)

    done = asyncio.run(go())
    assert [path for _, path, _ in seen] == ["/health", "/v1/models", "/v1/chat/completions"]
    assert seen[-1][2]["temperature"] == 0.7 and seen[-1][2]["model"] == "served"
    assert done.completion_tokens == 64 and done.accept_length is None

    async def overloaded():
        async with AsyncServerClient(
            "h:1", model="m", transport=transport({"/v1/chat/completions": (429, "busy")})
        ) as c:
            await c.chat([{"role": "user", "content": "hi"}], max_tokens=8)

    with pytest.raises(ServerError) as err:
        asyncio.run(overloaded())
    assert err.value.status == 429  # the caller decides to retry from the status
