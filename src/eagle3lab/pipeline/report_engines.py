"""The results page's sections on the real engines, rendered from stage 04's and 06's metrics: each engine's rows
and tune decisions, where a llama.cpp round's time goes, one table of engines, and the seeds' trap in llama.cpp."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from eagle3lab.benchmark.comparisons import seeds_and_prompts, verdict
from eagle3lab.benchmark.scaling import LEVEL
from eagle3lab.benchmark.table import DO_NOT_SPECULATE
from eagle3lab.engines.registry import SERVED_TITLES
from eagle3lab.pipeline import report_tables

SPEED_BOOTSTRAP = 2000  # draws: a report-time interval over a dozen prompts costs nothing


def served(b: dict) -> str:
    """Everything stage 04 measured in real engines (nothing for metrics from before they joined)."""
    return (
        "".join(_in_engine(name, b.get(name)) for name in SERVED_TITLES)
        + _split(b.get("llamacpp_split"))
        + _engines(b)
        + _dflash(b.get("dflash"))
    )


def _dflash(d: dict | None) -> str:
    """The DFlash draft timed in each engine against that engine's baseline (absent before it joined)."""
    if not d:
        return ""
    keys = ("system", "config", "accept_length", "tokens_per_s", "speedup_vs_baseline", "identical_rate")
    rows = [
        [engine, r.get("set", "all"), *(r.get(k, "") for k in keys)]  # the local engine's rows name no config
        for engine in ("local", *SERVED_TITLES)
        for r in (d.get(engine) or {}).get("rows", [])
        if r.get("engine", engine) == engine  # a served run also holds the local engine's baseline
    ]
    head = ["engine", "set", "system", "config", "accept length", "tok/s", "vs baseline", "identical output"]
    return (
        f"\nThe DFlash draft {d['draft']} (one forward drafts a block) in each engine, against that engine's baseline "
        "on the same prompts:\n\n" + report_tables.table(head, rows) + "\n" + _dflash_speed(d)
    )


def _dflash_speed(d: dict) -> str:
    """Each served engine's verdict on the DFlash draft's speed: its speed over the baseline's, prompt by prompt (the
    served runs keep every prompt's timing), with a bootstrap interval over the prompts."""
    lines = []
    for engine, title in SERVED_TITLES.items():
        runs = (d.get(engine) or {}).get("per_prompt", [])
        timed = {(p["set"], p["id"], p["system"]): p["tokens_per_s"] for p in runs if p.get("engine", engine) == engine}
        ratios = [timed[s, i, name] / timed[s, i, "baseline"] for s, i, name in timed if name == d["draft"]]
        if not ratios:
            continue
        r = seeds_and_prompts(np.array(ratios) - 1, boot=SPEED_BOOTSTRAP, seed=0)
        lines.append(
            f"- {title}: {1 + r['mean']:.2f}x its baseline [{1 + r['low']:.2f}, {1 + r['high']:.2f}] over "
            f"{r['prompts']} prompts: {_faster(r)}"
        )
    if not lines:
        return ""
    head = f"its speed over each served engine's baseline, prompt by prompt ({LEVEL:.0%} bootstrap interval, one run)"
    return f"\nIs the DFlash draft faster? {head}:\n\n" + "\n".join(lines) + "\n"


def _faster(r: dict) -> str:
    if verdict(r["low"], r["high"]) == "not shown":
        return "no difference shown"
    return "faster, shown" if r["mean"] > 0 else "slower, shown"


def diagnosis_llamacpp(rows: list[dict] | None, config: str) -> str:
    """The same trap in llama.cpp, wrong --spec-type vs right (absent before llama.cpp joined)."""
    if not rows:
        return ""
    labels = {"no speculation": "no speculation", "draft-simple": "`--spec-type draft-simple` (wrong)"}
    table = [
        [
            labels.get(r["spec_type"], f"`--spec-type {r['spec_type']}` (right)"),
            r["accept_length"],
            r["tokens_per_s"],
            r["speedup_vs_baseline"],
            r["identical_rate"],
        ]
        for r in rows
    ]
    return (
        f"\nIn llama.cpp (the Q4_1 GGUF target, the same draft as GGUF, n-max {config.split(',')[1]}; vs llama.cpp's "
        "own baseline):\n\n"
        + report_tables.table(["llama-server", "accept length", "tok/s", "vs baseline", "identical output"], table)
        + "\n"
    )


