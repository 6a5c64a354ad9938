"""The machine's limit for batched decoding of a model, the yardstick `eagle3lab regen bench` divides by: the multiply-
adds a token costs (from the model's config) against the best GEMM rate this machine's torch reaches at the model's
own shapes, measured in each dtype. Decoding at large batch is GEMM-bound, so no engine beats peak / FLOPs a token;
reading the weights and the KV cache once a step only lowers it."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class TokenCost:
    """Multiply-adds of one decoded token: the decoder layers' projections and the head (attention over the cache
    is left out: it grows with the context and is small beside these at regeneration lengths)."""

    layers: int
    per_layer: int
    head: int

    @property
    def flops(self) -> int:
        return 2 * (self.layers * self.per_layer + self.head)

    def arithmetic(self) -> str:
        return (
            f"2 x ({self.layers} layers x {self.per_layer / 1e6:.2f}M + head {self.head / 1e6:.1f}M) multiply-adds "
            f"= {self.flops / 1e6:.0f} MFLOP a token"
        )


def token_cost(config) -> TokenCost:
    """From a Llama-style transformers config: q, k, v, o and the gated MLP per layer, and the vocabulary head."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q = hidden * config.num_attention_heads * head_dim
    kv = 2 * hidden * config.num_key_value_heads * head_dim
    return TokenCost(config.num_hidden_layers, 2 * q + kv + 3 * hidden * inter, hidden * config.vocab_size)


def gemm_peak(config, dtype: str, rows: int = 128, seconds: float = 1.0) -> float:
    """GFLOP/s of torch's linear at the model's MLP shape (`rows` tokens x hidden -> intermediate), median of
    repeats over about `seconds`."""
    import torch

    kind = getattr(torch, dtype)
    x = torch.randn(rows, config.hidden_size, dtype=kind)
    w = torch.randn(config.intermediate_size, config.hidden_size, dtype=kind)
    flop = 2 * rows * config.hidden_size * config.intermediate_size
    times: list[float] = []
    with torch.inference_mode():
        torch.nn.functional.linear(x, w)  # warm-up: kernel selection, first-touch pages
        end = time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 5:
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w)
            times.append(time.perf_counter() - t0)
    return flop / sorted(times)[len(times) // 2] / 1e9


def machine_limit(config, dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> dict:
    """The limit in tokens/s with its arithmetic: the best measured GEMM rate over `dtypes` / FLOPs a token."""
    cost = token_cost(config)
    peaks = {dtype: gemm_peak(config, dtype) for dtype in dtypes}
    best = max(peaks, key=peaks.get)
    limit = peaks[best] * 1e9 / cost.flops
    lines = [
        cost.arithmetic(),
        "GEMM peak at the model's MLP shape: " + ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in peaks.items()),
        f"limit = {peaks[best]:.0f} GFLOP/s ({best}) / {cost.flops / 1e6:.0f} MFLOP = {limit:.0f} tok/s",
    ]
    return {"flops_per_token": cost.flops, "gemm_gflops": peaks, "limit_tok_s": limit, "arithmetic": lines}
