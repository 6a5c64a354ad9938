"""Regenerate every assistant turn of a ShareGPT-style dataset with the target, so the draft learns the target's own
distribution.

Two backends share one output format: `local` (in-process transformers, a batched decode loop with length-sorted
dynamic batching) and `openai` (async HTTP to one or several OpenAI-compatible servers: SGLang, vLLM,
`transformers serve`). Output is appended record by record; `--resume` continues a killed run; errors and skipped
inputs get their own files beside OUT, and every run ends by checking success + error + skipped = input.

    eagle3lab regen --backend local --input IN.jsonl --output OUT.jsonl [--resume]
    eagle3lab regen bench            # throughput: dynamic batching vs batch-1 vs transformers serve
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab.data.sources import ROLE_NAMES
from eagle3lab.io import InputError, read_jsonl, write_json, write_text
from eagle3lab.regen.batching import BatchGenerator, TurnResult
from eagle3lab.serving.processes import ServerError, free_port, start_server, transformers_serve_command

ERRORS_SUFFIX, SKIPPED_SUFFIX, PROGRESS_SUFFIX = ".errors.jsonl", ".skipped.jsonl", ".progress.json"
STALE_SUFFIX = ".stale.jsonl"
EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE, EXIT_NO_SERVER = 0, 1, 2, 3


class RegenError(RuntimeError):
    """A run cannot start or continue (existing output without --resume, no server reachable, ...)."""


class NoServerError(RegenError):
    pass


# ---- input: ShareGPT rows -> conversations to regenerate, or skips with a reason --------------------------------


@dataclass
class Job:
    """One input conversation: its user turns are kept, every assistant turn is regenerated."""

    key: str  # unique within the run (the input id, or a stand-in when missing or duplicated)
    source_id: str
    line: int
    system: str | None
    users: list[str]


@dataclass
class Skip:
    key: str
    line: int
    reason: str
    kind: str  # short cause for tables: malformed, no-conversations, bad-turn, starts-with-assistant, empty, ...
    source_id: str | None = None


class _Skipped(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def plan_conversation(obj: dict, max_turns: int | None) -> tuple[str | None, list[str]]:
    """Return (system prompt, user turns to answer) of one input row, or raise _Skipped with the reason."""
    if "conversations" not in obj:
        raise _Skipped("no-conversations", "missing field 'conversations'")
    raw = obj["conversations"]
    if not isinstance(raw, list) or not raw:
        raise _Skipped("no-conversations", "field 'conversations' should be a non-empty list")
    turns = []
    for j, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise _Skipped("bad-turn", f"conversations[{j}] is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role not in ROLE_NAMES:
            raise _Skipped("bad-turn", f"conversations[{j}]: unknown role {role!r}")
        if not isinstance(content, str):
            raise _Skipped(
                "bad-turn", f"conversations[{j}]: field 'content' should be a string, got {type(content).__name__}"
            )
        turns.append((j, ROLE_NAMES[role], content))
    system = None
    if turns[0][1] == "system":
        system = turns.pop(0)[2] or None
    # Many ShareGPT rows start with the assistant (a conversation cut at the front): drop the lead-in.
    while turns and turns[0][1] == "assistant":
        turns.pop(0)
    if not turns:
        raise _Skipped("starts-with-assistant", "starts with the assistant and has no user turn after it")
    users: list[list] = []  # [first index, text]; consecutive user turns merge into one
    previous = None
    for j, role, content in turns:
        if role == "system":
            raise _Skipped("bad-turn", f"conversations[{j}]: a system turn after the start")
        if role == "user":
            if not content.strip():
                raise _Skipped("empty", f"conversations[{j}]: empty content")
            if previous == "user":
                users[-1][1] += "\n\n" + content
            else:
                users.append([j, content])
        previous = role
    if max_turns is not None:
        users = users[:max_turns]
    return system, [text for _, text in users]


def read_inputs(path: str | os.PathLike, max_turns: int | None = None, limit: int | None = None) -> list[Job | Skip]:
    """Parse an input JSONL file line by line; a bad line becomes a Skip, never an exception."""
    path = Path(path)
    if not path.exists():
        raise RegenError(f"input {path} does not exist")
    items: list[Job | Skip] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            if limit is not None and len(items) >= limit:
                break
            fallback = f"{path.stem}:line{lineno}"
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                items.append(Skip(fallback, lineno, f"{path}: line {lineno}: not valid JSON ({e})", "malformed"))
                continue
            if not isinstance(obj, dict):
                items.append(
                    Skip(
                        fallback,
                        lineno,
                        f"{path}: line {lineno}: expected an object, got {type(obj).__name__}",
                        "malformed",
                    )
                )
                continue
            source_id = str(obj["id"]) if obj.get("id") not in (None, "") else fallback
            key = source_id
            if key in seen:
                key = f"{source_id}@line{lineno}"
                items.append(
                    Skip(
                        key,
                        lineno,
                        f"{path}: line {lineno}: duplicate id {source_id!r} (first on line {seen[source_id]})",
                        "duplicate",
                        source_id,
                    )
                )
                continue
            seen[source_id] = lineno
            try:
                system, users = plan_conversation(obj, max_turns)
            except _Skipped as e:
                items.append(Skip(key, lineno, f"{path}: line {lineno} (id {source_id!r}): {e}", e.kind, source_id))
                continue
            items.append(Job(key, source_id, lineno, system, users))
    return items


def messages_for(system: str | None, history: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system else []) + history


class PromptLength:
    """Token length of a chat prompt under the target's chat template, and whether it fits the context."""

    def __init__(self, tokenizer, max_context: int, max_new_tokens: int):
        self.tokenizer, self.max_context, self.max_new_tokens = tokenizer, max_context, max_new_tokens

    def ids(self, messages: list[dict]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def fits(self, n_prompt: int) -> bool:
        return n_prompt + self.max_new_tokens <= self.max_context

    def why_not(self, n_prompt: int) -> str:
        return (
            f"prompt of {n_prompt} tokens + {self.max_new_tokens} new tokens exceeds the context of "
            f"{self.max_context} tokens"
        )


# ---- output files: append per record, resume, accounting ------------------------------------------------------


def side_path(out: str | os.PathLike, suffix: str) -> Path:
    out = Path(out)
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out.with_name(stem + suffix)


def truncate_torn_tail(path: Path) -> int:
    """Cut a last line that has no newline (a writer killed mid-line); return the bytes removed."""
    if not path.exists() or path.stat().st_size == 0:
        return 0
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        pos, chunk = size, 1 << 16
        if (f.seek(size - 1), f.read(1))[1] == b"\n":
            return 0
        while pos > 0:  # scan backwards for the last newline
            start = max(0, pos - chunk)
            f.seek(start)
            block = f.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        f.truncate(keep)
        return size - keep


def file_ids(path: Path) -> list[str]:
    return [str(row["id"]) for row in read_jsonl(path)] if path.exists() else []


@dataclass
class Accounting:
    input: int
    success: int
    errors: int
    skipped: int
    duplicates: list[str] = field(default_factory=list)

    @property
    def pending(self) -> int:
        return self.input - self.success - self.errors - self.skipped

    @property
    def ok(self) -> bool:
        return self.pending == 0 and not self.duplicates

    def line(self) -> str:
        text = (
            f"input {self.input} = success {self.success} + error {self.errors} + skipped {self.skipped}"
            f"{'' if self.pending == 0 else f' + pending {self.pending}'}"
        )
        verdict = "OK" if self.ok else "MISMATCH"
        if self.duplicates:
            text += f"; duplicated ids: {self.duplicates[:5]}"
        return f"accounting: {text} [{verdict}]"


class RunFiles:
    """OUT plus its sidecars: OUT's stem + .errors.jsonl / .skipped.jsonl / .progress.json."""

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self.errors = side_path(out, ERRORS_SUFFIX)
        self.skipped = side_path(out, SKIPPED_SUFFIX)
        self.progress = side_path(out, PROGRESS_SUFFIX)
        self.stale = side_path(out, STALE_SUFFIX)
        self._handles: dict[Path, object] = {}

    def jsonl(self) -> list[Path]:
        return [self.out, self.errors, self.skipped]

    def open(self, resume: bool, keys: set[str]) -> set[str]:
        """Prepare the files and return the keys of the input already finished (written or skipped)."""
        existing = [p for p in self.jsonl() if p.exists() and p.stat().st_size > 0]
        if existing and not resume:
            raise RegenError(
                f"{existing[0]} already exists and is not empty: pass --resume to continue that run, or "
                f"remove {', '.join(str(p) for p in existing)} to start over"
            )
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for p in self.jsonl():
            truncate_torn_tail(p)
        self._set_aside_stale(keys)
        done = set(file_ids(self.out)) | set(file_ids(self.skipped))
        # Errors are retried on resume: start that file afresh (ids not yet redone are simply pending again).
        for p, mode in ((self.out, "a"), (self.skipped, "a"), (self.errors, "w")):
            self._handles[p] = open(p, mode, encoding="utf-8")
        return done

    def _set_aside_stale(self, keys: set[str]) -> None:
        """Resuming on a changed input (another mixture, a smaller --limit): finished records whose ids the input no
        longer has move to OUT.stale.jsonl, so the output and its accounting cover exactly the input."""
        for path in (self.out, self.skipped):
            if not path.exists():
                continue
            keep, stale = [], []
            for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
                if line.strip():
                    (keep if str(json.loads(line)["id"]) in keys else stale).append(line)
            if stale:
                with open(self.stale, "a", encoding="utf-8") as f:
                    f.writelines(stale)
                write_text(path, "".join(keep))

    def _append(self, path: Path, row: dict) -> None:
        f = self._handles[path]
        f.write(json.dumps(row, ensure_ascii=False) + "\n")  # one write per record: a kill tears at most this line
        f.flush()

    def write_ok(self, row: dict) -> None:
        self._append(self.out, row)

    def write_error(self, row: dict) -> None:
        self._append(self.errors, row)

    def write_skip(self, skip: Skip) -> None:
        self._append(
            self.skipped,
            {"id": skip.key, "source_id": skip.source_id, "line": skip.line, "kind": skip.kind, "reason": skip.reason},
        )

    def close(self) -> None:
        for f in self._handles.values():
            f.close()
        self._handles.clear()

    def accounting(self, n_input: int) -> Accounting:
        ids = {p: file_ids(p) for p in self.jsonl()}
        everything = [i for p in self.jsonl() for i in ids[p]]
        dupes = (
            sorted({i for i in everything if everything.count(i) > 1}) if len(set(everything)) < len(everything) else []
        )
        return Accounting(n_input, len(ids[self.out]), len(ids[self.errors]), len(ids[self.skipped]), dupes)


class Progress:
    """tqdm bar plus the sidecar file `eagle3lab monitor` reads from another process."""

    def __init__(self, files: RunFiles, total: int, done: int, settings: dict, enabled: bool = True):
        from tqdm import tqdm

        self.files, self.settings = files, settings
        self.total, self.done_at_start = total, done
        self.started = time.time()
        self.tokens = self.records = self.errors = self.skipped = 0
        self._last_write = self._last_sample = 0.0
        self.timeline: list[list[float]] = []  # [seconds since start, tokens, records], every few seconds
        self.bar = tqdm(total=total, initial=done, unit="rec", desc="regen", disable=not enabled, dynamic_ncols=True)
        self.write("running", force=True)

    def add_tokens(self, n: int) -> None:
        self.tokens += n
        self.write("running")

    def record(self, kind: str) -> None:
        self.records += 1
        if kind == "error":
            self.errors += 1
        elif kind == "skipped":
            self.skipped += 1
        self.bar.update(1)
        self.write("running")

    def rate(self) -> float:
        return self.tokens / max(time.time() - self.started, 1e-9)

    def write(self, status: str, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_write < 1.0:
            return
        self._last_write = now
        if now - self._last_sample >= 5.0 or status != "running":
            self._last_sample = now
            self.timeline.append([round(now - self.started, 2), self.tokens, self.records])
        self.bar.set_postfix_str(f"{self.rate():.1f} tok/s, err {self.errors}, skip {self.skipped}", refresh=False)
        write_json(
            self.files.progress,
            {
                "status": status,
                "pid": os.getpid(),
                "input_total": self.total,
                "done_at_start": self.done_at_start,
                "records_this_run": self.records,
                "errors_this_run": self.errors,
                "skipped_this_run": self.skipped,
                "tokens_this_run": self.tokens,
                "started_at": self.started,
                "updated_at": now,
                **self.settings,
                "timeline": self.timeline,
            },
        )

    def close(self, status: str) -> None:
        self.write(status, force=True)
        self.bar.close()


# ---- local backend: batched decode loop with a KV cache, left padding and dynamic batching ---------------------


# ---- shared driver: turn-by-turn conversations -------------------------------------------------------------------


@dataclass
class _Conversation:
    job: Job
    history: list[dict] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)

    def next_user(self) -> str | None:
        k = len(self.turns)
        return self.job.users[k] if k < len(self.job.users) else None

    def add(self, result: TurnResult) -> None:
        self.history.append({"role": "assistant", "content": result.text})
        self.turns.append({"finish_reason": result.finish_reason, "new_tokens": result.new_tokens})

    def prompt_messages(self) -> list[dict]:
        self.history.append({"role": "user", "content": self.next_user()})
        return messages_for(self.job.system, self.history)

    def output(self, generation: dict) -> dict:
        return {
            "id": self.job.key,
            "source_id": self.job.source_id,
            "conversations": messages_for(self.job.system, self.history),
            "turns": self.turns,
            "generation": generation,
        }


def run_local(
    jobs: Iterable[Job],
    target,
    lengths: PromptLength,
    *,
    batch_size: int,
    temperature: float,
    seed: int,
    generation: dict,
    files: RunFiles,
    progress: Progress,
    max_batch_tokens: int = 65536,
) -> None:
    engine = BatchGenerator(
        target.model,
        target.tokenizer,
        batch_size=batch_size,
        max_new_tokens=lengths.max_new_tokens,
        temperature=temperature,
        max_context=lengths.max_context,
        seed=seed,
        max_batch_tokens=max_batch_tokens,
    )

    def submit_next(conv: _Conversation) -> bool:
        if conv.next_user() is None:
            return False
        messages = conv.prompt_messages()
        ids = lengths.ids(messages)
        if not lengths.fits(len(ids)):
            conv.history.pop()  # a later turn that no longer fits ends the conversation where it is
            return False
        engine.submit(conv, ids)
        return True

    def on_finish(conv: _Conversation, result: TurnResult) -> None:
        conv.add(result)
        if not submit_next(conv):
            files.write_ok(conv.output(generation))
            progress.record("ok")

    for job in jobs:
        submit_next(_Conversation(job))
    engine.run(on_finish, progress.add_tokens)


# ---- openai backend: async HTTP, several servers, bounded concurrency, retries with backoff ----------------------


def normalize_address(address: str) -> str:
    address = address.rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


@dataclass
class _Server:
    url: str
    inflight: int = 0
    down_until: float = 0.0


class ServerPool:
    """Least-loaded choice among servers that are not cooling down after a connection failure (data parallel)."""

    def __init__(self, addresses: list[str], cooldown: float = 5.0):
        if not addresses:
            raise RegenError("the openai backend needs at least one --server-address HOST:PORT")
        self.servers = [_Server(normalize_address(a)) for a in addresses]
        self.cooldown = cooldown
        self._rr = itertools.count()

    def pick(self) -> _Server:
        now = time.monotonic()
        healthy = [s for s in self.servers if s.down_until <= now] or self.servers
        turn = next(self._rr)
        return min(healthy, key=lambda s: (s.inflight, (self.servers.index(s) - turn) % len(self.servers)))

    def mark_down(self, server: _Server) -> None:
        server.down_until = time.monotonic() + self.cooldown


class RequestFailed(Exception):
    pass


class OpenAIClient:
    def __init__(
        self,
        addresses: list[str],
        *,
        model: str | None,
        timeout: float = 600.0,
        retries: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
    ):
        import httpx

        self.httpx = httpx
        self.pool = ServerPool(addresses)
        self.model, self.timeout, self.retries = model, timeout, retries
        self.backoff, self.max_backoff = backoff, max_backoff
        self.client = None  # one httpx client per event loop: opened by `async with`

    async def __aenter__(self):
        httpx = self.httpx
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
        return self

    async def __aexit__(self, *exc):
        await self.client.aclose()
        self.client = None

    async def check(self) -> str:
        """Fail fast, with a clear message, when no server answers; return the model name to request."""
        async with self:
            return await self._check()

    async def _check(self) -> str:
        up, problems = [], []
        for server in self.pool.servers:
            try:
                r = await self.client.get(server.url + "/health", timeout=5.0)
                if r.status_code != 200:
                    r = await self.client.get(server.url + "/v1/models", timeout=5.0)
                r.raise_for_status()
                up.append(server)
            except self.httpx.HTTPError as e:
                problems.append(f"{server.url} ({type(e).__name__}: {e})")
                self.pool.mark_down(server)
        if not up:
            raise NoServerError(
                "no regeneration server is reachable: " + "; ".join(problems) + ". Start one first, e.g. "
                "`transformers serve MODEL_DIR --port PORT` or `python -m sglang.launch_server --model-path MODEL "
                "--port PORT`, then pass --server-address HOST:PORT"
            )
        if self.model is None:
            r = await self.client.get(up[0].url + "/v1/models", timeout=10.0)
            r.raise_for_status()
            models = r.json().get("data") or []
            if not models:
                raise RegenError(f"{up[0].url}/v1/models lists no model: pass --model NAME")
            self.model = models[0]["id"]
        return self.model

    async def complete(self, messages: list[dict], max_tokens: int, temperature: float) -> TurnResult:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": False,
        }
        last = "no attempt"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            server = self.pool.pick()
            server.inflight += 1
            try:
                r = await self.client.post(server.url + "/v1/chat/completions", json=body)
            except self.httpx.TransportError as e:  # connection refused/reset, timeouts: retry elsewhere
                self.pool.mark_down(server)
                last = f"{server.url}: {type(e).__name__}: {e}"
                continue
            finally:
                server.inflight -= 1
            if r.status_code == 200:
                try:
                    choice = r.json()["choices"][0]
                    text = choice["message"]["content"] or ""
                    tokens = (r.json().get("usage") or {}).get("completion_tokens")
                    return TurnResult(text, choice.get("finish_reason") or "stop", int(tokens or 0))
                except (KeyError, IndexError, TypeError, ValueError) as e:
                    raise RequestFailed(f"{server.url}: unexpected response ({e}): {r.text[:200]}") from None
            last = f"{server.url}: HTTP {r.status_code}: {r.text[:200]}"
            if r.status_code not in (408, 429) and r.status_code < 500:
                raise RequestFailed(last)  # the request itself is wrong: retrying will not help
        raise RequestFailed(f"gave up after {self.retries + 1} attempts; last: {last}")


