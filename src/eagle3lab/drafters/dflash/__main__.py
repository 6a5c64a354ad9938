"""`python -m eagle3lab.drafters.dflash acceptance|generate|bench|tune`: the block drafter's commands that the one CLI
does not run yet (docs/dflash.md); `eagle3lab train --drafter dflash`, `eagle3lab export`, `eagle3lab tune` and
`eagle3lab doctor` take a DFlash draft as they take an EAGLE-3 one.

- acceptance: exact offline accept length on the evaluation set, beside EAGLE-3 drafts if named with --eagle3;
- generate: greedy block decoding in the local engine, checked token for token against plain greedy decoding;
- bench: timed in one engine (local, vllm, llamacpp) against its own baseline, outputs compared;
- tune: the k to serve it at in one engine, from its exact offline acceptance and the engine's costs, confirmed by a
  timed run against the engine's baseline (`eagle3lab tune` options; `eagle3lab tune --draft DFLASH` runs it too).
Exit codes: 0 done, 1 a check failed (generate's output differs) or a server died, 2 bad input."""

from __future__ import annotations

import argparse
import json
import sys

import torch

from eagle3lab.io import InputError, command
from eagle3lab.options import add_options, from_options


def versus(per_prompt: list[dict], dflash: list[str], eagle3: list[str], boot: int = 2000) -> list[dict]:
    """The DFlash drafts (seeds of one recipe) minus the EAGLE-3 drafts (seeds of another), prompt by prompt: over
    every prompt, then set by set, each with its interval over prompts and seeds and its verdict."""
    import pandas as pd

    from eagle3lab.benchmark.comparisons import by_set, paired_difference

    frame = pd.DataFrame(per_prompt)
    return [
        {"set": name} | paired_difference(group, dflash, eagle3, boot=boot, seed=0) for name, group in by_set(frame)
    ]


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


def _acceptance_parser() -> argparse.ArgumentParser:
    from eagle3lab.benchmark.eval_set import DEFAULT_SETS
    from eagle3lab.models.target import DEFAULT_TARGET
    from eagle3lab.paths import ARTIFACTS

    parser = argparse.ArgumentParser(prog="python -m eagle3lab.drafters.dflash acceptance")
    parser.add_argument("drafts", nargs="+", help="DFlash draft folders (name=folder to label one)")
    parser.add_argument(
        "--eagle3",
        nargs="*",
        default=[],
        help="EAGLE-3 drafts to score beside them (chain depth); the DFlash drafts, as seeds of one recipe, are then "
        "compared with these, as seeds of another, prompt by prompt (interval over prompts x seeds)",
    )
    parser.add_argument("--depth", type=int, default=3, help="the EAGLE-3 drafts' chain depth")
    parser.add_argument(
        "--ks",
        help="score each DFlash draft at these drafted tokens, comma-separated, each a truncated block as the "
        "engines serve k < block_size - 1 (what `tune --offline` reads); default: the whole block",
    )
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--sets", default=",".join(f"{k}:{v or 'all'}" for k, v in DEFAULT_SETS.items()))
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--cache", default=str(ARTIFACTS / "eval"), help="folder of cached evaluation sets")
    parser.add_argument(
        "--subset",
        help="score only these sets' first N records of the evaluation set, SET:N|all,... (a quicker "
        "profile; the set is still built and cached whole, as --sets says)",
    )
    parser.add_argument("--output", help="write the table and the per-prompt rows to this JSON file")
    return parser


