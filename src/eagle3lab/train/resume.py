"""What a training checkpoint carries besides the optimizer: the draft's trained weights, every RNG a step draws
from, and their safe reading (torch.load(weights_only=True): plain tensors, dicts, lists, numbers and strings)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import torch

from eagle3lab.io import InputError
from eagle3lab.models.checkpoint import load_state

CHECKPOINT = "checkpoint.pt"


def frozen(draft) -> dict:
    """The parameters training leaves as they are (an EAGLE-3 draft's copy of the target embedding): the target
    restores them, so checkpoints and the held-out pick leave them out."""
    return {name: p.data for name, p in draft.named_parameters() if not p.requires_grad}


def draft_weights(draft) -> dict:
    """The draft's weights on the CPU, less its frozen ones."""
    skip = frozen(draft)
    return {k: v.detach().to("cpu", copy=True) for k, v in draft.state_dict().items() if k not in skip}


def load_draft_weights(draft, weights: dict) -> None:
    draft.load_state_dict({**weights, **frozen(draft)})


def param_checksum(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def rng_state(device: torch.device) -> dict:
    """Every RNG a step may draw from, as tensors (so the checkpoint loads with weights_only=True)."""
    version, state, gauss = random.getstate()
    out = {"torch": torch.get_rng_state(), "python": torch.tensor(state, dtype=torch.int64), "python_version": version}
    out["python_gauss"] = gauss
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def set_rng_state(saved: dict, device: torch.device) -> None:
    torch.set_rng_state(saved["torch"])
    random.setstate((saved["python_version"], tuple(saved["python"].tolist()), saved["python_gauss"]))
    if device.type == "cuda" and "cuda" in saved:
        torch.cuda.set_rng_state(saved["cuda"], device)


def read_checkpoint(path: Path, identity: dict) -> dict:
    """A training checkpoint, loaded safely (weights_only: no code runs), made with these same settings."""
    state = load_state(path, "a training checkpoint")
    if state.get("identity") != identity:
        diff = sorted(k for k in identity if state.get("identity", {}).get(k) != identity[k])
        raise InputError(f"{path}: made with different settings ({', '.join(diff)}); cannot resume")
    return state
