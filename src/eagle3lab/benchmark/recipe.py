"""`python -m eagle3lab.benchmark.recipe`: the recipe ablation. Each training lever is changed alone at one data
scale, with the shared recipe's data, plan and seeds (params.yaml's train_draft), and each draft is scored by exact
offline acceptance on the evaluation set at the sweep's chain depth (params.yaml's benchmark). Every lever is paired
with the shared recipe's draft prompt by prompt, seeds and prompts resampled, as stage 05's findings are.

It runs on a finished reference run's outputs under --root (regenerated data, feature cache, evaluation set): the
drafts trained there already (the scale's own draft, the run's ablation) are resumed, not retrained, and a killed
ablation resumes from its last checkpoint. Writes metrics/recipe.json and, from it, docs/recipe.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from eagle3lab.benchmark import acceptance, comparisons, eval_set, findings, scoring
from eagle3lab.benchmark.scaling import LEVEL
from eagle3lab.decoding.config import SpecConfig
from eagle3lab.devices import resolve_dtype
from eagle3lab.io import write_json
from eagle3lab.models.target import load_target
from eagle3lab.paths import ROOT
from eagle3lab.pipeline.stages import load_params, notebook_for, stage_parameters
from eagle3lab.train.answer_tokens import AnswerTokens
from eagle3lab.train.plan import plan_runs, scale_name
from eagle3lab.train.scales import in_input_order, train_runs

# One lever at a time against the shared recipe (draft vocabulary 4,096, TTT 3, lr 0.002 cosine to 0.1, fresh head).
# The last one is compute, not recipe: four times the answer tokens, to show what longer training buys.
LEVERS = (
    {"draft_vocab_size": 16384},
    {"draft_vocab_size": 32768},
    {"ttt_length": 1},
    {"ttt_length": 5},
    {"lr": 0.0005},
    {"lr": 0.005},
    {"min_lr_ratio": 1.0},  # constant after warm-up instead of the cosine decay
    {"init_head_from_target": True},
    {"init_layer_from_target": -1},
    {"acceptance_loss_weight": 1.0},
    {"min_answer_tokens": 200000},
)
# Levers the issue names that are not ablated, and why (the page says so).
NOT_ABLATED = (
    "2 draft layers: llama.cpp, the CPU user's engine, refuses an EAGLE-3 draft of more than one layer "
    "(`GGML_ASSERT(n_layer == 1)` in the pinned source's src/models/eagle3.cpp) and the SGLang checkpoint this "
    "package writes has one `midlayer`; only vLLM 0.32 builds more (llama_eagle3.py, `num_hidden_layers` layers, the "
    "first reading 2H). A winning 2-layer recipe could not be the final draft in two of the three engines.",
)
SETTINGS = (  # train_draft's keys that are shared TrainConfig settings (the rest place a draft in the experiment)
    "target", "device", "seed", "val_max_records", "draft_vocab_size", "ttt_length", "epochs", "min_answer_tokens",
    "max_answer_tokens", "lr", "warmup_ratio", "batch_tokens", "max_len", "dtype", "eval_every", "patience",
    "checkpoint_every",
)  # fmt: skip
SHARED_RECIPE = ("draft_vocab_size", "ttt_length", "lr", "warmup_ratio", "epochs", "min_answer_tokens")
BOOT = 2000


def train_levers(root: Path, train: dict, scale: int, levers, report=print) -> dict:
    """Train (or resume) the scale's draft and each lever's, every seed; name -> result with its place."""
    artifacts = root / "artifacts"
    regenerated = in_input_order(root, train["train_data"], train["original_data"], artifacts)
    runs, skipped = plan_runs(
        root,
        AnswerTokens(train["target"], train["max_len"]),
        train_data=regenerated,
        original_data=train["original_data"],
        scales=[scale],
        ablations=[{"scale": scale, **lever} for lever in levers],
        seeds=train["seeds"],
        seed=train["seed"],
    )
    if skipped:
        raise SystemExit("cannot train: " + "; ".join(skipped))
    settings = {key: train[key] for key in SETTINGS}
    return train_runs(runs, settings, root, artifacts, train["val_data"], report)


def score(root: Path, bench: dict, names: list[str]) -> pd.DataFrame:
    """Exact offline accept length of each draft on every evaluation prompt at the sweep's depth."""
    device = bench["device"]
    target = load_target(bench["target"], dtype=resolve_dtype(bench["eval_dtype"], device), device=device)
    records = eval_set.build_eval_set(
        target, root / "artifacts" / "eval", bench["eval_sets"], bench["eval_max_new_tokens"]
    )
    drafts = scoring.load_drafts({n: root / "artifacts" / "drafts" / n for n in names}, target, target.model.dtype)
    rows = scoring.score(drafts, target, records, [SpecConfig.parse(bench["sweep_config"]).steps], progress=True)
    return pd.DataFrame(acceptance.per_prompt(rows))


