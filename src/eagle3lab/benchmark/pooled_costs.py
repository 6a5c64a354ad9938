"""An engine's break-even need from its grid cost cells (`benchmark.timed_costs`): each cell's accept length needed
with its interval (prompts and timing repeats), and the engine's pooled over its cells. Two cells are two
measurements in separate processes; what differs between them (the process, its start, the machine's state) is
noise one cell's repeats cannot show, so the pooled interval resamples the cells too: a two-stage bootstrap, the
cells drawn with replacement, then each drawn cell's own draw. With two cells a kind, that between-cell term rests
on two measurements.
"""

from __future__ import annotations

import numpy as np

from eagle3lab.benchmark.scaling import quantiles
from eagle3lab.benchmark.timed_costs import TimedCosts

POOLED = "pooled"  # an engine's cost cells together
POOLED_STREAM = 10_000  # the pooled draws' random stream, apart from each cell's (seed, its index)


def pooled_draws(cells: list[TimedCosts], rng: np.random.Generator, count: int) -> np.ndarray:
    """[count] draws of an engine's break-even over its cost cells, a two-stage bootstrap: the cells resampled (what
    differs between measurements in separate processes, which one cell's own timings cannot show), then each drawn
    cell's own draw (its prompts and timing repeats); each draw the mean of its cells. One cell: that cell's draws."""
    slots = len(cells)
    own = np.stack([np.stack([cell.draws(rng, count) for cell in cells]) for _ in range(slots)])  # [slot, cell, draw]
    picked = rng.integers(0, slots, (count, slots))
    return own[np.arange(slots), picked, np.arange(count)[:, None]].mean(axis=1)


def pooled_need(cells: list[TimedCosts]) -> float:
    """An engine's break-even accept length over its cost cells: their mean (each measurement weighs the same)."""
    return float(np.mean([cell.break_even() for cell in cells]))


def tau_draws(cells: list[TimedCosts], boot: int, seeds: list[int]) -> dict[str, list[np.ndarray]]:
    """Per cost cell, and POOLED over the engine's cells, its break-even draws under each bootstrap seed."""
    draws = {
        # each cell its own stream: two cells timed on the same prompts must not resample them alike
        cell.cell: [cell.draws(np.random.default_rng((seed, index)), boot) for seed in seeds]
        for index, cell in enumerate(cells)
    }
    draws[POOLED] = [pooled_draws(cells, np.random.default_rng((seed, POOLED_STREAM)), boot) for seed in seeds]
    return draws


def needed(costs: dict[str, list[TimedCosts]], boot: int, seeds: list[int]) -> dict:
    """Per engine, the accept length its cost cells say it needs to break even: each cell's with its interval
    (prompts and timing repeats), whether the cells' intervals overlap (do separate measurements agree?), and the
    engine's, pooled over its cells (their mean; the interval also resamples the cells), the figure a forecast reads."""
    out = {}
    for engine, cells in costs.items():
        draws = tau_draws(cells, boot, seeds)
        intervals = [quantiles(draws[cell.cell][0]) for cell in cells]
        out[engine] = {
            "cells": {
                cell.cell: {
                    "accept_length_needed": cell.break_even(),
                    "interval": interval,
                    "timings": {"prompts": cell.prompts, "repeats": cell.repeats},
                }
                for cell, interval in zip(cells, intervals)
            },
            "intervals_overlap": max(low for low, _ in intervals) <= min(high for _, high in intervals)
            if len(cells) > 1
            else None,
            "accept_length_needed": pooled_need(cells),
            "interval": quantiles(draws[POOLED][0]),
        }
    return out
