"""eagle3lab doctor on a DFlash draft served for real: the committed drafts/smollm2-dflash-2200 (block 4) with SmolLM2
in vLLM (method dflash, float32, eager, k=3) and in llama.cpp (its GGUF, --spec-type draft-dflash, n-max 3), intact
and with the silent traps whose runtime signal is clear. Each trap is caught before launch, and `diagnose` on the
running server says so from the engine's own counters; the intact draft is weak there, never "contributes nothing".

Measured (docs/doctor.md, DFlash drafts; the doctor's 3 probes of 64 tokens; tokens per target step): intact 1.07 in
vLLM, 1.10 in llama.cpp; mask_token_id 0 (the target's unk) 1.01 in both; vLLM without "method" runs it as a plain
draft model, 1.00; llama.cpp's draft-simple 1.04; dflash_config.use_aux_hidden_state false (vLLM) and
--spec-type draft-eagle3 or no mask token (llama.cpp): the server starts and the first request kills it. The traps
that serve as the intact draft (layer ids off by one, a causal block, a draft length other than 3, a block size
missing or wrong) are tested before launch only (tests/test_doctor_dflash.py): no runtime signal tells them apart.
"""

from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import ServerPool, counted
from eagle3lab.doctor.diagnosis import diagnose
from eagle3lab.doctor.findings import ERROR, WARNING
from eagle3lab.doctor.probe import ACCEPT_NOTHING
from eagle3lab.doctor.reading import parse_launch
from eagle3lab.drafters.dflash.serve import DFlashLlamaCpp
from eagle3lab.engines.llamacpp.gguf import run_converter
from eagle3lab.paths import ROOT
from eagle3lab.serving.processes import free_port

DRAFT = ROOT / "drafts" / "smollm2-dflash-2200"
K = 3
PROBES = {"probes": 3, "probe_tokens": 64, "timeout": 300}  # the doctor's own; fewer cannot tell 1.07 from 1.05
CRASH = {"probes": 1, "probe_tokens": 8, "timeout": 300}  # the first request kills these servers


def checks(report, check, severity=None):
    return [f for f in report.findings if f.check == check and (severity is None or f.severity == severity)]


def draft_copy(folder: Path, edit=None) -> Path:
    """The committed draft with its config.json edited by edit(dict); the folder is named 'draft', without 'dflash'
    (vLLM infers the method from the path)."""
    folder = folder / "draft"
    folder.mkdir(parents=True)
    cfg = json.loads((DRAFT / "config.json").read_text())
    if edit is not None:
        edit(cfg)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    shutil.copy(DRAFT / "model.safetensors", folder)
    return folder


def mask(value):
    def edit(cfg):
        if value is None:
            cfg["dflash_config"].pop("mask_token_id")
        else:
            cfg["dflash_config"]["mask_token_id"] = value

    return edit


def probe_finding(report):
    [found] = [f for f in checks(report, "accept_length") if f.title.startswith("probe accept length")]
    return found


# ---- vLLM ------------------------------------------------------------------------------------------------------------

VLLM_CASES = {  # name: (config edit, --speculative-config edit)
    "intact": (None, None),
    "mask_unk": (mask(0), None),
    "no_method": (None, lambda spec: spec.pop("method")),
    "no_aux": (lambda cfg: cfg["dflash_config"].update(use_aux_hidden_state=False), None),
}


@pytest.fixture(scope="module")
def dflash_servers(request, vllm, smollm2_dir, tmp_path_factory):
    """Real vLLM servers of the cases this run's tests ask for, two at a time, each stopped after its test:
    (pool, name -> launch line)."""
    engine, root = replace(vllm, method="dflash"), tmp_path_factory.mktemp("vllm-traps")  # no "dflash": see draft_copy
    launches, lines = {}, {}
    for name, (edit, spec_edit) in VLLM_CASES.items():
        cmd = engine.launch_command(smollm2_dir, port=free_port(), draft=draft_copy(root / name, edit), k=K)
        if spec_edit is not None:
            i = cmd.index("--speculative-config") + 1
            spec = json.loads(cmd[i])
            spec_edit(spec)
            cmd[i] = json.dumps(spec)
        launches[name], lines[name] = (engine, cmd, root / f"{name}.log"), shlex.join(cmd)
    wanted = [i.callspec.params["case"] for i in request.session.items if i.originalname in VLLM_TESTS]
    pool = ServerPool(launches, wanted, together=2)
    yield pool, lines
    pool.close()


@pytest.fixture
def served(dflash_servers, request):
    """(the case's launch line, its server's URL), the server stopped after the test."""
    pool, lines = dflash_servers
    case = request.node.callspec.params["case"]
    yield lines[case], pool.get(case).url
    pool.stop(case)


VLLM_TESTS = ("test_vllm_dflash_weak_but_used", "test_vllm_dflash_traps_caught_before_launch_and_at_runtime")


@pytest.mark.parametrize("case", ["intact"])
def test_vllm_dflash_weak_but_used(vllm, served, case):
    """The intact draft accepts about 1.07 on the probes: a weak-draft warning in DFlash's own words, not an error."""
    line, url = served
    assert diagnose(launch=line).exit_code == 0
    report, counters = counted(vllm, url, lambda: diagnose(launch=line, server=url, **PROBES))
    assert counters.drafts > 10 and counters.accept_length > ACCEPT_NOTHING
    weak = probe_finding(report)
    assert weak.severity == WARNING and "first slot" in " ".join(weak.evidence) and "--draft" in weak.fix
    assert not any("on-policy" in e or "EAGLE" in e for e in weak.evidence) and report.exit_code == 0