def places(results: dict) -> dict:
    """The drafts' places in the experiment, as comparisons reads them from metrics/train.json."""
    keys = ("responses", "matched_to", "replicate_of")
    return {n: {"records": r["data"]["records"], **{k: r.get(k) for k in keys}} for n, r in results.items()}


def recipe_table(results: dict, paired: list[dict]) -> list[dict]:
    """One row per lever, all evaluation prompts: its accept length, the difference from the shared recipe with the
    interval over prompts x seeds and the verdict, and its cost (training tokens/s, held-out vocabulary coverage)."""
    seeds = comparisons.replicates(places(results))
    rows = []
    for row, finding in zip((r for r in paired if r["set"] == comparisons.ALL_SETS), findings.paired_findings(paired)):
        own = [results[n] for n in seeds[row["draft"]]]
        rows.append(
            {
                "lever": ", ".join(f"{k}={v}" for k, v in own[0]["overrides"].items()),
                "draft": row["draft"],
                "accept_length": round(row["draft_accept"], 4),
                "shared_recipe": round(row["partner_accept"], 4),
                "difference": round(finding["figure"], 4),
                "low": round(finding["low"], 4),
                "high": round(finding["high"], 4),
                "unit": finding["unit"],
                "prompts": finding["prompts"],
                "verdict": finding["verdict"],
                "steps": own[0]["steps"],
                "train_tokens_per_s": round(sum(r["tokens_per_s"] for r in own) / len(own), 1),
                "held_out_vocab_coverage": own[0]["vocab"].get("held_out_coverage"),
            }
        )
    return rows