async def _run_openai(
    jobs: list[Job],
    client: OpenAIClient,
    lengths: PromptLength,
    *,
    concurrency: int,
    temperature: float,
    generation: dict,
    files: RunFiles,
    progress: Progress,
    max_consecutive_errors: int,
) -> bool:
    """Returns False when the run was aborted because too many records in a row failed (servers gone)."""
    pending = iter(jobs)
    state = {"consecutive": 0, "aborted": False}

    async def one(job: Job) -> None:
        conv = _Conversation(job)
        try:
            while conv.next_user() is not None:
                messages = conv.prompt_messages()
                if not lengths.fits(len(lengths.ids(messages))):
                    conv.history.pop()
                    break
                result = await client.complete(messages, lengths.max_new_tokens, temperature)
                conv.add(result)
                progress.add_tokens(result.new_tokens)
        except RequestFailed as e:
            files.write_error(
                {"id": job.key, "source_id": job.source_id, "line": job.line, "turn": len(conv.turns), "error": str(e)}
            )
            progress.record("error")
            state["consecutive"] += 1
            if state["consecutive"] >= max_consecutive_errors:
                state["aborted"] = True
            return
        state["consecutive"] = 0
        files.write_ok(conv.output(generation))
        progress.record("ok")

    async def worker() -> None:
        for job in pending:  # a shared iterator: each job goes to exactly one worker
            if state["aborted"]:
                return
            await one(job)

    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    return not state["aborted"]