@pytest.mark.parametrize("case", ["mask_unk", "no_method", "no_aux"])
def test_vllm_dflash_traps_caught_before_launch_and_at_runtime(vllm, served, case):
    line, url = served
    static = diagnose(launch=line)
    if case == "no_aux":  # /health answered; the first request fails the proposer's assertion and kills the engine
        [error] = checks(static, "dflash_config", ERROR)
        assert "first request kills the engine" in error.title
        [failed] = checks(diagnose(launch=line, server=url, **CRASH), "probe", ERROR)
        assert "failed" in failed.title
        return
    report, counters = counted(vllm, url, lambda: diagnose(launch=line, server=url, **PROBES))
    assert counters.drafts > 10 and counters.accept_length <= ACCEPT_NOTHING  # it serves, drafting every round
    nothing = probe_finding(report)
    assert nothing.severity == ERROR and "contributes nothing" in nothing.title and report.exit_code == 1
    assert "mask_token_id" in nothing.evidence[-1] and "EAGLE" not in nothing.evidence[-1]
    if case == "mask_unk":  # in the vocabulary: only a warning before launch (the config is the only record)
        [warn] = checks(static, "dflash_config", WARNING)
        assert warn.title == "mask_token_id 0 is the target's unk_token_id"
    else:  # vLLM guesses 'draft_model' from the path; the runtime fix is the method, as before launch
        [error] = checks(static, "algorithm", ERROR)
        assert parse_launch(nothing.fix.splitlines()[1]).algorithm == "DFLASH"
        assert nothing.fix == error.fix


# ---- llama.cpp -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dflash_llamacpp(llamacpp, llamacpp_target):
    """llama.cpp as the tests run it, with the committed draft's GGUF (exported and checked once, cached)."""
    engine = DFlashLlamaCpp(threads=llamacpp.threads)
    return engine, engine.launch_command(llamacpp_target, port=free_port(), draft=DRAFT, k=K)


def line_with(cmd: list[str], **flags) -> list[str]:
    """The line with flag values replaced: spec_type= for --spec-type, md= for -md."""
    out = list(cmd)
    for key, value in flags.items():
        flag = "-md" if key == "md" else f"--{key.replace('_', '-')}"
        out[out.index(flag) + 1] = str(value)
    return out


def serve_and_diagnose(engine, cmd: list[str], log_dir: Path, probes: dict, count: bool = True):
    """`diagnose` of the line and its real server, and the server's own counters over it (count: False for a server
    the probes kill)."""
    cmd = line_with(cmd, port=free_port())
    line = shlex.join(cmd)
    with engine.serve(cmd, log_path=log_dir / "server.log") as server:
        run = lambda: diagnose(launch=line, server=server.url, **probes)  # noqa: E731
        return counted(engine, server.url, run) if count else (run(), None)


def test_llamacpp_dflash_weak_but_used_and_draft_simple_contributes_nothing(dflash_llamacpp, tmp_path):
    engine, cmd = dflash_llamacpp
    report, rounds = serve_and_diagnose(engine, cmd, tmp_path / "intact", PROBES)
    assert rounds.drafts > 10 and rounds.accept_length > ACCEPT_NOTHING
    assert probe_finding(report).severity == WARNING and report.exit_code == 0
    simple = line_with(cmd, spec_type="draft-simple")
    [error] = checks(diagnose(launch=shlex.join(simple)), "algorithm", ERROR)
    report, rounds = serve_and_diagnose(engine, simple, tmp_path / "simple", PROBES)
    assert rounds.drafts > 10 and rounds.accept_length <= ACCEPT_NOTHING  # the GGUF run as a plain draft model
    nothing = probe_finding(report)
    assert nothing.severity == ERROR and report.exit_code == 1
    # the runtime fix is the one before launch (on the line as served)
    assert nothing.fix.splitlines()[0] == error.fix.splitlines()[0] == "--spec-type draft-dflash"


def test_llamacpp_dflash_lines_whose_first_request_kills_the_server(dflash_llamacpp, converter, smollm2_dir, tmp_path):
    """--spec-type draft-eagle3 (the hand-over is 576 wide where the EAGLE-3 path expects 1728), and a GGUF without
    tokenizer.ggml.mask_token_id (the converter writes none when dflash_config has none): /health answers, the first
    request aborts the server. The doctor refuses both lines before launch, and its probe fails at runtime."""
    engine, cmd = dflash_llamacpp
    folder = draft_copy(tmp_path / "no-mask", mask(None))
    gguf = tmp_path / "no-mask.gguf"
    run_converter(
        [folder, "--target-model-dir", smollm2_dir, "--outtype", "bf16", "--outfile", gguf], "draft", converter
    )
    for name, broken in [("eagle3", line_with(cmd, spec_type="draft-eagle3")), ("no-mask", line_with(cmd, md=gguf))]:
        static = diagnose(launch=shlex.join(broken))
        assert static.exit_code == 1 and (checks(static, "algorithm", ERROR) or checks(static, "dflash_config", ERROR))
        report, _ = serve_and_diagnose(engine, broken, tmp_path / name, CRASH, count=False)
        [failed] = checks(report, "probe", ERROR)
        assert "failed" in failed.title, report.render()
