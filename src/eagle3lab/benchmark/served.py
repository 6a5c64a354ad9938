"""`eagle3lab bench --engine vllm|llamacpp`: the benchmark's table from a real serving engine.

One server per draft and draft shape (both are fixed at launch), the target alone first. Prompts go one at a time
as the very token ids the local engine gets, greedy. Per request: tok/s, and the engine's own speculation counters
read before and after it (accept length, per-position acceptance). Per prompt: identical output against the engine's
own baseline, token for token. Speedups against that baseline and, where they run here (`--peers`), against HF
generate and the local engine's baseline, measured in the same command.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import replace
from pathlib import Path

from eagle3lab.benchmark.engine_choice import make_engine
from eagle3lab.benchmark.prompts import Prompt, load_prompts
from eagle3lab.benchmark.systems import DEFAULT_DRAFT, config_label, parse_system_config
from eagle3lab.benchmark.table import CONFIG, KEY, Column
from eagle3lab.decoding.config import BASELINE, SpecConfig
from eagle3lab.engines.base import Engine
from eagle3lab.io import InputError
from eagle3lab.models.target import resolve
from eagle3lab.serving.client import ServerClient
from eagle3lab.serving.processes import free_port

SERVED_COLUMNS = (
    *KEY,
    Column("engine", "engine", 6, left=True),
    CONFIG,
    Column("accept", "accept_length", 6, ".2f"),
    Column("tok/s", "tokens_per_s", 7, ".1f"),
    Column("x base", "speedup_vs_baseline", 6, ".2f"),
    Column("x HF", "speedup_vs_hf_generate", 6, ".2f"),
    Column("x local", "speedup_vs_local", 7, ".2f"),
    Column("ident", "identical_rate", 5, ".2f"),
)


THRESHOLDS = {"llamacpp"}  # engines that stop a chain early below a draft probability (llama.cpp's p-min)


def chain_shape(config: str, engine: str) -> tuple[int, float]:
    """The draft length k and threshold of a chain config (1,k,1,k+1[@p]), the only shape the served engines
    draft; k 0 for the baseline. The threshold is llama.cpp's --spec-draft-p-min."""
    shape, threshold = parse_system_config(config)
    if (
        (threshold and engine not in THRESHOLDS)
        or shape.batch_size != 1
        or (not shape.is_baseline and (shape.topk != 1 or shape.num_draft_tokens != shape.steps + 1))
    ):
        extra = "[@p-min]" if engine in THRESHOLDS else ", without an adaptive threshold"
        raise InputError(
            f"config {config}: {engine} drafts chains one request at a time: use 1,k,1,k+1{extra} (k draft tokens)"
        )
    return shape.steps, threshold


