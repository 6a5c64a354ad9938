"""`eagle3lab regen onpolicy`: are the llamacpp backend's answers the HF target's own? The same token ids (N seeded
ShareGPT prompts, regen bench's sample, under the HF chat template) go to llama-server on the target's GGUF (started
as the llamacpp backend starts it, --weights as there) and to the HF target (the local batching engine; bf16 where
bf16 is native); both answer greedily.

Figures: the share of answers identical token for token, their mean common prefix, and the HF target's mean NLL per
token of llama.cpp's answers against that of its own answers (the ratio; 1.0: as likely as its own). The llamacpp
backend sends messages, not ids, so llama-server's own rendering of each prompt (/apply-template) must equal HF's
template text: the figures count the prompts where it does not.

    eagle3lab regen onpolicy --n 64 --max-new-tokens 256 [--slots 16] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3lab.devices import DTYPE_HELP, resolve_dtype
from eagle3lab.io import InputError, write_json
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import add_options, from_options, option
from eagle3lab.regen.errors import RegenError
from eagle3lab.regen.inputs import PromptLength
from eagle3lab.regen.settings import RegenSettings


@dataclass
class OnPolicySettings:
    n: int = option(64, "prompts")
    max_new_tokens: int = option(256, "new tokens per answer at most")
    slots: int = option(16, "llama-server's parallel slots (requests in flight)")
    threads: int | None = option(None, "llama-server's CPU threads (default: every core)", type=int)
    weights: str = option("auto", "llama-server's target GGUF (see eagle3lab regen --weights)")
    batch_size: int = option(32, "rows the HF target decodes together")
    dtype: str = option("auto", f"the HF target's dtype: {DTYPE_HELP}")
    max_prompt_tokens: int = option(512, "longest prompt sampled, in tokens")
    target: str = option(DEFAULT_TARGET, "the model (an embedded target or a local folder)")
    output: str | None = option(None, "write the figures and each prompt's answers to this JSON file")


def llamacpp_answers(s: OnPolicySettings, prompts: list[dict], lengths: PromptLength) -> list[dict]:
    """llama-server's greedy answer ids to each prompt's HF ids, and whether its template renders the prompt as HF's."""
    from eagle3lab.engines.llamacpp.server import LlamaCpp
    from eagle3lab.regen.llamacpp import start_server
    from eagle3lab.serving.client import ServerClient, json_object

    settings = RegenSettings(
        backend="llamacpp", target=s.target, concurrency=s.slots, threads=s.threads, weights=s.weights
    )
    with contextlib.ExitStack() as stack:
        # a failed start quotes the log's tail, so the log goes with the check
        log = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onpolicy-"))) / "llama-server.log"
        server, _ = start_server(settings, lengths.max_context, stack, log)
        client = stack.enter_context(ServerClient(server.url))

        def one(row: dict) -> dict:
            messages = row["conversations"]
            rendered = json_object(client.http.post("/apply-template", json={"messages": messages}))["prompt"]
            hf = lengths.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            done = LlamaCpp().complete(client, row["ids"], lengths.max_new_tokens)
            return {"same_template": rendered == hf, "llamacpp": done.token_ids}

        with ThreadPoolExecutor(max_workers=s.slots) as pool:
            return list(pool.map(one, prompts))


def hf_answers(target, prompts: list[dict], lengths: PromptLength, batch_size: int) -> list[list[int]]:
    """The HF target's greedy answer ids (its stop token included), from the local backend's batching engine."""
    from eagle3lab.regen.batching import BatchGenerator

    engine = BatchGenerator(
        target.model,
        target.tokenizer,
        batch_size=batch_size,
        max_new_tokens=lengths.max_new_tokens,
        max_context=lengths.max_context,
        max_batch_tokens=batch_size * lengths.max_context,
    )
    answers: dict[int, list[int]] = {}
    for i, row in enumerate(prompts):
        engine.submit(i, row["ids"])
    engine.run(lambda i, result: answers.__setitem__(i, result.token_ids))
    return [answers[i] for i in range(len(prompts))]


def answer_nll(target, prompt: list[int], answer: list[int]) -> float:
    """The target's summed NLL of `answer` after `prompt` (teacher-forced, one unpadded forward)."""
    import torch

    ids = torch.tensor([prompt + answer], device=target.device)
    with torch.inference_mode():
        logits = target.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum"))


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def onpolicy(s: OnPolicySettings, log=print) -> dict:
    """Run the check (see the module doc); return the figures, with each prompt's answers under "rows"."""
    from eagle3lab.models.target import load_target
    from eagle3lab.regen.inputs import sharegpt_prompts

    target = load_target(s.target, dtype=resolve_dtype(s.dtype))
    lengths = PromptLength(target.tokenizer, s.max_prompt_tokens + s.max_new_tokens, s.max_new_tokens)
    prompts = sharegpt_prompts(s.n, target.tokenizer, s.max_prompt_tokens)
    for row in prompts:
        row["ids"] = lengths.ids(row["conversations"])
    started = time.monotonic()
    rows = llamacpp_answers(s, prompts, lengths)
    log(f"onpolicy: llama.cpp answered {len(rows)} prompts ({time.monotonic() - started:.0f} s)")
    answers = hf_answers(target, prompts, lengths, s.batch_size)
    log(f"onpolicy: the HF target answered them ({time.monotonic() - started:.0f} s); scoring both sides' answers")
    for row, prompt, answer in zip(rows, prompts, answers):
        row.update(id=prompt["id"], hf=answer, common_prefix=_common_prefix(row["llamacpp"], answer))
        row["nll_llamacpp"] = answer_nll(target, prompt["ids"], row["llamacpp"])
        row["nll_hf"] = answer_nll(target, prompt["ids"], answer)
    tokens = {k: sum(len(r[k]) for r in rows) for k in ("llamacpp", "hf")}
    nll = {k: sum(r[f"nll_{k}"] for r in rows) / max(tokens[k], 1) for k in ("llamacpp", "hf")}
    figures = {
        **asdict(s),
        "n": len(rows),
        "template_mismatches": sum(not r["same_template"] for r in rows),
        "identical_share": sum(r["llamacpp"] == r["hf"] for r in rows) / max(len(rows), 1),
        "mean_common_prefix": sum(r["common_prefix"] for r in rows) / max(len(rows), 1),
        "tokens_llamacpp": tokens["llamacpp"],
        "tokens_hf": tokens["hf"],
        "nll_llamacpp": nll["llamacpp"],
        "nll_hf": nll["hf"],
        "nll_ratio": nll["llamacpp"] / nll["hf"] if nll["hf"] else None,
    }
    log(json.dumps(figures))
    return {**figures, "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eagle3lab regen onpolicy", description=__doc__.split("\n\n")[0])
    add_options(p, OnPolicySettings)
    return p


def main(argv: list[str]) -> int:
    s = from_options(build_parser().parse_args(argv), OnPolicySettings)
    try:
        result = onpolicy(s)
    except (RegenError, InputError) as e:
        print(f"eagle3lab regen onpolicy: error: {e}", file=sys.stderr)
        return 2
    if s.output:
        write_json(s.output, result)
    return 0
