"""Figures shared by the stage notebooks, each captioned with the hardware and settings it was measured on."""

from __future__ import annotations

import itertools
import os
import platform
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch


def hardware() -> str:
    """One line naming the machine a figure was measured on."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, torch {torch.__version__}"


EXTRAPOLATION = 10  # how far past the largest size measured a fit is drawn: benchmark.scaling.EXTRAPOLATION's decade
ENGINE_COLORS = ("black", "tab:purple", "tab:brown", "tab:gray", "tab:olive", "tab:cyan")


def _y_range(values: Sequence[float], pad: float = 0.08) -> tuple[float, float]:
    """Limits that hold every value with a margin of `pad` of their span on each side."""
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    margin = max(hi - lo, 0.05) * pad
    return lo - margin, hi + margin


def _line_labels(ax, lines: list[tuple[float, str, str, str]], ylim: tuple[float, float]) -> list[str]:
    """Draw each (accept length, engine, target, colour) inside `ylim` as a dashed line labelled at its right end,
    outside the data area; returns, per side, the ones left out ("above the y-range: local 2x 2.57, ...")."""
    inside = sorted((t for t in lines if ylim[0] <= t[0] <= ylim[1]), key=lambda t: t[0])
    span = ylim[1] - ylim[0]
    y = -1.0
    for tau, engine, target, color in inside:
        y = max((tau - ylim[0]) / span, y + 0.045)  # labels at least 0.045 of the axis apart
        ax.axhline(tau, color=color, ls="--", lw=1, zorder=1)
        ax.text(1.01, y, f"{engine} {target} {tau:.2f}", transform=ax.transAxes, color=color, fontsize=8, va="center")
    notes = []
    for side, out in (("above", lambda tau: tau > ylim[1]), ("below", lambda tau: tau < ylim[0])):
        engines: dict[str, list[str]] = {}
        for tau, engine, target, _ in lines:
            if out(tau):
                engines.setdefault(engine, []).append(f"{target} {tau:.2f}")
        if engines:
            listed = "; ".join(f"{engine} {', '.join(taus)}" for engine, taus in engines.items())
            notes.append(f"not drawn, {side} the y-range: {listed}")
    return notes


def _fit_curves(ax, fit, sizes, color, label: str, extrapolation: float) -> tuple[list[float], float]:
    """A fit drawn solid over the sizes measured with its bootstrap band, and dotted with a fainter band up to
    `extrapolation` times the largest (only where the ceiling is identified: past the data an unidentified ceiling
    is the config's bound, not the data's). Returns the values drawn (for the y-range) and where the curve ends."""
    low, high = min(sizes), max(sizes)
    end = high * (extrapolation if fit.ceiling_identified else 1)
    drawn = []
    for xs, style, alpha in ((np.geomspace(low, high, 120), "-", 0.18), (np.geomspace(high, end, 60), ":", 0.1)):
        if xs[-1] <= xs[0]:
            continue
        lo, hi = fit.band(xs)
        ax.plot(xs, fit.predict(xs), color=color, ls=style, label=label if style == "-" else None)
        ax.fill_between(xs, lo, hi, color=color, alpha=alpha, lw=0)
        drawn += [*lo, *hi, *fit.predict(xs)]
    return drawn, end


def _labelled_points(ax, labelled: Sequence[dict], colors: dict) -> list[float]:
    """Drafts trained elsewhere: a marker per set in that set's colour, named; returns the accept lengths drawn."""
    drawn = []
    for point, marker in zip(labelled, itertools.cycle("*DPX^v")):
        for set_name, tau in point["accept_length"].items():
            ax.scatter(point["conversations"], tau, marker=marker, s=90, color=colors.get(set_name, "grey"), zorder=4)
            drawn.append(tau)
        size = f"{point['responses']}, {point['tokens'] / 1e6:.2f}M tokens"
        label = f"{point['draft']}: {size}; {point['hardware']}, not fitted"
        ax.scatter([], [], marker=marker, s=90, color="grey", label=label)
        top = (point["conversations"], max(point["accept_length"].values()))
        ax.annotate(point["draft"], top, fontsize=7, xytext=(0, 8), ha="center", textcoords="offset points")
    return drawn


