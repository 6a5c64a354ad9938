"""Exact offline accept length on the evaluation set, no decoding: the rows every drafter kind scores into
(PromptAcceptance), their pooling and tables, and the options `eagle3lab acceptance` (benchmark.scoring) reads.

The walk (decoding.offline) scores a draft along the target's own greedy answers; one target forward per prompt
serves every draft of a kind at every depth, and the figure equals the local engine's online accept length prompt by
prompt (tests/test_acceptance.py for EAGLE-3's chains, tests/test_dflash.py for DFlash's blocks), with no timing noise
and no bf16 text drift between drafts. Each kind scores its own drafts into PromptAcceptance rows, through its tools
(drafters.base.DrafterTools.offline_acceptance: drafters/eagle3/acceptance.py the chains, drafters/dflash/acceptance.py
the blocks); benchmark.scoring loads and scores drafts of any kind through them.

Accept length here is the engine's: (answer tokens - 1) / rounds (the prefill's token is not a round's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab.io import InputError


@dataclass
class PromptAcceptance:
    """One draft on one prompt at one depth: the unit every interval resamples."""

    draft: str
    set: str
    prompt: str
    depth: int
    tokens: int  # answer tokens after the prefill's first: what the rounds emitted
    accepted: list[int] = field(repr=False)  # per round
    answer_cut: bool = False  # the cached answer was cut where the target's own argmax disagreed (eval_set)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def accept_length(self) -> float:
        return self.tokens / self.rounds if self.rounds else 1.0


def pooled(rows: list[PromptAcceptance]) -> dict:
    """Accept length (emitted tokens over rounds, pooled over prompts) and the share of rounds that accepted at
    least d draft tokens, d = 1..depth."""
    rounds = sum(r.rounds for r in rows)
    depth = max((r.depth for r in rows), default=0)
    return {
        "prompts": len(rows),
        "rounds": rounds,
        "accept_length": round(sum(r.tokens for r in rows) / rounds, 4) if rounds else 1.0,
        "position_acceptance": [
            round(sum(a >= d for r in rows for a in r.accepted) / rounds, 4) if rounds else 0.0
            for d in range(1, depth + 1)
        ],
    }


def table(rows: list[PromptAcceptance]) -> list[dict]:
    """One pooled row per draft, depth and set, plus the sets together ("all")."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.draft, r.depth, r.set), []).append(r)
        groups.setdefault((r.draft, r.depth, "all"), []).append(r)
    return [{"system": d, "depth": k, "set": s, **pooled(g)} for (d, k, s), g in groups.items()]


def per_prompt(rows: list[PromptAcceptance]) -> list[dict]:
    """The rows as plain dicts (tokens and rounds per prompt: what intervals resample)."""
    return [
        {
            "system": r.draft,
            "set": r.set,
            "id": r.prompt,
            "depth": r.depth,
            "accept_length": round(r.accept_length, 6),
            "tokens": r.tokens,
            "rounds": r.rounds,
        }
        for r in rows
    ]


def sets_option(text: str) -> dict[str, int | None]:
    """--sets "mtbench:all,gsm8k:120" as {set: records or None (every record)}."""
    sets = {}
    for part in text.split(","):
        name, _, n = part.partition(":")
        sets[name.strip()] = None if n in ("", "all") else int_list(n, f"--sets {name}")[0]
    return sets


def int_list(text: str, flag: str) -> list[int]:
    """A comma-separated list of positive integers given by `flag`, or an InputError naming it."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected positive integers, comma-separated") from None
    if any(v < 1 for v in values):
        raise InputError(f"{flag} {text!r}: expected positive integers, comma-separated")
    return values


def named(spec: str) -> tuple[str, str]:
    """A draft argument, NAME=FOLDER or FOLDER, as (name, folder): the folder's own name when none is given."""
    name, _, folder = spec.rpartition("=")
    return name or Path(folder).name, folder


def subset(records: list, limits: dict) -> list:
    """The records of the sets in `limits` ({set: N or None for all}), the first N of each, in their order."""
    unknown = set(limits) - {r.set for r in records}
    if unknown:
        raise InputError(f"--subset: the evaluation set has no records of {sorted(unknown)}")
    seen: dict[str, int] = {}
    out = []
    for r in records:
        if r.set in limits and (limits[r.set] is None or seen.get(r.set, 0) < limits[r.set]):
            seen[r.set] = seen.get(r.set, 0) + 1
            out.append(r)
    return out
