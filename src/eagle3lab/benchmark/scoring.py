"""`eagle3lab acceptance`: exact offline accept length of drafts of any kind on the evaluation set, no decoding.
Each draft is loaded and scored by its kind's tools (drafters.tools: an EAGLE-3 chain at its depths, a DFlash block
whole or truncated), into benchmark.acceptance's rows; `--compare` sets one recipe's seeds against another's, prompt
by prompt, with an interval over prompts and seeds.

It sits above benchmark.acceptance because the kinds' tools import that module's rows: asking the registry from
there would run an import circle."""

from __future__ import annotations

import argparse

import torch

from eagle3lab.benchmark.acceptance import int_list, named, per_prompt, sets_option, subset, table
from eagle3lab.drafters.tools import tools_of
from eagle3lab.io import InputError, command


def load_drafts(folders: dict, target, dtype: torch.dtype) -> dict[str, tuple]:
    """Draft folders of any kind (name -> folder), each loaded by its kind's tools beside the target: name -> (tools,
    draft)."""
    loaded = {}
    for name, folder in folders.items():
        tools = tools_of(folder)
        loaded[name] = (tools, tools.load_for_acceptance(folder, target, dtype))
    return loaded


def score(drafts: dict[str, tuple], target, records, depths: list[int] | None, progress: bool = True) -> list:
    """PromptAcceptance rows of loaded drafts of any kind (`load_drafts`) at `depths` (tokens drafted a round; None:
    each draft's kind's own): kind by kind, in the order of each kind's first draft, and its drafts in their order."""
    by_kind: dict = {}
    for name, (tools, draft) in drafts.items():
        by_kind.setdefault(tools, {})[name] = draft
    return [
        row
        for tools, group in by_kind.items()
        for row in tools.offline_acceptance(group, target, records, depths, progress)
    ]


def compare_option(text: str, names) -> tuple[list[str], list[str]]:
    """--compare "A,B:C,D" as (drafts, partners): each side a recipe's seeds, every one a scored draft's name."""
    mine, _, theirs = text.partition(":")
    sides = [[n.strip() for n in side.split(",") if n.strip()] for side in (mine, theirs)]
    if not all(sides):
        raise InputError(f"--compare {text!r}: expected DRAFTS:PARTNERS, each side draft names, comma-separated")
    unknown = [n for side in sides for n in side if n not in names]
    if unknown:
        raise InputError(f"--compare {text!r}: {', '.join(unknown)} not among the drafts ({', '.join(names)})")
    return sides[0], sides[1]


def common_depths(drafts: dict[str, tuple], names: list[str], depths: list[int] | None) -> list[int]:
    """The depths every one of `names` is scored at (`depths`, or each draft's kind's own)."""
    scored = [set(depths or tools.acceptance_depths(draft)) for tools, draft in (drafts[n] for n in names)]
    return sorted(set.intersection(*scored))


def versus(rows: list[dict], drafts: list[str], partners: list[str], depths: list[int], boot: int = 2000) -> list:
    """`drafts` (seeds of one recipe) minus `partners` (seeds of another) in accept length, prompt by prompt, at each
    of `depths`: over every prompt, then set by set, each with its interval over prompts and seeds and its verdict."""
    import pandas as pd

    from eagle3lab.benchmark.comparisons import by_set, paired_difference

    frame = pd.DataFrame(rows)
    return [
        {"depth": depth, "set": name} | paired_difference(group, drafts, partners, boot=boot, seed=0)
        for depth in depths
        for name, group in by_set(frame[frame.depth == depth])  # paired_difference pairs by (set, id): one depth
    ]