def _how_served(name: str, meta: dict) -> str:
    settings = meta["engine_settings"]
    if name == "vllm":
        return f"{'compiled' if settings['compile'] else 'eager'}, {settings['dtype']}"
    return f"the Q4_1 GGUF, {settings['threads']} threads, drafts as bf16 GGUF"


def _in_engine(name: str, v: dict | None) -> str:
    """Stage 04's rows from one real engine's servers, and tune's shape for each draft there (absent before the
    engine joined)."""
    if not v:
        return ""
    shown = SERVED_TITLES[name]
    rows = report_tables.cells(
        [r for r in v["rows"] if r["engine"] == name],
        (
            *report_tables.ROW_KEYS,
            "speedup_vs_local",
            "speedup_vs_hf_generate",
            "identical_rate",
        ),
    )
    tuned = []
    for draft, t in v["tuned"].items():
        checked = ", ".join(
            f"{r['label']} {r['speedup']:.2f}x predicted, {r['measured_speedup']:.2f}x measured" for r in t["ranked"]
        )
        code = v["doctor_exit_codes"][draft]  # None: do not speculate, no launch line to check
        checked_line = "" if code is None else f" (doctor exit {code})"
        tuned.append(f"- {draft}: **{t['decision']}**{checked_line}; {checked}")
    return (
        f"\nIn {shown} ({_how_served(name, v['meta'])}, one server per draft and shape, the same prompts; acceptance "
        f"from {shown}'s counters; speedups against {shown}'s own baseline, the local engine's and HF generate):\n\n"
        + report_tables.table(
            [
                "set",
                "system",
                "config",
                "accept length",
                "tok/s",
                f"vs {shown} baseline",
                "vs local baseline",
                "vs HF generate",
                "identical output",
            ],
            rows,
        )
        + f"\n\n`eagle3lab tune --engine {name}` on the same run (predicted from every other prompt, measured on the "
        "rest):\n\n" + "\n".join(tuned) + "\n"
    )


def engines_table(b: dict, set_name: str = "mtbench") -> list[dict]:
    """For each draft, each engine at its fastest measured config on `set_name` (the baseline, when no config beats
    it: do not speculate), against that engine's own baseline and against the fastest baseline of all engines; and
    the config `tune` picked there (stage 04 tunes the final draft locally and every draft in each real engine)."""
    runs = {"local": b["final"]["rows"], **{name: b[name]["rows"] for name in SERVED_TITLES if b.get(name)}}
    # an engine's run also carries the local peers measured beside it: keep each engine's own rows
    mine = {
        engine: [r for r in rows if r["set"] == set_name and r.get("engine", "local") == engine]
        for engine, rows in runs.items()
    }
    baselines = {
        engine: next(r["tokens_per_s"] for r in rows if r["system"] == "baseline") for engine, rows in mine.items()
    }
    picks = {
        "local": {Path(b["final"]["meta"]["drafts"][0]).name: b["tuned"]["decision"]},
        **{name: {d: t["decision"] for d, t in b[name]["tuned"].items()} for name in SERVED_TITLES if b.get(name)},
    }
    fastest = max(baselines.values())
    drafts = dict.fromkeys(r["system"] for rows in mine.values() for r in rows if r["draft"])
    out = []
    for draft in drafts:
        for engine, rows in mine.items():
            candidates = {r["config"]: r for r in rows if r["system"] == draft}
            if not candidates:
                continue
            best = max(candidates.values(), key=lambda r: r["tokens_per_s"])
            pays = best["tokens_per_s"] > baselines[engine]
            tok_s = best["tokens_per_s"] if pays else baselines[engine]
            pick = picks[engine].get(draft)
            picked = candidates.get(pick)  # None: tune did not run here, or said do not speculate
            out.append(
                {
                    "draft": draft,
                    "engine": engine,
                    "config": best["config"] if pays else DO_NOT_SPECULATE,
                    "accept_length": best["accept_length"] if pays else None,
                    "tokens_per_s": tok_s,
                    "vs_own_baseline": tok_s / baselines[engine],
                    "vs_fastest_baseline": tok_s / fastest,
                    "tuned": pick,
                    "tuned_vs_own_baseline": picked["tokens_per_s"] / baselines[engine] if picked else None,
                    "tuned_accept_length": picked["accept_length"] if picked else None,
                    "fastest_config": best["config"],
                    "fastest_vs_own_baseline": best["tokens_per_s"] / baselines[engine],
                    "fastest_accept_length": best["accept_length"],
                }
            )
    return out


