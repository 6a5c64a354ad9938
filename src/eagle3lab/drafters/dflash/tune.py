"""`tune` for a DFlash draft: the number of drafted tokens k to serve it at in one engine, or "do not speculate".

A served DFlash draft at k < block_size - 1 drafts a truncated block, the anchor and k masks, in one forward (vLLM:
`num_speculative_tokens` query slots; llama.cpp: `--spec-draft-n-max` masks; docs/dflash.md, "The serving shape").
Its slots see each other, so the block at k is not the whole block's first k slots. The k = 1..min(--max-steps,
block_size - 1) are the shapes:

1. **acceptance**: the truncated block's exact offline accept length at every k (`dflash.acceptance`), on the
   evaluation set's records of the tune's sets (the target's own cached answers in `--eval-cache`;
   `benchmark.eval_set`), or read from `eagle3lab acceptance DRAFT --depths 1,2,3 --output FILE` (`--offline FILE`);
2. **costs**: the engine's baseline and the draft at every k on the tune prompts (`serve.served`, `serve.local`); the
   calibration half gives the plain step t_step and the round t_round(k) (`benchmark.tune_engine`);
3. **prediction** tau_offline(k) * t_step / t_round(k); the held-out half times every k against the engine's own
   baseline, which confirms it or not. The decision is the measured best when it beats the baseline.

    eagle3lab tune --draft DFLASH_DRAFT --engine local|vllm|llamacpp [--sets mtbench --limit 8 ...] [--offline FILE]
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from eagle3lab.benchmark.tune import TuneSettings
from eagle3lab.benchmark.tune_engine import bench_settings, tune_from_benchmark
from eagle3lab.drafters.dflash import serve
from eagle3lab.drafters.dflash.config import drafted_by
from eagle3lab.io import InputError, require
from eagle3lab.options import option
from eagle3lab.paths import ARTIFACTS


@dataclass
class DFlashTuneSettings(TuneSettings):
    """`eagle3lab tune`'s options for a DFlash draft: TuneSettings and where its offline part comes from."""

    offline: str | None = option(
        None,
        "the accept length at each k read from `eagle3lab acceptance DRAFT --depths 1,...,k --output FILE` "
        "instead of scored here",
    )
    eval_cache: str = option(str(ARTIFACTS / "eval"), "folder of cached evaluation sets the offline part is scored on")


def offline_acceptance(draft, target_spec: str, ks: list[int], sets: list[str] | None, cache: str) -> dict:
    """{k: pooled accept length and per-position acceptance} of the truncated block at each k, on the evaluation
    set's records (built once into `cache`, the reference sets) of `sets` (None: every record)."""
    from eagle3lab.benchmark.acceptance import pooled
    from eagle3lab.benchmark.eval_set import DEFAULT_SETS, build_eval_set
    from eagle3lab.drafters.dflash.acceptance import evaluate
    from eagle3lab.drafters.dflash.model import load_dflash
    from eagle3lab.models.target import load_target

    target = load_target(target_spec, dtype=torch.float32)
    records = [r for r in build_eval_set(target, cache, DEFAULT_SETS) if sets is None or r.set in sets]
    if not records:
        raise InputError(f"offline acceptance: the evaluation set in {cache} has no record of the sets {sets}")
    rows = evaluate({"draft": load_dflash(draft, torch.float32)}, target, records, progress=False, ks=ks)
    return {k: pooled([r for r in rows if r.depth == k]) for k in ks}


def read_offline(path, ks: list[int], set_name: str = "all") -> dict:
    """{k: pooled row} for `ks` from `eagle3lab acceptance DRAFT --depths ... --output PATH` (its table's rows of
    `set_name`, one draft), so the offline part can run apart from the timed one."""
    try:
        table = json.loads(Path(path).read_text()).get("table")
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(f"{path}: not an acceptance result ({e})") from None
    if not isinstance(table, list):
        raise InputError(f"{path}: no `table` list: write it with eagle3lab acceptance DRAFT --depths ... --output")
    found, systems = {}, set()
    for i, row in enumerate(table):
        where = f"{path}: table record {i + 1}"
        if require(row, "set", where, str) == set_name:
            systems.add(require(row, "system", where, str))
            found[require(row, "depth", where, int)] = row | {
                "accept_length": require(row, "accept_length", where, (int, float))
            }
    if len(systems) > 1:
        raise InputError(f"{path}: rows of {sorted(systems)}: score the tuned draft alone")
    missing = [k for k in ks if k not in found]
    if missing:
        raise InputError(
            f"{path}: no {set_name!r} accept length at k = {missing} (acceptance --depths {','.join(map(str, ks))})"
        )
    return {k: found[k] for k in ks}


def shapes(settings: TuneSettings) -> list[int]:
    """The k to try: 1 up to the whole block, or --max-steps if fewer."""
    if settings.max_steps < 1:
        raise InputError(f"--max-steps {settings.max_steps}: the engine needs a draft length of at least 1")
    return list(range(1, min(settings.max_steps, drafted_by(settings.draft)) + 1))


def tune_dflash(settings: DFlashTuneSettings) -> dict:
    """The whole run in `settings.engine`: offline acceptance at every k (or read from `settings.offline`, scored on
    the tune's one set), the engine's baseline and every k timed, then `benchmark.tune_engine`'s decision with the
    offline acceptance in its predictions."""
    from eagle3lab.benchmark.run import split_list

    ks = shapes(settings)
    sets = None if settings.prompts else split_list(settings.sets)
    if settings.offline:
        offline = read_offline(settings.offline, ks, sets[0] if sets and len(sets) == 1 else "all")
    else:
        offline = offline_acceptance(settings.draft, settings.target, ks, sets, settings.eval_cache)
    run = bench_settings(settings, [])
    bench = (serve.local if settings.engine == "local" else serve.served)(run, settings.draft, ks)
    engine = None if settings.engine == "local" else serve.dflash_engine(run)
    tau = {k: profile["accept_length"] for k, profile in offline.items()}
    result = tune_from_benchmark(bench, settings, settings.draft, offline=tau, engine=engine)
    return result | {"offline": {str(k): v for k, v in offline.items()}, "settings": asdict(settings)}
