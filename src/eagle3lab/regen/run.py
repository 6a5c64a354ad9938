"""Regenerate every assistant turn of a ShareGPT-style dataset with the target, so the draft learns the target's own
distribution: `regenerate()` locks the output, plans the input, opens a backend (local: regen.local; openai:
regen.openai; llamacpp: regen.openai against the llama-server regen.llamacpp starts), writes record by record
(regen.files) and ends by checking success + error + skipped = input. A run with nothing to regenerate (an empty
input) or that regenerated nothing (every record skipped or failed) is a RegenError naming the first reasons.
`sampled_settings` is stage 02's second run: the first prompts again, sampled."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from eagle3lab.io import read_jsonl
from eagle3lab.regen.errors import RegenError
from eagle3lab.regen.files import Accounting, RunFiles, side_path
from eagle3lab.regen.inputs import Job, PromptLength, Skip, messages_for, read_inputs
from eagle3lab.regen.progress import Progress
from eagle3lab.regen.settings import RegenSettings, resolve_backend

SERVER_LOG_SUFFIX = ".server.log"  # the llamacpp backend's llama-server output, beside OUT
SHOWN_REASONS = 5  # reasons a run that regenerated nothing prints; its skipped and errors files hold every one


@dataclass
class RunResult:
    accounting: Accounting
    tokens: int
    seconds: float
    aborted: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def figures(self) -> dict:
        """The run's entry in metrics/regen.json: the output's accounting and this run's throughput."""
        acc = self.accounting
        return {
            "input": acc.input,
            "success": acc.success,
            "errors": acc.errors,
            "skipped": acc.skipped,
            "accounting": acc.line(),
            "new_tokens": self.tokens,
            "seconds": self.seconds,
            "tokens_per_s": self.tokens_per_s,
        }


def sampled_settings(main: RegenSettings, temperature: float, limit: int) -> RegenSettings:
    """Stage 02's sampled run: the first `limit` prompts of the main run's input (never beyond the main run's own
    limit, so its conversations are the main run's too) at `temperature`, all else as the main run: backend, servers,
    seed, resume. Its answers against the main run's are the temperature comparison of the data-scale runs."""
    if temperature <= 0 or limit < 1:
        raise RegenError(
            f"the sampled run needs a temperature above 0 and a limit of at least 1 prompt (got temperature "
            f"{temperature}, limit {limit}; a limit of 0 skips the run)"
        )
    return dataclasses.replace(main, temperature=temperature, limit=min(limit, main.limit or limit))


def _tokenizer_and_context(target_spec: str, max_context: int | None):
    from transformers import AutoConfig, AutoTokenizer

    from eagle3lab.models.target import resolve

    where = resolve(target_spec)
    tokenizer = AutoTokenizer.from_pretrained(where)
    if max_context is None:
        max_context = getattr(AutoConfig.from_pretrained(where), "max_position_embeddings", None) or 4096
    return tokenizer, max_context


@dataclass
class _Backend:
    """What a run needs from its backend: a model name for the records, prompt lengths, and how to run the jobs."""

    model_name: str
    lengths: PromptLength
    run: Callable  # (jobs, generation, files, progress) -> aborted?
    labels: dict  # shown by `eagle3lab monitor`


