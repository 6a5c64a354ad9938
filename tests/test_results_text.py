"""The figures written by hand in README's headline and docs/results.md's findings are the committed metrics': each
page's decimals, in order, equal what metrics/ (and the run's log) give, so a rerun that changes a figure fails here
until the prose says it."""

import json
import re

import yaml

from eagle3lab.paths import METRICS, ROOT
from eagle3lab.pipeline.report_engines import engines_table
from eagle3lab.pipeline.report_scaling import _size, _size_with_interval
from test_repo import HEADLINE

# 1.20 and 155.6; not 1,260, a version's 0.32.0, a setting's T=0.7 or anything in a code span (checked as a phrase)
DECIMAL = r"(?<![\d.=])(?<!\d,)(\d+\.\d+)(?!\d|,\d)"
RESULTS = ROOT / "docs" / "results.md"
FINDINGS = ("## The question", "## Checking a rerun")  # docs/results.md's hand-written part, between these


def _metrics(name: str) -> dict:
    return json.loads((METRICS / f"{name}.json").read_text())


def _mtbench(rows, system, config, engine=None):
    return next(
        r
        for r in rows
        if (r["set"], r["system"], r["config"]) == ("mtbench", system, config) and r.get("engine", engine) == engine
    )


def _headline_figures() -> list[str]:
    """README's headline figures as the committed metrics/ give them: the flags (stage 06), then the final and the
    6,960 drafts locally at the best config and in vLLM at tune's pick, then plain llama.cpp (stage 04), MT-bench."""
    diagnosis, bench = _metrics("diagnosis"), _metrics("benchmark")
    modes = {m["mode"]: m for m in diagnosis["modes"]}
    local = {d: _mtbench(bench["final"]["rows"], d, bench["best_config"]) for d in ("final", "smollm2-original-6960")}
    vllm = {d: _mtbench(bench["vllm"]["rows"], d, t["decision"], "vllm") for d, t in bench["vllm"]["tuned"].items()}
    llamacpp = _mtbench(bench["llamacpp"]["rows"], "baseline", "1,0,0,0", "llamacpp")
    two = [
        modes["eagle"]["accept_length"],
        modes["eagle"]["speedup_vs_baseline"],
        modes["eagle3"]["accept_length"],
        modes["eagle3"]["speedup_vs_baseline"],
        local["final"]["accept_length"],
        local["final"]["speedup_vs_baseline"],
        vllm["final"]["speedup_vs_baseline"],
        local["smollm2-original-6960"]["accept_length"],
        local["smollm2-original-6960"]["speedup_vs_baseline"],
        vllm["smollm2-original-6960"]["speedup_vs_baseline"],
    ]
    return [f"{x:.2f}" for x in two] + [f"{llamacpp['tokens_per_s']:.1f}", f"{llamacpp['speedup_vs_local']:.1f}"]


GRID_ENGINES = ("local", "vllm", "llamacpp")  # the order README's grid bullet names them in


def _grid_figures() -> list[str]:
    """README's answer to the seeds' question as the grid stands (metrics/forecast.json): each engine's need pooled
    over its cost cells with its interval, then the largest scale's accept length (all sets)."""
    forecast = _metrics("forecast")
    needs = [forecast["needed"][engine] for engine in GRID_ENGINES]
    now = forecast["sets"]["all"]["largest_against_needed"]["local"]
    return [f"{x:.2f}" for need in needs for x in (need["accept_length_needed"], *need["interval"])] + [
        f"{now['accept_length']:.2f}"
    ]


def _grid_phrases() -> list[str]:
    """The grid bullet's words that the forecast decides: the largest scale, its verdicts, what the curve can say."""
    forecast = _metrics("forecast")
    everything = forecast["sets"]["all"]
    verdicts = {e: everything["largest_against_needed"][e]["verdict"] for e in GRID_ENGINES}
    phrases = [f"The largest scale trained so far, {everything['sizes'][-1]:,} conversations"]
    if len(set(verdicts.values())) == 1:
        phrases += [f"{verdicts['local']} in every engine"]
    else:  # each engine's own
        phrases += [f"{verdict} in {engine}" for engine, verdict in verdicts.items()]
    if not everything["chosen"]:  # too few scales: the question's conversations cannot be read yet
        phrases += [f"{len(everything['sizes'])} scales so far, no curve form can be chosen"]
    return phrases


def _points() -> list[dict]:
    """The survey's points as committed (metrics/points/), lowest answer NLL first."""
    records = [json.loads(p.read_text()) for p in (METRICS / "points").glob("*.json")]
    return sorted(records, key=lambda r: r["estimates"]["answer_nll"]["estimate"])


