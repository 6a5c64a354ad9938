"""`diagnose`: run every check the inputs allow (launch line, draft, target, running server, in any combination);
unreadable inputs become findings, never tracebacks: a draft or target that is named by a local path and is not there
is an error naming the path (artifacts.missing_local_path), whoever names it. A launch line that cannot be checked at
all (blank, not shell syntax, no model) raises LaunchUsageError: bad usage, exit 2 on the command line.

The launch line may be SGLang's, vLLM's or llama.cpp's llama-server (`parse_launch` tells them apart); the server may
be any of them (SGLang's /server_info, vLLM's /metrics, llama-server's /props). With llama.cpp the draft and target are
GGUF files (the line's -md / -m, or --draft / --target ending in .gguf), checked by engines.llamacpp.rules.

Library use (a notebook):
    report = diagnose(launch="python -m sglang.launch_server ...", draft="artifacts/draft",
                      target="smollm2-135m-instruct")
    report = diagnose(launch="vllm serve MODEL --speculative-config '{...}'", server="http://127.0.0.1:8000")
    report = diagnose(launch="llama-server -m T.gguf -md D.gguf --spec-type draft-eagle3 --metrics ...")
    report.exit_code, report.findings, report.render(), report.to_json()
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from eagle3lab.doctor.artifacts import (
    DoctorInputError,
    DraftInfo,
    TargetInfo,
    missing_local_path,
    read_draft,
    read_target_config,
)
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding, Report
from eagle3lab.doctor.launch import Launch
from eagle3lab.doctor.probe import ACCEPT_LOW, ProbeSettings
from eagle3lab.doctor.reading import check_server, parse_launch
from eagle3lab.doctor.settings import (
    check_context_length,
    check_draft_named,
    check_launch_vs_draft_path,
)
from eagle3lab.drafters import checks, checks_of, named_by
from eagle3lab.drafters.kinds import DEFAULT, kind_of_gguf
from eagle3lab.engines.registry import ENGINES
from eagle3lab.options import option


@dataclass
class DoctorSettings:
    """Every `doctor` input and setting (`eagle3lab doctor`'s CLI is generated from these fields, and `diagnose`
    takes its defaults from them: one home for the defaults and their help)."""

    launch: str | None = option(
        None,
        'the server command, quoted: "python -m sglang.launch_server --model-path ...", '
        '"vllm serve MODEL --speculative-config \'{...}\'" or "llama-server -m T.gguf -md D.gguf ..."',
    )
    draft: str | None = option(None, "draft checkpoint folder (config.json + weights), or a draft .gguf")
    target: str | None = option(
        None, "target: a folder with config.json, the embedded id, a cached hub id, or a target .gguf"
    )
    server: str | None = option(None, "URL of a running SGLang, vLLM or llama.cpp server, e.g. http://127.0.0.1:30000")
    probes: int = option(3, "probe requests sent to --server (0: none)")
    probe_tokens: int = option(64, "max new tokens per probe")
    timeout: float = option(30.0, "HTTP timeout in seconds")
    low_accept: float = option(ACCEPT_LOW, "accept length below this is a weak-draft warning")


def _local_dir(path: str | None) -> bool:
    return bool(path) and Path(path).expanduser().is_dir()


def _read_target_finding(spec: str) -> tuple[TargetInfo | None, list[Finding]]:
    try:
        info = read_target_config(spec)
    except DoctorInputError as e:
        return None, [
            Finding(
                "target",
                WARNING,
                "target config not at hand: layer and vocab checks use the draft's own config",
                [str(e)],
                fix="--target PATH (a folder with the target's config.json) or the embedded target id",
            )
        ]
    return info, [
        Finding(
            "target",
            OK,
            f"target config: {info.num_layers} layers, hidden {info.hidden_size}, "
            f"vocab {info.vocab_size}, max positions {info.max_position_embeddings}",
            [info.source],
        )
    ]


def _read_draft_finding(spec: str | Path) -> tuple[DraftInfo | None, list[Finding]]:
    try:
        info = read_draft(spec)
    except DoctorInputError as e:
        return None, [
            Finding(
                "draft",
                ERROR,
                "the draft checkpoint cannot be read",
                [str(e)],
                fix="point --draft at the exported folder (config.json + model.safetensors)",
            )
        ]
    return info, [
        Finding(
            "draft",
            OK,
            f"draft checkpoint read: {info.kind.upper()} ({', '.join(info.architectures) or 'no architectures'})",
            [f"{info.path}: {len(info.shapes)} tensors in {', '.join(f.name for f in info.files)}"],
        )
    ]


# long: one pass over four optional inputs, each falling back on the others (launch line, server args)
def diagnose(
    launch: str | list[str] | None = None,
    draft: str | Path | None = None,
    target: str | None = None,
    server: str | None = None,
    *,
    probes: int = DoctorSettings.probes,
    probe_tokens: int = DoctorSettings.probe_tokens,
    timeout: float = DoctorSettings.timeout,
    low_accept: float = DoctorSettings.low_accept,
    transport=None,
) -> Report:
    """Run every check the inputs allow. Any combination of inputs; unreadable ones become findings."""
    if launch is None and not any((draft, target, server)):
        raise ValueError("diagnose needs at least one of launch, draft, target, server")
    parsed = parse_launch(launch) if launch is not None else None
    missing = _missing_paths(parsed, draft, target)
    findings: list[Finding] = list(missing.values())
    draft, target = (None if spec and str(spec) in missing else spec for spec in (draft, target))
    gguf = _engine_files(parsed, draft, target)
    if gguf is not None:  # an engine's own files (llama.cpp's GGUFs) get its checks, not a folder's or a config's
        draft = None if gguf.owns(draft) else draft
        target = None if gguf.owns(target) else target
        gguf.draft, gguf.target = (None if path in missing else path for path in (gguf.draft, gguf.target))
    if parsed is not None:
        findings += _launch_findings(parsed, draft)
    # target and draft: the arguments, else the launch line's paths when they are local folders
    target_spec = target or (parsed.model_path if parsed and _local_dir(parsed.model_path) else None)
    target_info = None
    if target_spec:
        target_info, more = _read_target_finding(target_spec)
        findings += more
    elif (parsed is not None or draft is not None) and gguf is None and not (parsed and parsed.model_path in missing):
        findings.append(
            Finding(
                "target",
                WARNING,
                "no target config: layer existence and target vocab not checked",
                [f"model path {parsed.model_path if parsed else None!r} is not a local folder"],
                fix="--target PATH|ID",
            )
        )
    if target_info is None and gguf is not None:
        target_info = gguf.target_info()  # the target file's layers, width, vocab and context
    draft_spec = draft or (parsed.draft_path if parsed and _local_dir(parsed.draft_path) else None)
    draft_info = None
    if draft_spec:
        draft_info, more = _read_draft_finding(draft_spec)
        findings += more

    server_launch = None
    if server:
        expect = bool(draft_info) or bool(parsed and parsed.speculative) or bool(gguf and gguf.draft)
        kind = served_drafter(parsed, draft_info, gguf and gguf.draft)
        settings = ProbeSettings(expect, probes, probe_tokens, kind.runtime_advice, low_accept)
        more, server_launch = check_server(server, parsed, settings, timeout=timeout, transport=transport)
        findings += more
        # without a launch line, the server's own args name the draft and target; use them when they are local
        if parsed is None and server_launch is not None:
            if draft_info is None and not draft_spec and _local_dir(server_launch.draft_path):
                draft_spec = server_launch.draft_path
                draft_info, more = _read_draft_finding(draft_spec)
                findings += more
            if target_info is None and not target_spec and _local_dir(server_launch.model_path):
                target_spec = server_launch.model_path
                target_info, more = _read_target_finding(target_spec)
                findings += more

    # static checks run on the launch line, or on what the server reports it was launched with
    findings += static_checks(parsed or server_launch, draft_info, target_info, gguf)
    inputs = {
        "launch": shlex.join(parsed.written) if parsed else None,  # copy-pasteable
        "draft": str(draft_spec) if draft_spec else gguf and gguf.draft,
        "target": target_spec or (gguf and gguf.target),
        "server": server,
    }
    return Report(findings=findings, inputs=inputs)


# files an engine serves as a draft or a target (llama.cpp's GGUFs): every other file named as one is a mistake
ENGINE_FILE_SUFFIXES = (".gguf",)


def _missing_paths(parsed: Launch | None, draft, target) -> dict[str, Finding]:
    """An error for each draft or target the inputs name by a local path with nothing usable at it (nothing, or a
    file where a folder or a GGUF belongs), by path."""
    named = [("draft", draft, "--draft"), ("target", target, "--target")]
    if parsed is not None:
        for what, key in (("draft", "draft_path"), ("target", "model_path")):
            named.append((what, getattr(parsed, key), f"the launch line's {parsed.flag(key)}"))
    missing = {}
    for what, spec, by in named:
        if not spec or str(spec) in missing:
            continue
        if missing_local_path(spec):
            title, why = "does not exist", "a local path (not a hub id such as org/name), and nothing is at"
            fix = f"point {by} at the {what} on this machine"
        elif Path(spec).expanduser().is_file() and not str(spec).endswith(ENGINE_FILE_SUFFIXES):
            title, why = f"is a file, not a {what} folder (config.json + weights) or a .gguf", "a file is at"
            fix = f"point {by} at the {what} folder, or at its .gguf for llama.cpp"
        else:
            continue
        missing[str(spec)] = Finding(
            what, ERROR, f"{what} {spec} {title}", [f"{by}: {spec}", f"{why} {_absolute(spec)}"], fix=fix
        )
    return missing


def _absolute(spec) -> Path:
    return Path(spec).expanduser().absolute()


def _launch_findings(parsed: Launch, draft: str | Path | None) -> list[Finding]:
    sev = ERROR if parsed.errors else WARNING if parsed.notes else OK
    title = {
        ERROR: f"{parsed.syntax.known.engine} would refuse this launch line",
        WARNING: "launch line parsed with problems",
        OK: "launch line parsed",
    }[sev]
    summary = (
        f"{parsed.engine}: algorithm {parsed.algorithm}, model {parsed.model_path}, draft {parsed.draft_path}, "
        f"steps/topk/ndraft {parsed.num_steps}/{parsed.topk}/{parsed.num_draft_tokens}, "
        f"context {parsed.context_length}, tp {parsed.tp_size}"
    )
    respelled = parsed.argv != parsed.written
    evidence = [*parsed.errors, *parsed.notes, summary]
    if respelled:
        evidence.append("the other checks read the line as corrected below")
    launch = Finding("launch", sev, title, evidence, fix=shlex.join(parsed.argv) if respelled else None)
    draft = str(draft) if draft else None
    return [launch, *check_draft_named(parsed, draft), *check_launch_vs_draft_path(parsed, draft)]


def _engine_files(launch: Launch | None, draft, target):
    """The engine's own draft and target files the inputs name (llama.cpp's GGUFs), or None."""
    for entry in ENGINES.values():
        files = entry.files(launch, draft, target) if entry.files else None
        if files is not None:
            return files
    return None


def static_checks(
    launch: Launch | None, draft: DraftInfo | None, target: TargetInfo | None, files=None
) -> list[Finding]:
    """Every check that needs no server, on whatever of launch / draft / target is known: the draft's kind's own
    (drafters.base.Drafter.doctor_checks). With an engine's own files (llama.cpp's GGUF pair) those are what is
    served (layers, widths, vocab, d2t); a draft folder then only says what the draft was trained on."""
    kind = checks(draft.drafter_kind if draft is not None else DEFAULT)
    if files is None:
        return kind.doctor_checks(launch, draft, target)
    findings, draft_gguf, target_gguf = files.read()
    if draft_gguf is not None:  # the file served says what it is; a folder beside it only what it was trained as
        kind = checks(kind_of_gguf(draft_gguf["architecture"]))
    findings += kind.gguf_checks(launch, draft, files, draft_gguf, target_gguf)
    return findings + kind.served_field_checks(launch, draft, target) + check_context_length(draft, target, launch)


def served_drafter(launch: Launch | None, draft: DraftInfo | None, gguf: str | None):
    """The kind the inputs name: the draft folder's, the draft GGUF's, else the kind whose name the line asks its
    engine for (EAGLE-3's family when none says)."""
    if draft is not None:
        return checks(draft.drafter_kind)
    return checks_of(gguf) if gguf else named_by(launch)
