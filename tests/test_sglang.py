"""eagle3lab.serving (launch, bench, processes, sglang): launch commands, the server lifecycle (against a real
`transformers serve`), and the benchmark against recorded SGLang /generate payloads. SGLang cannot run on this CPU."""

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from eagle3lab import paths
from eagle3lab.doctor.diagnosis import diagnose
from eagle3lab.doctor.findings import ERROR
from eagle3lab.doctor.reading import parse_launch
from eagle3lab.engines.sglang import cli as sglang
from eagle3lab.engines.sglang.bench import add_speedups, bench_server
from eagle3lab.engines.sglang.launch import command_for_config, launch_command, parse_config
from eagle3lab.io import InputError
from eagle3lab.serving.client import ServerError
from eagle3lab.serving.processes import free_port, start_server, transformers_serve_command

FIXTURES = Path(__file__).parent / "fixtures" / "sglang"
PROFILE = paths.ROOT / "params" / "gpu-llama3-8b.yaml"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


# ---- launch commands ---------------------------------------------------------------------------------------------


def test_launch_command_flags_and_eagle3_default():
    cmd = launch_command(
        "meta-llama/Llama-3.1-8B-Instruct",
        port=30001,
        tp=2,
        draft="/d",
        steps=3,
        topk=1,
        num_draft_tokens=4,
        context_length=8192,
        mem_fraction=0.8,
        cuda_graph_max_bs=8,
        extra=["--attention-backend", "fa3"],
    )
    assert cmd[:3] == ["python", "-m", "sglang.launch_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags == {
        "--model-path": "meta-llama/Llama-3.1-8B-Instruct",
        "--host": "127.0.0.1",
        "--port": "30001",
        "--tp-size": "2",
        "--speculative-algorithm": "EAGLE3",
        "--speculative-draft-model-path": "/d",
        "--speculative-num-steps": "3",
        "--speculative-eagle-topk": "1",
        "--speculative-num-draft-tokens": "4",
        "--context-length": "8192",
        "--mem-fraction-static": "0.8",
        "--cuda-graph-max-bs": "8",
        "--attention-backend": "fa3",
    }
    parsed = parse_launch(cmd)  # the doctor reads back what we built
    assert (parsed.algorithm, parsed.tp_size, parsed.num_steps, parsed.topk, parsed.num_draft_tokens) == (
        "EAGLE3",
        2,
        3,
        1,
        4,
    )
    # no draft: no speculative flag at all; a draft alone leaves steps/topk/ndraft to SGLang
    plain = launch_command("m", port=1)
    assert not any(a.startswith("--speculative") for a in plain) and plain[plain.index("--tp-size") + 1] == "1"
    assert "--speculative-num-steps" not in launch_command("m", port=1, draft="/d")
    eagle = launch_command("m", port=1, draft="/d", algorithm="eagle")
    assert eagle[eagle.index("--speculative-algorithm") + 1] == "EAGLE"  # what the doctor must catch, built faithfully


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(draft="/d", steps=3, topk=1), "missing: num_draft_tokens"),
        (dict(draft="/d", num_draft_tokens=4), "missing: steps, topk"),
        (dict(steps=3, topk=1, num_draft_tokens=4), "without a draft"),
        (dict(draft="/d", steps=0, topk=1, num_draft_tokens=1), ">= 1"),
        (dict(tp=0), "tp must be >= 1"),
        (dict(mem_fraction=1.5), "mem_fraction"),
    ],
)
def test_launch_command_rejects_bad_settings(kwargs, message):
    with pytest.raises(InputError, match=message):
        launch_command("m", port=1, **kwargs)


def test_parse_config_uses_the_engines_tree_rule():
    # any batch (requests in flight); steps/topk/ndraft by eagle3lab.decoding.config: 1 + topk + (steps - 1) topk^2
    assert parse_config("4,3,2,8") == (4, 3, 2, 8)
    assert parse_config("1,3,2,11") == (1, 3, 2, 11) and parse_config("1,0,0,0") == (1, 0, 0, 0)
    with pytest.raises(InputError, match="between 2 and 11"):
        parse_config("1,3,2,12")
    with pytest.raises(InputError, match="steps \\+ 1 = 4"):
        parse_config("1,3,1,5")
    with pytest.raises(InputError, match="batch"):
        parse_config("0,3,1,4")
    with pytest.raises(InputError, match="four integers"):
        parse_config("1,3,1")


def test_transformers_serve_command_takes_a_device():
    cmd = transformers_serve_command("/m", 8000, device="cpu")
    assert cmd[1:3] == ["serve", "/m"] and cmd[cmd.index("--device") + 1] == "cpu"
    auto = transformers_serve_command("/m", 8000)
    assert auto[auto.index("--device") + 1] == ("cuda:0" if torch.cuda.is_available() else "cpu")


