"""`eagle3lab acceptance`: exact offline accept length of drafts of any kind on the evaluation set, no decoding.

The walk (decoding.offline) scores a draft along the target's own greedy answers; one target forward per prompt
serves every draft of a kind at every depth, and the figure equals the local engine's online accept length prompt by
prompt (tests/test_acceptance.py for EAGLE-3's chains, tests/test_dflash.py for DFlash's blocks), with no timing noise
and no bf16 text drift between drafts. Here `evaluate` scores EAGLE-3's chains; each kind scores its own drafts
through its tools (drafters.base.DrafterTools.offline_acceptance), all into PromptAcceptance rows.

Accept length here is the engine's: (answer tokens - 1) / rounds (the prefill's token is not a round's)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle3lab.decoding.offline import draft_hits, walk
from eagle3lab.io import InputError, command


@dataclass
class PromptAcceptance:
    """One draft on one prompt at one depth: the unit every interval resamples."""

    draft: str
    set: str
    prompt: str
    depth: int
    tokens: int  # answer tokens after the prefill's first: what the rounds emitted
    accepted: list[int] = field(repr=False)  # per round
    answer_cut: bool = False  # the cached answer was cut where the target's own argmax disagreed (eval_set)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def accept_length(self) -> float:
        return self.tokens / self.rounds if self.rounds else 1.0


def evaluate(drafts: dict, target, records, depths: list[int], progress: bool = True) -> list[PromptAcceptance]:
    """PromptAcceptance of every draft (name -> Eagle3Draft) at every depth on every record. One target forward per
    record serves every draft that reads the same target layers."""
    from tqdm import tqdm

    from eagle3lab.benchmark.eval_set import teacher_forced
    from eagle3lab.models.target import aux_hidden_indices

    by_layers: dict[tuple, dict] = {}
    for name, draft in drafts.items():
        layers = tuple(aux_hidden_indices(target.num_layers, draft.config.aux_layer_ids))
        by_layers.setdefault(layers, {})[name] = draft
    deepest = max(depths)
    out = []
    for group in by_layers.values():
        forced = teacher_forced(target, records, next(iter(group.values())).config.aux_layer_ids)
        for tf in tqdm(forced, total=len(records), disable=not progress, desc="acceptance"):
            prompt_tokens, tokens = len(tf.record.prompt_ids), max(tf.answer_tokens - 1, 0)
            for name, draft in group.items():
                hits = draft_hits(draft, tf.aux, tf.ids, deepest, first=prompt_tokens - 1)
                for depth in depths:
                    accepted = walk(hits, prompt_tokens, tf.answer_tokens, depth)
                    out.append(PromptAcceptance(name, tf.record.set, tf.record.id, depth, tokens, accepted, tf.cut))
    return out


def pooled(rows: list[PromptAcceptance]) -> dict:
    """Accept length (emitted tokens over rounds, pooled over prompts) and the share of rounds that accepted at
    least d draft tokens, d = 1..depth."""
    rounds = sum(r.rounds for r in rows)
    depth = max((r.depth for r in rows), default=0)
    return {
        "prompts": len(rows),
        "rounds": rounds,
        "accept_length": round(sum(r.tokens for r in rows) / rounds, 4) if rounds else 1.0,
        "position_acceptance": [
            round(sum(a >= d for r in rows for a in r.accepted) / rounds, 4) if rounds else 0.0
            for d in range(1, depth + 1)
        ],
    }


def table(rows: list[PromptAcceptance]) -> list[dict]:
    """One pooled row per draft, depth and set, plus the sets together ("all")."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r.draft, r.depth, r.set), []).append(r)
        groups.setdefault((r.draft, r.depth, "all"), []).append(r)
    return [{"system": d, "depth": k, "set": s, **pooled(g)} for (d, k, s), g in groups.items()]


def per_prompt(rows: list[PromptAcceptance]) -> list[dict]:
    """The rows as plain dicts (tokens and rounds per prompt: what intervals resample)."""
    return [
        {
            "system": r.draft,
            "set": r.set,
            "id": r.prompt,
            "depth": r.depth,
            "accept_length": round(r.accept_length, 6),
            "tokens": r.tokens,
            "rounds": r.rounds,
        }
        for r in rows
    ]


def sets_option(text: str) -> dict[str, int | None]:
    """--sets "mtbench:all,gsm8k:120" as {set: records or None (every record)}."""
    sets = {}
    for part in text.split(","):
        name, _, n = part.partition(":")
        sets[name.strip()] = None if n in ("", "all") else int_list(n, f"--sets {name}")[0]
    return sets


def int_list(text: str, flag: str) -> list[int]:
    """A comma-separated list of positive integers given by `flag`, or an InputError naming it."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected positive integers, comma-separated") from None
    if any(v < 1 for v in values):
        raise InputError(f"{flag} {text!r}: expected positive integers, comma-separated")
    return values


def named(spec: str) -> tuple[str, str]:
    """A draft argument, NAME=FOLDER or FOLDER, as (name, folder): the folder's own name when none is given."""
    name, _, folder = spec.rpartition("=")
    return name or Path(folder).name, folder


def subset(records: list, limits: dict) -> list:
    """The records of the sets in `limits` ({set: N or None for all}), the first N of each, in their order."""
    unknown = set(limits) - {r.set for r in records}
    if unknown:
        raise InputError(f"--subset: the evaluation set has no records of {sorted(unknown)}")
    seen: dict[str, int] = {}
    out = []
    for r in records:
        if r.set in limits and (limits[r.set] is None or seen.get(r.set, 0) < limits[r.set]):
            seen[r.set] = seen.get(r.set, 0) + 1
            out.append(r)
    return out


def load_drafts(folders: dict, target, dtype: torch.dtype) -> dict[str, tuple]:
    """Draft folders of any kind (name -> folder), each loaded by its kind's tools beside the target: name -> (tools,
    draft)."""
    from eagle3lab.drafters.trained import tools_of

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


def versus(per_prompt: list[dict], drafts: list[str], partners: list[str], depths: list[int], boot: int = 2000) -> list:
    """`drafts` (seeds of one recipe) minus `partners` (seeds of another) in accept length, prompt by prompt, at each
    of `depths`: over every prompt, then set by set, each with its interval over prompts and seeds and its verdict."""
    import pandas as pd

    from eagle3lab.benchmark.comparisons import by_set, paired_difference

    frame = pd.DataFrame(per_prompt)
    return [
        {"depth": depth, "set": name} | paired_difference(group, drafts, partners, boot=boot, seed=0)
        for depth in depths
        for name, group in by_set(frame[frame.depth == depth])  # paired_difference pairs by (set, id): one depth
    ]


@command("eagle3lab acceptance")
def main(argv=None) -> int:
    from eagle3lab.benchmark.eval_set import DEFAULT_SETS, build_eval_set, summary
    from eagle3lab.benchmark.systems import check_draft_folders
    from eagle3lab.cli import COMMANDS
    from eagle3lab.devices import resolve_device
    from eagle3lab.io import write_json
    from eagle3lab.models.target import DEFAULT_TARGET, load_target
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
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    raise SystemExit(main())