SIGNAL_WORDS = {  # how README's survey bullet names a signal the finding tested
    "answer_nll": "The answers' NLL",
    "answer_length": "Answer length",
    "prompt_nll": "The prompts' NLL",
    "prompt_duplicate_rate": "The prompts' duplicate rate",
}


def _survey_correlations() -> tuple[dict, dict | None]:
    """The finding on all sets (metrics/closeness.json): the survey's score's row, and the best shown predictor's."""
    found = _metrics("closeness")
    rows = {row["signal"]: row for row in found["correlations"] if row["set"] == "all sets"}
    best = found["best_predictor"]["all sets"]
    return rows["answer_nll"], rows[best] if best and best != "answer_nll" else None


def _survey_figures() -> list[str]:
    """README's survey bullet: the closest and the farthest point's answer NLL, each with its interval; then the
    score's rank correlation with the drafts' accept length and its p-value; the best predictor's, Holm-adjusted."""
    said = [_points()[0]["estimates"]["answer_nll"], _points()[-1]["estimates"]["answer_nll"]]
    bet, best = _survey_correlations()
    figures = [f"{x:.2f}" for s in said for x in (s["estimate"], s["low"], s["high"])]
    figures += [f"{abs(bet['rho']):.2f}", f"{bet['p_value']:.3f}"]
    return figures + ([f"{abs(best['rho']):.2f}", f"{best['p_adjusted']:.3f}"] if best else [])


def _survey_phrases() -> list[str]:
    """The survey bullet's words that the records decide: the points named, how many, how many drafts are in, the
    score's verdict and the best predictor's (or that none is shown)."""
    points, closeness = _points(), _metrics("closeness")
    planned = yaml.safe_load((ROOT / "params.yaml").read_text())["drafts"]["closeness"]
    trained = sum(row["seeds"] for row in closeness["points"])
    bet, best = _survey_correlations()
    phrases = [
        f"({points[0]['name']})",
        f"({points[-1]['name']})",
        f"over {len(points)} points",
        f"{trained} of {len(planned['cells'])} drafts",
        f"rho {bet['rho']:+.2f} (p {bet['p_value']:.3f}): {bet['verdict']}",
    ]
    if best:
        said = f"{SIGNAL_WORDS[best['signal']]} ranks at rho {best['rho']:+.2f} (Holm p {best['p_adjusted']:.3f})"
        return phrases + [f"{said}: shown"]
    return phrases + ["No other signal stage 01 measures is shown to predict it"]


def test_readme_headline_figures_are_the_committed_metrics():
    """README's headline states exactly the figures metrics/ holds, in order, and nothing else with decimals."""
    readme = (ROOT / "README.md").read_text()
    headline = readme.split(HEADLINE, 1)[1].split("\n## ", 1)[0]
    bench = _metrics("benchmark")
    scaling = _metrics("scaling")
    assert _decimals(headline) == _headline_figures() + _grid_figures() + _survey_figures()
    for phrase in _grid_phrases() + _survey_phrases():
        assert phrase in " ".join(headline.split()), phrase
    assert f"`{bench['best_config']}`" in headline
    assert f"vLLM at {_size(_break_even(scaling, 'vllm')['figure'])} conversations" in headline
    assert f"({_size(_break_even(scaling, 'local')['figure'])} by the fit)" in headline
    assert f"of the {bench['final']['meta']['prompts']} benchmarked" in headline


def _repro_log() -> tuple[str, list[str]]:
    """The run's commit, and its minutes: in all, then each stage's."""
    log = (METRICS / "repro.log").read_text()
    commit = re.search(r"^# make repro began \S+ at (\w+)", log, re.M).group(1)
    stages = re.findall(r"^\w+  \S+  (\d+\.\d)$", log, re.M)
    return commit, [re.search(r"(\d+\.\d) minutes in all", log).group(1), *stages]


def _decimals(text: str) -> list[str]:
    return re.findall(DECIMAL, re.sub(r"`[^`]*`", "", text))


def _finding(scaling: dict, question: str) -> dict:
    return next(f for f in scaling["findings"] if f["question"].startswith(question))


def _break_even(scaling: dict, engine: str) -> dict:
    """The finding of the conversations MT-bench needs to break even in an engine, at the shape stage 05 fits."""
    return _finding(scaling, f"conversations for 1x in {engine} ({scaling['engines'][engine]['shape']}), mtbench")


