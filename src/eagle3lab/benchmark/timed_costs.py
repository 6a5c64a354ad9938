"""The costs break-even reads, timed end to end in one engine with their noise: a plain step (the target alone:
seconds per generated token) and a round of the chain the curve is measured at (one target verify and k draft steps:
seconds per drafted round), both on the same prompts, each prompt `repeats` times. Break-even is the accept length at
which a round pays for itself:

    tau* = t_round / t_step    (speedup = tau * t_step / t_round; Leviathan et al., REFERENCE.md)

A round costs what its shape costs (k draft forwards and a verify of k + 1 tokens), whatever the draft's weights: the
count of rounds divides acceptance out. Every (prompt, repeat) timing is kept, so tau*'s interval carries the timing
noise beside the prompts': `TimedCosts.draws` resamples the prompts and, per prompt, one repeat of each system.

Timings are whole requests, as a user meets them, so each holds its prompt's prefill P beside N decoded tokens. Both
systems pay about the same P, so the ratio is off by about (P / N t_step) x (tau_m / tau* - 1), tau_m the timed
draft's own accept length: a few percent of prefill times a draft near break-even is a fraction of a percent, and
N = 128 tokens keeps P's share small.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eagle3lab.io import InputError, require

BASELINE, DRAFT = "baseline", "draft"  # the two systems of a cost cell: the target alone, the chain with a draft
TIMING_FIELDS = {"set": str, "id": str, "system": str, "repeat": int, "tokens": int, "seconds": (int, float)}


def _system(row: dict, draft_system: str) -> str | None:
    """A benchmark row's system as a cost cell names it (None: another system the run held)."""
    return BASELINE if row["system"] == "baseline" else DRAFT if row["system"] == draft_system else None


def _timing(row: dict, system: str, repeat: int, seconds: float, rounds: int | None) -> dict:
    """One timing row of a cost cell: a prompt's whole request by one system in one repeat."""
    return {
        "set": row["set"],
        "id": row["id"],
        "system": system,
        "repeat": repeat,
        "tokens": row["completion_tokens"],
        "seconds": seconds,
        "rounds": rounds,
    }


def local_timings(result: dict, draft_system: str) -> list[dict]:
    """One row per (prompt, system, repeat) of a local `run_benchmark` result (per_prompt rows keep every repeat's
    time in `times`; greedy decoding makes the tokens and rounds the same in every repeat)."""
    return [
        _timing(r, system, repeat, seconds, r["verify_count"] if system == DRAFT else None)
        for r in result["per_prompt"]
        for system in [_system(r, draft_system)]
        if system
        for repeat, seconds in enumerate(r["times"])
    ]


def served_timings(result: dict, draft_system: str, repeat: int) -> list[dict]:
    """One row per (prompt, system) of one `run_served_benchmark` pass (repeats=1, fresh servers), as repeat
    `repeat`; the draft's rounds are the engine's own counter of drafted rounds."""
    return [
        _timing(r, system, repeat, r["seconds"], r["drafts"] if system == DRAFT else None)
        for r in result["per_prompt"]
        for system in [_system(r, draft_system)]
        if system
    ]


@dataclass
class TimedCosts:
    """One cost cell's timings as [prompt, repeat] arrays of each system."""

    engine: str
    cell: str
    base_seconds: np.ndarray
    base_tokens: np.ndarray
    draft_seconds: np.ndarray
    draft_rounds: np.ndarray

    @classmethod
    def from_timings(cls, engine: str, cell: str, timings: list[dict], where: str) -> TimedCosts:
        """Checked: every prompt timed by both systems in the same repeats, every draft run drafting rounds."""
        grid: dict[tuple, dict] = {}
        for i, row in enumerate(timings):
            at = f"{where}: timings[{i}]"
            for field, kind in TIMING_FIELDS.items():
                require(row, field, at, kind)
            if row["system"] not in (BASELINE, DRAFT):
                raise InputError(f"{at}: field 'system' must be {BASELINE!r} or {DRAFT!r}, got {row['system']!r}")
            if row["system"] == DRAFT and not (isinstance(row.get("rounds"), int) and row["rounds"] > 0):
                raise InputError(f"{at}: field 'rounds' must be 1 or more for the draft (the engine did not speculate)")
            if row["tokens"] < 1 or row["seconds"] <= 0:
                raise InputError(f"{at}: fields 'tokens' and 'seconds' must be positive")
            grid.setdefault((row["set"], row["id"]), {})[(row["system"], row["repeat"])] = row
        if not grid:
            raise InputError(f"{where}: timings: no timing recorded")
        prompts = sorted(grid)
        repeats = sorted({r for runs in grid.values() for _, r in runs})
        keys = {(system, r) for system in (BASELINE, DRAFT) for r in repeats}
        for prompt in prompts:
            if missing := sorted(keys - set(grid[prompt])):
                raise InputError(
                    f"{where}: timings: prompt {prompt[0]}/{prompt[1]} has no timing of (system, repeat) {missing} "
                    "(every prompt is timed by the baseline and the draft in every repeat)"
                )

        def table(system: str, field: str) -> np.ndarray:
            return np.array([[grid[p][(system, r)][field] for r in repeats] for p in prompts], dtype=float)

        return cls(
            engine,
            cell,
            table(BASELINE, "seconds"),
            table(BASELINE, "tokens"),
            table(DRAFT, "seconds"),
            table(DRAFT, "rounds"),
        )

    @property
    def prompts(self) -> int:
        return self.base_seconds.shape[0]

    @property
    def repeats(self) -> int:
        return self.base_seconds.shape[1]

    def step_s(self) -> float:
        return float(self.base_seconds.sum() / self.base_tokens.sum())

    def round_s(self) -> float:
        return float(self.draft_seconds.sum() / self.draft_rounds.sum())

    def break_even(self) -> float:
        """tau* from every timing: the accept length at which this engine's round costs what its plain steps do."""
        return self.round_s() / self.step_s()

    def draws(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """[count] bootstrap draws of tau*: the prompts resampled, and per drawn prompt one repeat of the baseline and
        one of the draft (timing repeats are the noise of the moment, drawn independently for each system)."""
        n, r = self.prompts, self.repeats
        picked = rng.integers(0, n, (count, n))
        base_repeat, draft_repeat = rng.integers(0, r, (count, n)), rng.integers(0, r, (count, n))
        step = self.base_seconds[picked, base_repeat].sum(1) / self.base_tokens[picked, base_repeat].sum(1)
        round_ = self.draft_seconds[picked, draft_repeat].sum(1) / self.draft_rounds[picked, draft_repeat].sum(1)
        return round_ / step


def read_cost_cells(folder: Path) -> dict[str, list[TimedCosts]]:
    """The cost cells' records (metrics/costs/NAME.json), engine -> its cells in name order, each checked: an
    InputError names the file and the field."""
    engines: dict[str, list[TimedCosts]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not valid JSON ({e.msg})") from None
        engine = require(record, "engine", str(path), str)
        timings = require(record, "timings", str(path), list)
        engines.setdefault(engine, []).append(
            TimedCosts.from_timings(engine, require(record, "cell", str(path), str), timings, str(path))
        )
    return engines
