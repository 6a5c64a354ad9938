"""llama.cpp's decoding rate without its server: `llama-batched-bench` (a program of the pinned source) prefills
`slots` prompts of `prompt_tokens` tokens each, then decodes `new_tokens` for all of them in lockstep, in one process
with no HTTP, no scheduler and no sampling beyond the engine's own. `eagle3lab regen bench` puts it beside the served
rows, so the gap between the engine and llama-server regenerating through our client is a measured figure."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from eagle3lab.engines.llamacpp.build import _run, build_dir, server_path
from eagle3lab.io import InputError

TOOL = "llama-batched-bench"


def tool_path() -> Path:
    """llama-batched-bench, built into the ready llama-server build on first use: seconds, since the libraries it
    links are built already."""
    path = server_path().parent / TOOL
    if not path.exists():
        # build.py's own step runner (progress, EngineMissing on failure); the function stays there, since build.py
        # is a stage-02 dependency and this tool is not
        _run(
            ["cmake", "--build", build_dir() / "build", "--target", TOOL, "-j", os.cpu_count() or 1], f"building {TOOL}"
        )
    return path


COLUMNS = ("PP", "TG", "B", "N_KV", "T_PP", "S_PP", "T_TG", "S_TG", "T", "S")


def parse_table(output: str) -> dict:
    """The one result row of llama-batched-bench's table: its columns as numbers, plus `new_tok_s`, new tokens (B x
    TG) over the whole time, prefill included, as a regeneration run counts them."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and len(cells) == len(COLUMNS):
            try:
                rows.append(dict(zip(COLUMNS, map(float, cells), strict=True)))
            except ValueError:  # the header and its rule
                continue
    if len(rows) != 1:
        raise InputError(f"llama-batched-bench: expected one result row, found {len(rows)} in:\n{output[-2000:]}")
    row = rows[0]
    return row | {"new_tok_s": row["B"] * row["TG"] / row["T"]}


def engine_throughput(gguf, *, slots: int, prompt_tokens: int, new_tokens: int, threads: int) -> dict:
    """Run llama-batched-bench once on `gguf`; its row (parse_table). Each sequence gets its own KV stream of
    prompt + new tokens, as each of llama-server's slots does; flash attention at the engine's default, as served."""
    context = slots * (prompt_tokens + new_tokens + 256)  # 256: the KV cache pads each stream
    cmd = [str(tool_path()), "-m", str(gguf), "-t", str(threads), "-c", str(context)]
    cmd += ["-npp", str(prompt_tokens), "-ntg", str(new_tokens), "-npl", str(slots)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise InputError(f"llama-batched-bench exited with {done.returncode}:\n{done.stderr[-2000:]}")
    return parse_table(done.stdout + done.stderr)
