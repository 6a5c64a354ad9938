"""`eagle3lab regen bench`: regeneration throughput (a command that prints figures, never a test).

On the same seeded ShareGPT prompts: plain batch-1 `generate`, the local backend at batch 1, the local backend with
each engine (eagle3lab's BatchGenerator, transformers' paged continuous batching) at each --batch-size, and a server
(`transformers serve` or vLLM, --server-engine) through the openai backend at each --serve-concurrency. Figures are
`NAME_tok_s`: local_ENGINE_bB, SERVER_cC, and local_ENGINE (the engine's best batch size).

    eagle3lab regen bench --engines batching --batch-size 1 4 16 --server-engine vllm --serve-concurrency 1 4 16 \\
        --n 32 --serve-n 32 --baseline-n 0 --max-new-tokens 128 --device cpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3lab.devices import DEVICE_HELP, clock, resolve_device
from eagle3lab.engines.base import EngineMissing
from eagle3lab.io import InputError, write_jsonl
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import add_options, from_options, option
from eagle3lab.regen.errors import RegenError
from eagle3lab.regen.inputs import PromptLength, SkippedRow, plan_conversation
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
    serve_n: int = option(16, "prompts through the server, the first of the local engines' (0 skips the server)")
    server_engine: str = option(
        "transformers",
        "the server the openai backend measures: `transformers serve` or vLLM (its own environment: `make vllm`)",
        choices=SERVER_ENGINES,
    )
    serve_concurrency: list[int] = option((4,), "requests in flight to the server (several: each)", metavar="N")
    server_compile: bool = option(True, "start vLLM eager (--enforce-eager) instead of compiled")
    dtype: str = option("bfloat16", "model dtype", choices=DTYPES)
    device: str = option("auto", f"where models run: {DEVICE_HELP}")
    target: str = option(DEFAULT_TARGET, "the model")
    max_prompt_tokens: int = option(512, "longest prompt sampled, in tokens")
    workdir: str | None = option(None, "where prompts and outputs go (a temp dir)")

    def __post_init__(self):
        self.engines, self.batch_size = list(self.engines), list(self.batch_size)
        self.serve_concurrency = list(self.serve_concurrency)


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


def bench_prompts(n: int, tokenizer, max_prompt_tokens: int = 512, seed: int = 0) -> list[dict]:
    """n single-turn ShareGPT prompts (first user turn, at most max_prompt_tokens tokens), a seeded sample."""
    from eagle3lab.data.sources import load_sharegpt

    records, _ = load_sharegpt()
    random.Random(seed).shuffle(records)
    rows = []
    for rec in records:
        try:
            _, users = plan_conversation({"conversations": rec.conversations}, 1)
        except SkippedRow:
            continue
        if len(tokenizer(users[0], add_special_tokens=False)["input_ids"]) <= max_prompt_tokens:
            rows.append({"id": rec.id, "conversations": [{"role": "user", "content": users[0]}]})
        if len(rows) == n:
            break
    return rows


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


def bench(s: BenchSettings, log: Callable[[str], None] = print) -> dict:
    """Tokens/s of each way to regenerate the same prompts (see the module doc); returns the figures."""
    from transformers import AutoTokenizer

    from eagle3lab.models.target import load_target, resolve

    workdir = Path(s.workdir or tempfile.mkdtemp(prefix="regen-bench-"))
    device = resolve_device(s.device)
    # the engines load their own model: only the batch-1 baseline needs one here, else only the tokenizer
    loaded = load_target(s.target, dtype=s.dtype, device=device) if s.baseline_n else None
    tokenizer = loaded.tokenizer if loaded else AutoTokenizer.from_pretrained(resolve(s.target))
    prompts = bench_prompts(s.n, tokenizer, s.max_prompt_tokens)
    figures: dict = {**asdict(s), "n": len(prompts), "device": str(device)}

    def measure(name: str, rows: list[dict], **overrides) -> None:
        """One regeneration run, local or through a server (the same `regenerate` call), into figures[name_tok_s]."""
        write_jsonl(workdir / f"{name}_prompts.jsonl", rows)
        result = regenerate(
            workdir / f"{name}_prompts.jsonl",
            workdir / f"{name}.jsonl",
            **{"max_turns": 1, "max_new_tokens": s.max_new_tokens, "dtype": s.dtype, "target": s.target, **overrides},
            log=log,
        )
        figures[f"{name}_tok_s"] = result.tokens_per_s
        log(f"{name}: {result.tokens} tokens in {result.seconds:.1f} s = {result.tokens_per_s:.1f} tok/s")

    if s.baseline_n:
        tokens, seconds = _hf_batch1(loaded, prompts[: s.baseline_n], s.max_new_tokens)
        figures["hf_batch1_tok_s"] = tokens / seconds
        log(f"hf_batch1 (plain generate): {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tok/s")
        del loaded
        # the local decode loop one row at a time: separates batching from loop overheads
        measure("local_batch1", prompts[: s.baseline_n], batch_size=1, engine="batching", device=s.device)
    for engine in s.engines:
        for b in s.batch_size:
            local = dict(batch_size=b, max_batch_tokens=s.max_batch_tokens, engine=engine, device=s.device)
            measure(f"local_{engine}_b{b}", prompts, **local)
        # the engine's best, the figure gpu_run sizes regeneration by
        figures[f"local_{engine}_tok_s"] = max(figures[f"local_{engine}_b{b}_tok_s"] for b in s.batch_size)
    if s.serve_n:
        _measure_server(s, measure, prompts[: s.serve_n], workdir / f"{s.server_engine}.log")
    log(json.dumps(figures))
    return figures


def _measure_server(s: BenchSettings, measure: Callable, rows: list[dict], log_path: Path) -> None:
    """The openai backend against one server of `s.server_engine`, started once, at each concurrency."""
    from eagle3lab.models.target import resolve

    started = serve_model(
        resolve(s.target),
        engine=s.server_engine,
        dtype=s.dtype,
        device=s.device,
        compile=s.server_compile,
        log_path=log_path,
    )
    with started as (address, _):
        for c in s.serve_concurrency:
            measure(f"{s.server_engine}_c{c}", rows, backend="openai", server_addresses=[address], concurrency=c)


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
