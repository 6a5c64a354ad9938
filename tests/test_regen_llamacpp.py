"""`eagle3lab regen --backend llamacpp` with a real llama-server, which the run starts itself on the target's GGUF
(bf16, or f32 on a CPU without bf16 arithmetic): the server is killed with SIGKILL mid-run and does not come back,
so the run ends with an error that says to rerun with --resume, the records written stay, and the rerun (a fresh
server) finishes with nothing lost, duplicated or rewritten."""

import json
import os
import signal
from pathlib import Path

import pytest

from eagle3lab.engines.llamacpp.gguf import target_weights
from eagle3lab.io import InputError
from test_regen import _run_cli, _wait_for_lines, write_rows
from test_regen_vllm import _lines

N = 6


def _rows() -> list[dict]:
    # Open-ended prompts: answers run to --max-new-tokens, so the run lasts long enough to be interrupted.
    rows = [
        {"id": f"l{i}", "conversations": [{"role": "user", "content": f"Write a long story about a robot named R{i}."}]}
        for i in range(N)
    ]
    # over the slot's 256-token context: an over-length skip, never a request the server refuses
    rows.append({"id": "too-long", "conversations": [{"role": "user", "content": "word " * 300}]})
    return rows


def _regen(path: Path, out: Path, *extra: str):
    # one thread, as the llamacpp fixture runs llama-server beside make test's other worker
    args = ["--backend", "llamacpp", "--threads", "1", "--concurrency", "2", "--max-context", "256"]
    args += ["--input", str(path), "--output", str(out), "--max-new-tokens", "24", "--max-turns", "1"]
    return _run_cli([*args, "--retries", "1", "--backoff", "0.05", "--no-progress", *extra])


