"""eagle3lab doctor on vLLM: its launch lines (no server), and each case vLLM accepts without complaint and then serves
badly, reproduced on a real vLLM server (SmolLM2 with a copy of the committed draft, k=2): the server answers while
accepting (about) no draft token, `diagnose` reports an ERROR from its /metrics, and the static checks catch the same
case before launch.

Found by experiment (vLLM 0.32 CPU, fp32, eager, 3 chat probes of 64 tokens; the committed draft gives 1.44 there):
no d2t -> 1.00; top-level eagle_aux_hidden_state_layer_ids [0, 1, 2] -> 1.02 ([5, 10, 20] -> 1.14); no "method" ->
/health answers, the first request kills the engine; architectures Qwen3ForCausalLM -> 1.37, built as
Eagle3Qwen3ForCausalLM (static check only: too close to 1.44 to assert at runtime); eagle_config ids [1, 14, 26]
(the trained layers in the trainers' convention, one layer early in vLLM's) -> 1.45 (a warning only);
draft config fields (FIELD_CASES, each measured); without effect: rope_theta 10000 (the target's is 100000) 1.44,
rope_scaling linear x4 1.46, num_hidden_layers 2 1.44 (vLLM drafts with the first layer only).
The bad servers start three at a time, once, and each stops after its test.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file, save_file

from conftest import TRAINED_DRAFT, ServerPool, counted, wanted_by
from eagle3lab.doctor.diagnosis import diagnose
from eagle3lab.doctor.findings import ERROR, OK, WARNING
from eagle3lab.doctor.launch import fix_flags
from eagle3lab.doctor.reading import parse_launch
from eagle3lab.paths import ROOT
from eagle3lab.serving.client import ServerClient, ServerError
from eagle3lab.serving.processes import free_port

K = 2
PROBES = {"probes": 2, "probe_tokens": 32, "timeout": 120}  # short: a broken draft makes each token slower
PROMPT = [{"role": "user", "content": "Explain in two sentences why the sky is blue."}]


def checks(report, check, severity=None):
    return [f for f in report.findings if f.check == check and (severity is None or f.severity == severity)]


def text(findings) -> str:
    return "\n".join(f.title + "\n" + "\n".join(f.evidence) + "\n" + (f.fix or "") for f in findings)


def broken_draft(folder: Path, *, config: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A copy of the committed draft with config.json keys set (None removes one) and tensors dropped."""
    source = ROOT / TRAINED_DRAFT
    folder.mkdir(parents=True)
    cfg = json.loads((source / "config.json").read_text())
    for key, value in (config or {}).items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    if drop:
        tensors = load_file(str(source / "model.safetensors"))
        save_file({k: v for k, v in tensors.items() if k not in drop}, str(folder / "model.safetensors"))
    else:
        shutil.copy(source / "model.safetensors", folder)
    return folder


def vllm_line(vllm, target, draft, *, port=8000, spec_edit=None) -> list[str]:
    """The vLLM command eagle3lab.engines.vllm.server writes, its --speculative-config edited by spec_edit(dict)."""
    cmd = vllm.launch_command(target, port=port, draft=draft, k=K if draft else 0)
    if spec_edit is not None:
        i = cmd.index("--speculative-config") + 1
        spec = json.loads(cmd[i])
        spec_edit(spec)
        cmd[i] = json.dumps(spec)
    return cmd


NO_METHOD = lambda s: s.pop("method")  # noqa: E731


# draft config fields vLLM serves silently: (config edit, the most it accepts); the comments give vLLM's accept length
# measured over the doctor's 2 probes of 32 tokens (1.44 for the intact draft: 1.15 on the first, 1.94 on the second, so
# one probe alone cannot tell norm_output's 1.15 from the intact draft)
FIELD_CASES = {
    "use_aux_hidden_state": ({"eagle_config": {"use_aux_hidden_state": False}}, 1.1),  # 1.02: fc never built
    "norm_before_residual": ({"norm_before_residual": True}, 1.15),  # 1.03: another network (SGLang ignores it)
    "norm_before_fc": ({"norm_before_fc": True}, 1.15),  # 1.07: a norm without weights
    "fc_norm": ({"fc_norm": True}, 1.15),  # 1.03: norms without weights
    "attention_bias": ({"attention_bias": True}, 1.1),  # 1.00: uninitialised biases
    "norm_output": ({"norm_output": True}, 1.4),  # 1.35: the second position's state is post-norm
    "num_attention_heads": ({"num_attention_heads": 18, "num_key_value_heads": 6, "head_dim": 32}, 1.4),  # 1.35
    "rms_norm_eps": ({"rms_norm_eps": 1.0}, 1.2),  # 1.09
}


