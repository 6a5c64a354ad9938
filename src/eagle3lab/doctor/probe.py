"""What the doctor judges on any running server: greedy probe requests (SGLang's /generate, whose
meta_info.spec_verify_ct gives the accept length, or the OpenAI chat API) and the accept length they show. Each
engine's own probe (`engines/<engine>/probe.py`) reads its server's settings and counters and judges with these. No
spec_verify_ct, or no spec_decode counters, means speculation is off, which is a different finding from accept length
1.0 (a draft loaded but never accepted)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx

from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch
from eagle3lab.engines.base import SpecCounters
from eagle3lab.serving.client import Completion, ServerClient, ServerError, accept_length

# Accept length (tokens per verify step, bonus token included): at or below NOTHING the draft contributes nothing.
ACCEPT_NOTHING = 1.05
ACCEPT_LOW = 2.0
SPECULATION_FIX = "--speculative-algorithm EAGLE3 --speculative-draft-model-path DRAFT"
CHECK_FIX = "run `eagle3lab doctor --launch '<the server command>' --draft DRAFT --target TARGET`"


@dataclass(frozen=True)
class ProbeSettings:
    """How a server is probed (from `diagnose`; defaults in `DoctorSettings`)."""

    expect_speculation: bool  # the inputs name a draft: speculation off is an error, not a note
    probes: int
    probe_tokens: int
    # what the served drafter kind says of an unused or weak draft (drafters.base.DrafterChecks.runtime_advice)
    advice: Callable[[Launch | None], dict]
    low: float = ACCEPT_LOW


PROBE_PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three tips for writing clear technical documentation.",
]


def judge_accept_length(
    value: float, what: str, evidence: list[str], launch: Launch | None, settings: ProbeSettings
) -> Finding:
    """One rule for every engine and drafter: at or below ACCEPT_NOTHING the draft contributes nothing (an error),
    below settings.low it is weak (a warning). What the finding names as causes and fix is the drafter's own."""
    advice = settings.advice(launch)
    if value <= ACCEPT_NOTHING:
        return Finding(
            "accept_length",
            ERROR,
            f"{what} {value:.2f}: the draft contributes nothing",
            evidence
            + [
                "every verify step keeps only the target's own token: no draft token is ever accepted",
                *advice["causes"],
            ],
            fix=advice["fix"] or CHECK_FIX,
        )
    if value < settings.low:
        return Finding(
            "accept_length",
            WARNING,
            f"{what} {value:.2f}: the draft works but is weak",
            [*evidence, f"below {settings.low}: speculation likely costs more than it saves", *advice["weak"]],
            fix=CHECK_FIX if advice["check_when_weak"] else None,
        )
    return Finding("accept_length", OK, f"{what} {value:.2f}: the draft is used", evidence)


def counters_text(c: SpecCounters) -> str:
    per = ", ".join(str(p) for p in c.per_position)
    return f"{c.drafts} drafts, {c.accepted} of {c.draft_tokens} draft tokens accepted (per position {per})"


def send_probes(client: ServerClient, info: dict | None, probes: int, probe_tokens: int, api: str = "generate"):
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


def probe_requests(
    client: ServerClient, info, launch, expect_speculation: bool, settings: ProbeSettings
) -> list[Finding]:
    """Greedy probes through /generate (or chat), judged by the responses' spec_verify_ct."""
    probe_tokens = settings.probe_tokens
    done, endpoint, errors = send_probes(client, info, settings.probes, probe_tokens)
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
    return [judge_accept_length(accept, "probe accept length", ev, launch, settings)]
