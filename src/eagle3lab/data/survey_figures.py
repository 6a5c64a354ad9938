"""The dataset survey's figures: length distributions, duplicates and per-set caps, on-policy score, regeneration
cost."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from eagle3lab.data.survey import Inventory

LOG_BINS = [2 ** (k / 2) for k in range(27)]  # 1 to 8k tokens, half-octave bins


def lengths(inventories: dict[str, Inventory]):
    """Prompt and response length distributions (target tokens) per source."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, attr, title in [
        (axes[0], "prompt_lengths", "prompt (all user turns)"),
        (axes[1], "response_lengths", "response (each answer or reference)"),
    ]:
        for sid, inv in inventories.items():
            values = [max(v, 1) for v in getattr(inv, attr)]
            if values:  # fractions, not densities: log-width bins would inflate the short ones
                ax.hist(values, bins=LOG_BINS, histtype="step", weights=[1 / len(values)] * len(values), label=sid)
        ax.set(xscale="log", xlabel="target tokens", title=title)
    axes[0].set_ylabel("fraction")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def duplicates(inventory_table: pd.DataFrame, set_summaries: dict[str, dict]):
    """Duplicates per source, and what the per-set caps keep of each many-set source."""
    fig, (ax, caps) = plt.subplots(1, 2, figsize=(12, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    inventory_table[["duplicate_rate", "prompt_duplicate_rate"]].plot.bar(ax=ax, rot=30)
    ax.set(ylabel="fraction of records", title="duplicates (normalized text)")
    many = {sid: s for sid, s in set_summaries.items() if s}
    x = range(len(many))
    caps.bar([i - 0.2 for i in x], [s["available"] for s in many.values()], 0.4, label="available")
    caps.bar([i + 0.2 for i in x], [s["kept"] for s in many.values()], 0.4, label="kept under the set cap")
    for i, s in zip(x, many.values()):
        caps.annotate(
            f"{s['sets']} sets, {s['capped_sets']} capped", (i, s["kept"]), ha="center", va="bottom", fontsize=8
        )
    caps.set_xticks(list(x), list(many), rotation=30)
    caps.set(yscale="log", ylabel="records", title="per-set caps")
    caps.legend(fontsize=8)
    fig.tight_layout()
    return fig


def onpolicy(onpolicy_table: pd.DataFrame, target: str):
    """Per-token NLL of each source's answers with its bootstrap interval (lower = closer to the target)."""
    t = onpolicy_table
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(t.index, t["nll"], yerr=[t["nll"] - t["ci_low"], t["ci_high"] - t["nll"]], capsize=4, color="tab:blue")
    for i, (n, k) in enumerate(zip(t["n_records"], t["n_tokens"])):
        ax.annotate(f"n={n}\n{k} tok", (i, 0.05), ha="center", color="white", fontsize=8)
    ax.set(ylabel="target NLL per token (nats)", title=f"on-policy score ({target}, lower = closer)")
    fig.tight_layout()
    return fig


def regeneration_cost(rows: list[dict], throughput_tok_s: float):
    """Projected hours per source and scope: low = source-length answers, high = every answer at the cap."""
    fig, ax = plt.subplots(figsize=(max(7, 0.75 * len(rows)), 3.6))
    labels = [f"{r['source']}\n{r['scope']}" for r in rows]
    ax.bar(
        labels, [r["hours"][1] for r in rows], color="tab:orange", alpha=0.5, label="high (every answer hits the cap)"
    )
    ax.bar(labels, [r["hours"][0] for r in rows], color="tab:orange", label="low (source-length answers)")
    ax.set(ylabel=f"hours at {throughput_tok_s:.0f} tok/s", yscale="log", title="projected regeneration time")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
