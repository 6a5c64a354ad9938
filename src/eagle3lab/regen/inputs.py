"""Input planning: ShareGPT-style rows -> conversations to regenerate (Job) or skips with a reason (Skip), the
prompt-length rule under the target's chat template, and the seeded ShareGPT prompts of the throughput and on-policy
checks."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from eagle3lab.data.sources import ROLE_NAMES
from eagle3lab.regen.errors import RegenError


@dataclass
class Job:
    """One input conversation: its user turns are kept, every assistant turn is regenerated."""

    key: str  # unique within the run (the input id, or a stand-in when missing or duplicated)
    source_id: str
    line: int
    system: str | None
    users: list[str]
    labels: dict  # the input row's LABELS, carried to the regenerated row


@dataclass
class Skip:
    key: str
    line: int
    reason: str
    kind: str  # short cause for tables: malformed, no-conversations, bad-turn, starts-with-assistant, empty, ...
    source_id: str | None = None


class SkippedRow(Exception):
    """An input row that cannot be regenerated; `kind` is the short cause recorded in the skipped file."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


LABELS = ("source", "category")  # a mixture row's labels (data.mixture): per-source drafts read `source`


def row_labels(obj: dict) -> dict:
    """The row's LABELS (None where absent), or SkippedRow for a label that is not a string."""
    for name in LABELS:
        if obj.get(name) is not None and not isinstance(obj[name], str):
            raise SkippedRow("bad-label", f"field {name!r} should be a string, got {type(obj[name]).__name__}")
    return {name: obj.get(name) for name in LABELS}


def plan_conversation(obj: dict, max_turns: int | None) -> tuple[str | None, list[str]]:
    """Return (system prompt, user turns to answer) of one input row, or raise SkippedRow with the reason."""
    if "conversations" not in obj:
        raise SkippedRow("no-conversations", "missing field 'conversations'")
    raw = obj["conversations"]
    if not isinstance(raw, list) or not raw:
        raise SkippedRow("no-conversations", "field 'conversations' should be a non-empty list")
    turns = []
    for j, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise SkippedRow("bad-turn", f"conversations[{j}] is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role not in ROLE_NAMES:
            raise SkippedRow("bad-turn", f"conversations[{j}]: unknown role {role!r}")
        if not isinstance(content, str):
            raise SkippedRow(
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
        raise SkippedRow("starts-with-assistant", "starts with the assistant and has no user turn after it")
    users: list[list] = []  # [first index, text]; consecutive user turns merge into one
    previous = None
    for j, role, content in turns:
        if role == "system":
            raise SkippedRow("bad-turn", f"conversations[{j}]: a system turn after the start")
        if role == "user":
            if not content.strip():
                raise SkippedRow("empty", f"conversations[{j}]: empty content")
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
                labels = row_labels(obj)
            except SkippedRow as e:
                items.append(Skip(key, lineno, f"{path}: line {lineno} (id {source_id!r}): {e}", e.kind, source_id))
                continue
            items.append(Job(key, source_id, lineno, system, users, labels))
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


def sharegpt_prompts(n: int, tokenizer, max_prompt_tokens: int = 512, seed: int = 0) -> list[dict]:
    """n single-turn ShareGPT prompts (first user turn, at most max_prompt_tokens tokens), a seeded sample
    (what regen bench and the on-policy check send)."""
    from eagle3lab.data.sources import load_sharegpt

    records, _ = load_sharegpt()
    random.Random(seed).shuffle(records)
    rows = []
    for rec in records:
        try:
            _, users = plan_conversation({"conversations": rec.conversations}, 1)
        except SkippedRow:
            continue
        if len(tokenizer(users[0], add_special_tokens=False)["input_ids"]) <= max_prompt_tokens:
            rows.append({"id": rec.id, "conversations": [{"role": "user", "content": users[0]}]})
        if len(rows) == n:
            break
    return rows