def measure_server(engine: Engine, client: ServerClient, prompts: list[Prompt], max_new_tokens: int, repeats: int):
    """Every prompt through a running server, `repeats` times: per prompt the median-time repeat's completion and
    the engine's counters around it (None where the server does not speculate)."""
    engine.complete(client, prompts[0].ids, 8)  # the first request pays one-off warm-up
    records = []
    for prompt in prompts:
        runs = []
        for _ in range(repeats):
            before = engine.counters(client)
            done = engine.complete(client, prompt.ids, max_new_tokens)
            after = engine.counters(client)
            runs.append((done, after - before if after and before else None))
        runs.sort(key=lambda run: run[0].seconds)
        done, counters = runs[(len(runs) - 1) // 2]
        if done.token_ids is None:
            raise InputError(f"{client.url}: the completion carries no token_ids; identical output needs them")
        records.append({"prompt": prompt, "done": done, "counters": counters})
    return records


def _row(set_name: str, system: str, config: str, draft, engine: str, records: list[dict], base: dict | None) -> dict:
    tokens = sum(r["done"].completion_tokens for r in records)
    seconds = sum(r["done"].seconds for r in records)
    counters = [r["counters"] for r in records if r["counters"] is not None]
    total = sum(counters[1:], counters[0]) if counters and draft else None
    identical = [r["done"].token_ids == base[r["prompt"].id] for r in records] if base else []
    return {
        "set": set_name,
        "system": system,
        "config": config,
        "draft": draft,
        "engine": engine,
        "prompts": len(records),
        "completion_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "accept_length": total.accept_length if total else None,
        "position_acceptance": total.position_acceptance if total else [],
        "drafts": total.drafts if total else None,
        "accepted": total.accepted if total else None,
        "identical_rate": sum(identical) / len(identical) if identical else None,
        "speedup_vs_baseline": None,
        "speedup_vs_hf_generate": None,
        "speedup_vs_local": None,
    }


def _local_rows(settings, prompts: list[Prompt]) -> list[dict]:
    """The local engine's baseline and the HF peers on the same prompts (`bench` without drafts)."""
    from eagle3lab.benchmark.run import run_benchmark

    local = replace(settings, engine="local", configs=[BASELINE.label], drafts=None, output=None)
    rows = run_benchmark(settings=local, progress=False)["rows"]
    return [r | {"engine": "local"} for r in rows if {p.set for p in prompts} >= {r["set"]}]


def _speedups(rows: list[dict], local: list[dict]) -> None:
    """Against the engine's baseline, HF generate and the local engine's baseline of the same set (in place)."""
    by = {(r["set"], r["system"]): r["tokens_per_s"] for r in local}
    base = {r["set"]: r["tokens_per_s"] for r in rows if r["draft"] is None}
    for r in rows:
        for key, reference in (
            ("speedup_vs_baseline", base.get(r["set"])),
            ("speedup_vs_hf_generate", by.get((r["set"], "hf-generate"))),
            ("speedup_vs_local", by.get((r["set"], "baseline"))),
        ):
            r[key] = r["tokens_per_s"] / reference if reference else None


def run_served_benchmark(settings, log_dir: Path | None = None, engine: Engine | None = None) -> dict:
    """The benchmark in `settings.engine` (BenchSettings), or in `engine` as given (one configured otherwise, as
    stage 06's wrong llama.cpp type): {"meta", "rows", "per_prompt"} like `run_benchmark`, rows carrying an `engine`
    column; the local baseline and HF peers come along when `settings.peers` names them."""
    from transformers import AutoTokenizer

    if any(m != "eagle3" for m in settings.modes):
        raise InputError(f"--modes: {settings.engine} serves EAGLE-3 drafts as eagle3 only")
    engine = engine or make_engine(settings)
    shapes = sorted({chain_shape(c, engine.name) for c in settings.configs} - {(0, 0.0)})
    target = engine.model(settings.target)
    prompts = load_prompts(
        AutoTokenizer.from_pretrained(resolve(settings.target)), settings.sets, settings.prompts_file, settings.limit
    )
    drafts = list(settings.drafts) if settings.drafts else [str(DEFAULT_DRAFT)]
    systems = [("baseline", None, (0, 0.0))] + [(Path(d).name, d, shape) for d in drafts for shape in shapes]
    log_dir = log_dir or Path(f"/tmp/eagle3lab-{engine.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    rows, per_prompt, servers, base = [], [], [], None
    for system, draft, (k, threshold) in systems:
        config = config_label(SpecConfig(1, k, 1 if k else 0, k + 1 if k else 0), threshold)
        command = engine.launch_command(target, port=free_port(), draft=draft, k=k, threshold=threshold)
        print(f"starting: {shlex.join(command)}", flush=True)
        log = log_dir / f"{system}-{config.replace(',', '_').replace('@', '_p')}.log"
        with engine.serve(command, log_path=log) as server, ServerClient(server.url, timeout=600.0) as client:
            records = measure_server(engine, client, prompts, settings.max_new_tokens, settings.repeats)
        servers.append({"system": system, "config": config, "command": command, "startup_s": server.started_s})
        base = base or {r["prompt"].id: r["done"].token_ids for r in records}
        for set_name in dict.fromkeys(p.set for p in prompts):
            mine = [r for r in records if r["prompt"].set == set_name]
            rows.append(_row(set_name, system, config, draft, engine.name, mine, base))
        per_prompt += [_per_prompt(r, system, config, engine.name) for r in records]
    local = _local_rows(settings, prompts) if settings.peers else []
    _speedups(rows, local)
    meta = {
        "engine": engine.name,
        "engine_settings": {k: v for k, v in vars(engine).items() if k != "name"},
        "target": str(target),
        "max_new_tokens": settings.max_new_tokens,
        "repeats": settings.repeats,
        "sets": list(dict.fromkeys(p.set for p in prompts)),
        "prompts": len(prompts),
        "servers": servers,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return {"meta": meta, "rows": local + rows, "per_prompt": per_prompt}


def _per_prompt(record: dict, system: str, config: str, engine: str) -> dict:
    done, counters = record["done"], record["counters"]
    return {
        "set": record["prompt"].set,
        "id": record["prompt"].id,
        "system": system,
        "config": config,
        "engine": engine,
        "completion_tokens": done.completion_tokens,
        "seconds": done.seconds,
        "tokens_per_s": done.completion_tokens / done.seconds if done.seconds > 0 else 0.0,
        "accept_length": counters.accept_length if counters else None,
        "per_position": list(counters.per_position) if counters else [],
        "drafts": counters.drafts if counters else None,
        "accepted": counters.accepted if counters else None,
        "tokens": done.token_ids,
    }
