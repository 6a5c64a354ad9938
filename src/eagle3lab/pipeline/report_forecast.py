"""The results page's section on the grid's data bet (issue 64), read from the grid's committed records only: each
draft cell of the scale curve (metrics/drafts/), each cost cell (metrics/costs/) and the forecast made from them
(metrics/forecast.json). Where the forecast cannot yet say something (too few scales for a form, no cost cell), the
section says what is missing instead of a figure."""

from __future__ import annotations

from pathlib import Path

from eagle3lab.benchmark.forecast import ALL
from eagle3lab.benchmark.pairs import CONTROLLED, PAIRED_RESPONSES
from eagle3lab.benchmark.pooled_costs import POOLED
from eagle3lab.pipeline.report_tables import load_folder, load_metrics, table

DRAFT_HEADER = ["cell", "conversations", "seed", "steps / budget", "stopped by", "held-out best", "accept length (all)"]
DRAFT_HEADER += ["MT-bench", "minutes (train + score)", "CPU, dtype"]
COST_HEADER = ["cell", "engine", "chain", "prompts x repeats", "step (ms)", "round (ms)", "break-even accept length"]
COST_HEADER += ["90% interval", "minutes", "CPU, dtype"]
NEEDED_HEADER = ["engine", "cost cells", "accept length needed, pooled", "90% interval", "cells' intervals overlap"]
NEEDED_HEADER += ["largest scale", "its accept length (all)", "minus the need [90% interval]", "verdict"]
KINDS = ("regenerated", *PAIRED_RESPONSES)  # the grid's EAGLE-3 cells shown, in this order at each scale
PAIR_HEADER = ["set", "draft", "partner", "seeds", "answer tokens", "steps", "accept length", "partner's"]
PAIR_HEADER += ["difference [90% interval]", "verdict"]
BREAK_EVEN_HEADER = ["set", "engine", "cost cell", "accept length needed", "conversations", "90% interval"]
BREAK_EVEN_HEADER += ["accept length at 10x [interval]", "10x the data", "cells agree"]


def _pooled(record: dict, name: str) -> float:
    return next(r["accept_length"] for r in record["acceptance"]["pooled"] if r["set"] == name)


def _draft_row(d: dict) -> list:
    t, ran = d["training"], d["ran"]
    minutes = ran.get("minutes") or {}
    return [
        d["cell"],
        d["records"],
        d["seed"],
        f"{t['steps']} / {t['budget_steps']}",
        t["stopped_by"],
        f"{t['best']['accept_length']:.3f}",
        f"{_pooled(d, 'all'):.3f}",
        f"{_pooled(d, 'mtbench'):.3f}",
        f"{minutes.get('train', 0) + minutes.get('score', 0):.1f} ({minutes.get('train')} + {minutes.get('score')})",
        f"{ran['cpu']}, {ran['auto_dtype']}",
    ]


def _cost_row(c: dict) -> list:
    said, ran = c["break_even"], c["ran"]
    return [
        c["cell"],
        c["engine"],
        c["chain"],
        f"{c['prompts']} x {c['repeats']}",
        said["step_s"] * 1e3,
        said["round_s"] * 1e3,
        f"{said['accept_length_needed']:.3f}",
        "[{:.3f}, {:.3f}]".format(*said["interval"]),
        c["minutes"],
        f"{ran['cpu']}, {c['dtype']}",
    ]


def _reading(value) -> str:
    return f"{value:,.0f}" if isinstance(value, float) else str(value)


def _needed_rows(forecast: dict) -> list[list]:
    """Per engine: its need pooled over its cost cells, against the largest scale measured (all sets)."""
    rows = []
    for engine, need in forecast["needed"].items():
        now = forecast["sets"][ALL]["largest_against_needed"][engine]
        rows.append(
            [
                engine,
                ", ".join(need["cells"]),
                f"{need['accept_length_needed']:.3f}",
                "[{:.3f}, {:.3f}]".format(*need["interval"]),
                need["intervals_overlap"],
                f"{now['conversations']:,}",
                f"{now['accept_length']:.3f}",
                "{:+.3f} [{:+.3f}, {:+.3f}]".format(now["difference"], *now["interval"]),
                now["verdict"],
            ]
        )
    return rows


def _pair_rows(pairs: dict) -> list[list]:
    """Each controlled pair per set: draft minus partner, both sides' seeds, answer tokens and steps."""
    return [
        [
            r["set"],
            r["draft"],
            r["partner"],
            " / ".join(map(str, r["seeds"])),
            f"{r['answer_tokens']:,} / {r['partner_answer_tokens']:,}",
            f"{', '.join(map(str, r['steps']))} / {', '.join(map(str, r['partner_steps']))}",
            f"{r['draft_accept']:.3f}",
            f"{r['partner_accept']:.3f}",
            "{:+.3f} [{:+.3f}, {:+.3f}]".format(r["difference"], r["low"], r["high"]),
            r["verdict"],
        ]
        for r in pairs["rows"]
    ]