@dataclasses.dataclass
class Bad:
    """One silent case: a broken copy of the committed draft, its launch line, and the real vLLM server of it."""

    draft: Path
    spec_edit: object = None
    line: str = ""
    url: str = ""


@pytest.fixture(scope="module")
def bad_servers(request, vllm, smollm2_dir, tmp_path_factory):
    """Real vLLM servers of the silent cases this run's tests ask for, started together on first use, each stopped
    after its test; (pool, name -> Bad). These tests come before the ones on the session's servers; the pool starts at
    most three at once."""
    root = tmp_path_factory.mktemp("bad")
    cases = {
        "nod2t": Bad(broken_draft(root / "nod2t", drop=("d2t", "t2d"))),
        "aux": Bad(broken_draft(root / "aux", config={"eagle_aux_hidden_state_layer_ids": [0, 1, 2]})),
        # the folder keeps the committed draft's name: vLLM guesses the method from it
        "no_method": Bad(broken_draft(root / "no_method" / "smollm2-original-6960"), NO_METHOD),
        **{field: Bad(broken_draft(root / field, config=edit)) for field, (edit, _) in FIELD_CASES.items()},
    }
    launches = {}
    for name, case in cases.items():
        cmd = vllm_line(vllm, smollm2_dir, case.draft, port=free_port(), spec_edit=case.spec_edit)
        case.line = shlex.join(cmd)
        launches[name] = (vllm, cmd, root / f"{name}.log")
    # in the order the tests ask: the served cases' tests come before the field test in this file
    wanted = [n.removesuffix("_server") for n in wanted_by(request, SERVED_CASES)]
    wanted += [i.callspec.params["field"] for i in request.session.items if i.originalname == FIELD_TEST]
    pool = ServerPool(launches, wanted)
    yield pool, cases
    pool.close()


SERVED_CASES = ("nod2t_server", "aux_server", "no_method_server")
FIELD_TEST = "test_draft_config_fields_vllm_serves_silently"


def _bad(bad_servers, name: str) -> Bad:
    pool, cases = bad_servers
    cases[name].url = pool.get(name).url
    return cases[name]


@pytest.fixture
def nod2t_server(bad_servers):
    yield _bad(bad_servers, "nod2t")
    bad_servers[0].stop("nod2t")


@pytest.fixture
def aux_server(bad_servers):
    yield _bad(bad_servers, "aux")
    bad_servers[0].stop("aux")


@pytest.fixture
def no_method_server(bad_servers):
    yield _bad(bad_servers, "no_method")
    bad_servers[0].stop("no_method")


def served(vllm, url):
    """One greedy chat answer and the spec_decode counters over it (None: the server does not speculate)."""
    with ServerClient(url, timeout=120) as client:
        before = vllm.counters(client)
        answer = client.chat(PROMPT, max_tokens=32)
        after = vllm.counters(client)
    return answer, (after - before if after is not None else None)


# ---- launch lines (no server) ---------------------------------------------------------------------------------------


def test_vllm_launch_forms():
    a = parse_launch(
        "VLLM_CPU_KVCACHE_SPACE=2 vllm serve /m/t -tp 2 --max-model-len 32k --speculative-config "
        """'{"method": "eagle3", "model": "/m/d", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 1}'"""
    )
    assert a.engine == "vllm" and a.notes == []
    assert (a.model_path, a.tp_size, a.context_length, a.algorithm, a.draft_path) == (
        "/m/t",
        2,
        32000,
        "EAGLE3",
        "/m/d",
    )
    assert (a.num_steps, a.topk, a.num_draft_tokens) == (4, 1, 5)  # k=4: a chain, 5 tokens verified per round
    b = parse_launch(
        "python3 -m vllm.entrypoints.openai.api_server --model=/m/t --max_model_len=4096 "
        """--speculative_config='{"method":"eagle","model":"/m/d","num_speculative_tokens":2}'"""
    )
    assert (b.engine, b.model_path, b.context_length, b.algorithm, b.num_steps) == ("vllm", "/m/t", 4096, "EAGLE", 2)
    c = parse_launch(
        "vllm serve --model /m/t --speculative-config.method eagle3 --speculative-config.model /m/d "
        "--speculative-config.num_speculative_tokens 3"
    )
    assert (c.model_path, c.algorithm, c.draft_path, c.num_steps) == ("/m/t", "EAGLE3", "/m/d", 3)
    d = parse_launch("""vllm serve /m/t -sc '{"model": "/m/d", "num_speculative_tokens": 2}'""")
    assert d.algorithm == "DRAFT_MODEL" and "vLLM infers 'draft_model'" in d.notes[0]  # vLLM guesses by path
    assert parse_launch("""vllm serve /m/t -sc '{"model": "/m/EAGLE3-x"}'""").algorithm == "EAGLE3"
    assert not parse_launch("vllm serve /m/t --port 8000").speculative


