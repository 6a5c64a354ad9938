"""The training prompt mixture: per-source quotas to a total, deduplicated, evaluation prompts excluded, split into
train/validation, written as ShareGPT-style JSONL rows {id, source, category, source_id, conversations}."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab.data.formats import clean_turns, normalize_text
from eagle3lab.data.sources import EVALUATION_SETS, Record
from eagle3lab.data.survey import prompt_key_of
from eagle3lab.io import InputError, write_jsonl


class EvalIndex:
    """Finds evaluation prompts inside training text, by normalized text: an exact match of any evaluation user turn,
    or a shared run of `ngram` words (so an evaluation prompt wrapped in other words is caught too)."""

    def __init__(self, eval_records: list[Record], ngram: int = 13):
        self.ngram = ngram
        self.exact: dict[str, str] = {}
        self.grams: dict[tuple, str] = {}
        for r in eval_records:
            for t in r.conversations:
                if t["role"] != "user":
                    continue
                norm = normalize_text(t["content"])
                self.exact.setdefault(norm, r.id)
                for g in self._grams(norm.split()):
                    self.grams.setdefault(g, r.id)
        self.size = len(self.exact)

    def _grams(self, words: list[str]):
        return (tuple(words[i : i + self.ngram]) for i in range(len(words) - self.ngram + 1))

    def match(self, text: str) -> str | None:
        """The id of an evaluation record whose prompt appears in `text`, else None."""
        norm = normalize_text(text)
        if norm in self.exact:
            return self.exact[norm]
        return next((self.grams[g] for g in self._grams(norm.split()) if g in self.grams), None)


@dataclass
class Mixture:
    train: list[dict]
    val: list[dict]
    summary: dict = field(default_factory=dict)


def allocate(quotas: dict[str, float], total: int) -> dict[str, int]:
    """Integer counts proportional to the quotas that sum exactly to `total` (largest remainder)."""
    weight = sum(quotas.values())
    raw = {s: total * q / weight for s, q in quotas.items()}
    counts = {s: int(v) for s, v in raw.items()}
    for s in sorted(raw, key=lambda s: (-(raw[s] - counts[s]), s))[: total - sum(counts.values())]:
        counts[s] += 1
    return counts


def stable_id(source: str, prompt_key: str) -> str:
    """Same prompt from the same source -> same id, whatever the seed, quota or order of the run."""
    return f"{source}:{hashlib.sha1(prompt_key.encode()).hexdigest()[:16]}"


def build_mixture(
    sources: dict[str, list[Record]],
    quotas: dict[str, float],
    total: int,
    *,
    eval_records: list[Record],
    val_fraction: float = 0.05,
    seed: int = 0,
    ngram: int = 13,
) -> Mixture:
    """Draw `total` conversations from `sources` in proportion to `quotas` (deterministic given `seed`).

    Each source is walked in a seeded random order; a record is taken after cleaning (empty turns and leading
    assistant turns dropped), unless it has no user turn, repeats an already-taken prompt (normalized user turns,
    across sources), or contains an evaluation prompt. Sources that run short are reported, not topped up."""
    _check_request(sources, quotas, total, val_fraction, eval_records)
    index = EvalIndex(eval_records, ngram)
    counts = allocate(quotas, total)
    taken_keys: set[str] = set()  # shared across sources: a prompt is taken once, whichever source has it
    selected: list[dict] = []
    per_source = {}
    for name in sorted(quotas):
        fraction = round(quotas[name] / sum(quotas.values()), 4)
        rows, per_source[name] = _draw(name, sources[name], counts[name], fraction, index, taken_keys, seed)
        selected += rows
    train, val = split(selected, val_fraction, seed)
    summary = {
        "seed": seed,
        "total_requested": total,
        "total_selected": len(selected),
        "train": len(train),
        "val": len(val),
        "val_fraction": val_fraction,
        "eval_prompts_checked": index.size,
        "eval_ngram": ngram,
        "sources": per_source,
        "notes": "leading assistant turns (before the first user turn) and empty turns are dropped; "
        "conversations left without a user turn are skipped (no_prompt)",
    }
    return Mixture(train=train, val=val, summary=summary)


def _check_request(sources, quotas, total, val_fraction, eval_records) -> None:
    if total < 1:
        raise InputError(f"mixture total must be at least 1, got {total}")
    if not 0 <= val_fraction < 1:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if not quotas:
        raise InputError("mixture quotas are empty: give at least one source -> fraction")
    for name, q in quotas.items():
        if name in EVALUATION_SETS or any(r.category == "evaluation" for r in sources.get(name, [])[:1]):
            raise InputError(f"mixture quota names evaluation set {name!r}: evaluation sets are never mixed in")
        if name not in sources:
            raise InputError(f"mixture quota names unknown source {name!r}; available: {sorted(sources)}")
        if not isinstance(q, (int, float)) or isinstance(q, bool) or q <= 0:
            raise InputError(f"mixture quota for {name!r} must be a positive fraction, got {q!r}")
    if not eval_records:
        raise InputError("no evaluation records given: the mixture must be checked against the evaluation prompts")


def _draw(name, records, quota, fraction, index, taken_keys, seed) -> tuple[list[dict], dict]:
    """Up to `quota` clean, new, evaluation-free conversations of one source, walked in a seeded order."""
    stats = {
        "quota": quota,
        "fraction": fraction,
        "available": len(records),
        "scanned": 0,
        "selected": 0,
        "duplicates": 0,
        "eval_excluded": 0,
        "no_prompt": 0,
        "leading_assistant_turns_dropped": 0,
        "empty_turns_dropped": 0,
        "conversations_trimmed": 0,
        "eval_matches": [],
    }
    order = sorted(records, key=lambda r: r.id)
    random.Random(f"{seed}:{name}").shuffle(order)
    rows = []
    for rec in order:
        if stats["selected"] >= quota:
            break
        stats["scanned"] += 1
        turns, leading, empty = clean_turns(rec.conversations)
        if leading or empty:
            stats["leading_assistant_turns_dropped"] += leading
            stats["empty_turns_dropped"] += empty
            stats["conversations_trimmed"] += 1
        if not any(t["role"] == "user" for t in turns):
            stats["no_prompt"] += 1
            continue
        key = prompt_key_of(turns)
        if key in taken_keys:
            stats["duplicates"] += 1
            continue
        hit = next((m for t in turns if t["role"] == "user" for m in [index.match(t["content"])] if m), None)
        if hit:
            stats["eval_excluded"] += 1
            if len(stats["eval_matches"]) < 20:
                stats["eval_matches"].append({"source_id": rec.id, "eval_id": hit})
            continue
        taken_keys.add(key)
        rows.append(
            {
                "id": stable_id(name, key),
                "source": name,
                "category": rec.category,
                "source_id": rec.id,
                "conversations": turns,
            }
        )
        stats["selected"] += 1
    stats["shortfall"] = quota - stats["selected"]
    return rows, stats


def split(rows: list[dict], val_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Deterministic split by a seeded hash of the stable id; both parts come out in that hashed order."""
    ordered = sorted(rows, key=lambda r: hashlib.sha1(f"{seed}:{r['id']}".encode()).hexdigest())
    n_val = round(len(ordered) * val_fraction)
    if val_fraction > 0 and n_val == 0 and len(ordered) >= 2:
        n_val = 1
    return ordered[n_val:], ordered[:n_val]


def write_mixture(mixture: Mixture, out_dir: str | Path) -> dict[str, Path]:
    """Write train.jsonl and val.jsonl atomically (a killed run leaves the previous files intact)."""
    out_dir = Path(out_dir)
    paths = {"train": out_dir / "train.jsonl", "val": out_dir / "val.jsonl"}
    write_jsonl(paths["train"], mixture.train)
    write_jsonl(paths["val"], mixture.val)
    return paths
