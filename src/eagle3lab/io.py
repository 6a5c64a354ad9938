"""Small file helpers: atomic writes, JSONL reading with errors that name file, line and field, and the one error path
of every command (bad input exits 2, a failed run 1, each in one line)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class InputError(ValueError):
    """Bad input: the message names the file, the record and the field (or the command's own flag)."""


class RunFailed(RuntimeError):
    """A run that could not finish (a server that died, training that failed, a stage's cell): the message says
    what failed and where its log is."""


EXIT_FAILED, EXIT_BAD_INPUT = 1, 2


def command(prog: str):
    """The one error path of every command's main(argv): bad input is one line on stderr naming the command and what
    was wrong, exit 2; a run that failed, one line, exit 1; neither ever a traceback. Commands raise; only this
    prints."""

    def wrap(main):
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except InputError as e:
                print(f"{prog}: {e}", file=sys.stderr)
                return EXIT_BAD_INPUT
            except RunFailed as e:
                print(f"{prog}: {e}", file=sys.stderr)
                return EXIT_FAILED

        return run

    return wrap


def folder_argument(path: str | os.PathLike, flag: str, holds: str = "config.json") -> Path:
    """A folder a command was given by `flag` (its own option name, or the positional's metavar), checked before any
    model loads: InputError when nothing is there, when a file is there, or when the folder lacks `holds`."""
    folder = Path(path)
    if not folder.exists():
        raise InputError(f"{flag} {folder}: nothing there")
    if not folder.is_dir():
        raise InputError(f"{flag} {folder}: a file, not a folder (one holding {holds})")
    if holds and not (folder / holds).is_file():
        raise InputError(f"{flag} {folder}: no {holds} in this folder")
    return folder


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it into place only if the block succeeds.

    A killed or failing writer therefore never leaves a half-written file that a later run would trust.
    Works for files and for directories (the block may create a directory at the yielded path).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)) / path.name
    try:
        yield tmp
        if path.is_dir() and tmp.is_dir():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_jsonl(path: str | os.PathLike, rows) -> int:
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_jsonl(path: str | os.PathLike, *, tolerate_torn_tail: bool = False) -> Iterator[dict]:
    """Yield the JSON objects of a JSONL file.

    A malformed line raises InputError naming file and line; with tolerate_torn_tail a malformed
    *last* line without a trailing newline (a writer killed mid-line) is ignored instead.
    """
    path = Path(path)
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            if tolerate_torn_tail and i == last:
                return
            raise InputError(f"{path}: line {i + 1}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}: line {i + 1}: expected a JSON object, got {type(obj).__name__}")
        yield obj


def require(record: dict, field: str, where: str, kind: type | tuple = object) -> Any:
    """Return record[field], or raise InputError naming where (file and record) and the field."""
    if field not in record:
        raise InputError(f"{where}: missing field '{field}'")
    value = record[field]
    if not isinstance(value, kind):
        raise InputError(
            f"{where}: field '{field}' should be {getattr(kind, '__name__', kind)}, got {type(value).__name__}"
        )
    return value


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