def _pair_lines(pairs: dict) -> list[str]:
    if not pairs["rows"]:
        return ["No controlled pair yet: " + ("; ".join(pairs["waiting"]) or "no pair cell has run") + ".", ""]
    lines = [
        f"The controlled pairs ({CONTROLLED}; the interval resamples prompts and both sides' seeds):",
        "",
        table(PAIR_HEADER, _pair_rows(pairs)),
        "",
    ]
    return lines + ([f"Waiting: {'; '.join(pairs['waiting'])}.", ""] if pairs["waiting"] else [])


def _break_even_rows(forecast: dict) -> list[list]:
    rows = []
    for name, s in forecast["sets"].items():
        for engine, e in (s["break_even"] or {}).items():
            for cell, b in {**e["cells"], f"{POOLED} ({len(e['cells'])} cells)": e[POOLED]}.items():
                bet = b["at_data_bet"]
                rows.append(
                    [
                        name,
                        engine,
                        cell,
                        "{:.3f} [{:.3f}, {:.3f}]".format(
                            b["accept_length_needed"], *b["accept_length_needed_interval"]
                        ),
                        _reading(b["conversations"]) + (" (projected)" if b["projected"] else ""),
                        "[" + ", ".join(map(_reading, b["interval"])) + "]",
                        "{:.3f} [{:.3f}, {:.3f}]".format(bet["accept_length"], *bet["interval"]),
                        bet["verdict"],
                        e["agreement"]["intervals_overlap"],
                    ]
                )
    return rows


def _forecast_lines(forecast: dict) -> list[str]:
    everything = forecast["sets"][ALL]
    lines = [
        "Accept length per scale, the mean over prompts (all sets) and seeds: "
        + ", ".join(
            f"{n:,}: {m:.3f} ({k} seed{'s' * (k != 1)})"
            for n, m, k in zip(everything["sizes"], everything["means"], everything["seeds"])
        )
        + ".",
        "",
    ]
    stops = forecast["plateau"]
    stopped = sum(row["stopped_by_plateau"] for row in stops)
    lines += [f"Stopped by the plateau rule: {stopped} of {sum(row['seeds'] for row in stops)} drafts.", ""]
    if forecast["needed"]:
        lines += [
            "Each engine's need, pooled over its cost cells (their mean; the interval resamples the cells too), "
            "against the largest scale measured:",
            "",
            table(NEEDED_HEADER, _needed_rows(forecast)),
            "",
        ]
    if not everything["chosen"]:
        lines += [f"No curve form chosen yet: {everything['why']}.", ""]
    else:
        lines += [f"Form chosen: {everything['chosen']}, by {everything['why']}.", ""]
        test = everything["backtest"]
        if test:
            verdicts = "; ".join(f"{form} {f['predicted']:.3f}: {f['verdict']}" for form, f in test["forms"].items())
            lines += [
                f"Backtest of {test['held_out']:,} conversations from {min(test['fitted_on'])}-"
                f"{max(test['fitted_on'])} (measured {test['measured']:.3f}): {verdicts}.",
                "",
            ]
    rows = _break_even_rows(forecast)
    if rows:
        lines += [table(BREAK_EVEN_HEADER, rows), ""]
    elif everything["chosen"]:
        lines += ["No break-even yet: no cost cell has run (`make carry ONLY=costs`).", ""]
    return lines


def section(metrics: Path) -> str:
    """The section's markdown from the records under `metrics`, or a line saying the grid has none yet."""
    drafts = sorted(
        (d for d in load_folder(metrics / "drafts") if d["responses"] in KINDS and d["drafter"] == "eagle3"),
        # by the scale in the cell's name (a pair's cells beside the scale they are matched to), its kind, its seed
        key=lambda d: (d["cell"].split("-")[1], KINDS.index(d["responses"]), d["seed"]),
    )
    costs = load_folder(metrics / "costs")
    forecast = load_metrics(metrics, "forecast")
    lines = ["### The data bet, carried by the grid", ""]
    if not drafts and not costs:
        return "\n".join(lines + ["No grid cell of the scale curve or of the costs has run yet.", ""])
    if drafts:
        lines += [
            "The draft cells of the scale curve and its controlled pairs (`metrics/drafts/`):",
            "",
            table(DRAFT_HEADER, [_draft_row(d) for d in drafts]),
            "",
        ]
    if costs:
        lines += ["The cost cells (`metrics/costs/`):", "", table(COST_HEADER, [_cost_row(c) for c in costs]), ""]
    else:
        lines += ["No cost cell has run yet: break-even waits for `make carry ONLY=costs` on a quiet machine.", ""]
    if forecast:
        lines += _forecast_lines(forecast) + _pair_lines(forecast["controlled_pairs"])
    return "\n".join(lines)