def test_vllm_unknown_flag_is_an_error_and_the_fix_uses_the_flag_meant():
    spec = """'{"method": "eagle3", "model": "/m/d", "num_speculative_tokens": 2}'"""
    wrong = parse_launch(f"vllm serve /m/t --max-model-len 2048 --speculative-confg {spec}")
    assert wrong.errors == ["vLLM 0.32 has no --speculative-confg: did you mean --speculative-config?"]
    assert wrong.algorithm == "EAGLE3" and wrong.num_steps == 2  # read on as meant: speculation is not silently off
    report = diagnose(launch=f"vllm serve org/t --max-model-len 2048 --speculative-confg {spec}")
    [launch] = checks(report, "launch", ERROR)
    assert launch.fix == f"vllm serve org/t --max-model-len 2048 --speculative-config {spec}"
    assert report.exit_code == 1 and all("confg" not in (f.fix or "") for f in report.findings)
    # underscores, prefixes and dotted keys are vLLM's own forms; an option with no near name is dropped
    forms = parse_launch("vllm serve /m/t --max_model_len=4096 --max-num-seq 8 --speculative_config.method eagle3")
    assert forms.errors == [] and forms.context_length == 4096
    dropped = parse_launch("vllm serve /m/t --xyzzy 3 --port 8000")
    assert dropped.errors == ["vLLM 0.32 has no --xyzzy (dropped from the corrected line)"]
    assert dropped.argv == ["vllm", "serve", "/m/t", "--port", "8000"]


@pytest.mark.parametrize(
    "config, error",
    [
        ("{method:eagle3}", "--speculative-config is not JSON"),
        ('["eagle3"]', "--speculative-config must be a JSON object"),
        ('{"method": "eagle3", "model": "/m/d", "num_speculative_tokens": "two"}', '"two" is not an integer'),
    ],
)
def test_vllm_speculative_config_vllm_cannot_read_is_an_error(config, error):
    parsed = parse_launch(f"vllm serve /m/t --speculative-config {shlex.quote(config)}")
    [message] = parsed.errors
    assert error.replace('"two"', "'two'") in message
    assert checks(diagnose(launch=f"vllm serve org/t --speculative-config {shlex.quote(config)}"), "launch", ERROR)


def test_vllm_unknown_speculative_config_key_or_method_is_an_error():
    """SpeculativeConfig forbids extra fields and takes only its methods: vLLM refuses both before it starts."""
    wrong = parse_launch(
        """vllm serve /m/t --speculative-config '{"metod": "eagel3", "model": "/m/d", "num_speculative_tokens": 2}'"""
    )
    assert wrong.errors == [
        "--speculative-config metod: vLLM 0.32 has no such key; did you mean method?",
        '--speculative-config "method" eagel3: vLLM 0.32 has no such method; did you mean eagle3?',
    ]
    assert wrong.spec_config["method"] == "eagle3" and json.loads(wrong.argv[-1]) == wrong.spec_config
    dotted = parse_launch("vllm serve /m/t --speculative-config.methd=eagle3 --speculative-config.model /m/d")
    assert "did you mean method?" in dotted.errors[0] and dotted.argv[3] == "--speculative-config.method=eagle3"
    assert dotted.algorithm == "EAGLE3"