def test_doctor_passes_our_command_and_flags_eagle(project_draft):
    target, draft = project_draft
    good = launch_command(str(target), port=30000, draft=draft, steps=3, topk=1, num_draft_tokens=4, context_length=256)
    report = diagnose(launch=good)
    assert report.exit_code == 0, report.render()
    bad = diagnose(
        launch=launch_command(
            str(target),
            port=30000,
            draft=draft,
            algorithm="EAGLE",
            steps=3,
            topk=1,
            num_draft_tokens=4,
            context_length=256,
        )
    )
    assert bad.exit_code == 1 and any(f.check == "algorithm" and f.severity == ERROR for f in bad.findings)


# ---- the GPU profile -----------------------------------------------------------------------------------------------


def test_gpu_profile_matches_reference_params_and_builds_commands():
    reference = yaml.safe_load(paths.PARAMS.read_text())
    gpu = yaml.safe_load(PROFILE.read_text())
    assert {k: sorted(v) for k, v in gpu.items() if k != "sglang"} == {k: sorted(v) for k, v in reference.items()}
    assert gpu["common"]["target"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert gpu["regenerate"]["backend"] == "openai" and gpu["regenerate"]["server_addresses"]
    assert (gpu["train_draft"]["ttt_length"], gpu["train_draft"]["draft_vocab_size"]) == (7, 32000)
    for config in gpu["benchmark"]["configs"]:
        parse_config(config)
    target, settings, _ = sglang.load_profile(PROFILE)
    cmd = command_for_config(settings, target, "4,3,1,4")
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert cmd[cmd.index("--cuda-graph-max-bs") + 1] == str(max(4, settings["cuda_graph_max_bs"]))
    assert "--speculative-algorithm" not in command_for_config(settings, target, "1,0,0,0")


def test_cli_launch_command_and_bad_profile(tmp_path, capsys):
    assert sglang.main(["launch-command", "--params", str(PROFILE), "--config", "1,5,1,6"]) == 0
    line = capsys.readouterr().out.strip()
    parsed = parse_launch(line)
    assert (parsed.model_path, parsed.num_steps, parsed.num_draft_tokens) == ("meta-llama/Llama-3.1-8B-Instruct", 5, 6)
    broken = yaml.safe_load(PROFILE.read_text())
    del broken["sglang"]["port"]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(broken))
    assert sglang.main(["launch-command", "--params", str(tmp_path / "p.yaml")]) == 2
    assert "missing key(s) ['port']" in capsys.readouterr().err
    assert sglang.main(["launch-command", "--params", str(PROFILE), "--config", "1,3,0,4"]) == 2


# ---- bench_server on recorded SGLang payloads ------------------------------------------------------------------------