def test_llamacpp_killed_mid_run_then_resume(tmp_path, llamacpp):
    path = write_rows(tmp_path / "in.jsonl", _rows())
    out, errors, skipped = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl", tmp_path / "out.skipped.jsonl"
    proc = _regen(path, out)
    try:
        _wait_for_lines(out, 2, proc)
        server_pid = json.loads((tmp_path / "out.progress.json").read_text())["server_pid"]
        os.kill(server_pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr  # no server: the run ends at once, it does not fail job after job
    assert f"llama-server (pid {server_pid}) exited with code -9" in stderr and "Rerun with --resume" in stderr
    assert str(tmp_path / "out.server.log") in stderr
    written, failed = out.read_bytes(), _lines(errors)
    done = [r["id"] for r in _lines(out)]
    assert 2 <= len(done) < N and len(failed) <= 2, "the kill lands mid-run; only the requests in flight fail"
    assert not set(done) & {e["id"] for e in failed}
    assert [r["id"] for r in _lines(skipped)] == ["too-long"]
    assert "exceeds the context of 256 tokens" in _lines(skipped)[0]["reason"]
    assert not (tmp_path / "out.lock").exists()  # the run's lock went with it

    proc = _regen(path, out, "--resume")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert f"input {N + 1} = success {N} + error 0 + skipped 1 [OK]" in stdout
    after = _lines(out)
    assert out.read_bytes().startswith(written)  # the records from before the kill, byte for byte
    assert sorted(r["id"] for r in after) == sorted(f"l{i}" for i in range(N)) and len(after) == N
    assert _lines(errors) == [] and [r["id"] for r in _lines(skipped)] == ["too-long"]
    assert all(r["turns"][0]["new_tokens"] >= 1 and r["generation"]["backend"] == "llamacpp" for r in after)
    weights = target_weights()  # --weights auto: the exported target at the CPU's fast precision
    assert all(r["generation"]["model"].endswith(".gguf") and f"-{weights}-" in r["generation"]["model"] for r in after)


def test_onpolicy_check_sends_the_same_ids_and_template(llamacpp):
    from eagle3lab.regen.onpolicy import OnPolicySettings, onpolicy

    s = OnPolicySettings(n=3, max_new_tokens=16, slots=2, threads=1, batch_size=3, max_prompt_tokens=128)
    figures = onpolicy(s, log=lambda line: None)
    assert figures["n"] == 3 and figures["template_mismatches"] == 0  # llama-server renders HF's chat template
    rows = figures["rows"]
    assert all(1 <= len(r["llamacpp"]) <= 16 and 1 <= len(r["hf"]) <= 16 for r in rows)
    assert figures["tokens_llamacpp"] == sum(len(r["llamacpp"]) for r in rows)
    # the same weights, greedy: llama.cpp's answers are about as likely under the HF target as its own
    assert figures["nll_hf"] > 0 and 0 < figures["nll_ratio"] < 1.5
    assert 0 <= figures["identical_share"] <= 1 and figures["mean_common_prefix"] >= 1


def test_regen_bench_puts_each_llamacpp_row_against_the_machine_limit(tmp_path, llamacpp):
    """Two llama.cpp rows (the exported target and the wheel's Q4_1) on one table, each with its share of the
    machine's limit, whose arithmetic comes from SmolLM2's config."""
    from eagle3lab.regen.bench import BenchSettings, bench

    s = BenchSettings(
        n=2,
        max_new_tokens=4,
        baseline_n=0,
        engines=[],
        serve_n=2,
        threads=1,
        workdir=str(tmp_path),
        llamacpp_slots=[2],
        llamacpp_weights=["auto", "q4_1"],
    )
    lines: list[str] = []
    figures = bench(s, log=lines.append)
    machine = figures["machine"]
    assert machine["flops_per_token"] == 268_959_744  # 2 x (30 x 3.54M + 28.3M head) multiply-adds
    assert machine["limit_tok_s"] > 0 and any("MFLOP a token" in line for line in lines)
    served = {row["weights"]: row for row in figures["rows"] if row["engine"] == "llama.cpp"}
    alone = {row["weights"]: row for row in figures["rows"] if row["engine"] == "llama.cpp, no server"}
    assert set(served) == set(alone) == {target_weights(), "q4_1"} and len(figures["rows"]) == 4
    for name, row in served.items():
        assert row["tokens"] >= 2 and row["tok_s"] > 0
        assert row["share_of_limit"] == pytest.approx(row["tok_s"] / machine["limit_tok_s"])
        assert figures[f"llamacpp_{name}_s2_tok_s"] == row["tok_s"]
    for name, row in alone.items():  # llama-batched-bench: 2 sequences in lockstep, every answer 4 tokens
        assert row["tokens"] == 2 * 4 and row["tok_s"] > 0 and row["setting"] == "2 in lockstep"
        assert figures[f"llamacpp_engine_{name}_s2_tok_s"] == row["tok_s"]
        assert row["share_of_limit"] == pytest.approx(row["tok_s"] / machine["limit_tok_s"])
    assert "of limit" in lines[-2] and "llama.cpp" in lines[-2]  # the table, printed before the JSON


BATCHED_BENCH_OUTPUT = """main: n_kv_max = 40000, n_batch = 2048, n_ubatch = 512, flash_attn = -1, n_threads = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|   128 |    256 |   32 |  12288 |    5.401 |   758.32 |   22.491 |   364.24 |   27.892 |   440.55 |

llama_perf_context_print:        load time =     120.00 ms
"""


def test_batched_bench_table_gives_new_tokens_over_the_whole_time():
    """llama-batched-bench's row (recorded on a 2-core EPYC): new tokens are B x TG, over prefill and decoding."""
    from eagle3lab.engines.llamacpp.batched_bench import parse_table

    row = parse_table(BATCHED_BENCH_OUTPUT)
    assert (row["B"], row["TG"], row["T"]) == (32, 256, 27.892)
    assert row["new_tok_s"] == pytest.approx(32 * 256 / 27.892)
    with pytest.raises(InputError, match="one result row, found 0"):
        parse_table(BATCHED_BENCH_OUTPUT.split("|-")[0])