def _needs_lines(needs: dict[str, dict[str, float]], ceiling: float) -> list[tuple[float, str, str, str]]:
    """(accept length, engine, target, colour) of every engine's need (a colour per engine) and the config's
    ceiling."""
    lines = [
        (tau, engine, target, color)
        for (engine, taus), color in zip(needs.items(), itertools.cycle(ENGINE_COLORS))
        for target, tau in taus.items()
    ]
    return [*lines, (ceiling, "the config's ceiling", "(steps + 1)", "0.3")]


def scaling_figure(
    fits: dict,
    points: dict,
    *,
    needs: dict[str, dict[str, float]],
    ceiling: float,
    caption: str,
    labelled: Sequence[dict] = (),
    extrapolation: float = EXTRAPOLATION,
):
    """Accept length against training-set size (log x): measured points, fitted curve and bootstrap band per set
    (solid over the sizes measured, dotted and fainter up to `extrapolation` times the largest, in a shaded span
    marked "fit extrapolation"), and the accept length each engine needs for each target (`needs`: engine -> target,
    such as "2x" -> accept length), one dashed line each labelled at its right end. The y-range holds the points,
    the curves and their bands, and only the needs inside it are drawn; the others are listed under the figure.
    `labelled`: drafts trained elsewhere (`scaling.labelled_points`), each a marker per set in that set's colour,
    named, outside the fit."""
    fig, ax = plt.subplots(figsize=(10, 6.5))
    colors = dict(zip(fits, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    shown, largest, reach = [], 0.0, 0.0
    for name, fit in fits.items():
        sizes, taus = zip(*points[name])
        ax.scatter(sizes, taus, color=colors[name], zorder=3)
        shape = f"ceiling {fit.a:.2f}" if fit.ceiling_identified else "ceiling not identified"
        label = f"{name}: {shape}, +{fit.gain_per_doubling:.3f} per doubling"
        drawn, end = _fit_curves(ax, fit, sizes, colors[name], label, extrapolation)
        shown += [*taus, *drawn]
        largest, reach = max(largest, max(sizes)), max(reach, end)
    shown += _labelled_points(ax, labelled, colors)
    if reach > largest:
        ax.axvspan(largest, reach, color="0.95", zorder=0)
        middle = (largest * reach) ** 0.5
        ax.text(middle, 0.02, "fit extrapolation", transform=ax.get_xaxis_transform(), ha="center", style="italic")
    ylim = _y_range(shown)
    off = _line_labels(ax, _needs_lines(needs, ceiling), ylim)
    smallest = min(s for pts in points.values() for s, _ in pts)
    farthest = max([reach, *(p["conversations"] for p in labelled)])
    ax.set(
        xscale="log",
        xlim=(smallest / 1.5, farthest * 1.5),
        ylim=ylim,
        xlabel="training conversations (fitted: regenerated by the target)",
        ylabel="accept length",
        title="EAGLE-3 accept length against data size",
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2, frameon=False)
    notes = [caption, *off]
    fig.text(0.01, 0.005, "\n".join(notes), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.02 * len(notes), 1, 1))
    return fig


KINDS = {  # a draft's kind is its name's first word (`train.plan`): scale-00022, original-00055, ...
    "scale": "regenerated answers, by data scale",
    "original": "sources' original answers",
    "sampled": "answers sampled at T=0.7",
    "source": "one source's regenerated answers",
    "ablation": "ablations: one lever changed",
    "dflash": "DFlash block drafter",
}


def distinct_colors(n: int) -> list:
    """`n` colours, none repeated: tab10, then tab20, then evenly spaced viridis."""
    if n <= 10:
        return list(plt.get_cmap("tab10").colors[:n])
    if n <= 20:
        return list(plt.get_cmap("tab20").colors[:n])
    return [plt.get_cmap("viridis")(x) for x in np.linspace(0, 1, n)]


def _kind_curves(loss_ax, acc_ax, curves: dict[str, list[dict]], window: int) -> None:
    """One kind's drafts: rolling training loss above, held-out accept length below, a colour each; a draft's other
    training seeds (NAME-seedK) share its colour, dashed."""
    bases = list(dict.fromkeys(name.split("-seed")[0] for name in curves))
    colors = dict(zip(bases, distinct_colors(len(bases))))
    for name, rows in curves.items():
        base = name.split("-seed")[0]
        style = dict(color=colors[base], linestyle="-" if name == base else "--")
        train = [r for r in rows if r.get("split") == "train"]
        loss = np.convolve([r["loss"] for r in train], np.ones(window), "full")[: len(train)]
        loss /= np.minimum(np.arange(1, len(train) + 1), window)  # the trailing mean over up to `window` steps
        loss_ax.plot([r["step"] for r in train], loss, label=name, **style)
        val = [r for r in rows if r.get("split") == "val"]
        acc_ax.plot([r["step"] for r in val], [r["accept_length"] for r in val], marker="o", ms=4, **style)


def train_figure(curves: dict[str, list[dict]], caption: str, window: int = 10):
    """Training curves in small multiples, one column per kind of draft (`KINDS`): the training loss (trailing mean
    over `window` steps) above, the held-out accept length below (exact, what picks the exported draft), rows sharing
    their y-axis; no colour repeats within a column but a draft's seeds, and each column's legend sits under it.
    `curves`: draft name -> its metrics.jsonl rows (split "train": step, loss; split "val": step, accept_length)."""
    kinds: dict[str, dict[str, list[dict]]] = {}
    for name, rows in curves.items():
        kinds.setdefault(name.split("-")[0], {})[name] = rows
    columns = max(len(kinds), 1)
    fig, axes = plt.subplots(2, columns, figsize=(min(12.0, 3.0 * columns + 1), 7), sharey="row", squeeze=False)
    if not kinds:
        _empty(axes[0, 0], "no training curves")
    for (kind, drafts), (loss_ax, acc_ax) in zip(kinds.items(), axes.T):
        _kind_curves(loss_ax, acc_ax, drafts, window)
        loss_ax.set_title(KINDS.get(kind, kind), fontsize=10)
        acc_ax.set_xlabel("step")
        under = dict(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
        acc_ax.legend(*loss_ax.get_legend_handles_labels(), fontsize=8, **under)
    axes[0, 0].set_ylabel(f"TTT loss (mean of {window} steps)")
    axes[1, 0].set_ylabel("held-out accept length\n(exact, picks the export)")
    fig.text(0.01, 0.005, caption, fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def _empty(ax, message: str) -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_axis_off()


PAIRED_MARKERS = {"original": "o", "sampled": "s", "ablation": "^", "dflash": "D"}


def paired_figure(rows: list[dict], caption: str):
    """Accept length of each original, sampled and ablation draft minus its regenerated (T=0) partner, by the partner's
    scale (`comparisons.paired_comparisons` rows): a marker per set, bootstrap interval as bars, zero as a line."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if not rows:
        _empty(ax, "no original or sampled draft matched to a regenerated one in metrics/train.json")
    sets = list(dict.fromkeys(r["set"] for r in rows))
    colors = dict(zip(sets, ["black", *plt.rcParams["axes.prop_cycle"].by_key()["color"]]))
    for r in rows:
        shift = 1.06 ** (sets.index(r["set"]) - (len(sets) - 1) / 2)  # side by side on the log axis
        low, high = (r["difference"], r["difference"]) if r["low"] is None else (r["low"], r["high"])
        err = [[r["difference"] - low], [high - r["difference"]]]
        marker = PAIRED_MARKERS[r["responses"]]
        ax.errorbar(r["scale"] * shift, r["difference"], yerr=err, fmt=marker, color=colors[r["set"]], capsize=3)
    for name, color in colors.items():
        ax.plot([], [], "o", color=color, label=name)
    for responses, marker in PAIRED_MARKERS.items():
        if any(r["responses"] == responses for r in rows):
            ax.plot([], [], marker, color="grey", mfc="none", label=f"{responses} minus its regenerated T=0 partner")
    if rows:
        ax.axhline(0.0, color="k", lw=1)
        ax.set(xscale="log", xlabel="conversations of the regenerated partner", ylabel="accept length difference")
        ax.legend(fontsize=8)
    title = "equal target tokens: original (o), T=0.7 (s) and one recipe lever (^) minus regenerated T=0, 90% CI"
    ax.set_title(title, fontsize=10)
    fig.text(0.01, 0.005, caption, fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def source_figure(rows: list[dict], rank: dict | None, caption: str):
    """Accept length of each per-source draft against its source's on-policy NLL (`comparisons.per_source` rows),
    both with their intervals: the seeds' ranking criterion, tested."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    scored = [r for r in rows if r["onpolicy_nll"] is not None]
    if not scored:
        _empty(ax, "no per-source draft with an on-policy score in metrics/train.json and metrics/survey.json")
    for r in scored:
        xerr = [[r["onpolicy_nll"] - r["nll_low"]], [r["nll_high"] - r["onpolicy_nll"]]]
        yerr = None if r["low"] is None else [[r["accept_length"] - r["low"]], [r["high"] - r["accept_length"]]]
        ax.errorbar(r["onpolicy_nll"], r["accept_length"], xerr=xerr, yerr=yerr, fmt="o", capsize=3)
        ax.annotate(r["source"], (r["onpolicy_nll"], r["accept_length"]), xytext=(5, 5), textcoords="offset points")
    if scored:
        ax.set(xlabel="on-policy NLL of the source's answers (nats/token; lower: closer to the target)")
        ax.set(ylabel="accept length, all evaluation prompts")
    verdict = f"Spearman rho {rank['rho']:+.2f}, p = {rank['p_value']:.2f}, {rank['points']} points" if rank else ""
    ax.set_title(f"does the on-policy score predict the draft? {verdict}", fontsize=10)
    fig.text(0.01, 0.005, caption, fontsize=7, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def acceptance_figure(rows: list[dict], system: str, caption: str):
    """Per-position acceptance of each config of `system` (left) and where its wall time goes (right)."""
    import pandas as pd

    mine = [r for r in rows if r["system"] == system and r["draft"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4))
    for config in dict.fromkeys(r["config"] for r in mine):
        positions = pd.DataFrame([r["position_acceptance"] for r in mine if r["config"] == config]).mean()
        a.plot(range(1, len(positions) + 1), positions, marker="o", label=config)
    a.set(
        xlabel="draft position",
        ylabel="share of rounds accepting it",
        ylim=(0, 1),
        title=f"per-position acceptance, {system}",
    )
    a.legend(title="bs,steps,topk,ndraft[@threshold]")
    split = pd.DataFrame([{"config": r["config"], **r["time_split"]} for r in mine if r["time_split"]])
    split.groupby("config").mean().plot.barh(stacked=True, ax=b)
    b.set(xlabel="share of wall time", title="where the time goes")
    fig.suptitle(caption, fontsize=9)
    fig.tight_layout()
    return fig


PEER_WORDS = {
    "baseline": "target alone (baseline)",
    "hf-generate": "HF generate",
    "hf-prompt-lookup": "HF prompt lookup",
}


def config_words(config: str) -> str:
    """A `bs,steps,topk,ndraft[@threshold]` config (`decoding.config.SpecConfig`) in words, the string after them:
    "chain of 5 (1,5,1,6)" (topk 1: 5 tokens drafted in a line, 6 verified with the root), "tree: 2 steps, top-4,
    10 tokens (1,2,4,10)" (10 tokens of the tree verified)."""
    shape, _, threshold = str(config).partition("@")
    batch, steps, topk, ndraft = (int(p) for p in shape.split(","))
    if not steps:
        words = "no draft"
    elif topk == 1:
        words = f"chain of {steps}"
    else:
        words = f"tree: {steps} steps, top-{topk}, {ndraft} tokens"
    if threshold:
        words += f", stop below confidence {float(threshold):g}"
    return words + (f", batch {batch}" if batch != 1 else "") + f" ({config})"


def draft_words(system: str) -> str:
    """A benchmark row's system as a heading: "final draft", "smollm2-original-6960 draft", "..., EAGLE mode"."""
    name = system.removesuffix(" [EAGLE]")
    return f"{name} draft" + (", EAGLE mode" if name != system else "")  # [EAGLE]: SGLang's wrong-flag path


def _throughput_labels(rows: list[dict]) -> list[tuple[str, tuple[str, str] | None]]:
    """Tick labels top to bottom, each with its (system, config), None for a heading: a peer on one line; a draft's
    name as a heading over its configs in words."""
    configs: dict[str, dict[str, None]] = {}
    for r in rows:
        configs.setdefault(r["system"], {})[r["config"]] = None
    labels = []
    for system, shapes in configs.items():
        if system in PEER_WORDS:
            labels += [(PEER_WORDS[system], (system, config)) for config in shapes]
        else:
            labels += [(draft_words(system), None)] + [(config_words(c), (system, c)) for c in shapes]
    return labels


def throughput_figure(rows: list[dict], title: str):
    """Speedup over the target alone on each evaluation set (tokens/s over the baseline's on the same set and
    prompts), one bar per set drawn from the 1.0x line, every system and config labelled in words; tokens/s where
    the rows hold no baseline."""
    sets = list(dict.fromkeys(r["set"] for r in rows))
    base = {r["set"]: r["tokens_per_s"] for r in rows if r["system"] == "baseline" and r["tokens_per_s"]}
    labels = _throughput_labels([r for r in rows if not (base and r["system"] == "baseline")])
    where = {key: k for k, (_, key) in enumerate(labels) if key}
    fig, ax = plt.subplots(figsize=(10, min(8.0, 0.32 * len(labels) + 2)))
    height = 0.8 / len(sets)
    origin = 1.0 if base else 0.0
    for i, set_name in enumerate(sets):
        mine = [r for r in rows if r["set"] == set_name and (r["system"], r["config"]) in where]
        y = [where[r["system"], r["config"]] + (i - (len(sets) - 1) / 2) * height for r in mine]
        values = [r["tokens_per_s"] / base[set_name] if base else r["tokens_per_s"] for r in mine]
        words = f"{set_name} (baseline {base[set_name]:.1f} tok/s)" if set_name in base else set_name
        ax.barh(y, [v - origin for v in values], height, left=origin, label=words)
    for k, (_, key) in enumerate(labels):  # a thin rule above each draft's heading
        if key is None and k:
            ax.axhline(k - 0.5, color="0.8", lw=0.8)
    if base:
        ax.axvline(1.0, color="k", lw=1.2)
        ax.text(1.0, -0.75, " baseline 1.0x", fontsize=8, va="center")
    ax.set_yticks(range(len(labels)), [text for text, _ in labels], fontsize=9)
    for tick, (_, key) in zip(ax.get_yticklabels(), labels):
        tick.set_fontweight("normal" if key else "bold")
    ax.set_ylim(len(labels) - 0.5, -1.1)  # the first system on top
    xlabel = "speedup over the target alone, same set and prompts (tokens/s / baseline's)" if base else "tokens/s"
    ax.set(xlabel=xlabel, title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.6 / fig.get_figheight()), ncol=len(sets))
    fig.tight_layout()
    return fig


def tune_figure(compared: list[dict], caption: str):
    """Predicted speedup (`tune.predicted_vs_measured` rows) against the measured one (diagonal: a perfect model)."""
    ranked = [r for r in compared if r["measured_speedup"] is not None]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for r in ranked:
        ax.scatter(r["speedup"], r["measured_speedup"], zorder=3)
        ax.annotate(
            r["label"], (r["speedup"], r["measured_speedup"]), fontsize=8, xytext=(4, 4), textcoords="offset points"
        )
    values = [v for r in ranked for v in (r["speedup"], r["measured_speedup"])] or [1.0]
    lo, hi = min(values + [1.0]) - 0.05, max(values + [1.0]) + 0.05
    ax.plot([lo, hi], [lo, hi], color="k", lw=1, ls="--")
    ax.axhline(1.0, color="grey", lw=1, ls=":")
    ax.set(
        xlim=(lo, hi),
        ylim=(lo, hi),
        xlabel="predicted speedup",
        ylabel="measured speedup",
        title="tune: model vs measurement",
    )
    fig.text(0.01, 0.005, caption, fontsize=7, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
