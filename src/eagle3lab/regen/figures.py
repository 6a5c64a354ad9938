"""The regeneration stage's figure: throughput over the run, and answer lengths by finish reason."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd


def throughput_and_lengths(progress: dict, rows: list[dict], mean_tok_s: float, title: str):
    """`progress` is the run's OUT.progress.json, `rows` its records (each with per-turn `turns`)."""
    timeline = pd.DataFrame(progress["timeline"], columns=["seconds", "tokens", "records"])
    turns = pd.DataFrame([t for r in rows for t in r["turns"]])
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    if len(timeline) > 1:
        a.plot(timeline.seconds, timeline.tokens.diff() / timeline.seconds.diff(), marker=".")
    a.axhline(mean_tok_s, color="k", ls="--", label=f"mean {mean_tok_s:.0f} tok/s")
    a.set(xlabel="seconds", ylabel="new tokens / s", title=f"regeneration throughput ({title})")
    a.legend()
    if len(turns):
        for reason, group in turns.groupby("finish_reason"):
            b.hist(group.new_tokens, bins=30, alpha=0.7, label=reason)
    b.set(xlabel="new tokens per assistant turn", ylabel="turns", title="answer lengths by finish reason")
    b.legend()
    fig.tight_layout()
    return fig
