"""The rules that depend on the machine: the model dtype `auto` resolves to, the target GGUF's weights llama.cpp
regenerates with, and the yardstick of `eagle3lab regen bench` (a token's FLOPs from the model's config over the
measured GEMM rate)."""

import pytest
from transformers import LlamaConfig

from conftest import TINY_LLAMA
from eagle3lab import devices
from eagle3lab.engines.llamacpp.gguf import target_weights
from eagle3lab.io import InputError
from eagle3lab.regen.machine_limit import machine_limit, token_cost


def test_token_cost_counts_projections_and_head():
    config = LlamaConfig(**TINY_LLAMA)  # hidden 64, intermediate 128, 6 layers, 4 heads of 16, 2 KV heads, vocab 320
    cost = token_cost(config)
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128  # q and o, k and v (2 KV heads of 16), gate/up/down
    assert (cost.layers, cost.per_layer, cost.head) == (6, per_layer, 64 * 320)
    assert cost.flops == 2 * (6 * per_layer + 64 * 320)
    assert f"{cost.flops / 1e6:.0f} MFLOP a token" in cost.arithmetic()


def test_machine_limit_is_the_best_measured_rate_over_a_token(one_thread):
    config = LlamaConfig(**TINY_LLAMA)
    limit = machine_limit(config, dtypes=("float32",))
    gflops = limit["gemm_gflops"]["float32"]
    assert gflops > 0 and limit["limit_tok_s"] == pytest.approx(gflops * 1e9 / token_cost(config).flops)
    assert limit["arithmetic"][-1].endswith(f"= {limit['limit_tok_s']:.0f} tok/s")


def test_auto_dtype_is_bf16_only_where_it_is_native(monkeypatch):
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "amx_bf16"})
    assert devices.resolve_dtype("auto", "cpu") == "bfloat16"
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f"})  # AVX-512 without its BF16 extension
    assert devices.resolve_dtype("auto", "cpu") == "float32"
    assert devices.resolve_dtype("bfloat16", "cpu") == "bfloat16"  # a name is kept as given
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 1)
    assert devices.resolve_dtype("auto", "cuda") == "bfloat16"


def test_target_weights_follow_the_cpu(monkeypatch):
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert target_weights("auto") == "bf16"
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "fma"})  # bf16 emulated: the same weights at f32
    assert target_weights("auto") == "f32"
    assert target_weights("q4_1") == "q4_1"
    with pytest.raises(InputError, match="target weights 'f8'.*bf16, f32, q4_1 or auto"):
        target_weights("f8")


def test_auto_backend_is_local_only_where_torch_has_amx(monkeypatch):
    from eagle3lab.regen.settings import resolve_backend

    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    assert resolve_backend("auto", "cpu") == "local"
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})  # llama.cpp wins there
    assert resolve_backend("auto", "cpu") == "llamacpp"
    assert resolve_backend("openai", "cpu") == "openai"  # an explicit choice is kept