def test_vllm_known_flags_are_vllms_own(vllm):
    """The doctor's lists are what vLLM 0.32's own server parser and SpeculativeConfig take, no more and no less."""
    from eagle3lab.engines.vllm.environment import python_path
    from eagle3lab.engines.vllm.fields import METHODS, SPEC_KEYS
    from eagle3lab.engines.vllm.launch_line import KNOWN

    code = """
import dataclasses, typing
from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

def literals(t):
    return [n for a in typing.get_args(t) for n in (literals(a) if typing.get_origin(a) is typing.Literal else [a])]

parser = make_arg_parser(FlexibleArgumentParser())
print(*{o for a in parser._actions for o in a.option_strings})
print(*{f.name for f in dataclasses.fields(SpeculativeConfig) if f.init})
print(*literals(SpeculativeMethod))
"""
    run = subprocess.run([python_path(), "-c", code], capture_output=True, text=True, timeout=300, check=True)
    options, keys, methods = run.stdout.splitlines()[-3:]
    assert set(options.split()) == KNOWN.names
    assert set(keys.split()) == set(SPEC_KEYS) and set(methods.split()) == set(METHODS)


def test_vllm_fix_is_the_corrected_speculative_config():
    line = (
        "vllm serve /m/t --port 8000 --speculative_config "
        """'{"method": "eagle", "model": "/m/d", "num_speculative_tokens": 4, "max_model_len": 2048}' """
        "--max-model-len=8192"
    )
    first, whole = fix_flags(parse_launch(line), algorithm="EAGLE3", context_length=4096).splitlines()
    spec = {"method": "eagle3", "model": "/m/d", "num_speculative_tokens": 4, "max_model_len": 2048}
    assert first == f"--speculative-config '{json.dumps(spec)}' --max-model-len 4096"
    fixed = parse_launch(whole)
    assert fixed.spec_config == spec and fixed.context_length == 4096 and fixed.notes == []
    assert whole.startswith("vllm serve /m/t --port 8000 --speculative-config ") and "--max-model-len=4096" in whole
    # the dotted spelling is replaced by one JSON option
    dotted = parse_launch("vllm serve /m/t --speculative-config.method eagle --speculative-config.model /m/d")
    whole = fix_flags(dotted, algorithm="EAGLE3").splitlines()[1]
    assert "speculative-config." not in whole and parse_launch(whole).spec_config["method"] == "eagle3"


def test_eagle_method_with_an_eagle3_draft_is_flagged_before_launch(vllm, smollm2_dir):
    """vLLM refuses to start here ("Model architectures ['EagleLlamaForCausalLMEagle3'] are not supported"); the
    doctor says so before launch and gives the corrected --speculative-config."""
    cmd = vllm_line(vllm, smollm2_dir, ROOT / TRAINED_DRAFT, spec_edit=lambda s: s.update(method="eagle"))
    report = diagnose(launch=shlex.join(cmd))
    [err] = checks(report, "algorithm", ERROR)
    assert "vLLM will not start" in err.title and "EagleLlamaForCausalLMEagle3" in text([err])
    assert '"method": "eagle3"' in err.fix.splitlines()[0]
    fixed = diagnose(launch=err.fix.splitlines()[1])
    assert fixed.exit_code == 0, fixed.render()
    assert checks(fixed, "architecture", OK) and checks(fixed, "aux_layers", OK)


def test_eagle3_without_a_draft_is_flagged_before_launch_and_vllm_refuses_it(vllm, smollm2_dir, tmp_path):
    """A --speculative-config that asks for eagle3 and names no "model": vLLM 0.32 refuses to start, as the doctor
    says before launch; the fix names the draft."""
    cmd = vllm_line(vllm, smollm2_dir, ROOT / TRAINED_DRAFT, spec_edit=lambda s: s.pop("model"))
    report = diagnose(launch=shlex.join(cmd))
    [err] = checks(report, "draft", ERROR)
    assert "names no draft" in err.title and "without speculative model" in text([err])
    assert parse_launch(err.fix.splitlines()[1]).draft_path == "DRAFT"
    cmd[cmd.index("--port") + 1] = str(free_port())
    with pytest.raises(ServerError, match="exited with code"), vllm.serve(cmd, log_path=tmp_path / "server.log"):
        pass
    assert "num_speculative_tokens was provided but without speculative model" in (tmp_path / "server.log").read_text()


