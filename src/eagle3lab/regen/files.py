"""OUT and its sidecars: one writer at a time (a lock), append record by record, resume after a kill (torn tails cut,
stale records set aside, errors retried), and the closing check success + error + skipped = input."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab.io import read_jsonl, write_text
from eagle3lab.regen.errors import RegenError
from eagle3lab.regen.inputs import Skip

ERRORS_SUFFIX, SKIPPED_SUFFIX, PROGRESS_SUFFIX = ".errors.jsonl", ".skipped.jsonl", ".progress.json"
STALE_SUFFIX, LOCK_SUFFIX = ".stale.jsonl", ".lock"


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
        self.lock = side_path(out, LOCK_SUFFIX)
        self._handles: dict[Path, object] = {}

    def jsonl(self) -> list[Path]:
        return [self.out, self.errors, self.skipped]

    @contextlib.contextmanager
    def locked(self):
        """Hold an exclusive flock on OUT-stem.lock for the run: a second run on the same OUT would append the same
        ids twice, so it is refused. The kernel drops the lock of a killed run; a finished run removes the file."""
        self.out.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise RegenError(
                    f"{self.out} is being written by another regeneration (pid {holder}, holding {self.lock}): "
                    "wait for it to end or stop it, or write to another --output"
                ) from None
            with contextlib.suppress(FileNotFoundError):
                if os.stat(self.lock).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)  # a finishing run removed the file between our open and our lock: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            os.unlink(self.lock)  # before the unlock: a run that opened the old file sees it gone and retries
            os.close(fd)

    def open(self, resume: bool, keys: set[str], generation: dict) -> set[str]:
        """Prepare the files and return the keys of the input already finished (written or skipped) by a run with
        this `generation` (the settings each record carries)."""
        existing = [p for p in self.jsonl() if p.exists() and p.stat().st_size > 0]
        if existing and not resume:
            raise RegenError(
                f"{existing[0]} already exists and is not empty: pass --resume to continue that run, or "
                f"remove {', '.join(str(p) for p in existing)} to start over"
            )
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for p in self.jsonl():
            truncate_torn_tail(p)
        self._set_aside_stale(keys, generation)
        done = set(file_ids(self.out)) | set(file_ids(self.skipped))
        # Errors are retried on resume: start that file afresh (ids not yet redone are simply pending again).
        for p, mode in ((self.out, "a"), (self.skipped, "a"), (self.errors, "w")):
            self._handles[p] = open(p, mode, encoding="utf-8")  # noqa: SIM115 (open for the run; close() ends it)
        return done

    def _set_aside_stale(self, keys: set[str], generation: dict) -> None:
        """Resuming on a changed input (another mixture, a smaller --limit) or changed settings (another temperature,
        seed, model or answer length: a DVC run keeps OUT across parameter changes): finished records whose ids the
        input no longer has, or that other settings wrote, move to OUT.stale.jsonl, so the output and its accounting
        cover exactly the input, answered one way."""
        for path in (self.out, self.skipped):
            if not path.exists():
                continue
            keep, stale = [], []
            for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
                if line.strip():
                    row = json.loads(line)
                    current = str(row["id"]) in keys and row.get("generation", generation) == generation
                    (keep if current else stale).append(line)
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
