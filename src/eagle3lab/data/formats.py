"""Read chat/instruction datasets in the common formats into `eagle3lab.data.sources.Record`s through `datasets`.

Formats (detected from the columns, or forced with `format=`):
  sharegpt        `conversations`: [{from, value}] or [{role, content}]
  messages        `messages`: [{role, content}] (OpenAI style)
  alpaca          `instruction`, optional `input`, `output`
  prompt_response a prompt column (prompt/question/problem/query/input) and a response column
                  (response/answer/completion/solution/output)
  pretokenized    `input_ids` + `loss_mask` (needs the tokenizer that produced them)
Locations: a JSON/JSONL/parquet file (optionally .gz), a folder in hub layout (data/train-*.parquet, *.jsonl, ...),
or a Hugging Face hub id (online only).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from eagle3lab.data.sources import ROLE_NAMES, Record
from eagle3lab.io import InputError

PROMPT_KEYS = ("prompt", "question", "problem", "query", "input")
RESPONSE_KEYS = ("response", "answer", "completion", "solution", "output")
SYSTEM_KEYS = ("system", "system_prompt")
FORMATS = ("sharegpt", "messages", "alpaca", "prompt_response", "pretokenized")
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
ID_KEYS = ("id", "idx", "task_id", "question_id", "uuid")


def detect_format(columns, where: str) -> str:
    cols = set(columns)
    if "conversations" in cols:
        return "sharegpt"
    if "messages" in cols:
        return "messages"
    if "input_ids" in cols and "loss_mask" in cols:
        return "pretokenized"
    if "instruction" in cols and "output" in cols:
        return "alpaca"
    if any(k in cols for k in PROMPT_KEYS) and any(k in cols for k in RESPONSE_KEYS if k != "input"):
        return "prompt_response"
    raise InputError(
        f"{where}: cannot tell the format from columns {sorted(cols)}; expected one of: 'conversations' (ShareGPT), "
        f"'messages' (OpenAI), 'instruction'+'output' (Alpaca), a prompt column {list(PROMPT_KEYS)} with a response "
        f"column {list(RESPONSE_KEYS)}, or 'input_ids'+'loss_mask' (pre-tokenized); or pass format= explicitly"
    )


def _data_files(folder: Path) -> tuple[str, dict[str, list[str]]]:
    """Files of a hub-layout folder grouped by split, and the `datasets` builder that reads them."""
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    files = [p for p in files if _suffix(p) in BUILDERS]
    if not files:
        raise InputError(f"{folder}: no data files (.json, .jsonl, .parquet, .csv, optionally .gz) in this folder")
    builders = {BUILDERS[_suffix(p)] for p in files}
    if len(builders) > 1:
        raise InputError(f"{folder}: mixes file types {sorted(builders)}; keep one format per dataset folder")
    splits: dict[str, list[str]] = {}
    for p in files:
        name = p.name.lower()
        split = next(
            (
                s
                for s in ("train", "validation", "valid", "test")
                if name.startswith(s) or f"/{s}/" in "/" + str(p.relative_to(folder).parent).lower() + "/"
            ),
            "train",
        )
        splits.setdefault(split, []).append(str(p))
    return builders.pop(), splits


def _suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def open_dataset(location: str | os.PathLike, split: str = "train"):
    """A `datasets.Dataset` for a local file, a local hub-layout folder, or a hub id (online)."""
    import datasets

    path = Path(location).expanduser()
    if path.is_file():
        builder = BUILDERS.get(_suffix(path))
        if builder is None:
            raise InputError(f"{path}: unsupported file type; use .json, .jsonl, .parquet or .csv (optionally .gz)")
        try:
            return datasets.load_dataset(builder, data_files={"train": str(path)}, split="train")
        except Exception as e:  # pyarrow/json errors: say which file
            raise InputError(f"{path}: could not be read as {builder} ({_cause(e)})") from None
    if path.is_dir():
        builder, splits = _data_files(path)
        if split not in splits:
            raise InputError(f"{path}: no split {split!r}; found {sorted(splits)}")
        try:
            return datasets.load_dataset(builder, data_files={split: splits[split]}, split=split)
        except Exception as e:
            raise InputError(f"{path}: could not read split {split!r} as {builder} ({_cause(e)})") from None
    text = str(location)
    if text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise InputError(f"{location}: no such file or folder (and not a hub id of the form org/name)")
    if os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise InputError(_offline_message(text))
    try:
        return datasets.load_dataset(text, split=split)
    except (ConnectionError, OSError) as e:
        raise InputError(_offline_message(text) + f" ({type(e).__name__}: {e})") from None


def _cause(e: BaseException) -> str:
    """The innermost error's type and message (datasets wraps the useful pyarrow error in a generic one)."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {e}"


def _offline_message(hub_id: str) -> str:
    return (
        f"{hub_id}: hub dataset is not reachable (offline). On a machine with network access run "
        f"`huggingface-cli download {hub_id} --repo-type dataset --local-dir data/hub/{hub_id}`, copy that "
        f"folder here, and load the folder instead"
    )