def test_missing_k_and_short_draft_positions(vllm, smollm2_dir, tmp_path):
    draft = broken_draft(tmp_path / "short", config={"max_position_embeddings": 1024})
    cmd = vllm_line(vllm, smollm2_dir, draft, spec_edit=lambda s: s.pop("num_speculative_tokens"))
    report = diagnose(launch=shlex.join(cmd))
    [k] = checks(report, "spec_params", ERROR)
    assert "num_speculative_tokens" in k.title and '"num_speculative_tokens": 3' in k.fix
    [ctx] = checks(report, "context_length", ERROR)
    assert "stop at 1024" in ctx.title and "--max-model-len 2048" in text([ctx])
    assert parse_launch(ctx.fix.splitlines()[-1].removeprefix("or serve with ")).context_length == 1024


def test_architecture_names_vllm_builds_another_class_from(vllm, smollm2_dir, tmp_path):
    """Qwen3ForCausalLM becomes Eagle3Qwen3ForCausalLM: vLLM starts and serves (1.37 measured, vs 1.44) with q_norm
    and k_norm the checkpoint lacks; a name vLLM does not know makes it refuse to start."""
    for name, arch, needle in [
        ("qwen3", "Qwen3ForCausalLM", "builds the draft as Eagle3Qwen3ForCausalLM"),
        ("mistral", "MistralForCausalLM", "refuses to start"),
    ]:
        draft = broken_draft(tmp_path / name, config={"architectures": [arch]})
        report = diagnose(launch=shlex.join(vllm_line(vllm, smollm2_dir, draft)))
        [err] = checks(report, "architecture", ERROR)
        assert needle in err.title and '"architectures": ["LlamaForCausalLMEagle3"]' in err.fix


def test_eagle_config_ids_read_one_layer_early_by_vllm(vllm, smollm2_dir, tmp_path):
    """[1, 14, 26] are the trained layers hidden_states[2, 15, 27] as SGLang reads them; vLLM reads hidden_states[1,
    14, 26] (measured: no loss for this draft, hence a warning); the top-level key vLLM reads first fixes it."""
    draft = broken_draft(tmp_path / "ids", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}})
    report = diagnose(launch=shlex.join(vllm_line(vllm, smollm2_dir, draft)))
    [warn] = checks(report, "aux_layers", WARNING)
    assert "one layer earlier" in warn.title and "[2, 15, 27] at the top level" in warn.fix
    sglang = f"sglang serve {smollm2_dir} --speculative-algorithm EAGLE3 --speculative-draft-model-path {draft}"
    assert not checks(diagnose(launch=sglang), "aux_layers", WARNING)
    fixed = broken_draft(
        tmp_path / "fixed",
        config={
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]},
            "eagle_aux_hidden_state_layer_ids": [2, 15, 27],
        },
    )
    assert diagnose(launch=shlex.join(vllm_line(vllm, smollm2_dir, fixed))).exit_code == 0


# ---- real vLLM servers ----------------------------------------------------------------------------------------------


def test_draft_without_d2t_accepts_nothing(vllm, smollm2_dir, nod2t_server):
    """draft_vocab_size 4096 < 49152 and no d2t: vLLM keeps its zero-initialised map, every draft id is read as target
    id 0..4095, and no draft token is accepted."""
    bad = nod2t_server
    static = diagnose(launch=shlex.join(vllm_line(vllm, smollm2_dir, bad.draft)))
    assert "no d2t tensor" in checks(static, "draft_vocab", ERROR)[0].title
    report, counters = counted(vllm, bad.url, lambda: diagnose(launch=bad.line, server=bad.url, **PROBES))
    assert counters.drafts > 10 and counters.accept_length <= 1.05  # it answers the probes, speculating
    assert report.exit_code == 1
    [probe] = [f for f in checks(report, "accept_length", ERROR) if f.title.startswith("probe accept length")]
    assert "contributes nothing" in probe.title


