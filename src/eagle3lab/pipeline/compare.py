"""`python -m eagle3lab.pipeline.report --compare`: two runs' metrics folders side by side, figure by figure."""

from __future__ import annotations

from pathlib import Path

from eagle3lab.engines.registry import SERVED_TITLES
from eagle3lab.pipeline import report_tables


# Headline figures for `--compare`: what a rerun should reproduce. "count": exact on any machine (records,
# accounting); "quality": a function of the data and the model (NLL, accuracy, accept length), the same on the same
# hardware and close elsewhere; "speed": timings, which vary 2x run to run on a shared 2-core machine.
# long: one flat list of every headline figure, stage by stage
def headline(metrics: Path) -> list[tuple[str, str, float]]:
    figures = []

    def add(name, kind, value):
        if isinstance(value, (int, float)):
            figures.append((name, kind, float(value)))

    if d := report_tables.load_metrics(metrics, "diagnosis"):
        for m in d["modes"]:
            add(f"diagnosis {m['mode']}: accept length", "quality", m["accept_length"])
            add(f"diagnosis {m['mode']}: vs baseline", "speed", m["speedup_vs_baseline"])
        for launch in ("wrong", "fixed"):
            add(f"diagnosis doctor exit ({launch} launch)", "count", d["doctor"][launch]["exit_code"])
    if s := report_tables.load_metrics(metrics, "survey"):
        for name, inv in s["inventory"].items():
            add(f"survey {name}: records", "count", inv["records"])
        for name, score in s.get("onpolicy", {}).items():
            add(f"survey {name}: on-policy NLL", "quality", score["nll"])
        add("mixture train", "count", s["mixture"]["train"])
        add("mixture val", "count", s["mixture"]["val"])
    if r := report_tables.load_metrics(metrics, "regen"):
        for key in ("success", "errors", "skipped"):
            add(f"regen {key}", "count", r[key])
        add("regen new tokens", "quality", r["new_tokens"])
        add("regen tok/s", "speed", r["tokens_per_s"])
    drafts = set()
    if t := report_tables.load_metrics(metrics, "train"):
        drafts = {Path(t["final"]).name} | {d["name"] for d in t["drafts"]}
        for d in t["drafts"]:
            add(
                f"train {d['name']}: held-out top-1 acc",
                "quality",
                ((d["final_val"] or {}).get("acc_pos") or [None])[0],
            )
            add(f"train {d['name']}: tok/s", "speed", d["tokens_per_s"])
    if b := report_tables.load_metrics(metrics, "benchmark"):
        for row in b["final"]["rows"]:
            label = f"benchmark {row['set']} {row['system']}"
            if row["config"] == b["best_config"]:  # named "best", not by config: two runs may pick different ones
                add(f"{label} at its best config: accept length", "quality", row["accept_length"])
                add(f"{label} at its best config: vs baseline", "speed", row["speedup_vs_baseline"])
            elif row["system"] not in ("baseline", *drafts):  # peers, and third-party drafts at each config
                config = f" {row['config']}" if row["draft"] else ""
                add(f"{label}{config}: vs baseline", "speed", row["speedup_vs_baseline"])
        for engine, shown in SERVED_TITLES.items():
            for row in (b.get(engine) or {}).get("rows", []):
                if row["engine"] == engine and row["draft"]:
                    label = f"benchmark {engine} {row['set']} {row['system']} {row['config']}"
                    add(f"{label}: accept length", "quality", row["accept_length"])
                    add(f"{label}: vs {shown} baseline", "speed", row["speedup_vs_baseline"])
        for r in (b.get("tuned") or {}).get("predicted_vs_measured", []):
            if r["label"] == b["tuned"]["config"]:  # named "tuned", not by config, like "best" above
                add("benchmark tuned config: predicted speedup", "speed", r["speedup"])
                add("benchmark tuned config: measured speedup", "speed", r["measured_speedup"])
    if c := report_tables.load_metrics(metrics, "scaling"):
        add("scaling break-even accept length", "speed", c["break_even_tau"])
        if c.get("tuned"):
            add("scaling break-even accept length, tuned config", "speed", c["tuned"]["break_even_tau"])
        for name, fit in c["fits"].items():
            add(f"scaling {name}: gain per doubling", "quality", fit.get("gain_per_doubling"))
    return figures


def compare(reference: Path, other: Path) -> str:
    """Side by side: the reference run's headline figures and another run's, with their ratio."""
    theirs = {name: value for name, _, value in headline(other)}
    rows = []
    for name, kind, mine in headline(reference):
        value = theirs.get(name)
        ratio = 1.0 if value == mine else value / mine if value is not None and mine else None
        rows.append(
            [
                name,
                kind,
                f"{mine:.4g}",
                "-" if value is None else f"{value:.4g}",
                "-" if ratio is None else f"{ratio:.3f}",
            ]
        )
    return report_tables.table(["figure", "kind", str(reference), str(other), "ratio"], rows)