def page(payload: dict) -> str:
    """docs/recipe.md from metrics/recipe.json: the setting, one row per lever, the verdicts, set by set."""
    rows, shared = payload["levers"], payload["shared_recipe"]
    seeds = comparisons.replicates({n: d for n, d in payload["drafts"].items()})
    own = [payload["drafts"][n] for n in seeds[scale_name(payload["scale"])]]
    recipe = ", ".join(f"{k} {v}" for k, v in shared.items())
    lines = [
        "# The recipe ablation",
        "",
        f"Each lever changed alone against the shared recipe ({recipe}): {payload['scale']} regenerated "
        f"conversations, the same data, plan and step budget, {len(own)} training seeds each. Scored by exact "
        f"offline accept length at {payload['depth']} drafted tokens on {rows[0]['prompts']} evaluation prompts "
        f"([acceptance.md](acceptance.md)). Each interval is a {LEVEL:.0%} bootstrap over prompts and both sides' "
        "seeds; a difference is shown only where it excludes zero. Regenerate this page: "
        "`python -m eagle3lab.benchmark.recipe` after `make repro` (`--render` rewrites it from "
        "`metrics/recipe.json`).",
        "",
        f"| lever | accept length | minus shared recipe [{LEVEL:.0%} interval] | verdict | steps | train tok/s "
        "| vocab coverage |",
        "|---|---|---|---|---|---|---|",
        f"| shared recipe | {rows[0]['shared_recipe']:.3f} | | | {own[0]['steps']} | "
        f"{sum(d['tokens_per_s'] for d in own) / len(own):.0f} | {own[0]['held_out_vocab_coverage']:.3f} |",
    ]
    for r in rows:
        lines.append(
            f"| {r['lever']} | {r['accept_length']:.3f} | {r['difference']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}] | "
            f"{r['verdict']} | {r['steps']} | {r['train_tokens_per_s']:.0f} | {r['held_out_vocab_coverage']:.3f} |"
        )
    more = [f"{r['lever']} ({r['steps']} steps)" for r in rows if r["steps"] > own[0]["steps"] + 1]
    lines += [
        "",
        "Train tok/s is the mean of the seeds' runs on a shared 2-core machine (2x run to run): a lever that "
        "changes no step's work (the learning rate, its schedule, the head's or the layer's initialisation) costs "
        "what the shared recipe costs, and the acceptance loss adds one sum a step: a figure far below the shared "
        "recipe's is other jobs sharing the machine."
        + (f" Changing the compute, not the recipe at equal compute: {', '.join(more)}." if more else ""),
    ]
    for word, test in (("help", lambda r: r["low"] > 0), ("hurt", lambda r: r["high"] < 0)):
        found = [r["lever"] for r in rows if r["verdict"] == "shown" and test(r)]
        lines += ["", f"Shown to {word}: {', '.join(found) or 'none'}."]
    lines += ["", "Not ablated:", ""] + [f"- {reason}" for reason in NOT_ABLATED]
    sets = sorted({r["set"] for r in payload["paired"]} - {comparisons.ALL_SETS})
    lines += ["", "The difference set by set (seeds averaged):", "", f"| lever | {' | '.join(sets)} |"]
    lines.append("|---|" + "---|" * len(sets))
    for r in rows:
        by = {p["set"]: p["difference"] for p in payload["paired"] if p["draft"] == r["draft"]}
        lines.append(f"| {r['lever']} | " + " | ".join(f"{by[s]:+.3f}" for s in sets) + " |")
    return "\n".join(lines) + "\n"


def run(root: Path, params_file: Path, scale: int) -> dict:
    """Train, score and compare every lever: the payload of metrics/recipe.json. The stages' own parameters, checked
    and merged as the stage runner does (a key in `common` and in a section is refused, never silently overridden)."""
    params = load_params(params_file)
    train, bench = (
        stage_parameters(name, notebook_for(name), params, params_file) for name in ("train_draft", "benchmark")
    )
    results = train_levers(root, train, scale, LEVERS)
    per_prompt = score(root, bench, list(results))
    paired, unmatched = comparisons.paired_comparisons(per_prompt, places(results), boot=BOOT, seed=train["seed"])
    if unmatched:
        raise SystemExit("unpaired: " + "; ".join(unmatched))
    drafts = {
        n: places(results)[n]
        | {"steps": r["steps"], "tokens_per_s": r["tokens_per_s"], "held_out_vocab_coverage": r["vocab"].get(
            "held_out_coverage"), "plateaued": r["plateaued"], "pick_step": (r.get("best") or {}).get("step")}
        for n, r in results.items()
    }  # fmt: skip
    return {
        "scale": scale,
        "depth": SpecConfig.parse(bench["sweep_config"]).steps,
        "shared_recipe": {k: train[k] for k in SHARED_RECIPE},
        "drafts": drafts,
        "levers": recipe_table(results, paired),
        "paired": paired,
        "per_prompt": per_prompt.to_dict("records"),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3lab.benchmark.recipe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(ROOT), help="a checkout holding a finished run's artifacts/")
    parser.add_argument("--params", help="params file (default: ROOT's params.yaml)")
    parser.add_argument("--scale", type=int, default=350, help="conversations every lever trains on")
    parser.add_argument("--output", default=str(ROOT / "metrics" / "recipe.json"))
    parser.add_argument("--page", default=str(ROOT / "docs" / "recipe.md"), help="the page written from --output")
    parser.add_argument("--render", action="store_true", help="only rewrite --page from --output")
    args = parser.parse_args(argv)
    if not args.render:
        root = Path(args.root).resolve()
        write_json(Path(args.output), run(root, Path(args.params or root / "params.yaml"), args.scale))
    Path(args.page).write_text(page(json.loads(Path(args.output).read_text())))
    print(Path(args.page).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