def test_top_level_aux_ids_capture_other_layers(vllm, smollm2_dir, aux_server):
    """The top-level eagle_aux_hidden_state_layer_ids is vLLM's own key, read before eagle_config's and ignored by
    SGLang: [0, 1, 2] hands the draft layers it was never trained on (it was trained on hidden_states[2, 15, 27])."""
    bad = aux_server
    static = diagnose(launch=shlex.join(vllm_line(vllm, smollm2_dir, bad.draft)))
    [err] = checks(static, "aux_layers", ERROR)
    assert "other target layers" in err.title and "hidden_states[0], hidden_states[1], hidden_states[2]" in text([err])
    assert '"eagle_aux_hidden_state_layer_ids": [2, 15, 27] at the top level' in err.fix
    report, counters = counted(vllm, bad.url, lambda: diagnose(launch=bad.line, server=bad.url, **PROBES))
    assert counters.drafts > 10 and counters.accept_length <= 1.1
    assert checks(report, "accept_length", ERROR) and report.exit_code == 1


def test_no_method_starts_then_dies_on_the_first_request(vllm, smollm2_dir, no_method_server):
    """Without "method" vLLM guesses from the path ("smollm2-original-6960": neither 'eagle-' nor 'eagle3') and runs
    the EAGLE-3 checkpoint as a standalone draft model: /health answers, the first request kills the engine."""
    bad = no_method_server
    static = diagnose(launch=shlex.join(vllm_line(vllm, smollm2_dir, bad.draft, spec_edit=NO_METHOD)))
    [err] = checks(static, "algorithm", ERROR)
    assert "DRAFT_MODEL" in err.title and "first request kills the engine" in text([err])
    assert parse_launch(err.fix.splitlines()[1]).algorithm == "EAGLE3"
    report = diagnose(launch=bad.line, server=bad.url, **PROBES)
    with pytest.raises((ServerError, httpx.HTTPError)):
        served(vllm, bad.url)
    [failed] = checks(report, "probe", ERROR)
    assert "failed" in failed.title and "500" in text([failed])


@pytest.mark.parametrize("field", sorted(FIELD_CASES))
def test_draft_config_fields_vllm_serves_silently(vllm, smollm2_dir, bad_servers, field):
    """Each field starts a server that drafts every round and is accepted far less than the intact draft (vLLM's own
    counters over the doctor's probes); the doctor names the field before launch with vLLM's consequence first, and
    its probe sees the loss."""
    bad = _bad(bad_servers, field)
    try:
        static = diagnose(launch=shlex.join(vllm_line(vllm, smollm2_dir, bad.draft)))
        [found] = [f for f in checks(static, "draft_fields") if f.title.split()[0].endswith(field)]
        assert found.severity in (ERROR, WARNING) and found.evidence[1].startswith("vLLM: ")
        report, counters = counted(vllm, bad.url, lambda: diagnose(launch=bad.line, server=bad.url, **PROBES))
        assert counters.drafts > 10 and counters.accept_length <= FIELD_CASES[field][1]
        [probe] = [f for f in checks(report, "accept_length") if f.title.startswith("probe accept length")]
        assert probe.severity != OK
    finally:
        bad_servers[0].stop(field)


def test_good_server_is_used(vllm, vllm_eagle3, smollm2_dir):
    port = int(vllm_eagle3.url.rsplit(":", 1)[1])
    line = shlex.join(vllm.launch_command(smollm2_dir, port=port, draft=ROOT / TRAINED_DRAFT, k=K))
    report = diagnose(launch=line, server=vllm_eagle3.url, **(PROBES | {"probe_tokens": 64}))
    assert report.exit_code == 0, report.render()
    assert checks(report, "server", OK) and "vLLM server" in checks(report, "server", OK)[0].title
    probe = [f for f in checks(report, "accept_length") if f.title.startswith("probe accept length")]
    assert len(probe) == 1 and probe[0].severity != ERROR  # 1.4-1.6 here: a weak-draft warning below 2.0
    assert float(probe[0].title.split()[3].rstrip(":")) > 1.15


def test_server_without_speculation_is_its_own_finding(vllm, vllm_baseline, smollm2_dir):
    url = vllm_baseline.url  # the session's vLLM without a draft
    assert served(vllm, url)[1] is None  # no spec_decode counters at all
    alone = diagnose(server=url, **PROBES)
    expecting = diagnose(server=url, draft=ROOT / TRAINED_DRAFT, target=str(smollm2_dir), **PROBES)
    [off] = checks(alone, "speculation")
    assert off.severity == WARNING and "speculation is off" in off.title and not checks(alone, "accept_length")
    assert alone.exit_code == 0
    [off] = checks(expecting, "speculation", ERROR)
    assert "--speculative-config" in off.fix and expecting.exit_code == 1
