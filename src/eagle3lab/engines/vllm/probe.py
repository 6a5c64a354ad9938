"""A running vLLM server for the doctor: speculation on or off from its Prometheus /metrics, the accept length so
far, and over greedy chat probes (the spec_decode counters read before and after: 1 + accepted / drafts)."""

from __future__ import annotations

import httpx

from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch
from eagle3lab.doctor.probe import counters_text, judge_accept_length, probes_failed, send_probes
from eagle3lab.engines.base import SpecCounters
from eagle3lab.engines.vllm.launch_line import VLLM
from eagle3lab.engines.vllm.server import parse_counters
from eagle3lab.serving.client import ServerClient, ServerError


def check_server(client: ServerClient, launch: Launch | None, settings) -> tuple[list[Finding], None] | None:
    """vLLM's findings; None: not a vLLM server."""
    is_vllm, before = _vllm_counters(client)
    return (_vllm_server(client, launch, before, settings), None) if is_vllm else None


def _vllm_counters(client: ServerClient) -> tuple[bool, SpecCounters | None]:
    """(is this a vLLM server, its spec_decode counters or None when it registers none: it does not speculate)."""
    try:
        text = client.metrics()
    except (httpx.HTTPError, ServerError):
        return False, None
    return "vllm:" in text, parse_counters(text)


def _vllm_server(client: ServerClient, launch, before, settings) -> list[Finding]:
    """vLLM: speculation on or off from /metrics, the accept length so far, and over the probes' own requests."""
    expect_speculation, probes, probe_tokens = settings.expect_speculation, settings.probes, settings.probe_tokens
    ev = ["GET /metrics: " + (f"spec_decode so far: {counters_text(before)}" if before else "no vllm:spec_decode_*")]
    findings = [Finding("server", OK, f"{client.url} is a vLLM server (Prometheus /metrics)", ev)]
    if before is None:
        return findings + [
            Finding(
                "speculation",
                ERROR if expect_speculation else WARNING,
                "speculation is off on the vLLM server: /metrics has no spec_decode counters",
                ev
                + [
                    "vLLM registers them only when it speculates: it was started without --speculative-config; "
                    "this is not the same as accept length 1.0 (a draft loaded but useless)"
                ],
                fix=VLLM.speculation_fix if expect_speculation else None,
            )
        ]
    if before.accept_length is not None:
        findings.append(
            judge_accept_length(before.accept_length, "server accept length (/metrics)", ev, launch, settings)
        )
    if probes == 0:
        return findings
    done, endpoint, errors = send_probes(client, None, probes, probe_tokens, api="chat")
    if not done:
        return findings + [probes_failed(client, errors)]
    after = _vllm_counters(client)[1]
    delta = (after or before) - before  # counters gone (a dead engine): nothing drafted
    ev = [
        f"{len(done)} probe(s) via POST {endpoint}, temperature 0, max {probe_tokens} new tokens",
        *errors[:2],
        f"/metrics over the probes: {counters_text(delta)}",
    ]
    if delta.accept_length is None:
        return findings + [Finding("probe", WARNING, "the probes drafted nothing: acceptance not judged", ev)]
    return findings + [judge_accept_length(delta.accept_length, "probe accept length", ev, launch, settings)]
