"""The results page's scaling section (stage 05's metrics/scaling.json): the fit and its parameters, the
conversations each engine needs, the drafts trained elsewhere beside the curve, and the data questions (regenerated
against original and T=0 against T=0.7 at equal tokens, per-source drafts against the on-policy score), each with its
interval. Sections whose keys a scaling.json from before issue 26 lacks are left out."""

from __future__ import annotations

from eagle3lab.benchmark.comparisons import ALL_SETS
from eagle3lab.benchmark.scaling import BEYOND, describe_parameter, fitted_size, speedup_label
from eagle3lab.pipeline.report_tables import figure, table


def with_interval(value: float, low: float | None, high: float | None, fmt: str = "+.3f") -> str:
    """A value and its interval, as the tables print them ("value" alone without one)."""
    text = format(value, fmt)
    return text if low is None else f"{text} [{format(low, fmt)}, {format(high, fmt)}]"


def _size(size) -> str:
    """Conversations read off a fit: a count, a large one in scientific notation, or why there is none."""
    if isinstance(size, str):
        return size
    return f"{size:,.0f}" if size < 1e6 else f"{size:.3g}"


def _size_with_interval(size, interval: list | None) -> str:
    """Conversations and their interval, the interval left out where it says no more than the reading."""
    if interval is None or list(interval) == [size, size]:
        return _size(size)
    return "{} [{}, {}]".format(*map(_size, [size, *interval]))


def _fits(s: dict) -> str:
    rows = [
        [
            name,
            with_interval(f["gain_per_doubling"], *f["gain_per_doubling_interval"]),
            *(describe_parameter(f, p) for p in "abc"),
            fitted_size(f["records_for_break_even"], f["ceiling_identified"], f["sizes"]),
            fitted_size(f["records_for_2x"], f["ceiling_identified"], f["sizes"]),
        ]
        for name, f in s["fits"].items()
    ]
    beyond = (
        f"\n\n{BEYOND.capitalize()}: past the largest size measured "
        f"({max(max(f['sizes']) for f in s['fits'].values()):,.0f} conversations) while the fit cannot identify its "
        "ceiling; its extrapolation there follows the bound the config allows, not the data."
        if any(BEYOND in row for row in rows)
        else ""
    )
    header = ["set", "accept length gained per doubling of data [90% CI]", "ceiling a", "scale b", "exponent c"]
    return table([*header, "conversations for break-even (fit)", "conversations for 2x (fit)"], rows) + beyond


def _engines(s: dict) -> str:
    """Each engine's own break-even, 1.5x and 2x accept lengths, and the conversations the curve needs for them."""
    if "records_needed" not in s:
        return ""
    needed = {(r["engine"], r["set"], r["speedup"]): r for r in s["records_needed"]}
    speedups = sorted({r["speedup"] for r in s["records_needed"]})
    rows = []
    for engine, e in s["engines"].items():
        for set_name in s["fits"]:
            cells = [needed[engine, set_name, x] for x in speedups]
            sizes = [_size_with_interval(r["records"], r["interval"]) for r in cells]
            rows.append([engine, e["shape"], e["round_ms"], set_name, *(r["accept_length"] for r in cells), *sizes])
    targets = [speedup_label(x) for x in speedups]
    header = ["engine", "shape", "round ms", "set", *(f"accept length for {t}" for t in targets)]
    left_out = "".join(f"\n\n{name} is left out: {why}." for name, why in s.get("engines_left_out", {}).items())
    return (
        "\n\nThe curve is measured in the local engine; each engine's break-even accept length is its own, from its "
        "own per-round costs (local: `tune`'s forward costs at the sweep's config; vLLM and llama.cpp: their "
        "`tune --engine` calibration of the chain nearest the sweep's steps), read off that one curve "
        "(conversations [90% CI of the fit's bootstrap]):\n\n"
        + table([*header, *(f"conversations for {t}" for t in targets)], rows)
        + left_out
    )


def _beside(rows: list[dict] | None) -> str:
    """The pipeline's own point nearest each regenerated draft trained elsewhere, against it."""
    if not rows:
        return ""
    cells = [
        [
            r["draft"],
            r["conversations"],
            r["pipeline_draft"],
            r["pipeline_records"],
            r["set"],
            r["draft_accept"],
            r["partner_accept"],
            with_interval(r["difference"], r["low"], r["high"]),
        ]
        for r in rows
    ]
    header = ["draft elsewhere", "conversations", "pipeline draft", "conversations", "set", "its accept", "ours"]
    unpaired = "" if rows[0]["paired"] else " (the sweep did not run it: set means, no interval)"
    return (
        "\n\nThe pipeline's own point nearest a GPU-trained draft"
        + unpaired
        + ":\n\n"
        + table([*header, "difference [90% CI]"], cells)
    )


def _paired(s: dict) -> str:
    """Original and sampled drafts against their regenerated T=0 partners at equal target tokens, over all prompts."""
    if "paired" not in s:  # before issue 26: the equal-size comparison
        return "\n\nRegenerated vs original responses at equal size (accept length, config {}): {}.".format(
            s["config"],
            ", ".join(
                f"{r['set']} {r['regenerated']:.2f} vs {r['original']:.2f}" for r in s["regenerated_vs_original"]
            ),
        )
    rows = [
        [
            r["draft"],
            r["responses"],
            r["partner"],
            r["scale"],
            r["answer_tokens"],
            r["partner_answer_tokens"],
            r["draft_accept"],
            r["partner_accept"],
            with_interval(r["difference"], r["low"], r["high"]),
            r["prompts"],
        ]
        for r in s["paired"]
        if r["set"] == ALL_SETS
    ]
    header = ["draft", "answers", "regenerated T=0 partner", "partner conversations", "answer tokens", "partner's"]
    header += ["accept", "partner's", "difference [90% CI]", "prompts"]
    unmatched = "".join(f"\n\nLeft out: {line}." for line in s.get("unmatched", []))
    if not rows:
        return (
            "\n\nOriginal and sampled answers against regenerated ones at equal target tokens: none matched."
            + unmatched
        )
    return (
        "\n\nAt equal target tokens, each draft's accept length against its regenerated (T=0) partner, paired by "
        f"prompt over all sets:\n\n{table(header, rows)}\n\n{figure('paired', 'scaling_paired_differences.png')}"
        + unmatched
    )


