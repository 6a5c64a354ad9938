"""A launch line read by the engine it starts: the registry picks the reader (vLLM's, llama.cpp's llama-server, else
SGLang's), and a running server is probed by the engine that answers."""

from __future__ import annotations

import shlex

import httpx

from eagle3lab.doctor.findings import ERROR, WARNING, Finding
from eagle3lab.doctor.launch import Launch, LaunchUsageError
from eagle3lab.doctor.probe import ProbeSettings, probe_requests
from eagle3lab.engines.registry import ENGINES, entry_for_launch
from eagle3lab.serving.client import ServerClient


def parse_launch(command: str | list[str]) -> Launch:
    """Parse a server command (shell quoting and line continuations) with the reader of the engine it starts:
    vLLM's (`vllm serve`, `-m vllm.entrypoints.openai.api_server`), llama.cpp's `llama-server`, anything else as
    SGLang's `python -m sglang.launch_server ...` / `sglang serve ...`. A line that cannot be checked at all (blank,
    not shell syntax, no model) raises LaunchUsageError."""
    if isinstance(command, str):
        try:
            argv = shlex.split(command.replace("\\\r\n", " ").replace("\\\n", " "))
        except ValueError as e:
            raise LaunchUsageError(f"the launch line is not valid shell syntax ({e}): {command}") from None
    else:
        argv = [str(a) for a in command]
    argv = [a for a in argv if a.strip()]
    if not argv:
        raise LaunchUsageError("the launch line is blank: give the server command, quoted")
    launch = Launch(source="launch line", argv=argv, written=list(argv))
    entry_for_launch(argv).read_launch(launch)
    if not launch.model_path:
        why = "; ".join(launch.notes + launch.errors)
        raise LaunchUsageError(
            f"the launch line names no model ({launch.flag('model_path')}): {shlex.join(argv)}"
            + (f" ({why})" if why else "")
        )
    return launch


def check_server(
    url: str, launch: Launch | None, settings: ProbeSettings, *, timeout: float, transport=None
) -> tuple[list[Finding], Launch | None]:
    """Runtime checks by the engine that answers. Returns the findings and the launch as the server reports it (None
    when it does not)."""
    with ServerClient(url, timeout=timeout, transport=transport) as client:
        try:
            for entry in ENGINES.values():  # each probe asks for its engine's own mark (/metrics' vllm:, /props, ...)
                found = entry.check_server(client, launch, settings)
                if found is not None:
                    return found
        except httpx.HTTPError as e:
            return [
                Finding(
                    "server",
                    ERROR,
                    f"server {url} is unreachable",
                    [f"{e.__class__.__name__}: {e}"],
                    fix="check the URL and that the server is up (GET /health)",
                )
            ], None
        findings = [
            Finding(
                "server",
                WARNING,
                f"{url} has no /server_info: not an SGLang server (or an old one)",
                ["server args and avg_spec_accept_length unavailable; relying on probe requests"],
            )
        ]
        if settings.probes > 0:
            findings += probe_requests(client, None, launch, settings.expect_speculation, settings)
    return findings, None
