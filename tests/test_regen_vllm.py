"""`eagle3lab regen --backend openai` against a real vLLM server (the session's baseline server, SmolLM2 alone): the
server is killed with SIGKILL mid-run, and `--resume` on the session's other server of the same target (a failover)
finishes the output with nothing lost, duplicated or rewritten."""

import json
import os
import signal
from pathlib import Path

import pytest

from eagle3lab.regen.cli import main as regen_main
from test_regen import _run_cli, _wait_for_lines, write_rows

N = 10


def _rows() -> list[dict]:
    # Open-ended prompts: answers run to --max-new-tokens, so the run lasts long enough to be interrupted.
    rows = [
        {"id": f"v{i}", "conversations": [{"role": "user", "content": f"Write a long story about a robot named R{i}."}]}
        for i in range(N)
    ]
    # Fits the tokenizer's 8192-token context but not the server's --max-model-len 2048: an over-length skip (the
    # server's own limit), not an HTTP 400 error retried on every --resume.
    rows.append({"id": "too-long", "conversations": [{"role": "user", "content": "word " * 2100}]})
    return rows


def _lines(path: Path) -> list[dict]:
    """Every line of a JSONL file, each one whole (newline-terminated JSON)."""
    data = path.read_bytes() if path.exists() else b""
    assert not data or data.endswith(b"\n"), f"{path} ends with a torn line"
    return [json.loads(line) for line in data.splitlines()]


def _regen(address: str, path: Path, out: Path, *extra: str):
    args = ["--backend", "openai", "--server-address", address, "--input", str(path), "--output", str(out)]
    args += ["--max-new-tokens", "24", "--max-turns", "1", "--no-progress", *extra]
    return _run_cli(args)


@pytest.mark.kills_session_server  # runs after every other test of the session's vLLM servers
def test_vllm_killed_mid_run_then_resume(tmp_path, vllm_baseline, vllm_eagle3, capsys):
    path = write_rows(tmp_path / "in.jsonl", _rows())
    out, errors, skipped = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl", tmp_path / "out.skipped.jsonl"
    address = vllm_baseline.url.removeprefix("http://")
    proc = _regen(address, path, out, "--concurrency", "4", "--retries", "1", "--backoff", "0.05")
    _wait_for_lines(out, 3, proc)
    os.killpg(vllm_baseline.process.pid, signal.SIGKILL)  # the API server and its engine core
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 1, stderr  # incomplete: records failed
    written, failed = out.read_bytes(), _lines(errors)
    done = [r["id"] for r in _lines(out)]
    assert 3 <= len(done) < N and failed, "the kill should land mid-run"
    assert all("gave up after 2 attempts" in e["error"] and address in e["error"] for e in failed)
    assert [r["id"] for r in _lines(skipped)] == ["too-long"]
    assert "exceeds the context of 2048 tokens" in _lines(skipped)[0]["reason"]
    assert f"input {N + 1} = success {len(done)} + error {len(failed)} + skipped 1 [OK]" in stdout
    assert len(set(done) | {e["id"] for e in failed}) == len(done) + len(failed) == N  # disjoint, complete

    # the same target speculating: greedy answers are the target's own, and records carry the same model name
    address = vllm_eagle3.url.removeprefix("http://")
    # asking for more context than the server serves is refused before any file is touched
    rc = regen_main(
        ["--backend", "openai", "--server-address", address, "--input", str(path)]
        + ["--output", str(tmp_path / "o.jsonl"), "--max-context", "4096", "--no-progress"]
    )
    assert rc == 2 and "--max-context 4096 exceeds the 2048 tokens" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
    proc = _regen(address, path, out, "--concurrency", "4", "--resume")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert f"input {N + 1} = success {N} + error 0 + skipped 1 [OK]" in stdout
    after = [r["id"] for r in _lines(out)]
    assert out.read_bytes().startswith(written)  # the records from before the kill, byte for byte
    assert sorted(after) == sorted(f"v{i}" for i in range(N)) and len(after) == len(set(after)) == N
    assert _lines(errors) == [] and [r["id"] for r in _lines(skipped)] == ["too-long"]
    assert all(r["turns"][0]["new_tokens"] >= 1 and r["generation"]["backend"] == "openai" for r in _lines(out))
