"""The running server. SGLang: its /server_info (launch args, avg_spec_accept_length) and a few greedy probe requests,
whose meta_info.spec_verify_ct gives the accept length. vLLM: its Prometheus /metrics spec_decode counters, read before
and after the probes (accept length = 1 + accepted / drafts over the difference). llama.cpp: doctor.llamacpp (its
/props, /slots and the probes' timings). No spec_verify_ct, or no spec_decode counters, means speculation is off,
which is a different finding from accept length 1.0 (a draft loaded but never accepted)."""

from __future__ import annotations

import httpx

from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import EAGLE_ALGORITHMS, Launch, fix_flags, launch_from_server_info
from eagle3lab.doctor.vllm import VLLM
from eagle3lab.serving.client import Completion, ServerClient, ServerError, accept_length
from eagle3lab.serving.engine import SpecCounters
from eagle3lab.serving.vllm import parse_counters

# Accept length (tokens per verify step, bonus token included): at or below NOTHING the draft contributes nothing.
ACCEPT_NOTHING = 1.05
ACCEPT_LOW = 2.0
SPECULATION_FIX = "--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT"

PROBE_PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three tips for writing clear technical documentation.",
]


def _accept_lengths_from_info(info: dict) -> list[float]:
    """avg_spec_accept_length: top level (older SGLang), per DP rank in internal_states, or per decode server (PD)."""
    found = []
    if isinstance(info.get("avg_spec_accept_length"), (int, float)):
        found.append(float(info["avg_spec_accept_length"]))
    for group in ("internal_states", "decode"):
        for state in info.get(group) or []:
            if isinstance(state, dict):
                value = state.get("avg_spec_accept_length")
                if isinstance(value, (int, float)):
                    found.append(float(value))
                for inner in state.get("internal_states") or []:
                    if isinstance(inner, dict) and isinstance(inner.get("avg_spec_accept_length"), (int, float)):
                        found.append(float(inner["avg_spec_accept_length"]))
    return found


def judge_accept_length(
    value: float, what: str, evidence: list[str], launch: Launch | None, low: float = ACCEPT_LOW
) -> Finding:
    if value <= ACCEPT_NOTHING:
        fix = None
        if launch is not None and launch.algorithm in EAGLE_ALGORITHMS:
            fix = (
                fix_flags(launch, algorithm="EAGLE3")
                + "\n(if the draft is EAGLE-3; run the doctor with --draft to confirm)"
            )
        return Finding(
            "accept_length",
            ERROR,
            f"{what} {value:.2f}: the draft contributes nothing",
            evidence
            + [
                "every verify step keeps only the target's own token: no draft token is ever accepted",
                "usual causes: an EAGLE-3 draft served with EAGLE/NEXTN (fc bypassed), capture layers or a vocab map "
                "(d2t) other than the draft was trained with, or a draft for another target",
            ],
            fix=fix or "run `eagle3lab doctor --launch '<the server command>' --draft DRAFT --target TARGET`",
        )
    if value < low:
        return Finding(
            "accept_length",
            WARNING,
            f"{what} {value:.2f}: the draft works but is weak",
            evidence
            + [
                f"below {low}: speculation likely costs more than it saves; a data/quality issue, not a flag bug",
                "more on-policy training data (target-regenerated responses) raises it",
            ],
        )
    return Finding("accept_length", OK, f"{what} {value:.2f}: the draft is used", evidence)


def check_server(
    url: str,
    launch: Launch | None,
    *,
    expect_speculation: bool,
    probes: int,
    probe_tokens: int,
    timeout: float,
    low: float,
    transport=None,
) -> tuple[list[Finding], Launch | None]:
    """Runtime checks (settings from `diagnose`, defaults `DoctorSettings`). Returns the findings and the launch as
    the server reports it (None when it does not)."""
    with ServerClient(url, timeout=timeout, transport=transport) as client:
        try:
            info, info_path = client.server_info()
        except httpx.HTTPError as e:
            return [
                Finding(
                    "server",
                    ERROR,
                    f"server {url} is unreachable",
                    [f"GET /server_info: {e.__class__.__name__}: {e}"],
                    fix="check the URL and that the server is up (GET /health)",
                )
            ], None
        if info is None:
            from eagle3lab.doctor import llamacpp  # it builds on this module's judge

            props = llamacpp.server_props(client)
            if props is not None:
                findings = llamacpp.check_server(client, props, launch, expect_speculation, probes, probe_tokens, low)
                return findings, None
            is_vllm, before = _vllm_counters(client)
            if is_vllm:
                return _vllm_server(client, launch, before, expect_speculation, probes, probe_tokens, low), None
            server_launch = None
            findings = [
                Finding(
                    "server",
                    WARNING,
                    f"{url} has no /server_info: not an SGLang server (or an old one)",
                    ["server args and avg_spec_accept_length unavailable; relying on probe requests"],
                )
            ]
        else:
            server_launch = launch_from_server_info(info)
            findings = _server_info_findings(url, info, info_path, launch, server_launch, expect_speculation, low)
        if probes > 0:
            expect = expect_speculation or bool(server_launch and server_launch.speculative)
            findings += _probe(client, info, launch or server_launch, expect, probes, probe_tokens, low)
    return findings, server_launch


