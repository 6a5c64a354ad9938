"""A running SGLang server for the doctor: its /server_info (launch args, avg_spec_accept_length), then greedy
/generate probes (doctor.probe)."""

from __future__ import annotations

from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch
from eagle3lab.doctor.probe import SPECULATION_FIX, judge_accept_length, probe_requests
from eagle3lab.engines.sglang.launch_line import launch_from_server_info
from eagle3lab.serving.client import ServerClient


def check_server(client: ServerClient, launch: Launch | None, settings) -> tuple[list[Finding], Launch | None] | None:
    """SGLang's findings and the launch as /server_info reports it; None: the server has no /server_info."""
    info, info_path = client.server_info()
    if info is None:
        return None
    server_launch = launch_from_server_info(info)
    findings = _server_info_findings(client.url, info, info_path, launch, server_launch, settings)
    if settings.probes > 0:
        expect = settings.expect_speculation or server_launch.speculative
        findings += probe_requests(client, info, launch or server_launch, expect, settings)
    return findings, server_launch


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


def _server_info_findings(
    url: str, info: dict, info_path: str, launch: Launch | None, server: Launch, settings
) -> list[Finding]:
    """What /server_info says: does the server match the launch line, does it speculate, and how well."""
    accepts = _accept_lengths_from_info(info)
    expect_speculation = settings.expect_speculation
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
            judge_accept_length(mean, "server avg_spec_accept_length", ev + [per_rank], launch or server, settings)
        )
    return findings
