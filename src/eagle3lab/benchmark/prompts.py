"""Benchmark prompts: the evaluation sets' first user turns or a JSONL file's, with the target's chat template."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3lab.io import InputError, read_jsonl, require


@dataclass
class Prompt:
    id: str
    set: str
    messages: list[dict]
    ids: list[int]


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _prompt_messages(record: dict, where: str) -> list[dict]:
    from eagle3lab.data.sources import sharegpt_turns

    if "prompt" in record:
        return [{"role": "user", "content": require(record, "prompt", where, str)}]
    if "conversations" not in record:
        raise InputError(f"{where}: needs a field 'prompt' (one user message) or 'conversations'")
    turns = sharegpt_turns(require(record, "conversations", where, list), where)
    while turns and turns[-1]["role"] == "assistant":  # generate the next assistant turn
        turns.pop()
    if not any(t["role"] == "user" for t in turns):
        raise InputError(f"{where}: field 'conversations' has no user turn")
    return turns


def load_prompts(tokenizer, sets=None, prompts_file=None, limit: int | None = None) -> list[Prompt]:
    """Evaluation-set prompts (first user turn, chat template applied) or a JSONL file's, `limit` per set."""
    out: list[Prompt] = []
    if prompts_file is not None:
        path = Path(prompts_file)
        if not path.exists():
            raise InputError(f"{path}: prompts file not found")
        seen: dict[str, int] = {}
        for i, record in enumerate(read_jsonl(path)):
            where = f"{path}: record {i + 1}"
            rid = require(record, "id", where, (str, int))
            name = record.get("set", path.stem)
            if not isinstance(name, str):
                raise InputError(f"{where}: field 'set' should be a string")
            if limit is not None and seen.get(name, 0) >= limit:
                continue
            seen[name] = seen.get(name, 0) + 1
            messages = _prompt_messages(record, where)
            out.append(Prompt(str(rid), name, messages, encode_chat(tokenizer, messages)))
        if not out:
            raise InputError(f"{path}: no prompts")
        return out
    from eagle3lab.data.sources import EVALUATION_SETS

    for name in sets or ("mtbench",):
        if name not in EVALUATION_SETS:
            raise InputError(f"--sets: unknown set '{name}' (known: {', '.join(EVALUATION_SETS)})")
        records = EVALUATION_SETS[name]()
        for record in records[:limit] if limit is not None else records:
            messages = [{"role": "user", "content": record.prompt}]
            out.append(Prompt(record.id, name, messages, encode_chat(tokenizer, messages)))
    return out