def _acceptance(argv) -> int:
    from eagle3lab.benchmark import acceptance as chain
    from eagle3lab.benchmark.eval_set import build_eval_set, parse_sets, summary
    from eagle3lab.benchmark.systems import load_bench_draft
    from eagle3lab.drafters.dflash import acceptance
    from eagle3lab.drafters.dflash.model import load_dflash
    from eagle3lab.io import write_json
    from eagle3lab.models.target import load_target

    args = _acceptance_parser().parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")] if args.ks else None
    if ks and args.eagle3:
        raise InputError("--ks scores a draft's serving shapes; compare it with --eagle3 at its whole block")
    sets = parse_sets(chain.sets_option(args.sets))
    target = load_target(args.target, dtype=torch.float32)
    records = build_eval_set(target, args.cache, sets, args.max_new_tokens)
    if args.subset:
        records = subset(records, chain.sets_option(args.subset))

    blocks = {name: load_dflash(folder, torch.float32) for name, folder in map(chain.named, args.drafts)}
    rows = acceptance.evaluate(blocks, target, records, ks=ks)
    if args.eagle3:
        chains = {
            name: load_bench_draft(folder, target, torch.float32) for name, folder in map(chain.named, args.eagle3)
        }
        rows += chain.evaluate(chains, target, records, [args.depth])
    table, per_prompt = chain.table(rows), chain.per_prompt(rows)
    for row in table:
        if row["set"] == "all":
            print(f"{row['system']:<40} depth {row['depth']}  accept length {row['accept_length']:.3f}")
    paired = versus(per_prompt, list(blocks), list(chains)) if args.eagle3 else []
    for row in paired:
        print(f"DFlash minus EAGLE-3, {row['set']}: {row['difference']:+.3f} [{row['low']:+.3f}, {row['high']:+.3f}] "
              f"over {row['prompts']} prompts x seeds {row['seeds']}: {row['verdict']}")  # fmt: skip
    if args.output:
        write_json(
            args.output,
            {"eval_set": summary(records), "table": table, "dflash_minus_eagle3": paired, "per_prompt": per_prompt},
        )
    return 0


def _generate(argv) -> int:
    from eagle3lab.benchmark.prompts import encode_chat
    from eagle3lab.decoding.engine import generate
    from eagle3lab.drafters.dflash.engine import DFlashEngine
    from eagle3lab.drafters.dflash.model import load_dflash
    from eagle3lab.models.target import DEFAULT_TARGET, load_target

    parser = argparse.ArgumentParser(prog="python -m eagle3lab.drafters.dflash generate")
    parser.add_argument("draft", help="DFlash draft folder")
    parser.add_argument("prompt", help="a user message")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    target = load_target(args.target, dtype=torch.float32)
    prompt = encode_chat(target.tokenizer, [{"role": "user", "content": args.prompt}])
    eos = [target.tokenizer.eos_token_id]
    block = DFlashEngine(target.model, load_dflash(args.draft, torch.float32), eos_token_ids=eos)
    out = block.generate(prompt, args.max_new_tokens)
    plain = generate(target.model, prompt, args.max_new_tokens, eos_token_ids=eos)
    print(json.dumps({**out.summary(), "identical_to_greedy": out.tokens == plain.tokens}, indent=1))
    print(target.tokenizer.decode(out.tokens))
    return 0 if out.tokens == plain.tokens else 1


def _bench(argv) -> int:
    from eagle3lab.benchmark.run import BenchSettings
    from eagle3lab.drafters.dflash import serve
    from eagle3lab.io import write_json

    parser = argparse.ArgumentParser(prog="python -m eagle3lab.drafters.dflash bench")
    parser.add_argument("draft", help="DFlash draft folder")
    add_options(parser, BenchSettings)
    args = parser.parse_args(argv)
    settings = from_options(args, BenchSettings)
    result = (serve.local if settings.engine == "local" else serve.served)(settings, args.draft)
    for row in result["rows"]:
        if row.get("set", "all") != "all" and settings.engine != "local":
            continue
        keys = ("engine", "set", "system", "config", "tokens_per_s", "accept_length", "identical_rate")
        print({k: row.get(k) for k in (*keys, "speedup_vs_baseline")})
    if settings.output:
        write_json(settings.output, result)
    return 0


def _tune(argv) -> int:
    from eagle3lab.benchmark.tune import TuneSettings
    from eagle3lab.benchmark.tune_engine import format_engine_result
    from eagle3lab.drafters.dflash.tune import EVAL_CACHE, tune_dflash
    from eagle3lab.io import write_json

    parser = argparse.ArgumentParser(prog="python -m eagle3lab.drafters.dflash tune")
    add_options(parser, TuneSettings)
    parser.add_argument("--eval-cache", default=EVAL_CACHE, help="folder of cached evaluation sets (the offline part)")
    parser.add_argument("--offline", help="the offline part from `acceptance DRAFT --ks 1,...,k --output FILE`")
    args = parser.parse_args(argv)
    settings = from_options(args, TuneSettings)
    result = tune_dflash(settings, args.eval_cache, args.offline)
    print(format_engine_result(result))
    write_json(settings.output, result)
    print(f"wrote {settings.output}")
    return 0


COMMANDS = {
    "acceptance": _acceptance,
    "generate": _generate,
    "bench": _bench,
    "tune": _tune,
}


@command("python -m eagle3lab.drafters.dflash")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
