"""The EAGLE-3 drafter kind, training side (drafters.base.Drafter): one decoder layer over the target's three captured
hidden states, trained with training-time test. Its folder holds its trainer (train.py, on train.loop.Trainer), its
TTT objective (loss.py), its exact chain acceptance (acceptance.py) and the doctor's facts of its artifact
(algorithm.py, vocab.py, fields.py), behind its doors: this module, checks.py and tools.py. Three of its parts stay
where the project grew them, shared: its network and config (models.draft, models.draft_config: DFlash reuses the
attention cache and config readers), its chain and tree proposals in the local engine (decoding.engine,
decoding.tree: the engine's verify and accept loop is theirs too), and its GGUF writer (engines.llamacpp.gguf, which
also converts the targets)."""

from __future__ import annotations

from eagle3lab.drafters.base import Drafter


class Eagle3(Drafter):
    name = "eagle3"

    def train_config(self) -> type:
        from eagle3lab.drafters.eagle3.train import Eagle3TrainConfig

        return Eagle3TrainConfig

    def train(self, config) -> dict:
        from eagle3lab.drafters.eagle3.train import train_draft

        return train_draft(config)

    def train_summary(self, result: dict) -> str:
        v = result["final_val"]
        return (
            f"trained {result['steps']} steps, {result['tokens_seen']} tokens at {result['tokens_per_s']:.0f} tok/s; "
            f"vocab coverage {result['vocab']['coverage']:.3f}"
            + (f"; held-out acc per TTT position {v['acc_pos']}" if v else "")
            + f"\ndraft: {result['draft']}"
        )


DRAFTER = Eagle3()
