"""The training prompt mixture: category quotas to a total (each category's sources with their caps), deduplicated,
evaluation and reserved prompts excluded, split into train/validation, written as ShareGPT-style JSONL rows
{id, source, category, source_id, conversations}."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab.data.formats import clean_turns, normalize_text
from eagle3lab.data.packaged import RESERVED_SETS
from eagle3lab.data.sources import EVALUATION_SETS, Record
from eagle3lab.data.survey import prompt_key_of
from eagle3lab.io import InputError, write_jsonl


class HeldOutIndex:
    """Finds held-out prompts (evaluation and reserved sets) inside training text, by normalized text: an exact match
    of any held-out user turn, or a shared run of `ngram` words (so a prompt wrapped in other words is caught too)."""

    def __init__(self, held_out: list[Record], ngram: int = 13):
        self.ngram = ngram
        self.exact: dict[str, str] = {}
        self.grams: dict[tuple, str] = {}
        self.reserved = {r.id for r in held_out if r.source in RESERVED_SETS}
        self.checked = {"evaluation": 0, "reserved": 0}  # distinct prompts of each kind
        for r in held_out:
            for t in r.conversations:
                if t["role"] != "user":
                    continue
                norm = normalize_text(t["content"])
                if norm not in self.exact:
                    self.checked["reserved" if r.id in self.reserved else "evaluation"] += 1
                self.exact.setdefault(norm, r.id)
                for g in self._grams(norm.split()):
                    self.grams.setdefault(g, r.id)
        self.size = len(self.exact)

    def _grams(self, words: list[str]):
        return (tuple(words[i : i + self.ngram]) for i in range(len(words) - self.ngram + 1))

    def match(self, text: str) -> str | None:
        """The id of a held-out record whose prompt appears in `text`, else None."""
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


def plan(quotas: dict[str, dict], total: int) -> dict[str, int]:
    """Conversations per source: categories get `total` by their shares; a category's count is split evenly among
    its sources, none above its cap (null: no cap), what a capped source cannot take going to the others (in name
    order for the odd one). A category whose sources are all at their caps comes out short."""
    counts = {}
    for category, n in allocate({c: q["share"] for c, q in quotas.items()}, total).items():
        caps = quotas[category]["sources"]
        open_, left = sorted(caps), n
        while open_:
            even = allocate(dict.fromkeys(open_, 1), left)
            full = [s for s in open_ if caps[s] is not None and even[s] > caps[s]]
            if not full:
                counts.update(even)
                break
            for s in full:  # a capped source takes its cap; the rest is split again among the others
                counts[s] = caps[s]
                left -= caps[s]
                open_.remove(s)
    return counts


def stable_id(source: str, prompt_key: str) -> str:
    """Same prompt from the same source -> same id, whatever the seed, quota or order of the run."""
    return f"{source}:{hashlib.sha1(prompt_key.encode()).hexdigest()[:16]}"


def build_mixture(
    sources: dict[str, list[Record]],
    quotas: dict[str, dict],
    total: int,
    *,
    held_out: list[Record],
    val_fraction: float = 0.05,
    seed: int = 0,
    ngram: int = 13,
) -> Mixture:
    """Draw `total` conversations from `sources` by category quotas (`plan`; deterministic given `seed`).

    `held_out` must hold every evaluation set's and every reserved set's records (`packaged.held_out_records()`):
    this is the one check that keeps them out of training. Each source is walked in a seeded random order; a record
    is taken after cleaning (empty turns and leading assistant turns dropped), unless it has no user turn, repeats
    an already-taken prompt (normalized user turns, across sources), or contains a held-out prompt. Sources that
    run short are reported, not topped up."""
    _check_request(sources, quotas, total, val_fraction, held_out)
    index = HeldOutIndex(held_out, ngram)
    counts = plan(quotas, total)
    category = {s: c for c, q in quotas.items() for s in q["sources"]}
    taken_keys: set[str] = set()  # shared across sources: a prompt is taken once, whichever source has it
    selected: list[dict] = []
    per_source = {}
    for name in sorted(counts):
        rows, per_source[name] = _draw(name, sources[name], counts[name], index, taken_keys, seed)
        per_source[name].update(category=category[name], cap=quotas[category[name]]["sources"][name])
        selected += rows
    train, val = split(selected, val_fraction, seed)
    summary = {
        "seed": seed,
        "total_requested": total,
        "total_selected": len(selected),
        "train": len(train),
        "val": len(val),
        "val_fraction": val_fraction,
        "eval_prompts_checked": index.checked["evaluation"],
        "reserved_prompts_checked": index.checked["reserved"],
        "held_out_sets": sorted({r.source for r in held_out}),
        "eval_ngram": ngram,
        "categories": {
            c: {"share": q["share"], "planned": sum(counts[s] for s in q["sources"])} for c, q in quotas.items()
        },
        "sources": per_source,
        "notes": "leading assistant turns (before the first user turn) and empty turns are dropped; "
        "conversations left without a user turn are skipped (no_prompt)",
    }
    return Mixture(train=train, val=val, summary=summary)


def _check_request(sources, quotas, total, val_fraction, held_out) -> None:
    if total < 1:
        raise InputError(f"mixture total must be at least 1, got {total}")
    if not 0 <= val_fraction < 1:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if not quotas:
        raise InputError("mixture quotas are empty: give at least one category -> {share, sources}")
    seen = {}
    for cat, q in quotas.items():
        where = f"mixture quota {cat!r}"
        if not isinstance(q, dict) or set(q) != {"share", "sources"} or not isinstance(q["sources"], dict):
            raise InputError(f"{where}: expected {{share: fraction, sources: {{source: cap or null}}}}, got {q!r}")
        share = q["share"]
        if not isinstance(share, (int, float)) or isinstance(share, bool) or share <= 0:
            raise InputError(f"{where}: field 'share' must be a positive fraction, got {share!r}")
        if not q["sources"]:
            raise InputError(f"{where}: field 'sources' is empty")
        for name, cap in q["sources"].items():
            _check_source(name, cap, cat, sources, seen)
    missing = (set(EVALUATION_SETS) | set(RESERVED_SETS)) - {r.source for r in held_out}
    if missing:
        raise InputError(
            f"held-out records lack {sorted(missing)}: the mixture must be checked against every evaluation and "
            "reserved set (pass eagle3lab.data.packaged.held_out_records())"
        )


def _check_source(name, cap, category, sources, seen) -> None:
    where = f"mixture quota {category!r}: source {name!r}"
    if name in EVALUATION_SETS or name in RESERVED_SETS:
        kind = "evaluation" if name in EVALUATION_SETS else "reserved"
        raise InputError(f"{where} is a{'n' if kind == 'evaluation' else ''} {kind} set: it is never mixed in")
    if name not in sources:
        raise InputError(f"{where} is unknown; available: {sorted(sources)}")
    held = next((r.category for r in sources[name][:1] if r.category in ("evaluation", "reserved")), None)
    if held:
        raise InputError(f"{where} holds {held} records: they are never mixed in")
    if name in seen:
        raise InputError(f"{where} is already under {seen[name]!r}: a source fills one category")
    seen[name] = category
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise InputError(f"{where}: cap must be a positive integer or null, got {cap!r}")
    wrong = next((r.category for r in sources[name][:1] if r.category != category), None)
    if wrong:
        raise InputError(f"{where}: its records are {wrong!r}, not {category!r}")


def _draw(name, records, quota, index, taken_keys, seed) -> tuple[list[dict], dict]:
    """Up to `quota` clean, new, held-out-free conversations of one source, walked in a seeded order."""
    stats = {
        "quota": quota,
        "available": len(records),
        "scanned": 0,
        "selected": 0,
        "duplicates": 0,
        "eval_excluded": 0,
        "reserved_excluded": 0,
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
            stats["reserved_excluded" if hit in index.reserved else "eval_excluded"] += 1
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
