"""SpecForge's offline trainer on a CPU: the one place its CPU workarounds live. Runs inside SpecForge's own
environment (train.specforge.environment), so it imports nothing of ours:

    python -P cpu_shim.py check                         # apply the workarounds and import the offline trainer
    python -P cpu_shim.py train --config RUN.yaml ...   # `specforge train`, after writing OUTPUT/resolved_config.json

What blocks SpecForge 0.2.0's offline path here, and what this module does about each:
- `specforge.core.loss` imports triton at the top (its soft cross-entropy is a Triton kernel): a torch version of
  `LogSoftmaxLoss` takes that module's place.
- The trainer always wraps the model in FSDP, which needs an accelerator: one process trains it unwrapped (the draft
  is already in the bf16 FSDP's mixed precision would give it; the optimizer keeps its fp32 masters).
- `torch.compile` decorates the draft's RoPE and RMSNorm and the teacher's projection: TORCH_COMPILE_DISABLE=1.
- `TargetHead.load_weights` wants a `*.index.json` and an `lm_head.weight`; SmolLM2 has one safetensors file and a
  head tied to its embedding: the head is read from either layout, the embedding when the head is tied.
- Its draft config derived from a target under transformers 5.8.1 loses rope_theta (RoPE base 10000 instead of
  SmolLM2's 100000): we hand it our draft's config.json instead, and the draft it builds is checked against the
  target's rope_theta.
Config-level ones are set by the run config train.specforge.inputs writes: `training.attention_backend: sdpa` (the
default flex attention compiles kernels) and `data.dataloader_num_workers: 0` (two cores).
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # before torch is imported: its decorators read it then

import torch  # noqa: E402

EMBEDDING_KEY = "model.embed_tokens.weight"  # SpecForge's model.embedding_key default


class LogSoftmaxLoss:
    """SpecForge's soft cross-entropy in plain torch: per position -sum_v p_v log softmax(logits)_v where the
    position mask is set, 0 elsewhere, averaged over all B*T positions (the kernel's mean)."""

    @staticmethod
    def apply(logits: torch.Tensor, target_p: torch.Tensor, position_mask: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(logits.float(), dim=-1)
        return -(position_mask * target_p * log_p).sum(-1).mean()


def _replace_triton_loss() -> None:
    module = types.ModuleType("specforge.core.loss", "eagle3lab's torch LogSoftmaxLoss (no triton on a CPU)")
    module.LogSoftmaxLoss = LogSoftmaxLoss
    sys.modules["specforge.core.loss"] = module


def _train_unwrapped() -> None:
    from specforge.training.backend import FSDPTrainingBackend

    wrapped = FSDPTrainingBackend.prepare_model

    def prepare_model(self, model, *, wrap=True, optimizer_target=None):
        if self.parallel_config.world_size > 1:
            raise RuntimeError("the CPU workarounds train in one process; set deployment.trainer.nproc_per_node: 1")
        return wrapped(self, model, wrap=False, optimizer_target=optimizer_target)

    FSDPTrainingBackend.prepare_model = prepare_model


def _weight_files(folder: Path) -> list[Path]:
    index = sorted(folder.glob("*.index.json"))
    if index:
        return [folder / name for name in sorted(set(json.loads(index[0].read_text())["weight_map"].values()))]
    return sorted(folder.glob("*.safetensors"))


def _read_head(self, model_path, lm_head_key="lm_head.weight", cache_dir=None):
    from safetensors import safe_open

    folder = Path(model_path)
    keys = [lm_head_key] + ([EMBEDDING_KEY] if getattr(self.config, "tie_word_embeddings", False) else [])
    for key in keys:
        for path in _weight_files(folder):
            with safe_open(str(path), framework="pt") as f:
                names = f.keys()  # safe_open is not iterable
                if key in names:
                    with torch.no_grad():
                        self.fc.weight.copy_(f.get_tensor(key))
                    return
    raise FileNotFoundError(f"{folder}: no safetensors file holds {' or '.join(keys)} (the target's head)")


def _check_rope(build):
    def build_eagle3_draft(cfg, draft_config):
        from transformers import AutoConfig

        draft = build(cfg, draft_config)
        target = AutoConfig.from_pretrained(cfg.model.target_model_path)
        want = (getattr(target, "rope_parameters", None) or {}).get("rope_theta", getattr(target, "rope_theta", None))
        got = draft.midlayer.self_attn.rotary_emb.base
        if want is not None and float(got) != float(want):
            raise ValueError(f"{cfg.model.draft_model_config}: the draft's RoPE base is {got}, the target's {want}")
        return draft

    return build_eagle3_draft


def apply() -> None:
    """Every code-level workaround, before SpecForge's trainer modules are imported."""
    _replace_triton_loss()
    _train_unwrapped()
    from specforge.algorithms import model_providers
    from specforge.modeling.target.target_head import TargetHead

    TargetHead.load_weights = _read_head
    model_providers.build_eagle3_draft = _check_rope(model_providers.build_eagle3_draft)


def _write_resolved(argv: list[str]) -> None:
    """The run config as SpecForge resolves it (its defaults filled in), beside its output."""
    from specforge.config import load_config

    config = argv[argv.index("--config") + 1]
    overrides = [a for a in argv[argv.index("--config") + 2 :] if "=" in a]
    cfg = load_config(config, overrides)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "resolved_config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")


def main(argv: list[str]) -> int:
    apply()
    if argv[:1] == ["check"]:
        import specforge.algorithms.eagle3.model  # noqa: F401  (the loss import the workaround replaces)
        import specforge.launch  # noqa: F401
        import specforge.training.assembly  # noqa: F401

        print(f"SpecForge's offline trainer imports on torch {torch.__version__}")
        return 0
    if argv[:1] != ["train"] or "--config" not in argv:
        print("usage: cpu_shim.py check | train --config RUN.yaml [section.field=value ...]", file=sys.stderr)
        return 2
    from specforge.cli import main as specforge_main

    _write_resolved(argv)
    return specforge_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
