"""`eagle3lab regen bench`: regeneration throughput of every engine on one table (a command that prints figures,
never a test).

On the same seeded ShareGPT prompts: plain batch-1 `generate` and the local backend at batch 1 (--baseline-n), the
local backend with each engine (eagle3lab's BatchGenerator, transformers' paged continuous batching) at each
--batch-size, llama.cpp (the llamacpp backend: its own llama-server) for each --llamacpp-weights at each
--llamacpp-slots and the same engine without its server (llama-batched-bench: `llama.cpp, no server`), vLLM (its own
environment: `make vllm`) at each --vllm-concurrency and `transformers serve` at each --transformers-concurrency,
both through the openai backend. Each row's tok/s is also given as a share of the machine's limit
(regen.machine_limit: the model's FLOPs a token against the GEMM rate measured here), whose arithmetic is printed.
Figures are `NAME_tok_s` (local_ENGINE_bB, llamacpp_WEIGHTS_sS, llamacpp_engine_WEIGHTS_sS, vllm_cC,
transformers_cC; local_ENGINE: the engine's best batch size) and `rows`, the table.

    eagle3lab regen bench --engines batching --batch-size 8 32 --llamacpp-weights f32 bf16 q4_1 \\
        --llamacpp-slots 8 16 32 --vllm-concurrency 16 32 --n 64 --baseline-n 0 --max-new-tokens 128 --device cpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3lab.devices import DEVICE_HELP, DTYPE_HELP, clock, resolve_device, resolve_dtype
from eagle3lab.engines.base import EngineMissing
from eagle3lab.io import InputError, write_jsonl
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import add_options, from_options, option
from eagle3lab.regen.errors import RegenError
from eagle3lab.regen.inputs import PromptLength, sharegpt_prompts
from eagle3lab.regen.run import regenerate
from eagle3lab.regen.settings import DTYPES
from eagle3lab.serving.processes import ServerError, free_port, start_server, transformers_serve_command

SERVER_ENGINES = ("transformers", "vllm")


@dataclass
class BenchSettings:
    n: int = option(64, "prompts for the local engines")
    max_new_tokens: int = option(256, "new tokens per answer at most")
    batch_size: list[int] = option(
        (32,), "rows decoded together at most by the local engines (several: each)", metavar="N"
    )
    max_batch_tokens: int = option(65536, "KV-cache budget in tokens (see eagle3lab regen)")
    baseline_n: int = option(4, "prompts for the batch-1 baselines (0 skips them)")
    engines: list[str] = option(("batching", "continuous"), "local engines to measure", metavar="ENGINE")
    serve_n: int = option(64, "prompts through the servers, the first of the local engines' (0 skips every server)")
    llamacpp_slots: list[int] = option((16,), "llama-server's parallel slots (several: each)", metavar="N")
    llamacpp_weights: list[str] = option(
        ("auto",), "the target GGUFs llama.cpp runs: bf16, f32, q4_1, auto (see eagle3lab regen --weights)", metavar="W"
    )
    threads: int | None = option(None, "llama-server's CPU threads (default: every core)", type=int)
    vllm_concurrency: list[int] = option(
        (), "requests in flight to vLLM (several: each; none: no vLLM row)", metavar="N"
    )
    server_compile: bool = option(True, "start vLLM eager (--enforce-eager) instead of compiled")
    transformers_concurrency: list[int] = option(
        (), "requests in flight to `transformers serve` (several: each; none: no row)", metavar="N"
    )
    dtype: str = option("auto", f"model dtype of the local engines and the servers: {DTYPE_HELP}", choices=DTYPES)
    device: str = option("auto", f"where models run: {DEVICE_HELP}")
    target: str = option(DEFAULT_TARGET, "the model")
    max_prompt_tokens: int = option(512, "longest prompt sampled, in tokens")
    workdir: str | None = option(None, "where prompts and outputs go (a temp dir)")

    def __post_init__(self):
        self.engines, self.batch_size = list(self.engines), list(self.batch_size)
        self.llamacpp_slots, self.llamacpp_weights = list(self.llamacpp_slots), list(self.llamacpp_weights)
        self.vllm_concurrency = list(self.vllm_concurrency)
        self.transformers_concurrency = list(self.transformers_concurrency)


def _start(engine: str, model_dir, port: int, dtype: str, device: str, compile: bool, timeout: float, log_path):
    """The server's start (a context manager from eagle3lab.serving): the engine decides only the launch line."""
    if engine == "vllm":
        from eagle3lab.engines.vllm.server import VLLM

        where = "cuda" if resolve_device(device).type == "cuda" else "cpu"
        vllm = VLLM(dtype=dtype, compile=compile, startup_timeout=timeout, device=where)
        return vllm.serve(vllm.launch_command(model_dir, port=port), log_path=log_path)
    cmd = transformers_serve_command(model_dir, port, dtype, device)
    return start_server(cmd, f"http://127.0.0.1:{port}", timeout, log_path=log_path)