def load_records(
    location: str | os.PathLike,
    *,
    format: str | None = None,
    source: str | None = None,
    category: str = "unknown",
    split: str = "train",
    limit: int | None = None,
    tokenizer=None,
) -> list[Record]:
    """Records from any supported location; the format is detected from the columns unless given."""
    ds = open_dataset(location, split)
    where = str(location)
    fmt = format or detect_format(ds.column_names, where)
    if fmt not in FORMATS:
        raise InputError(f"{where}: unknown format {fmt!r}; use one of {list(FORMATS)}")
    if fmt == "pretokenized" and tokenizer is None:
        raise InputError(f"{where}: pre-tokenized data (input_ids + loss_mask) needs the tokenizer that made it")
    source = source or Path(str(location)).name
    records = []
    for i, row in enumerate(ds):
        if limit is not None and len(records) >= limit:
            break
        row_where = f"{where}: record {i}"
        rid = next((str(row[k]) for k in ID_KEYS if row.get(k) not in (None, "")), str(i))
        turns = _TO_TURNS[fmt](row, row_where, tokenizer)
        records.append(Record(id=f"{source}/{rid}", source=source, category=category, conversations=turns))
    return records


def _sharegpt(row, where, _tok):
    return _role_turns(row.get("conversations"), "conversations", where)


def _messages(row, where, _tok):
    return _role_turns(row.get("messages"), "messages", where)


def _role_turns(raw, field, where) -> list[dict]:
    if not isinstance(raw, list):
        raise InputError(f"{where}: field '{field}' should be a list of turns, got {type(raw).__name__}")
    turns = []
    for j, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise InputError(f"{where}: field '{field}' turn {j} is not an object")
        role = turn.get("from") if turn.get("from") is not None else turn.get("role")
        content = turn.get("value") if turn.get("value") is not None else turn.get("content")
        if role not in ROLE_NAMES and role != "tool":
            raise InputError(f"{where}: field '{field}' turn {j}: unknown role {role!r}")
        if not isinstance(content, str):
            raise InputError(
                f"{where}: field '{field}' turn {j}: content should be a string, got {type(content).__name__}"
            )
        turns.append({"role": ROLE_NAMES.get(role, role), "content": content})
    return turns


def _text(row, key, where) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise InputError(f"{where}: field '{key}' should be a string, got {type(value).__name__}")
    return value


def _system(row) -> list[dict]:
    sys_text = next((row[k] for k in SYSTEM_KEYS if isinstance(row.get(k), str) and row[k].strip()), None)
    return [{"role": "system", "content": sys_text}] if sys_text else []


def _alpaca(row, where, _tok):
    prompt = _text(row, "instruction", where)
    extra = row.get("input")
    if isinstance(extra, str) and extra.strip():
        prompt = f"{prompt}\n\n{extra}"
    return _system(row) + [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": _text(row, "output", where)},
    ]


def _prompt_response(row, where, _tok):
    pkey = next((k for k in PROMPT_KEYS if k in row), None)
    rkey = next((k for k in RESPONSE_KEYS if k in row and k != pkey), None)
    if pkey is None or rkey is None:
        raise InputError(
            f"{where}: needs a prompt column {list(PROMPT_KEYS)} and a response column "
            f"{list(RESPONSE_KEYS)}; found {sorted(row)}"
        )
    return _system(row) + [
        {"role": "user", "content": _text(row, pkey, where)},
        {"role": "assistant", "content": _text(row, rkey, where)},
    ]


CHATML_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.S)


def _pretokenized(row, where, tokenizer):
    """Split the token stream into turns at loss-mask changes: masked spans are the answers. An unmasked span is the
    prompt side; rendered in ChatML it is parsed into its system/user turns, otherwise it is one user turn."""
    ids, mask = row.get("input_ids"), row.get("loss_mask")
    if not isinstance(ids, list) or not isinstance(mask, list):
        raise InputError(f"{where}: fields 'input_ids' and 'loss_mask' should be lists")
    if len(ids) != len(mask):
        raise InputError(f"{where}: field 'loss_mask' has {len(mask)} entries but 'input_ids' has {len(ids)}")
    turns, start = [], 0
    for k in range(1, len(ids) + 1):
        if k < len(ids) and bool(mask[k]) == bool(mask[start]):
            continue
        span = ids[start:k]
        raw = tokenizer.decode(span, skip_special_tokens=False)
        if not mask[start] and "<|im_start|>" in raw:
            turns += [
                {"role": ROLE_NAMES.get(role, role), "content": text.strip()}
                for role, text in CHATML_TURN.findall(raw)
                if text.strip()
            ]
        else:
            text = tokenizer.decode(span, skip_special_tokens=True).strip()
            if text:
                turns.append({"role": "assistant" if mask[start] else "user", "content": text})
        start = k
    return turns


_TO_TURNS = {
    "sharegpt": _sharegpt,
    "messages": _messages,
    "alpaca": _alpaca,
    "prompt_response": _prompt_response,
    "pretokenized": _pretokenized,
}


def normalize_text(text: str) -> str:
    """Comparison key for duplicates and evaluation overlap: NFKC, case-folded, whitespace collapsed."""
    import unicodedata

    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def clean_turns(turns: list[dict]) -> tuple[list[dict], int, int]:
    """Drop empty turns, then assistant turns before the first user turn (leading system turns stay).

    Returns (turns, leading assistant turns dropped, empty turns dropped). A conversation that starts with the
    assistant has no prompt for that answer, and regeneration conditions every answer on the user before it.
    """
    kept = [t for t in turns if isinstance(t.get("content"), str) and t["content"].strip()]
    empty = len(turns) - len(kept)
    out, leading, seen_user = [], 0, False
    for t in kept:
        if t["role"] == "user":
            seen_user = True
        elif t["role"] == "assistant" and not seen_user:
            leading += 1
            continue
        out.append(t)
    return out, leading, empty
