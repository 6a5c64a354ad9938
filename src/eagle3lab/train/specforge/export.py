"""SpecForge's checkpoint as one of our draft folders: the draft weights of its newest `RUN_ID-stepN/
training_state.pt` (bf16, the frozen embedding left out), the draft config it trained and the target's embedding,
written by models.draft.save_draft, so our engine, the served engines and the doctor read it as they read ours.

    python -m eagle3lab.train.specforge.export --checkpoint RUN_OUTPUT_OR_STATE --draft-config CONFIG.json
        --output DRAFT [--target smollm2-135m-instruct]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

from eagle3lab.io import InputError, require
from eagle3lab.models.checkpoint import load_state, normalise_key, read_json
from eagle3lab.models.draft import EMBEDDING, Eagle3Draft, save_draft
from eagle3lab.models.draft_config import DraftConfig
from eagle3lab.models.target import DEFAULT_TARGET, load_target
from eagle3lab.train.specforge.inputs import RUN_ID

STATE_FILE = "training_state.pt"


def latest_state(run_output) -> Path:
    """The state file of the newest checkpoint SpecForge wrote under its output folder."""
    found = []
    for folder in Path(run_output).glob(f"{RUN_ID}-step*"):
        step = re.fullmatch(rf"{RUN_ID}-step(\d+)", folder.name)
        if step and (folder / STATE_FILE).exists():
            found.append((int(step.group(1)), folder / STATE_FILE))
    if not found:
        raise InputError(f"{run_output}: no {RUN_ID}-stepN/{STATE_FILE}: SpecForge saved no checkpoint there")
    return max(found)[1]


def read_state(path) -> dict:
    """A SpecForge EAGLE-3 training state, loaded safely (weights_only: no code runs)."""
    state = load_state(path, "a SpecForge checkpoint")
    if not isinstance(state, dict) or state.get("strategy") != "eagle3":
        found = state.get("strategy") if isinstance(state, dict) else type(state).__name__
        raise InputError(f"{path}: field 'strategy' is {found!r}, expected 'eagle3'")
    require(state, "draft_state_dict", str(path), dict)
    return state


def target_embedding(spec: str) -> torch.Tensor:
    """The target's input embedding, which the draft shares (SpecForge freezes it and saves none)."""
    return load_target(spec).model.get_input_embeddings().weight.detach()


def export_draft(state_path, draft_config: dict, embedding: torch.Tensor, out) -> Path:
    """Write the draft in `state_path` (a SpecForge training_state.pt) as our draft folder `out`; `draft_config` is
    the config.json it was trained with, `embedding` the target's input embedding."""
    state = read_state(state_path)
    model = Eagle3Draft(DraftConfig.from_sglang(draft_config, where=f"{state_path}: its draft config"))
    weights = {normalise_key(k): v for k, v in state["draft_state_dict"].items()}
    weights.setdefault(EMBEDDING, embedding)  # frozen, so SpecForge saves none
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:  # missing, unexpected or misshapen tensors, all listed
        raise InputError(f"{state_path}: field 'draft_state_dict' does not fit the draft config: {e}") from None
    return save_draft(model, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3lab.train.specforge.export",
        description="Write a SpecForge checkpoint as our draft folder.",
    )
    parser.add_argument(
        "--checkpoint", required=True, help=f"a {STATE_FILE}, or SpecForge's output folder (the newest)"
    )
    parser.add_argument("--draft-config", required=True, help="the draft config.json SpecForge trained with")
    parser.add_argument("--output", required=True, help="the draft folder to write")
    parser.add_argument("--target", default=DEFAULT_TARGET, help="the target whose embedding the draft reads")
    args = parser.parse_args(argv)
    try:
        state = Path(args.checkpoint)
        state = state if state.is_file() else latest_state(state)
        print(export_draft(state, read_json(args.draft_config), target_embedding(args.target), args.output))
    except (InputError, ValueError) as e:
        print(f"eagle3lab specforge export: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
