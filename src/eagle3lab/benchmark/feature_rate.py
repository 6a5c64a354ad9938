"""`python -m eagle3lab.benchmark.feature_rate`: how fast the feature cache is built, against the target's own prefill
rate on the same records. Prints tokens per second of, each over the first N records of a training file:

- prefill: the target's plain forward (logits at every position, as the cache needs their argmax), in padded batches
  of up to --batch-tokens tokens of records of similar length: the rate the cache is measured against;
- features, one record a forward: `record_features` as the CPU ran it up to now;
- features, batched: `record_features` with the prefill's batches;
- cache build: `FeatureCache.build` end to end at its default (shards written to a temporary folder).

Each is timed --repeats times alone on the machine; the median is reported. Timings never go in tests: this command
prints them."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from eagle3lab.devices import resolve_dtype
from eagle3lab.models.target import DEFAULT_TARGET, aux_hidden_indices, load_target
from eagle3lab.train.features import (
    FeatureCache,
    cache_key,
    length_groups,
    padded_batch,
    record_features,
    tokenize_file,
)


def _timed(fn, repeats: int) -> float:
    """Median seconds of fn() over repeats runs, after one untimed warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _prefill(model, rows, batch_tokens: int) -> None:
    for group in length_groups(rows, batch_tokens):
        ids, mask = padded_batch(group, "cpu")
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask).logits.argmax(-1)


def measure(data: str, target_spec: str, records: int, batch_tokens: int, max_len: int, dtype: str, repeats: int):
    """name -> tokens per second (median of repeats) and the setting, for the rows above."""
    torch_dtype = resolve_dtype(dtype, "cpu")
    target = load_target(target_spec, dtype=torch_dtype, device="cpu")  # the cache's dtype: build() copies nothing
    rows, _ = tokenize_file(data, target.tokenizer, max_len, limit=records)
    tokens = sum(len(r) for r in rows)
    indices = aux_hidden_indices(target.num_layers)
    model = target.model

    def build():
        with tempfile.TemporaryDirectory() as tmp:
            key = cache_key("benchmark", target, indices, max_len, 64, torch_dtype)
            FeatureCache(Path(tmp), key).build(rows, target, len(rows), progress=False)

    runs = {
        "prefill": lambda: _prefill(model, rows, batch_tokens),
        "features, one record a forward": lambda: record_features(model, rows, indices, batch_tokens=0),
        "features, batched": lambda: record_features(model, rows, indices, batch_tokens=batch_tokens),
        "cache build (its default)": build,
    }
    seconds = {name: _timed(fn, repeats) for name, fn in runs.items()}
    return {
        "records": len(rows),
        "tokens": tokens,
        "dtype": torch_dtype,
        "batch_tokens": batch_tokens,
        "tok_s": {name: round(tokens / s, 1) for name, s in seconds.items()},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3lab.benchmark.feature_rate",
        description="The feature cache's build rate against the target's own prefill on the same records.",
    )
    parser.add_argument("data", help="training conversations (JSONL), e.g. artifacts/regen/train.jsonl")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--records", type=int, default=64, help="the first N records of the file")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per batched forward")
    parser.add_argument("--max-len", type=int, default=768, help="truncate conversations (train_draft.max_len)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 where native), bfloat16, float32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    result = measure(args.data, args.target, args.records, args.batch_tokens, args.max_len, args.dtype, args.repeats)
    prefill = result["tok_s"]["prefill"]
    print(f"{result['records']} records, {result['tokens']} tokens, {result['dtype']}, batches of {args.batch_tokens}")
    for name, rate in result["tok_s"].items():
        print(f"{name:32s} {rate:8.0f} tok/s  {rate / prefill:5.2f} of prefill")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
