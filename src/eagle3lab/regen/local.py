"""The local backend: the target in this process, on one device, driven by one of two continuous-batching engines
(eagle3lab's BatchGenerator or transformers' paged ContinuousGenerator), conversation by conversation, turn by turn."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from eagle3lab.regen.batching import BatchGenerator, TurnResult
from eagle3lab.regen.continuous import ContinuousGenerator
from eagle3lab.regen.conversation import Conversation
from eagle3lab.regen.files import RunFiles
from eagle3lab.regen.inputs import Job, PromptLength
from eagle3lab.regen.progress import Progress
from eagle3lab.regen.settings import RegenSettings

# `engine: auto` per device type. CPU, measured (`eagle3lab regen bench --n 32 --max-new-tokens 128 --baseline-n 0
# --serve-n 0 --device cpu`, bf16, 1 thread, median of 3): batching 178 tok/s, continuous 92. CUDA: not measured (no
# GPU here); continuous for the library's paged attention and CUDA graphs. `--engine batching` overrides it.
AUTO_ENGINE = {"cpu": "batching", "cuda": "continuous"}


def pick_engine(setting: str, device: torch.device) -> str:
    return AUTO_ENGINE.get(device.type, "batching") if setting == "auto" else setting


def make_engine(name: str, target, lengths: PromptLength, settings: RegenSettings):
    kv_tokens = settings.max_batch_tokens or settings.batch_size * lengths.max_context
    common = dict(
        batch_size=settings.batch_size,
        max_new_tokens=lengths.max_new_tokens,
        temperature=settings.temperature,
        max_context=lengths.max_context,
        seed=settings.seed,
    )
    if name == "continuous":
        return ContinuousGenerator(target.model, target.tokenizer, cache_tokens=kv_tokens, **common)
    return BatchGenerator(target.model, target.tokenizer, max_batch_tokens=kv_tokens, **common)


def run_local(
    jobs: Iterable[Job],
    engine,
    lengths: PromptLength,
    *,
    generation: dict,
    files: RunFiles,
    progress: Progress,
) -> None:
    def submit_next(conv: Conversation) -> bool:
        if conv.next_user() is None:
            return False
        messages = conv.prompt_messages()
        ids = lengths.ids(messages)
        if not lengths.fits(len(ids)):
            conv.history.pop()  # a later turn that no longer fits ends the conversation where it is
            return False
        engine.submit(conv, ids)
        return True

    def on_finish(conv: Conversation, result: TurnResult) -> None:
        conv.add(result)
        if not submit_next(conv):
            files.write_ok(conv.output(generation))
            progress.record("ok")

    for job in jobs:
        submit_next(Conversation(job))
    engine.run(on_finish, progress.add_tokens)
