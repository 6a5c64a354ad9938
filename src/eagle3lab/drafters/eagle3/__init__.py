"""The EAGLE-3 drafter kind, training side (drafters.base.Drafter): one decoder layer over the target's three captured
hidden states, trained with training-time test; its tools are drafters.eagle3.tools. What is its own still lives
where the pipeline grew it, and these two modules are its doors for the shared machinery: the model and its config
(models.draft, models.draft_config), training (train.loop, train.loss), its exact offline walk (decoding.offline),
its chain and tree proposals (decoding.engine, decoding.tree), its GGUF (engines.llamacpp.gguf) and the doctor's
facts about its artifact (doctor.algorithm, doctor.vocab, doctor.fields, engines.llamacpp.rules). Moving those into
this folder is the rest of the drafters issue."""

from __future__ import annotations

from eagle3lab.drafters.base import Drafter


class Eagle3(Drafter):
    name = "eagle3"

    def train_config(self) -> type:
        from eagle3lab.train.config import TrainConfig

        return TrainConfig

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