def _results_figures() -> tuple[list[str], list[str]]:  # long: one list in the page's order reads best as one
    """docs/results.md's hand-written findings as metrics/ give them, in the page's order: its decimals, and the
    phrases with whole numbers the decimals cannot hold (the run's commit, conversations, millisecond ranges)."""
    bench, scaling, diagnosis = _metrics("benchmark"), _metrics("scaling"), _metrics("diagnosis")
    seeds = yaml.safe_load((ROOT / "params.yaml").read_text())["scaling_curves"]
    commit, minutes = _repro_log()
    simple = next(r for r in diagnosis["llamacpp"] if r["spec_type"] == "draft-simple")
    headline = _headline_figures()
    llamacpp_best = max(
        (r for r in engines_table(bench) if r["engine"] == "llamacpp"), key=lambda r: r["fastest_vs_own_baseline"]
    )
    regenerated = _finding(scaling, "regenerated minus original")
    doubling = {s: _finding(scaling, f"accept length gained per doubling of data, {s}") for s in ("mtbench", "gsm8k")}
    vllm_1x, local_1x = _break_even(scaling, "vllm"), _break_even(scaling, "local")
    projected = scaling["seeds"]["projected_tau_after_10x"].values()
    projected_speedup = scaling["seeds"]["projected_speedup_after_10x"].values()
    dflash = _finding(scaling, "DFlash minus EAGLE-3")
    dflash_speed = [
        next(
            r["speedup_vs_baseline"]
            for r in bench["dflash"][engine]["rows"]
            if r["system"] == bench["dflash"]["draft"]
            and r.get("set", "all") == ("all" if engine == "local" else "mtbench")
        )
        for engine in ("local", "vllm", "llamacpp")
    ]
    split = bench["llamacpp_split"]
    deeper = [r for r in split["rows"] if r["k"] > 1]
    one = next(r for r in split["rows"] if r["k"] == 1)
    vllm = bench["vllm"]["tuned"]
    final_rounds = vllm["final"]["calibration"]["round_s"].values()
    decimals = [
        f"{seeds['seeds_spec_tok_s']:.1f}",
        f"{seeds['seeds_accept_length']:.1f}",
        *minutes,
        *headline[:4],  # the flags
        f"{simple['accept_length']:.2f}",
        f"{simple['speedup_vs_baseline']:.2f}",
        headline[5],  # the final draft locally, in vLLM; the 6,960 draft locally, in vLLM
        headline[6],
        headline[8],
        headline[9],
        *headline[10:],  # plain llama.cpp
        f"{llamacpp_best['fastest_vs_own_baseline']:.2f}",
        *(f"{abs(regenerated[k]):.3f}" for k in ("figure", "low", "high")),
        *(f"{doubling[s]['figure']:.3f}" for s in ("mtbench", "gsm8k")),
        list(scaling["engines"]["local"]["needs"])[1].rstrip("x"),  # the 1.5x goal
        f"{seeds['seeds_spec_tok_s']:.1f}",
        f"{scaling['seeds']['break_even_tau']:.2f}",
        f"{seeds['seeds_accept_length']:.1f}",
        f"{min(projected):.2f}",
        f"{max(projected):.2f}",
        f"{min(projected_speedup):.2f}",
        f"{max(projected_speedup):.2f}",
        *(f"{abs(dflash[k]):.3f}" for k in ("figure", "high", "low")),
        *(f"{x:.2f}" for x in dflash_speed),
        f"{split['step_s'] * 1000:.1f}",
        f"{one['round_s'] * 1000:.1f}",
        f"{one['break_even']:.1f}",
        f"{one['perfect_speedup']:.2f}",
        f"{min(r['round_s'] for r in deeper) * 1000:.1f}",
        f"{max(r['round_s'] for r in deeper) * 1000:.1f}",
        f"{min(r['break_even'] for r in deeper):.1f}",
        f"{max(r['break_even'] for r in deeper):.1f}",
        f"{vllm['final']['calibration']['step_s'] * 1000:.1f}",
        *(f"{vllm[d]['ranked'][0][k]:.2f}" for d in vllm for k in ("speedup", "measured_speedup")),
    ]
    phrases = [
        f"clean clone of {commit}",
        f"`{bench['tuned']['decision']}`",
        f"`{llamacpp_best['fastest_config']}`",
        f"{_size_with_interval(vllm_1x['figure'], [vllm_1x['low'], vllm_1x['high']])} conversations",
        f"{_size(local_1x['figure'])} by the fit",
        "{:.0f}-{:.0f} ms a round".format(*(f(r["rest_s"] for r in split["rows"]) * 1000 for f in (min, max))),
        "{:.0f}-{:.0f} ms at k=1-3".format(*(f(final_rounds) * 1000 for f in (min, max))),
    ]
    return decimals, phrases


def test_results_findings_are_the_committed_metrics():
    """docs/results.md's hand-written findings state the committed run's figures, in order, and no other decimal."""
    text = RESULTS.read_text()
    findings = text.split(FINDINGS[0], 1)[1].split(FINDINGS[1], 1)[0]
    decimals, phrases = _results_figures()
    assert _decimals(findings) == decimals
    missing = [p for p in phrases if p not in findings]
    assert not missing, f"docs/results.md's findings lack {missing}"
