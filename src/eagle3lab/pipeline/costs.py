"""`python -m eagle3lab.pipeline.costs NAME`: one cost cell of the grid, dvc.yaml's `costs` stage (one cell per entry
of params.yaml's `costs.cells`). It times one engine's plain step and its round of the sweep's chain
(`benchmark.sweep_config`, the depth at which every draft's accept length is measured) end to end: `costs.limit`
prompts of each of `costs.sets`, `costs.max_new_tokens` tokens each, `costs.repeats` times (the served engines on
fresh servers for each repeat). Each engine has two cells, two measurements in separate processes, so the forecast
shows whether its break-even holds from one to the other (issue 64).

How the engines run (dtype, vLLM's dtype and compile mode) is params.yaml's `benchmark` section, their one home. The
record, metrics/costs/NAME.json, keeps every timing (the forecast's bootstrap resamples them), tau* from all of them
and where the cell ran. A killed cell starts over: a measurement is one process's by design, and the record is
written whole at the end or not at all.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eagle3lab import paths
from eagle3lab.benchmark.engine_choice import ENGINES
from eagle3lab.benchmark.scaling import LEVEL, quantiles
from eagle3lab.benchmark.timed_costs import TimedCosts, local_timings, served_timings
from eagle3lab.decoding.config import SpecConfig
from eagle3lab.devices import resolve_dtype
from eagle3lab.io import InputError, command, require, write_json
from eagle3lab.pipeline import machine, repro_log
from eagle3lab.pipeline.stages import SHARED_SECTION, cell_arguments, check_params, load_params

SECTION = "costs"
RECORDS = "metrics/costs"  # metrics/costs/NAME.json, committed
LOGS = "artifacts/grid/costs"  # the served engines' server logs, per cell
CELL_FIELDS = {"engine"}
BOOT = 2000  # bootstrap draws of the record's own interval of break-even


@dataclass(frozen=True)
class CostSettings:
    cell: str
    engine: str
    target: str
    device: str
    draft: Path
    sets: list[str]
    limit: int
    max_new_tokens: int
    repeats: int
    chain: str  # the sweep's chain, 1,k,1,k+1
    dtype: str  # the engine's model dtype (vLLM: benchmark.vllm_dtype where set)
    eager: bool  # vLLM without its compile

    @property
    def record(self) -> Path:
        return paths.ROOT / RECORDS / f"{self.cell}.json"


def _count(section: dict, key: str, where: str) -> int:
    value = require(section, key, where, int)
    if isinstance(value, bool) or value < 1:
        raise InputError(f"{where}: field '{key}' must be a whole number of 1 or more, got {value!r}")
    return value


def cost_settings(params: dict, name: str, params_file: Path) -> CostSettings:
    """The cell NAME of params' `costs` section and what it reads from `common` and `benchmark`, checked: an
    InputError names the file, the section and the field."""
    where = f"{params_file}: section '{SECTION}'"
    section = params.get(SECTION)
    if not isinstance(section, dict) or not isinstance(section.get("cells"), dict):
        raise InputError(f"{where}: expected a mapping `cells` of NAME -> {{engine}} and the timing settings")
    if name not in section["cells"]:
        raise InputError(f"{where}: no cell '{name}' (cells: {', '.join(section['cells'])})")
    spec = section["cells"][name] or {}
    unknown = sorted(set(spec) - CELL_FIELDS)
    if unknown:
        raise InputError(f"{where}: cell '{name}': unknown field(s) {unknown}; a cell has {sorted(CELL_FIELDS)}")
    if spec.get("engine") not in ENGINES:
        raise InputError(
            f"{where}: cell '{name}': field 'engine' must be one of {list(ENGINES)}, got {spec.get('engine')!r}"
        )
    sets = require(section, "sets", where, list)
    if not sets or not all(isinstance(s, str) for s in sets):
        raise InputError(f"{where}: field 'sets' must be a list of evaluation set names")
    draft = paths.ROOT / require(section, "draft", where, str)
    if not (draft / "config.json").exists():
        raise InputError(f"{where}: field 'draft': {draft} holds no draft (no config.json)")
    bench_where = f"{params_file}: section 'benchmark'"
    bench, shared = params.get("benchmark") or {}, params.get(SHARED_SECTION) or {}
    chain = require(bench, "sweep_config", bench_where, str)
    shape = SpecConfig.parse(chain)
    if shape.topk != 1 or shape.num_draft_tokens != shape.steps + 1 or shape.is_baseline:
        raise InputError(f"{bench_where}: field 'sweep_config': the served engines draft chains 1,k,1,k+1; got {chain}")
    device = shared.get("device", "auto")
    dtype = resolve_dtype(require(bench, "dtype", bench_where, str), device)
    if spec["engine"] == "vllm":
        dtype = bench.get("vllm_dtype") or dtype
    return CostSettings(
        cell=name,
        engine=spec["engine"],
        target=require(shared, "target", f"{params_file}: section '{SHARED_SECTION}'", str),
        device=device,
        draft=draft,
        sets=sets,
        limit=_count(section, "limit", where),
        max_new_tokens=_count(section, "max_new_tokens", where),
        repeats=_count(section, "repeats", where),
        chain=chain,
        dtype=dtype,
        eager=not bench.get("vllm_compile", True),
    )


def timings(s: CostSettings) -> list[dict]:
    """Every (prompt, system, repeat) timing of the cell: the local engine repeats each prompt in one process,
    interleaving the systems; a served engine serves every repeat on fresh servers (a server's warm state is part of
    what varies)."""
    from eagle3lab.benchmark.run import BenchSettings, run_benchmark
    from eagle3lab.benchmark.served import run_served_benchmark

    bench = BenchSettings(
        target=s.target,
        sets=s.sets,
        limit=s.limit,
        max_new_tokens=s.max_new_tokens,
        configs=[s.chain],
        drafts=[str(s.draft)],
        peers=[],
        repeats=s.repeats if s.engine == "local" else 1,
        dtype=s.dtype,
        device=s.device,
        engine=s.engine,
        eager=s.eager,
    )
    if s.engine == "local":
        return local_timings(run_benchmark(settings=bench, progress=False), s.draft.name)
    logs = paths.ROOT / LOGS / s.cell
    return [
        row
        for repeat in range(s.repeats)
        for row in served_timings(run_served_benchmark(bench, log_dir=logs / f"repeat-{repeat}"), s.draft.name, repeat)
    ]


def run_cell(name: str, params_file: Path | None = None) -> dict:
    """Time one cell and write its record; returns the record."""
    params_file = Path(params_file or paths.PARAMS)
    params = load_params(params_file)
    check_params(params, params_file)
    s = cost_settings(params, name, params_file)
    started = time.monotonic()
    rows = timings(s)
    costs = TimedCosts.from_timings(s.engine, name, rows, f"cell {name}")  # checked before anything is written
    minutes = (time.monotonic() - started) / 60
    record = {
        "cell": name,
        "engine": s.engine,
        "chain": s.chain,
        "draft": str(s.draft.relative_to(paths.ROOT)),
        "dtype": s.dtype,
        "prompts": costs.prompts,
        "repeats": costs.repeats,
        "max_new_tokens": s.max_new_tokens,
        # from every timing, its interval over prompts and repeats; smoke_compare leaves out a dict holding an accept
        # length needed, as it is decided by speed
        "break_even": {
            "step_s": costs.step_s(),
            "round_s": costs.round_s(),
            "accept_length_needed": costs.break_even(),
            "interval": quantiles(costs.draws(np.random.default_rng(0), BOOT)),
            "level": LEVEL,
        },
        "minutes": round(minutes, 2),
        "ran": machine.where_ran(paths.ROOT),
        "timings": rows,
    }
    write_json(s.record, record)
    repro_log.stage(f"{SECTION}@{name}", minutes * 60)
    return record


@command("python -m eagle3lab.pipeline.costs")
def main(argv: list[str] | None = None) -> int:
    args = cell_arguments("costs", __doc__, argv, "a cell of params.yaml's costs.cells, e.g. local-first")
    record = run_cell(args.cell, args.params)
    said = record["break_even"]
    print(
        f"costs {args.cell} ({record['engine']}, {record['chain']}): step {said['step_s'] * 1e3:.1f} ms, round "
        f"{said['round_s'] * 1e3:.1f} ms, break-even accept length {said['accept_length_needed']:.3f} "
        f"[{said['interval'][0]:.3f}, {said['interval'][1]:.3f}] "
        f"({record['prompts']} prompts x {record['repeats']} repeats, {record['minutes']:.1f} min)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