def _run_async(coroutine):
    """asyncio.run; from a thread of its own where this thread already runs an event loop (a Jupyter kernel: stage
    02's notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _openai_context(asked: int | None, served: int | None) -> int | None:
    """The servers' own limit (vLLM's --max-model-len) bounds prompt + answer: a server refuses a longer request
    with HTTP 400, which would be an error record on every --resume instead of an over-length skip."""
    if asked is not None and served is not None and asked > served:
        raise RegenError(
            f"--max-context {asked} exceeds the {served} tokens the servers serve the model with (max_model_len in "
            f"their /v1/models): lower --max-context or restart the servers with a longer context"
        )
    return asked or served


def _openai_backend(s: RegenSettings, alive: Callable[[], bool] = lambda: True) -> _Backend:
    from eagle3lab.regen.openai import OpenAIClient, run_openai

    client = OpenAIClient(s.server_addresses, model=s.model, timeout=s.timeout, retries=s.retries, backoff=s.backoff)
    model_name, served = _run_async(client.check())  # check the servers before touching any file
    tokenizer, context = _tokenizer_and_context(s.target, _openai_context(s.max_context, served))
    lengths = PromptLength(tokenizer, context, s.max_new_tokens)

    def run(jobs, generation, files, progress) -> bool:
        async def go():
            async with client:
                return await run_openai(
                    jobs,
                    client,
                    lengths,
                    concurrency=s.concurrency,
                    temperature=s.temperature,
                    seed=s.seed,
                    generation=generation,
                    files=files,
                    progress=progress,
                    max_consecutive_errors=s.max_consecutive_errors,
                    alive=alive,
                )

        return not _run_async(go())

    return _Backend(model_name, lengths, run, {})


def _llamacpp_backend(s: RegenSettings, stack: contextlib.ExitStack, out: Path) -> _Backend:
    """The openai backend against a llama-server started for this run (regen.llamacpp), its log beside OUT; the run
    ends with NoServerError if the server dies."""
    from eagle3lab.engines.llamacpp.gguf import target_weights
    from eagle3lab.regen.llamacpp import check_alive, start_server

    _, context = _tokenizer_and_context(s.target, s.max_context)
    server, served = start_server(s, context, stack, side_path(out, SERVER_LOG_SUFFIX))
    backend = _openai_backend(served, alive=lambda: server.process.poll() is None)

    def run(jobs, generation, files, progress) -> bool:
        aborted = backend.run(jobs, generation, files, progress)
        check_alive(server, out)
        return aborted

    labels = {"server": server.url, "server_pid": server.process.pid, "server_log": str(server.log_path)}
    labels |= {"slots": s.concurrency, "weights": target_weights(s.weights)}
    return _Backend(backend.model_name, backend.lengths, run, labels)


def _local_backend(s: RegenSettings) -> _Backend:
    from eagle3lab.devices import resolve_device, resolve_dtype
    from eagle3lab.models.target import load_target
    from eagle3lab.regen.local import make_engine, pick_engine, run_local

    device = resolve_device(s.device)
    loaded = load_target(s.target, dtype=resolve_dtype(s.dtype, device), device=device)
    context = s.max_context or loaded.model.config.max_position_embeddings
    lengths = PromptLength(loaded.tokenizer, context, s.max_new_tokens)
    engine_name = pick_engine(s.engine, device)

    def run(jobs, generation, files, progress) -> bool:
        engine = make_engine(engine_name, loaded, lengths, s)
        run_local(jobs, engine, lengths, generation=generation, files=files, progress=progress)
        return False

    return _Backend(s.target, lengths, run, {"device": str(device), "engine": engine_name})


def _plan(
    items: list[Job | Skip], done: set[str], lengths: PromptLength, input, files: RunFiles, progress
) -> list[Job]:
    """The jobs still to run; inputs whose first prompt does not fit the context are recorded as over-length skips."""
    todo: list[Job] = []
    for item in items:
        if item.key in done:
            continue
        if isinstance(item, Job):
            n_prompt = len(lengths.ids(messages_for(item.system, [{"role": "user", "content": item.users[0]}])))
            if lengths.fits(n_prompt):
                todo.append(item)
                continue
            item = Skip(
                item.key,
                item.line,
                f"{input}: line {item.line} (id {item.source_id!r}): {lengths.why_not(n_prompt)}",
                "over-length",
                item.source_id,
            )
        files.write_skip(item)
        progress.record("skipped")
    return todo


def _backend(s: RegenSettings, stack: contextlib.ExitStack, out: Path) -> _Backend:
    if s.backend == "llamacpp":
        return _llamacpp_backend(s, stack, out)
    return _openai_backend(s) if s.backend == "openai" else _local_backend(s)


def regenerate(
    input: str | os.PathLike,
    output: str | os.PathLike,
    settings: RegenSettings | None = None,
    *,
    log: Callable[[str], None] = print,
    **overrides,
) -> RunResult:
    """Regenerate `input` into `output` with `settings` (or RegenSettings(**overrides)); returns the accounting of
    the whole output."""
    s = settings or RegenSettings(**overrides)
    s = dataclasses.replace(s, backend=resolve_backend(s.backend, s.device))
    items = read_inputs(input, s.max_turns, s.limit)
    if not items:
        why = "--limit is 0" if s.limit == 0 else "the file is empty or every line is blank"
        raise RegenError(f"input {input} has no records to regenerate ({why})")
    files = RunFiles(output)
    with contextlib.ExitStack() as stack:  # the lock and a started server, released in reverse order
        stack.enter_context(files.locked())  # before any server starts or file opens: one run per OUT
        backend = _backend(s, stack, files.out)
        generation = {
            "backend": s.backend,
            "model": backend.model_name,
            "temperature": s.temperature,
            "max_new_tokens": s.max_new_tokens,
            "max_turns": s.max_turns,
            "seed": s.seed,
        }
        done = files.open(s.resume, {it.key for it in items}, generation)
        labels = {"backend": s.backend, "model": backend.model_name, "output": str(files.out), **backend.labels}
        progress = Progress(files, len(items), sum(1 for it in items if it.key in done), labels, enabled=s.progress_bar)
        aborted, status = False, "failed"
        try:
            todo = _plan(items, done, backend.lengths, input, files, progress)
            aborted = backend.run(todo, generation, files, progress)
            status = "aborted" if aborted else "finished"
        finally:
            progress.close(status)
            files.close()
    result = RunResult(files.accounting(len(items)), progress.tokens, time.time() - progress.started, aborted)
    _report(result, progress, files, s, log)
    if not result.accounting.success:
        raise _nothing_regenerated(result.accounting, files, input)
    return result


def _nothing_regenerated(acc: Accounting, files: RunFiles, input) -> RegenError:
    """The error of a run whose output holds no record: counts, the first reasons and the files that hold them all."""
    skips = (row["reason"] for row in read_jsonl(files.skipped))
    errors = (
        f"{input}: line {row['line']} (id {row['source_id']!r}): {row['error']}" for row in read_jsonl(files.errors)
    )
    reasons = list(itertools.islice(itertools.chain(skips, errors), SHOWN_REASONS))
    where = [str(path) for path, n in ((files.skipped, acc.skipped), (files.errors, acc.errors)) if n]
    counts = f"{acc.skipped} skipped, {acc.errors} failed" + (f", {acc.pending} not run" if acc.pending else "")
    return RegenError(
        f"no record regenerated into {files.out} ({counts} of {acc.input} input records); first reasons:\n  "
        + "\n  ".join(reasons)
        + f"\nevery reason: {', '.join(where)}"
    )


def _skip_counts(files: RunFiles) -> str:
    """The skipped file's records counted by cause, most frequent first, then by name: "malformed 2, empty 1"."""
    counts = collections.Counter(row.get("kind", "unknown") for row in read_jsonl(files.skipped))
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _report(result: RunResult, progress: Progress, files: RunFiles, s: RegenSettings, log) -> None:
    log(
        f"regen: {progress.records} records this run in {result.seconds:.1f} s, {result.tokens} new tokens "
        f"({result.tokens_per_s:.1f} tok/s)"
    )
    if result.aborted:
        log(
            f"regen: aborted after {s.max_consecutive_errors} records in a row failed; fix the servers and rerun "
            f"with --resume"
        )
    log(result.accounting.line())
    if result.accounting.skipped:
        log(f"regen: {result.accounting.skipped} skipped ({_skip_counts(files)}); every reason in {files.skipped}")
    if result.accounting.errors:
        log(f"regen: {result.accounting.errors} errors in {files.errors}; rerun with --resume to retry them")