def _parser() -> argparse.ArgumentParser:
    from eagle3lab.benchmark.eval_set import DEFAULT_SETS
    from eagle3lab.cli import COMMANDS
    from eagle3lab.models.target import DEFAULT_TARGET
    from eagle3lab.paths import ARTIFACTS

    parser = argparse.ArgumentParser(
        prog="eagle3lab acceptance",
        description=COMMANDS["acceptance"][2]
        + " Each draft, an EAGLE-3 chain or a DFlash block, runs teacher-forced along the target's greedy answers to "
        "the evaluation sets (cached in --cache) and each round counts its draft tokens up to the first miss, as the "
        "engine's greedy verification does: no decoding, no timing, one target forward a prompt for every draft of a "
        "kind and depth.",
    )
    parser.add_argument(
        "drafts", nargs="+", metavar="DRAFT", help="draft folders of any kind (name=folder to label one)"
    )
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target spec, model folder or HF id")
    parser.add_argument(
        "--depths",
        help="comma-separated depths, the tokens drafted a round, for every draft: a chain's steps, a block truncated "
        "to that many masks as the engines serve k < block_size - 1 (what `tune --offline` reads); default: chains "
        "at 3,5, blocks at their whole block",
    )
    parser.add_argument(
        "--sets", default=",".join(f"{k}:{v or 'all'}" for k, v in DEFAULT_SETS.items()), help="SET:N|all,..."
    )
    parser.add_argument(
        "--subset",
        help="score only these sets' first N records of the evaluation set, SET:N|all,... (a quicker profile; the set "
        "is still built and cached whole, as --sets says)",
    )
    parser.add_argument(
        "--compare",
        metavar="DRAFTS:PARTNERS",
        help="A,B:C,D: drafts A and B (seeds of one recipe) minus C and D (seeds of another) in accept length, prompt "
        "by prompt, at each depth both sides are scored at, over every prompt and set by set (interval over prompts "
        "x seeds)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="answer length (tokens)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="target and drafts")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--cache", default=str(ARTIFACTS / "eval"), help="folder of cached evaluation sets")
    parser.add_argument("--output", help="write the table and the per-prompt rows to this JSON file")
    return parser


@command("eagle3lab acceptance")
def main(argv=None) -> int:
    from eagle3lab.benchmark.eval_set import build_eval_set, summary
    from eagle3lab.benchmark.systems import check_draft_folders
    from eagle3lab.devices import resolve_device
    from eagle3lab.io import write_json
    from eagle3lab.models.target import load_target

    args = _parser().parse_args(argv)
    sets = sets_option(args.sets)
    depths = int_list(args.depths, "--depths") if args.depths else None
    limits = sets_option(args.subset) if args.subset else None
    folders = dict(map(named, args.drafts))
    compared = compare_option(args.compare, list(folders)) if args.compare else None
    check_draft_folders(list(folders.values()), "DRAFT")  # before the target loads
    dtype = getattr(torch, args.dtype)
    target = load_target(args.target, dtype=dtype, device=resolve_device(args.device))
    drafts = load_drafts(folders, target, dtype)
    compared_at = common_depths(drafts, [*compared[0], *compared[1]], depths) if compared else []
    if compared and not compared_at:
        raise InputError(f"--compare {args.compare}: the two sides are scored at no common depth: give --depths")
    records = build_eval_set(target, args.cache, sets, args.max_new_tokens)
    if limits:
        records = subset(records, limits)
    rows = score(drafts, target, records, depths)
    cut = len({r.prompt for r in rows if r.answer_cut})
    result = {"eval_set": summary(records), "answers_cut": cut, "table": table(rows), "per_prompt": per_prompt(rows)}
    print(f"{len(records)} prompts; {cut} answers cut where the target's single forward disagreed with the batch")
    for row in result["table"]:
        positions = ", ".join(f"{p:.3f}" for p in row["position_acceptance"])
        print(
            f"{row['system']:<28} depth {row['depth']}  {row['set']:<10} prompts {row['prompts']:>4}  "
            f"accept length {row['accept_length']:.3f}  per position {positions}"
        )
    if compared:
        mine, theirs = compared
        paired = versus(result["per_prompt"], mine, theirs, compared_at)
        result["comparison"] = {"drafts": mine, "partners": theirs, "rows": paired}
        for row in paired:
            print(
                f"{','.join(mine)} minus {','.join(theirs)}, depth {row['depth']}, {row['set']}: "
                f"{row['difference']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}] over {row['prompts']} prompts x "
                f"seeds {row['seeds']}: {row['verdict']}"
            )
    if args.output:
        write_json(args.output, result)
    return 0