# ---- the run -----------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    accounting: Accounting
    tokens: int
    seconds: float
    aborted: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


def _tokenizer_and_context(target_spec: str, max_context: int | None):
    from transformers import AutoConfig, AutoTokenizer

    from eagle3lab.models.target import resolve

    where = resolve(target_spec)
    tokenizer = AutoTokenizer.from_pretrained(where)
    if max_context is None:
        max_context = getattr(AutoConfig.from_pretrained(where), "max_position_embeddings", None) or 4096
    return tokenizer, max_context


def regenerate(
    input: str | os.PathLike,
    output: str | os.PathLike,
    *,
    backend: str = "local",
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    max_turns: int | None = 2,
    resume: bool = False,
    limit: int | None = None,
    seed: int = 0,
    # local backend
    target: str = "smollm2-135m-instruct",
    dtype: str = "bfloat16",
    batch_size: int = 32,
    max_batch_tokens: int = 65536,
    max_context: int | None = None,
    # openai backend
    server_addresses: list[str] | None = None,
    model: str | None = None,
    concurrency: int = 16,
    timeout: float = 600.0,
    retries: int = 4,
    backoff: float = 1.0,
    max_consecutive_errors: int = 32,
    progress_bar: bool = True,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Regenerate `input` into `output` (see the module doc); returns the accounting of the whole output."""
    if backend not in ("local", "openai"):
        raise RegenError(f"unknown backend {backend!r}: use 'local' or 'openai'")
    if max_new_tokens < 1 or (max_turns is not None and max_turns < 1):
        raise RegenError("--max-new-tokens and --max-turns must be at least 1")
    items = read_inputs(input, max_turns, limit)
    files = RunFiles(output)
    client = None
    if backend == "openai":  # check the servers before touching any file
        client = OpenAIClient(server_addresses or [], model=model, timeout=timeout, retries=retries, backoff=backoff)
        model_name = asyncio.run(client.check())
        tokenizer, context = _tokenizer_and_context(target, max_context)
        loaded = None
    else:
        from eagle3lab.models.target import load_target

        loaded = load_target(target, dtype=dtype)
        tokenizer = loaded.tokenizer
        context = max_context or loaded.model.config.max_position_embeddings
        model_name = target
    lengths = PromptLength(tokenizer, context, max_new_tokens)
    generation = {
        "backend": backend,
        "model": model_name,
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
        "max_turns": max_turns,
        "seed": seed,
    }
    done = files.open(resume, {it.key for it in items})
    progress = Progress(
        files,
        len(items),
        sum(1 for it in items if it.key in done),
        {"backend": backend, "model": model_name, "output": str(files.out)},
        enabled=progress_bar,
    )
    todo: list[Job] = []
    aborted, status = False, "failed"
    try:
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
        if backend == "local":
            run_local(
                todo,
                loaded,
                lengths,
                batch_size=batch_size,
                temperature=temperature,
                seed=seed,
                generation=generation,
                files=files,
                progress=progress,
                max_batch_tokens=max_batch_tokens,
            )
        else:

            async def go():
                async with client:
                    return await _run_openai(
                        todo,
                        client,
                        lengths,
                        concurrency=concurrency,
                        temperature=temperature,
                        generation=generation,
                        files=files,
                        progress=progress,
                        max_consecutive_errors=max_consecutive_errors,
                    )

            aborted = not asyncio.run(go())
        status = "aborted" if aborted else "finished"
    finally:
        progress.close(status)
        files.close()
    seconds = time.time() - progress.started
    accounting = files.accounting(len(items))
    log(
        f"regen: {progress.records} records this run in {seconds:.1f} s, {progress.tokens} new tokens "
        f"({progress.tokens / max(seconds, 1e-9):.1f} tok/s)"
    )
    if aborted:
        log(
            f"regen: aborted after {max_consecutive_errors} records in a row failed; fix the servers and rerun with "
            f"--resume"
        )
    log(accounting.line())
    if accounting.errors:
        log(f"regen: {accounting.errors} errors in {files.errors}; rerun with --resume to retry them")
    return RunResult(accounting, progress.tokens, seconds, aborted)


# ---- a real OpenAI-compatible server for tests and the benchmark: `transformers serve` ----------------------------


@contextlib.contextmanager
def transformers_serve(
    model_dir: str | os.PathLike,
    *,
    port: int | None = None,
    dtype: str = "auto",
    startup_timeout: float = 180.0,
    log_path: str | os.PathLike | None = None,
):
    """Run `transformers serve MODEL_DIR` on 127.0.0.1 and yield (address, process) once /health answers; stop it after."""
    port = port or free_port()
    cmd = transformers_serve_command(model_dir, port, dtype)
    try:
        with start_server(cmd, f"http://127.0.0.1:{port}", startup_timeout, log_path=log_path) as server:
            yield f"127.0.0.1:{port}", server.process
    except ServerError as e:
        raise RegenError(str(e)) from None


# ---- benchmark (a command that prints figures, never a test) ----------------------------------------------------


def bench_prompts(n: int, tokenizer, max_prompt_tokens: int = 512, seed: int = 0) -> list[dict]:
    """n single-turn ShareGPT prompts (first user turn, at most max_prompt_tokens tokens), a seeded sample."""
    import random

    from eagle3lab.data.sources import load_sharegpt

    records, _ = load_sharegpt()
    random.Random(seed).shuffle(records)
    rows = []
    for rec in records:
        try:
            _, users = plan_conversation({"conversations": rec.conversations}, 1)
        except _Skipped:
            continue
        if len(tokenizer(users[0], add_special_tokens=False)["input_ids"]) <= max_prompt_tokens:
            rows.append({"id": rec.id, "conversations": [{"role": "user", "content": users[0]}]})
        if len(rows) == n:
            break
    return rows


def bench(
    n: int = 64,
    max_new_tokens: int = 256,
    batch_size: int = 32,
    baseline_n: int = 4,
    serve_n: int = 16,
    serve_concurrency: int = 4,
    dtype: str = "bfloat16",
    target: str = "smollm2-135m-instruct",
    max_prompt_tokens: int = 512,
    workdir: str | os.PathLike | None = None,
    log: Callable[[str], None] = print,
) -> dict:
    """Tokens/s of the local backend (dynamic batching) vs plain batch-1 `generate` in the same process, and of the
    same prompts through `transformers serve` with the openai backend."""
    import tempfile

    import torch

    from eagle3lab.io import write_jsonl
    from eagle3lab.models.target import load_target

    workdir = Path(workdir or tempfile.mkdtemp(prefix="regen-bench-"))
    loaded = load_target(target, dtype=dtype)
    prompts = bench_prompts(n, loaded.tokenizer, max_prompt_tokens)
    write_jsonl(workdir / "prompts.jsonl", prompts)
    figures: dict = {"n": len(prompts), "max_new_tokens": max_new_tokens, "batch_size": batch_size, "dtype": dtype}

    # plain batch-1 generation, greedy, stopping on EOS like the batched path
    lengths = PromptLength(loaded.tokenizer, loaded.model.config.max_position_embeddings, max_new_tokens)
    tokens, seconds = 0, 0.0
    with torch.inference_mode():
        for row in prompts[:baseline_n]:
            ids = torch.tensor([lengths.ids(row["conversations"])])
            t0 = time.perf_counter()
            out = loaded.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=loaded.tokenizer.eos_token_id,
            )
            seconds += time.perf_counter() - t0
            tokens += out.shape[1] - ids.shape[1]
    figures["batch1_tok_s"] = tokens / seconds
    log(
        f"batch-1 HF generate: {tokens} tokens in {seconds:.1f} s = {figures['batch1_tok_s']:.1f} tok/s "
        f"({baseline_n} prompts)"
    )
    del loaded
    # the same decode loop as the local backend, one row at a time (separates batching from loop overheads)
    write_jsonl(workdir / "batch1_prompts.jsonl", prompts[:baseline_n])
    result = regenerate(
        workdir / "batch1_prompts.jsonl",
        workdir / "batch1.jsonl",
        backend="local",
        max_turns=1,
        max_new_tokens=max_new_tokens,
        dtype=dtype,
        batch_size=1,
        target=target,
        log=log,
    )
    figures["engine_batch1_tok_s"] = result.tokens_per_s
    log(f"batch-1 local backend: {result.tokens} tokens in {result.seconds:.1f} s = {result.tokens_per_s:.1f} tok/s")

    result = regenerate(
        workdir / "prompts.jsonl",
        workdir / "local.jsonl",
        backend="local",
        max_turns=1,
        max_new_tokens=max_new_tokens,
        dtype=dtype,
        batch_size=batch_size,
        target=target,
        log=log,
    )
    figures["local_tok_s"] = result.tokens_per_s
    figures["local_seconds"] = result.seconds
    figures["local_tokens"] = result.tokens
    figures["speedup_vs_batch1"] = figures["local_tok_s"] / figures["batch1_tok_s"]
    figures["speedup_vs_engine_batch1"] = figures["local_tok_s"] / figures["engine_batch1_tok_s"]
    log(
        f"local dynamic batching: {result.tokens} tokens in {result.seconds:.1f} s = {result.tokens_per_s:.1f} tok/s "
        f"= {figures['speedup_vs_batch1']:.1f}x batch-1 HF generate, "
        f"{figures['speedup_vs_engine_batch1']:.1f}x batch-1 local backend"
    )

    if serve_n:
        write_jsonl(workdir / "serve_prompts.jsonl", prompts[:serve_n])
        from eagle3lab.models.target import resolve

        with transformers_serve(resolve(target), dtype=dtype, log_path=workdir / "serve.log") as (address, _):
            result = regenerate(
                workdir / "serve_prompts.jsonl",
                workdir / "serve.jsonl",
                backend="openai",
                max_turns=1,
                max_new_tokens=max_new_tokens,
                server_addresses=[address],
                concurrency=serve_concurrency,
                target=target,
                log=log,
            )
        figures["serve_tok_s"] = result.tokens_per_s
        log(
            f"transformers serve (openai backend, concurrency {serve_concurrency}, {serve_n} prompts): "
            f"{result.tokens} tokens in {result.seconds:.1f} s = {result.tokens_per_s:.1f} tok/s"
        )
    log(json.dumps(figures))
    return figures


def bench_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="eagle3lab regen bench", description=bench.__doc__)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--baseline-n", type=int, default=4)
    p.add_argument("--serve-n", type=int, default=16, help="0 skips the transformers serve measurement")
    p.add_argument("--serve-concurrency", type=int, default=4)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    bench(
        a.n,
        a.max_new_tokens,
        a.batch_size,
        a.baseline_n,
        a.serve_n,
        a.serve_concurrency,
        a.dtype,
        a.target,
        workdir=a.workdir,
    )
    return 0


# ---- command line ------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3lab regen", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["local", "openai"], default="local")
    p.add_argument("--input", required=True, help="ShareGPT-style JSONL ({id, conversations:[{role, content}]})")
    p.add_argument("--output", required=True, help="output JSONL; errors/skipped/progress files sit beside it")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--max-turns", type=int, default=2, help="user turns answered per conversation")
    p.add_argument("--resume", action="store_true", help="continue an existing OUT: skip ids already written")
    p.add_argument("--limit", type=int, default=None, help="only the first N input rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--target",
        default="smollm2-135m-instruct",
        help="local: the model; openai: the tokenizer for prompt-length checks (the served model)",
    )
    p.add_argument("--max-context", type=int, default=None, help="default: the target's max_position_embeddings")
    g = p.add_argument_group("local backend")
    g.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    g.add_argument("--batch-size", type=int, default=32)
    g.add_argument("--max-batch-tokens", type=int, default=65536, help="bound on batch rows x padded length")
    g = p.add_argument_group("openai backend")
    g.add_argument("--server-address", action="extend", nargs="+", default=None, metavar="HOST:PORT")
    g.add_argument("--model", default=None, help="model name to request (default: the first of /v1/models)")
    g.add_argument("--concurrency", type=int, default=16)
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    g.add_argument("--retries", type=int, default=4)
    g.add_argument("--backoff", type=float, default=1.0, help="first retry delay in seconds, doubled per retry")
    g.add_argument(
        "--max-consecutive-errors",
        type=int,
        default=32,
        help="abort after this many failed records in a row (servers gone)",
    )
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":
        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        result = regenerate(
            args.input,
            args.output,
            backend=args.backend,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            max_turns=args.max_turns,
            resume=args.resume,
            limit=args.limit,
            seed=args.seed,
            target=args.target,
            dtype=args.dtype,
            batch_size=args.batch_size,
            max_batch_tokens=args.max_batch_tokens,
            max_context=args.max_context,
            server_addresses=args.server_address or ["127.0.0.1:30000"],
            model=args.model,
            concurrency=args.concurrency,
            timeout=args.timeout,
            retries=args.retries,
            backoff=args.backoff,
            max_consecutive_errors=args.max_consecutive_errors,
            progress_bar=not args.no_progress,
        )
    except NoServerError as e:
        print(f"eagle3lab regen: error: {e}", file=sys.stderr)
        return EXIT_NO_SERVER
    except (RegenError, InputError) as e:
        print(f"eagle3lab regen: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK if result.accounting.ok and not result.accounting.errors and not result.aborted else EXIT_INCOMPLETE


if __name__ == "__main__":
    sys.exit(main())
