"""The packaged raw sources as one record type.

Every loader returns `Record`s: id, source, category, conversations (role/content turns) and an optional
reference answer. This module holds ShareGPT and the evaluation sets; the other packaged training sources and the
reserved sets are in `eagle3lab.data.packaged`.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle3lab.io import InputError, read_jsonl, require
from eagle3lab.paths import DATA

ROLE_NAMES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
}


@dataclass
class Record:
    id: str
    source: str
    category: str
    conversations: list[dict] = field(default_factory=list)  # [{"role": "user"|"assistant"|"system", "content": str}]
    reference: str | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def prompt(self) -> str:
        """The first user turn."""
        return next(t["content"] for t in self.conversations if t["role"] == "user")


@dataclass
class SalvageReport:
    complete: int  # conversations parsed
    dropped_bytes: int  # bytes of the partial tail that were not a complete record
    total_bytes: int


def salvage_json_array(path: Path) -> tuple[list[dict], SalvageReport]:
    """Parse a JSON array that may be cut off mid-record: keep every complete element, drop the partial tail."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise InputError(f"{path}: not a JSON array (no '[' found)")
    items, pos, end_of_last = [], start + 1, start + 1
    n = len(text)
    while True:
        while pos < n and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or text[pos] == "]":
            end_of_last = pos + 1 if pos < n else end_of_last
            break
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the truncated tail
        items.append(obj)
        end_of_last = pos
    dropped = len(text[end_of_last:].encode("utf-8")) if end_of_last < n else 0
    return items, SalvageReport(complete=len(items), dropped_bytes=dropped, total_bytes=Path(path).stat().st_size)


def sharegpt_turns(raw: list, where: str) -> list[dict]:
    """Map ShareGPT `{from, value}` (or `{role, content}`) turns to role/content turns."""
    turns = []
    for j, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise InputError(f"{where}: turn {j} is not an object")
        role = turn.get("from", turn.get("role"))
        content = turn.get("value", turn.get("content"))
        if role not in ROLE_NAMES:
            raise InputError(f"{where}: turn {j}: unknown role {role!r} in field 'from'")
        if not isinstance(content, str):
            raise InputError(f"{where}: turn {j}: field 'value' should be a string")
        turns.append({"role": ROLE_NAMES[role], "content": content})
    return turns


def load_sharegpt(path: Path | None = None) -> tuple[list[Record], SalvageReport]:
    path = path or DATA / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    require_data(path)
    items, report = salvage_json_array(path)
    records = []
    for i, item in enumerate(items):
        where = f"{path}: record {i} (id {item.get('id')!r})"
        convs = sharegpt_turns(require(item, "conversations", where, list), where)
        records.append(
            Record(id=f"sharegpt/{item.get('id', i)}", source="sharegpt", category="chat", conversations=convs)
        )
    return records, report


def load_mtbench(path: Path | None = None) -> list[Record]:
    """MT-bench: two user turns per question; the second is asked after the model's first answer."""
    path = path or DATA / "mtbench" / "mt-en.jsonl"
    require_data(path)
    records = []
    for i, row in enumerate(read_jsonl(path)):
        where = f"{path}: record {i + 1}"
        turns = require(row, "turns", where, list)
        records.append(
            Record(
                id=f"mtbench/{require(row, 'question_id', where)}",
                source="mtbench",
                category=row.get("category", "mtbench"),
                conversations=[{"role": "user", "content": t} for t in turns],
            )
        )
    return records


def load_humaneval(path: Path | None = None) -> list[Record]:
    path = path or DATA / "humaneval" / "HumanEval.jsonl.gz"
    require_data(path)
    records = []
    with gzip.open(path, "rt") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            where = f"{path}: record {i + 1}"
            row = json.loads(line)
            prompt = require(row, "prompt", where, str)
            records.append(
                Record(
                    id=require(row, "task_id", where, str),
                    source="humaneval",
                    category="code",
                    conversations=[{"role": "user", "content": "Complete the following Python function.\n\n" + prompt}],
                    reference=row.get("canonical_solution"),
                )
            )
    return records


def load_gsm8k(path: Path | None = None) -> list[Record]:
    path = path or DATA / "gsm8k" / "test.jsonl"
    require_data(path)
    return [
        Record(
            id=f"gsm8k-test/{i}",
            source="gsm8k",
            category="math",
            conversations=[{"role": "user", "content": require(row, "question", f"{path}: record {i + 1}", str)}],
            reference=row.get("answer"),
        )
        for i, row in enumerate(read_jsonl(path))
    ]


def require_data(path: Path) -> None:
    if not Path(path).exists():
        raise FileNotFoundError(f"{path} is missing: run `make data` (or `eagle3lab data fetch`) first")


def read_json(path: Path):
    """One JSON document from data/, or an InputError naming the file."""
    require_data(path)
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON ({e})") from None


# Evaluation sets have a registry of their own (training sources: packaged.TRAINING_SOURCES; reserved sets, in
# neither: packaged.RESERVED_SETS), so no mixture can pick one up as training data by name.
EVALUATION_SETS = {"mtbench": load_mtbench, "humaneval": load_humaneval, "gsm8k": load_gsm8k}
