"""Where a speculative round's time goes in llama.cpp on this machine, and what acceptance would make it pay.

On the same prompts, each measurement on its own llama-server:
1. **plain step**: the target alone, seconds per generated token.
2. **verify**: the target's cost of evaluating k+1 tokens on top of a cached prompt (llama-server's own
   `timings.prompt_ms` for exactly those tokens), the verify part of a round at n-max k. (A verify also computes the
   head at every position, a prompt step only at the last: a lower bound.)
3. **rounds at perfect synthetic acceptance** (`--spec-synth-rates 1,...,1`: llama.cpp's benchmarking mode runs the
   real draft, then accepts every drafted token): seconds per round at n-max k with the round at its most useful.
   Round minus verify is the draft's k forwards, the hand-over of hidden states and the per-call overhead.

From those: a round pays when its accept length beats t_round / t_step, so break-even accept length(k) = t_round(k) /
t_step and 2x needs twice that; the measured tok/s at perfect acceptance (accept length k+1) says whether any draft,
however good, can pay at k.

An EAGLE-3 draft drafts its k tokens in k forwards; a DFlash draft folder (config.json `DFlashDraftModel`) is served
with `--spec-type draft-dflash` (`dflash.serve`) and drafts them in one forward of the anchor and k masks, so its
rest is one draft forward at any k (k up to block_size - 1: llama.cpp clamps a longer n-max to that).

    python -m eagle3lab.engines.llamacpp.round_split --draft drafts/smollm2-original-6960 [--max-steps 3]
    python -m eagle3lab.engines.llamacpp.round_split --draft DFLASH_DRAFT_FOLDER --max-steps 3
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from eagle3lab.benchmark.prompts import load_prompts
from eagle3lab.benchmark.served import measure_server
from eagle3lab.benchmark.table import Column, render_rows
from eagle3lab.drafters import drafter_of
from eagle3lab.drafters.tools import tools_of
from eagle3lab.engines.llamacpp.server import LlamaCpp, read_completion
from eagle3lab.io import InputError, write_json
from eagle3lab.models.target import DEFAULT_TARGET, resolve
from eagle3lab.serving.client import ServerClient
from eagle3lab.serving.processes import free_port


def _per_token(records: list[dict]) -> float:
    return sum(r["done"].seconds for r in records) / sum(r["done"].completion_tokens for r in records)


def _verify_s(client: ServerClient, prompts, n_tokens: int) -> float:
    """Median seconds llama-server spends evaluating `n_tokens` more tokens of each prompt on top of the rest cached."""
    times = []
    for prompt in prompts:
        head, tail = prompt.ids[:-n_tokens], prompt.ids
        for ids in (head, tail):  # the first caches the head; the second evaluates only the last n_tokens
            body = {"prompt": ids, "n_predict": 1, "temperature": 0.0, "cache_prompt": True, "return_tokens": True}
            timings = client.timed_post("/completion", body, read_completion).meta
        if timings["prompt_n"] != n_tokens:
            raise InputError(f"verify timing: llama-server evaluated {timings['prompt_n']} tokens, not {n_tokens}")
        times.append(timings["prompt_ms"] / 1e3)
    return statistics.median(times)


def _engine(draft: str, target: str, max_steps: int) -> LlamaCpp:
    """llama-server for the draft's kind (drafters.base.DrafterTools.llamacpp_engine), a folder or an EAGLE-3 GGUF."""
    kind = drafter_of(draft)
    most = kind.max_drafted(draft)
    if most is not None and max_steps > most:  # llama.cpp would clamp n-max and time a shorter round under k's label
        raise InputError(f"{draft}: a round of this draft drafts at most {most} tokens, not --max-steps {max_steps}")
    return tools_of(draft).llamacpp_engine(target)


def split_rounds(draft: str, target: str = DEFAULT_TARGET, *, max_steps: int = 3, prompts=None, tokens: int = 64):
    """The split for k = 1..max_steps: {"step_s", "rows": [{k, verify_s, round_s, rest_s, break_even, ...}]}."""
    from transformers import AutoTokenizer

    engine = _engine(draft, target, max_steps)
    gguf = engine.model(target)
    prompts = prompts or load_prompts(AutoTokenizer.from_pretrained(resolve(target)), ["mtbench"], None, 6)
    if any(len(p.ids) <= max_steps + 1 for p in prompts):
        raise InputError(f"round split: every prompt needs more than {max_steps + 1} tokens")
    with engine.serve(engine.launch_command(gguf, port=free_port())) as server, ServerClient(server.url) as client:
        step_s = _per_token(measure_server(engine, client, prompts, tokens, repeats=1))
        verify = {k: _verify_s(client, prompts, k + 1) for k in range(1, max_steps + 1)}
    rows = []
    for k in range(1, max_steps + 1):
        perfect = replace(engine, extra_args=("--spec-synth-rates", ",".join(["1"] * k)))
        command = perfect.launch_command(gguf, port=free_port(), draft=draft, k=k)
        with perfect.serve(command) as server, ServerClient(server.url) as client:
            records = measure_server(perfect, client, prompts, tokens, repeats=1)
        rounds = sum(r["counters"].drafts for r in records)
        round_s = sum(r["done"].seconds for r in records) / rounds
        rows.append(
            {
                "k": k,
                "verify_s": verify[k],
                "round_s": round_s,
                "rest_s": round_s - verify[k],  # the draft's forwards, the hand-over, per-call overhead
                "break_even": round_s / step_s,
                "tau_for_2x": 2 * round_s / step_s,
                "perfect_accept_length": 1 + sum(r["counters"].accepted for r in records) / rounds,
                "perfect_speedup": step_s / _per_token(records),
                "command": shlex.join(command),
            }
        )
    return {
        "engine": "llamacpp",
        "spec_type": engine.spec_type,
        "target": str(gguf),
        "draft": str(draft),
        "prompts": len(prompts),
        "step_s": step_s,
        "rows": rows,
    }


COLUMNS = (
    Column("k", "k", 2),
    Column("verify ms", "verify_ms", 9, ".1f"),
    Column("round ms", "round_ms", 8, ".1f"),
    Column("rest ms", "rest_ms", 7, ".1f"),
    Column("break-even", "break_even", 10, ".2f"),
    Column("2x needs", "tau_for_2x", 8, ".2f"),
    Column("at accept", "perfect_accept_length", 9, ".2f"),
    Column("x base", "perfect_speedup", 6, ".2f"),
)


def format_split(split: dict) -> str:
    rows = [r | {f"{n}_ms": r[f"{n}_s"] * 1e3 for n in ("verify", "round", "rest")} for r in split["rows"]]
    return (
        f"llama.cpp plain step {split['step_s'] * 1e3:.1f} ms/token ({split['prompts']} prompts); per round at "
        f"n-max k, perfect synthetic acceptance, {split['spec_type']}:\n" + render_rows(rows, COLUMNS, details=False)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3lab.engines.llamacpp.round_split", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--draft", required=True, help="EAGLE-3 draft folder or GGUF, or a DFlash draft folder")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--max-steps", type=int, default=3, help="deepest n-max k")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--output", help="write the JSON here")
    args = parser.parse_args(argv)
    try:
        split = split_rounds(args.draft, args.target, max_steps=args.max_steps, tokens=args.max_new_tokens)
    except InputError as e:
        print(f"round split: {e}", file=sys.stderr)
        return 2
    print(format_split(split))
    if args.output:
        write_json(Path(args.output), split)
    return 0


if __name__ == "__main__":
    sys.exit(main())
