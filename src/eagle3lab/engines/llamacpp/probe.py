"""A running llama-server for the doctor: /props and /slots, greedy /completion probes whose timings count the
accepted draft tokens, /metrics (only with --metrics) for the drafting rounds."""

from __future__ import annotations

import httpx

from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.probe import PROBE_PROMPTS, counters_text, judge_accept_length, probes_failed
from eagle3lab.engines.llamacpp.launch_line import LLAMACPP
from eagle3lab.engines.llamacpp.server import LlamaCpp
from eagle3lab.serving.client import Completion, ServerClient, ServerError, json_object

ENGINE = LlamaCpp()  # its completion request and its counters


def server_props(client: ServerClient) -> dict | None:
    """llama-server's /props (its build, model and endpoints); None from a server that is not llama.cpp's."""
    try:
        props = json_object(client.http.get("/props"))
    except (httpx.HTTPError, ServerError):
        return None
    return props if "build_info" in props else None


def _slots_speculative(client: ServerClient) -> bool | None:
    """Whether the first slot speculates (/slots); None when the server was started with --no-slots."""
    try:
        return bool(json_object(client.http.get("/slots")).get("speculative"))
    except (httpx.HTTPError, ServerError):
        return None


def _prompt_ids(client: ServerClient, prompt: str) -> list[int]:
    """The prompt in the server's own chat template and tokenizer (the doctor needs neither)."""
    messages = [{"role": "user", "content": prompt}]
    text = json_object(client.http.post("/apply-template", json={"messages": messages}))["prompt"]
    return json_object(client.http.post("/tokenize", json={"content": text}))["tokens"]


def _send_probes(client: ServerClient, probes: int, probe_tokens: int) -> tuple[list[Completion], list[str]]:
    done, errors = [], []
    for prompt in (PROBE_PROMPTS * probes)[:probes]:
        try:
            done.append(ENGINE.complete(client, _prompt_ids(client, prompt), probe_tokens))
        except (httpx.HTTPError, ServerError) as e:
            errors.append(f"{e.__class__.__name__}: {e}")
    return done, errors


def _speculation_off(ev: list[str], why: str, expect_speculation: bool) -> Finding:
    return Finding(
        "speculation",
        ERROR if expect_speculation else WARNING,
        f"speculation is off on the llama.cpp server: {why}",
        ev
        + [
            "llama-server speculates only with a draft (-md) and a --spec-type that uses it: with -md and no "
            "--spec-type it loads an EAGLE-3 draft and never drafts"
        ],
        fix=LLAMACPP.speculation_fix if expect_speculation else None,
    )


def check_server(client: ServerClient, launch, settings) -> tuple[list[Finding], None] | None:
    """llama.cpp's findings; None: not a llama.cpp server (no /props with a build)."""
    props = server_props(client)
    return None if props is None else (_check_props(client, props, launch, settings), None)


def _check_props(client, props, launch, settings) -> list[Finding]:
    """llama.cpp: speculation on or off from /slots, and the accept length over greedy probes, as tokens per target
    step (rounds where p-min stops the draft count too), from the responses' timings; /metrics adds the rounds."""
    expect_speculation, probes, probe_tokens = settings.expect_speculation, settings.probes, settings.probe_tokens
    ev = [
        f"GET /props: model {props.get('model_path')}, n_ctx "
        f"{(props.get('default_generation_settings') or {}).get('n_ctx')}, build {props.get('build_info')}"
    ]
    findings = [Finding("server", OK, f"{client.url} is a llama.cpp server (/props)", ev)]
    speculative = _slots_speculative(client)
    if speculative is False:
        return findings + [_speculation_off(ev, "/slots reports speculative false", expect_speculation)]
    metrics = bool(props.get("endpoint_metrics"))
    if not metrics:
        findings.append(
            Finding(
                "metrics",
                WARNING,
                "/metrics is off: the probe needs llama-server started with --metrics for its drafting rounds",
                ["GET /props: endpoint_metrics false; the accepted tokens still come from each response's timings"],
                fix="--metrics",
            )
        )
    if probes == 0:
        return findings
    before = ENGINE.counters(client) if metrics else None
    done, errors = _send_probes(client, probes, probe_tokens)
    if not done:
        return findings + [probes_failed(client, errors)]
    rounds = ENGINE.counters(client) - before if metrics else None
    return findings + [_judge(done, errors, rounds, speculative, launch, settings)]


def _judge(done, errors, rounds, speculative, launch, settings) -> Finding:
    expect_speculation, probe_tokens = settings.expect_speculation, settings.probe_tokens
    timings = [c.meta or {} for c in done]
    tokens = sum(c.completion_tokens or 0 for c in done)
    drafted = sum(t.get("draft_n", 0) for t in timings)
    accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
    ev = [
        f"{len(done)} probe(s) via POST /completion, greedy, max {probe_tokens} new tokens",
        *errors[:2],
        f"{tokens} tokens in {tokens - accepted} target steps: {accepted} of {drafted} draft tokens accepted "
        "(the responses' timings)",
    ]
    if rounds is not None:
        ev.append(f"/metrics over the probes: {counters_text(rounds)}")
    if tokens < 8:
        return Finding(
            "probe", WARNING, "probes produced too few tokens to judge acceptance", ev, fix="a larger --probe-tokens"
        )
    if drafted == 0 and speculative is None:
        return _speculation_off(ev, "no probe drafted a token (and /slots is off)", expect_speculation)
    if drafted == 0:
        ev.append(
            "/slots reports speculative true, yet no round drafted: llama.cpp drops a draft whose top token is below "
            "--spec-draft-p-min, or that is shorter than --spec-draft-n-min"
        )
    ev.append("accept length here: tokens per target step, the rounds that did not draft included")
    return judge_accept_length(tokens / (tokens - accepted), "probe accept length", ev, launch, settings)