@contextlib.contextmanager
def serve_model(
    model_dir: str | os.PathLike,
    *,
    engine: str = "transformers",
    port: int | None = None,
    dtype: str = "auto",
    device: str = "auto",
    compile: bool = True,
    startup_timeout: float = 600.0,
    log_path: str | os.PathLike | None = None,
):
    """Serve MODEL_DIR with `engine` (one of SERVER_ENGINES) on 127.0.0.1; yield (address, process) once /health
    answers; stop its process group after."""
    port = port or free_port()
    try:
        with _start(engine, model_dir, port, dtype, device, compile, startup_timeout, log_path) as server:
            yield f"127.0.0.1:{port}", server.process
    except (ServerError, EngineMissing) as e:
        raise RegenError(str(e)) from None


def _hf_batch1(loaded, prompts: list[dict], max_new_tokens: int) -> tuple[int, float]:
    """Plain batch-1 greedy `generate`, stopping on EOS like the batched engines: (new tokens, seconds)."""
    import torch

    lengths = PromptLength(loaded.tokenizer, loaded.model.config.max_position_embeddings, max_new_tokens)
    tokens, seconds = 0, 0.0
    with torch.inference_mode():
        for row in prompts:
            ids = torch.tensor([lengths.ids(row["conversations"])], device=loaded.device)
            t0 = clock(loaded.device)
            out = loaded.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=loaded.tokenizer.eos_token_id,
            )
            seconds += clock(loaded.device) - t0
            tokens += out.shape[1] - ids.shape[1]
    return tokens, seconds


# long: every row of the table in order, each measured by the one `measure` closure
def bench(s: BenchSettings, log: Callable[[str], None] = print) -> dict:
    """Tokens/s of each way to regenerate the same prompts (see the module doc); returns the figures."""
    from transformers import AutoConfig, AutoTokenizer

    from eagle3lab.models.target import load_target, resolve
    from eagle3lab.regen.machine_limit import machine_limit

    workdir = Path(s.workdir or tempfile.mkdtemp(prefix="regen-bench-"))
    device = resolve_device(s.device)
    s.dtype = resolve_dtype(s.dtype, device)  # every row and the figures name the dtype that ran
    # the engines load their own model: only the batch-1 baseline needs one here, else only the tokenizer
    loaded = load_target(s.target, dtype=s.dtype, device=device) if s.baseline_n else None
    tokenizer = loaded.tokenizer if loaded else AutoTokenizer.from_pretrained(resolve(s.target))
    prompts = sharegpt_prompts(s.n, tokenizer, s.max_prompt_tokens)
    figures: dict = {**asdict(s), "n": len(prompts), "device": str(device), "rows": []}
    if device.type == "cpu":  # measured before any engine runs, alone on the machine
        figures["machine"] = machine_limit(AutoConfig.from_pretrained(resolve(s.target)))
        for line in figures["machine"]["arithmetic"]:
            log(f"machine limit: {line}")

    def measure(name: str, row: dict, rows: list[dict], **overrides) -> None:
        """One regeneration run (local, a server, or llama-server of its own: the same `regenerate` call) into
        figures[name_tok_s] and a table row."""
        write_jsonl(workdir / f"{name}_prompts.jsonl", rows)
        result = regenerate(
            workdir / f"{name}_prompts.jsonl",
            workdir / f"{name}.jsonl",
            **{"max_turns": 1, "max_new_tokens": s.max_new_tokens, "dtype": s.dtype, "target": s.target, **overrides},
            log=log,
        )
        figures[f"{name}_tok_s"] = result.tokens_per_s
        add_row(figures, row, prompts=len(rows), tokens=result.tokens, tok_s=result.tokens_per_s)
        log(f"{name}: {result.tokens} tokens in {result.seconds:.1f} s = {result.tokens_per_s:.1f} tok/s")

    if s.baseline_n:
        tokens, seconds = _hf_batch1(loaded, prompts[: s.baseline_n], s.max_new_tokens)
        figures["hf_batch1_tok_s"] = tokens / seconds
        log(f"hf_batch1 (plain generate): {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tok/s")
        del loaded
        # the local decode loop one row at a time: separates batching from loop overheads
        row = {"engine": "local batching", "weights": s.dtype, "setting": "batch 1"}
        measure("local_batch1", row, prompts[: s.baseline_n], batch_size=1, engine="batching", device=s.device)
    for engine in s.engines:
        for b in s.batch_size:
            local = dict(batch_size=b, max_batch_tokens=s.max_batch_tokens, engine=engine, device=s.device)
            row = {"engine": f"local {engine}", "weights": s.dtype, "setting": f"batch {b}"}
            measure(f"local_{engine}_b{b}", row, prompts, **local)
        # the engine's best, the figure gpu_run sizes regeneration by
        figures[f"local_{engine}_tok_s"] = max(figures[f"local_{engine}_b{b}_tok_s"] for b in s.batch_size)
    served = prompts[: s.serve_n]
    if served:
        _measure_llamacpp(s, measure, served, tokenizer, figures)
        for engine, concurrency in (("vllm", s.vllm_concurrency), ("transformers", s.transformers_concurrency)):
            if concurrency:
                _measure_server(s, engine, concurrency, measure, served, workdir / f"{engine}.log")
    log(table(figures))
    log(json.dumps(figures))
    return figures