def recorded_sglang(answers: dict[str, str], seen: list):
    """A MockTransport answering /generate with recorded payloads, chosen by the prompt text."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/generate":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        seen.append(body)
        key = body.get("text") or str(body.get("input_ids"))
        return httpx.Response(200, json=fixture(answers[key]))

    return httpx.MockTransport(handler)


def test_accept_length_is_completion_over_verify():
    seen = []
    transport = recorded_sglang(
        {"a": "generate_eagle3.json", "b": "generate_eagle_bypassed.json", "[1, 2, 3]": "generate_eagle3.json"}, seen
    )
    prompts = [
        {"id": "p1", "set": "mtbench", "text": "a"},
        {"id": "p2", "set": "mtbench", "text": "b"},
        {"id": "p3", "set": "gsm8k", "input_ids": [1, 2, 3]},
    ]
    result = bench_server(
        "http://sglang.test:30000", prompts, 64, concurrency=2, config="2,3,1,4", draft="/d", transport=transport
    )
    assert {b["sampling_params"]["max_new_tokens"] for b in seen} == {64}
    assert {b["sampling_params"]["temperature"] for b in seen} == {0.0}
    assert [b for b in seen if "input_ids" in b] == [
        {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0, "max_new_tokens": 64}}
    ]
    rows = {r["set"]: r for r in result["rows"]}
    assert rows["mtbench"]["accept_length"] == pytest.approx((64 + 64) / (30 + 64))
    assert rows["mtbench"]["verify_count"] == 94 and rows["mtbench"]["completion_tokens"] == 128
    assert rows["gsm8k"]["accept_length"] == pytest.approx(64 / 30)
    assert rows["gsm8k"]["accept_length"] == pytest.approx(
        fixture("generate_eagle3.json")["meta_info"]["spec_accept_length"], abs=1e-3
    )
    assert result["meta"]["api"] == "generate" and rows["mtbench"]["config"] == "2,3,1,4"
    # the same columns as eagle3lab.benchmark.run rows, so both engines go in one table
    bench_keys = {
        "set",
        "system",
        "config",
        "draft",
        "mode",
        "prompts",
        "completion_tokens",
        "seconds",
        "tokens_per_s",
        "accept_length",
        "sglang_accept_length",
        "verify_count",
        "speedup_vs_baseline",
        "speedup_vs_hf_generate",
        "identical_rate",
        "divergences",
        "position_acceptance",
        "time_split",
    }
    assert bench_keys <= set(rows["gsm8k"])
    assert [p["accept_length"] for p in result["per_prompt"] if p["id"] == "p1"] == [pytest.approx(64 / 30)]


def test_no_spec_verify_ct_means_speculation_off_not_one():
    result = bench_server(
        "http://sglang.test", [{"text": "a"}], 64, transport=recorded_sglang({"a": "generate_no_spec.json"}, [])
    )
    [row] = result["rows"]
    assert row["accept_length"] is None and row["verify_count"] is None and row["completion_tokens"] == 64
    bypassed = bench_server(
        "http://sglang.test", [{"text": "a"}], 64, transport=recorded_sglang({"a": "generate_eagle_bypassed.json"}, [])
    )
    assert bypassed["rows"][0]["accept_length"] == 1.0  # speculating, nothing accepted: a different finding


def test_chat_fallback_when_generate_is_absent():
    seen = []

    def handler(request):
        seen.append(request.url.path)
        if request.url.path == "/v1/chat/completions":
            body = json.loads(request.content)
            assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 64
            return httpx.Response(200, json=fixture("chat_completion_plain.json"))
        return httpx.Response(404, json={"detail": "Not Found"})

    tok = type("Tok", (), {"apply_chat_template": lambda self, m, **kw: "<|user|>" + m[0]["content"]})()
    result = bench_server(
        "http://x", ["hi", "hi"], 64, model="m", tokenizer=tok, transport=httpx.MockTransport(handler)
    )
    assert seen == ["/generate", "/v1/chat/completions", "/v1/chat/completions"]  # /generate probed once
    [row] = result["rows"]
    assert row["api"] == "chat" and row["completion_tokens"] == 128 and row["accept_length"] is None


def test_add_speedups_by_set_and_batch():
    rows = [
        {"set": "s", "config": "1,0,0,0", "tokens_per_s": 100.0},
        {"set": "s", "config": "1,3,1,4", "tokens_per_s": 210.0},
        {"set": "s", "config": "4,3,1,4", "tokens_per_s": 300.0},
    ]
    add_speedups(rows)
    assert [r["speedup_vs_baseline"] for r in rows] == [1.0, 2.1, None]


# ---- a real server process: `transformers serve` -------------------------------------------------------------------


def test_start_server_waits_for_health_benches_and_stops(tiny_target, tmp_path):
    port = free_port()
    exe = Path(sys.executable).with_name("transformers")
    cmd = [str(exe), "serve", tiny_target, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with start_server(cmd, url, timeout=240, log_path=tmp_path / "serve.log") as server:
        assert server.process.poll() is None
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        result = bench_server(
            url,
            [{"id": "q", "set": "mtbench", "messages": [{"role": "user", "content": "Hello"}]}],
            8,
            model=tiny_target,
        )
    assert server.process.poll() is not None  # stopped, with its whole process group
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)
    [row] = result["rows"]
    assert result["meta"]["api"] == "chat"  # transformers serve has no /generate
    assert row["accept_length"] is None and row["verify_count"] is None
    assert 0 < row["completion_tokens"] <= 8 and row["tokens_per_s"] > 0


def test_start_server_reports_early_exit_with_log_tail(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('loading weights'); print('CUDA error: no GPU found'); sys.exit(3)"]
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ServerError) as err, start_server(cmd, url, timeout=60, log_path=tmp_path / "x.log"):
        pass
    msg = str(err.value)
    assert "exited with code 3" in msg and "CUDA error: no GPU found" in msg and str(tmp_path / "x.log") in msg


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")  # a killed orphan may linger as a zombie until init reaps it


def test_start_server_times_out_and_kills_the_process_group(tmp_path):
    # like SGLang, the server forks a worker: the worker must die with it
    script = (
        "import os, subprocess, sys, time; "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        "print('pids', os.getpid(), w.pid, flush=True); print('still loading', flush=True); time.sleep(600)"
    )
    log = tmp_path / "y.log"
    with (
        pytest.raises(ServerError, match="did not answer .* within 6 s(.|\n)*still loading"),
        start_server(
            [sys.executable, "-c", script],
            f"http://127.0.0.1:{free_port()}",
            timeout=6.0,
            poll=0.2,
            log_path=log,
            stop_grace=5,
        ),
    ):
        pass
    pids = [int(x) for x in log.read_text().split("pids", 1)[1].split()[:2]]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)
