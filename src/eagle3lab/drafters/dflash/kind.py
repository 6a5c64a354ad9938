"""The DFlash block drafter as a drafter kind, training side (drafters.base.Drafter); its tools are
drafters.dflash.tools. Its config, model, training, offline walk, block proposal, export and doctor are this folder's
modules; these two are their doors for the shared machinery."""

from __future__ import annotations

from eagle3lab.drafters.base import Drafter


class DFlash(Drafter):
    name = "dflash"

    def train_config(self) -> type:
        from eagle3lab.drafters.dflash.train import DFlashTrainConfig

        return DFlashTrainConfig

    def train(self, config) -> dict:
        from eagle3lab.drafters.dflash.train import train_dflash

        return train_dflash(config)

    def train_summary(self, result: dict) -> str:
        best = result["best"] or {}
        return (
            f"trained {result['steps']} of {result['budget_steps']} steps at {result['tokens_per_s']:.0f} tok/s; "
            f"held-out accept length {best.get('accept_length')} at step {best.get('step')}\ndraft: {result['draft']}"
        )

    def max_drafted(self, draft) -> int | None:
        """A whole block: block_size - 1 masks after the anchor."""
        from eagle3lab.drafters.dflash.config import drafted_by

        return drafted_by(draft)


DRAFTER = DFlash()
