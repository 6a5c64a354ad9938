"""`eagle3lab acceptance`: exact offline accept length of chain drafts on the evaluation set, no decoding.

The walk (decoding.offline) scores a draft along the target's own greedy answers; one target forward per prompt
serves every draft at every depth, and the figure equals the local engine's online accept length prompt by prompt
(tests/test_acceptance.py, SmolLM2 in float32), with no timing noise and no bf16 text drift between drafts.

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


@command("eagle3lab acceptance")
def main(argv=None) -> int:
    from eagle3lab.benchmark.eval_set import DEFAULT_SETS, build_eval_set, summary
    from eagle3lab.benchmark.systems import check_draft_folders, load_bench_draft
    from eagle3lab.cli import COMMANDS
    from eagle3lab.devices import resolve_device
    from eagle3lab.io import write_json
    from eagle3lab.models.target import DEFAULT_TARGET, load_target
    from eagle3lab.paths import ARTIFACTS

    parser = argparse.ArgumentParser(
        prog="eagle3lab acceptance",
        description=COMMANDS["acceptance"][2]
        + " Each draft runs teacher-forced along the target's greedy answers to the evaluation sets (cached in "
        "--cache) and each round counts its draft tokens up to the first miss, as the engine's greedy verification "
        "does: no decoding, no timing, one target forward a prompt for every draft and depth.",
    )
    parser.add_argument("drafts", nargs="+", metavar="DRAFT", help="draft folders (name=folder to label one)")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="target spec, model folder or HF id")
    parser.add_argument("--depths", default="3,5", help="comma-separated chain depths (steps), e.g. 3,5")
    parser.add_argument(
        "--sets", default=",".join(f"{k}:{v or 'all'}" for k, v in DEFAULT_SETS.items()), help="SET:N|all,..."
    )
    parser.add_argument("--max-new-tokens", type=int, default=128, help="answer length (tokens)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="target and drafts")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--cache", default=str(ARTIFACTS / "eval"), help="folder of cached evaluation sets")
    parser.add_argument("--output", help="write the table and the per-prompt rows to this JSON file")
    args = parser.parse_args(argv)
    sets = sets_option(args.sets)
    depths = int_list(args.depths, "--depths")
    check_draft_folders([folder for _, folder in map(named, args.drafts)], "DRAFT")  # before the target loads
    dtype = getattr(torch, args.dtype)
    target = load_target(args.target, dtype=dtype, device=resolve_device(args.device))
    drafts = {name: load_bench_draft(folder, target, dtype, "DRAFT") for name, folder in map(named, args.drafts)}
    records = build_eval_set(target, args.cache, sets, args.max_new_tokens)
    rows = evaluate(drafts, target, records, depths)
    cut = len({r.prompt for r in rows if r.answer_cut})
    result = {"eval_set": summary(records), "answers_cut": cut, "table": table(rows), "per_prompt": per_prompt(rows)}
    print(f"{len(records)} prompts; {cut} answers cut where the target's single forward disagreed with the batch")
    for row in result["table"]:
        positions = ", ".join(f"{p:.3f}" for p in row["position_acceptance"])
        print(
            f"{row['system']:<28} depth {row['depth']}  {row['set']:<10} prompts {row['prompts']:>4}  "
            f"accept length {row['accept_length']:.3f}  per position {positions}"
        )
    if args.output:
        write_json(args.output, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