def _server_info_findings(
    url: str, info: dict, info_path: str, launch: Launch | None, server: Launch, expect_speculation: bool, low: float
) -> list[Finding]:
    """What /server_info says: does the server match the launch line, does it speculate, and how well."""
    accepts = _accept_lengths_from_info(info)
    ev = [
        f"GET {info_path}: speculative_algorithm {info.get('speculative_algorithm')!r}, "
        f"draft {info.get('speculative_draft_model_path')!r}, version {info.get('version', '?')}"
    ]
    findings = [Finding("server", OK, f"{url} answers /server_info", ev)]
    if launch is not None and launch.algorithm != server.algorithm:
        findings.append(
            Finding(
                "server",
                WARNING,
                "the running server does not match the launch line",
                [
                    f"launch line: {launch.algorithm}; server: {server.algorithm}",
                    "it was started with another command: restart it with the checked one",
                ],
            )
        )
    if not server.speculative and not accepts:
        findings.append(
            Finding(
                "speculation",
                ERROR if expect_speculation else WARNING,
                "speculation is off on the server",
                ev + ["no speculative_algorithm and no avg_spec_accept_length: no draft is loaded"],
                fix=SPECULATION_FIX if expect_speculation else None,
            )
        )
    elif accepts:
        per_rank = f"avg_spec_accept_length per rank: {', '.join(f'{a:.2f}' for a in accepts)}"
        mean = sum(accepts) / len(accepts)
        findings.append(
            judge_accept_length(mean, "server avg_spec_accept_length", ev + [per_rank], launch or server, low)
        )
    return findings


def _vllm_counters(client: ServerClient) -> tuple[bool, SpecCounters | None]:
    """(is this a vLLM server, its spec_decode counters or None when it registers none: it does not speculate)."""
    try:
        text = client.metrics()
    except (httpx.HTTPError, ServerError):
        return False, None
    return "vllm:" in text, parse_counters(text)


def counters_text(c: SpecCounters) -> str:
    per = ", ".join(str(p) for p in c.per_position)
    return f"{c.drafts} drafts, {c.accepted} of {c.draft_tokens} draft tokens accepted (per position {per})"


def _vllm_server(client: ServerClient, launch, before, expect_speculation, probes, probe_tokens, low) -> list[Finding]:
    """vLLM: speculation on or off from /metrics, the accept length so far, and over the probes' own requests."""
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
        findings.append(judge_accept_length(before.accept_length, "server accept length (/metrics)", ev, launch, low))
    if probes == 0:
        return findings
    done, endpoint, errors = _send_probes(client, None, probes, probe_tokens, api="chat")
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
    return findings + [judge_accept_length(delta.accept_length, "probe accept length", ev, launch, low)]


def _send_probes(client: ServerClient, info: dict | None, probes: int, probe_tokens: int, api: str = "generate"):
    """Greedy probe requests: SGLang's /generate, or the chat API on servers without it (or when `api` is "chat").
    Returns the completions, the endpoint used and the errors met."""
    done: list[Completion] = []
    errors: list[str] = []
    if api == "chat":
        client.model = client.model or _chat_model(client, info)
    for prompt in (PROBE_PROMPTS * probes)[:probes]:
        try:
            answer = client.generate(text=prompt, max_new_tokens=probe_tokens) if api == "generate" else None
            if answer is None:
                if api == "generate":  # no /generate: an OpenAI-style server
                    api = "chat"
                    client.model = client.model or _chat_model(client, info)
                answer = client.chat([{"role": "user", "content": prompt}], max_tokens=probe_tokens)
            done.append(answer)
        except (httpx.HTTPError, ServerError) as e:
            errors.append(f"{e.__class__.__name__}: {e}")
    return done, ("/generate" if api == "generate" else "/v1/chat/completions"), errors


def _chat_model(client: ServerClient, info: dict | None) -> str:
    info = info or {}
    try:
        return info.get("served_model_name") or info.get("model_path") or client.discover_model()
    except (httpx.HTTPError, ServerError):
        return "default"  # servers with a single model accept any name


def probes_failed(client: ServerClient, errors: list[str]) -> Finding:
    return Finding(
        "probe",
        ERROR,
        f"probe requests to {client.url} failed",
        errors[:3],
        fix="check the server log; retry with --probes 0 to skip probing",
    )


def _probe(client: ServerClient, info, launch, expect_speculation, probes, probe_tokens, low) -> list[Finding]:
    done, endpoint, errors = _send_probes(client, info, probes, probe_tokens)
    if not done:
        return [probes_failed(client, errors)]
    with_ct = [c for c in done if c.verify_ct is not None]
    ev = [f"{len(done)} probe(s) via POST {endpoint}, temperature 0, max {probe_tokens} new tokens"] + errors[:2]
    if not with_ct:
        if endpoint != "/generate":
            ev.append(
                "the server has no SGLang /generate; OpenAI-style responses carry no meta_info, "
                "so speculation is off or at least unreported"
            )
        return [
            Finding(
                "speculation",
                ERROR if expect_speculation else WARNING,
                "no spec_verify_ct in any response: speculation is off",
                ev
                + [
                    "a server that speculates reports meta_info.spec_verify_ct on every request; "
                    "this is not the same as accept length 1.0 (draft loaded but useless)"
                ],
                fix=SPECULATION_FIX if expect_speculation else None,
            )
        ]
    tokens = sum(c.completion_tokens or 0 for c in with_ct)
    verify = sum(c.verify_ct for c in with_ct)
    per = [(c.meta or {}).get("spec_accept_length") for c in with_ct]
    ev.append(
        f"completion_tokens {tokens}, spec_verify_ct {verify}; per-request spec_accept_length "
        + ", ".join(f"{p:.2f}" if isinstance(p, (int, float)) else "-" for p in per)
    )
    accept = accept_length(tokens, verify)
    if accept is None or tokens < 8:
        return [
            Finding(
                "probe",
                WARNING,
                "probes produced too few tokens to judge acceptance",
                ev,
                fix="rerun with a larger --probe-tokens",
            )
        ]
    return [judge_accept_length(accept, "probe accept length", ev, launch, low)]