def _sources(s: dict) -> str:
    """Per-source drafts against their source's on-policy score, and the rank correlation."""
    if "sources" not in s:  # a scaling.json from before issue 26
        return ""
    if not s["sources"]:
        return "\n\nPer-source drafts against the on-policy score: none trained in this run."
    rows = [
        [
            r["source"],
            r["records"],
            r["answer_tokens"],
            with_interval(r["accept_length"], r["low"], r["high"], ".3f"),
            None if r["onpolicy_nll"] is None else with_interval(r["onpolicy_nll"], r["nll_low"], r["nll_high"], ".2f"),
        ]
        for r in s["sources"]
    ]
    rank = s.get("source_rank")
    verdict = (
        f"Spearman rho {rank['rho']:+.2f} between on-policy NLL and accept length (p = {rank['p_value']:.2f}, "
        f"{rank['points']} points; the criterion predicts -1): with so few points it proves little."
        if rank
        else "Fewer than 3 scored sources: no rank correlation."
    )
    header = ["source", "conversations", "answer tokens", "accept length [90% CI]", "on-policy NLL [CI]"]
    return (
        "\n\nOne draft per source at equal answer tokens, accept length over every evaluation prompt against the "
        f"source's on-policy score:\n\n{table(header, rows)}\n\n{verdict}\n\n{figure('sources', 'scaling_sources.png')}"
    )


def _elsewhere(points: list[dict] | None, config: str) -> str:
    """Drafts trained elsewhere beside the curve (stage 05's labelled points; absent before they were committed)."""
    if not points:
        return ""
    rows = [
        [
            p["draft"],
            p["hardware"],
            p["responses"],
            p["conversations"],
            p["tokens"],
            name,
            tau,
            p["fit_there"].get(name),
        ]
        for p in points
        for name, tau in p["accept_length"].items()
    ]
    header = ["draft", "trained on", "responses", "conversations", "tokens", "set", f"accept length, {config}"]
    return (
        "\n\nDrafts trained elsewhere (`drafts/`), labelled on the curve but not fitted (another machine and recipe), "
        "measured by stage 04 beside the final draft:\n\n" + table([*header, "the fit there"], rows)
    )


def _figure_text(value, is_size: bool) -> str:
    """A finding's figure: a number of conversations as a size (95, 2,173), any other as a signed difference."""
    if isinstance(value, str):
        return value
    return _size(value) if is_size else f"{value:+.3f}"


def findings(s: dict) -> str:
    """Stage 05's findings table: every question, its figure and interval, what the interval resamples, and the
    verdict ("shown" only where the interval excludes zero). Empty for a scaling.json written before it existed."""
    if not s.get("findings"):
        return ""

    def text(f, value):
        return _figure_text(value, f["question"].startswith("conversations for"))

    rows = [
        [
            f["question"],
            text(f, f["figure"]),
            "-" if f["low"] is None else f"[{text(f, f['low'])}, {text(f, f['high'])}]",
            f["unit"],
            f["prompts"],
            f["seeds"],
            f"**{f['verdict']}**",
        ]
        for f in s["findings"]
    ]
    header = ["question", "figure", "90% interval", "resampled", "prompts", "seeds", "verdict"]
    return "### Findings\n\n" + table(header, rows) + "\n\n"


def scaling(s: dict) -> str:
    seeds = s["seeds"]
    proj = ", ".join(
        f"{k} {v:.2f} ({seeds['projected_speedup_after_10x'][k]:.2f}x)"
        for k, v in seeds["projected_tau_after_10x"].items()
    )
    c = s["costs_ms"]
    return (
        findings(s) + "### 6. Scaling and break-even\n\n"
        f"Costs on this machine (config {s['config']}): target step {c['target_step']:.1f} ms, verify "
        f"{c['verify']:.1f} ms, draft step {c['draft_step']:.1f} ms, other {c['other_per_round']:.1f} ms per round: "
        f"break-even accept length **{s['break_even_tau']:.2f}**, 2x needs **{s['tau_for_2x']:.2f}**.\n\n"
        + _fits(s)
        + _engines(s)
        + _elsewhere(s.get("third_party"), s["config"])
        + _beside(s.get("beside_the_curve"))
        + f"\n\nThe seeds' numbers (90 vs 82.3 tok/s at accept length 2.1) put their break-even at accept length "
        f"{seeds['break_even_tau']:.2f} and 2x at {seeds['tau_for_2x']:.2f}. Carrying our fitted gain from 10x "
        f"more data over to their 2.1 gives: {proj}."
        + _paired(s)
        + _sources(s)
        + "\n\n"
        + figure("scaling", "scaling_accept_length.png")
        + "\n"
        + (
            f"\nTuned config {s['tuned']['config']}: a round costs {s['tuned']['round_ms']:.1f} ms, break-even accept "
            f"length **{s['tuned']['break_even_tau']:.2f}**, 2x needs **{s['tuned']['tau_for_2x']:.2f}**.\n"
            if s.get("tuned")
            else ""
        )
    )