def _measure_llamacpp(s: BenchSettings, measure: Callable, rows: list[dict], tokenizer, figures: dict) -> None:
    """The llamacpp backend per weights and slots, each run starting its own llama-server (not in the timing), then
    the same engine without the server (engines.llamacpp.batched_bench: prompts of the rows' mean length, every
    answer max_new_tokens long), so the table shows what the server and our client cost."""
    from eagle3lab.engines.llamacpp.batched_bench import engine_throughput
    from eagle3lab.engines.llamacpp.gguf import target_gguf, target_weights
    from eagle3lab.engines.llamacpp.server import default_threads

    lengths = PromptLength(tokenizer, s.max_prompt_tokens + s.max_new_tokens, s.max_new_tokens)
    prompt_tokens = round(sum(len(lengths.ids(r["conversations"])) for r in rows) / len(rows))
    for weights in map(target_weights, s.llamacpp_weights):
        for slots in s.llamacpp_slots:
            row = {"engine": "llama.cpp", "weights": weights, "setting": f"{slots} slots"}
            served = dict(backend="llamacpp", weights=weights, concurrency=slots, threads=s.threads)
            measure(
                f"llamacpp_{weights}_s{slots}", row, rows, max_context=s.max_prompt_tokens + s.max_new_tokens, **served
            )
        for slots in s.llamacpp_slots:
            got = engine_throughput(
                target_gguf(s.target, weights),
                slots=slots,
                prompt_tokens=prompt_tokens,
                new_tokens=s.max_new_tokens,
                threads=s.threads or default_threads(),
            )
            figures[f"llamacpp_engine_{weights}_s{slots}_tok_s"] = got["new_tok_s"]
            row = {"engine": "llama.cpp, no server", "weights": weights, "setting": f"{slots} in lockstep"}
            add_row(figures, row, prompts=slots, tokens=int(got["B"] * got["TG"]), tok_s=got["new_tok_s"])


def _measure_server(
    s: BenchSettings, engine: str, concurrency: list[int], measure: Callable, rows: list[dict], log_path: Path
) -> None:
    """The openai backend against one server of `engine`, started once, at each concurrency."""
    from eagle3lab.models.target import resolve

    started = serve_model(
        resolve(s.target), engine=engine, dtype=s.dtype, device=s.device, compile=s.server_compile, log_path=log_path
    )
    with started as (address, _):
        for c in concurrency:
            row = {"engine": engine, "weights": s.dtype, "setting": f"{c} in flight"}
            measure(f"{engine}_c{c}", row, rows, backend="openai", server_addresses=[address], concurrency=c)


def add_row(figures: dict, row: dict, *, prompts: int, tokens: int, tok_s: float) -> None:
    """One row of the table, with its share of the machine's limit where the limit was measured (CPU)."""
    limit = figures.get("machine", {}).get("limit_tok_s")
    share = tok_s / limit if limit else None
    figures["rows"].append(row | {"prompts": prompts, "tokens": tokens, "tok_s": tok_s, "share_of_limit": share})


def table(figures: dict) -> str:
    """The rows as one text table, fastest first, with the machine's limit above it."""
    lines = [f"machine limit: {line}" for line in figures.get("machine", {}).get("arithmetic", [])]
    lines.append(f"{'engine':<20} {'weights':<9} {'setting':<14} {'tok/s':>8} {'of limit':>9}")
    for row in sorted(figures["rows"], key=lambda r: -r["tok_s"]):
        share = f"{row['share_of_limit']:.0%}" if row["share_of_limit"] is not None else "-"
        lines.append(f"{row['engine']:<20} {row['weights']:<9} {row['setting']:<14} {row['tok_s']:>8.1f} {share:>9}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3lab regen bench", description=__doc__.split("\n\n")[0])
    add_options(p, BenchSettings)
    return p


def main(argv: list[str]) -> int:
    try:
        bench(from_options(build_parser().parse_args(argv), BenchSettings))
    except (RegenError, InputError) as e:
        print(f"eagle3lab regen bench: error: {e}", file=sys.stderr)
        return 2
    return 0