def _engines(b: dict) -> str:
    """One table of engines: which engine, which flags, how much faster, on this machine."""
    rows = engines_table(b)
    if len({r["engine"] for r in rows}) < 2:
        return ""
    shown = {"local": "local", **SERVED_TITLES}
    return (
        "\nOne table of engines (MT-bench, same prompts; each engine at its fastest measured config, or its baseline "
        "where none beats it; and the config `tune` picked there, in a real engine from every other prompt):\n\n"
        + report_tables.table(
            [
                "draft",
                "engine",
                "fastest config",
                "accept length",
                "tok/s",
                "vs its own baseline",
                "vs the fastest baseline",
                "tune picks",
                "its vs own baseline",
            ],
            [
                [
                    r["draft"],
                    shown[r["engine"]],
                    r["config"],
                    r["accept_length"],
                    r["tokens_per_s"],
                    r["vs_own_baseline"],
                    r["vs_fastest_baseline"],
                    r["tuned"],
                    r["tuned_vs_own_baseline"],
                ]
                for r in rows
            ],
        )
        + "\n"
    )


def _split(split: dict | None) -> str:
    """Where a llama.cpp round's time goes (stage 04's round split)."""
    if not split:
        return ""
    rows = [
        [
            r["k"],
            r["verify_s"] * 1e3,
            r["round_s"] * 1e3,
            r["rest_s"] * 1e3,
            r["break_even"],
            r["tau_for_2x"],
            r["perfect_accept_length"],
            r["perfect_speedup"],
        ]
        for r in split["rows"]
    ]
    return (
        f"\nWhere a llama.cpp round's time goes (plain step {split['step_s'] * 1e3:.1f} ms/token, {split['prompts']} "
        "MT-bench prompts; verify from llama-server's own prompt timings; rounds with every drafted token accepted, "
        "llama.cpp's synthetic acceptance):\n\n"
        + report_tables.table(
            [
                "n-max k",
                "verify ms",
                "round ms",
                "draft + hand-over + overhead ms",
                "break-even accept length",
                "2x needs",
                "perfect accept length",
                "perfect vs baseline",
            ],
            rows,
        )
        + "\n"
    )


def _pays_cell(ratio: float, config: str | None, accept: float | None, tuned: str | None) -> str:
    where = f"{ratio:.2f}x" + (f" at `{config}`" if config else "") + (f", accept {accept:.2f}" if accept else "")
    if tuned == DO_NOT_SPECULATE:
        return f"do not speculate (best {where})"
    return f"slower: {where}" if ratio < 1 else where


def what_pays(b: dict) -> str:
    """README's table: each draft in each engine on MT-bench, at tune's pick where tune ran there and otherwise at
    the fastest measured config, against that engine's own baseline; the DFlash draft at its whole block."""
    shown = {"local": "local engine", **SERVED_TITLES}
    grid: dict[str, dict[str, str]] = {}
    for r in engines_table(b):
        picked = r["tuned_vs_own_baseline"] is not None  # tune ran here and picked a shape it measured
        which = "tuned" if picked else "fastest"
        ratio, accept = r[f"{which}_vs_own_baseline"], r[f"{which}_accept_length"]
        config = r["tuned"] if picked else r["fastest_config"]
        grid.setdefault(r["draft"], {})[r["engine"]] = _pays_cell(ratio, config, accept, r["tuned"])
    d = b.get("dflash") or {}
    for engine in shown:
        # the local DFlash bench pools its 12 prompts over the three sets; a served run has MT-bench's own rows
        wanted = ("all", d.get("draft")) if engine == "local" else ("mtbench", d.get("draft"))
        for x in (d.get(engine) or {}).get("rows", []):
            if (x.get("set", "all"), x["system"]) == wanted and x.get("engine", engine) == engine:
                cell = _pays_cell(x["speedup_vs_baseline"], x.get("config"), x["accept_length"], None)
                pooled = ", all sets" if engine == "local" else ""
                grid.setdefault(d["draft"], {})[engine] = cell + pooled
    rows = [[draft, *(cells.get(e, "-") for e in shown)] for draft, cells in grid.items()]
    return report_tables.table(["draft", *shown.values()], rows)
