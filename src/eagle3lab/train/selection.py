"""Held-out selection: the draft a run exports is the one with the best held-out accept length at any of its
evaluations (every eval_every steps, each epoch's end and the last step), not the last one, because acceptance can
peak while the training loss still falls. The checkpoint carries the best so far, weights included, so a resumed run
exports the draft an uninterrupted one would."""

from __future__ import annotations

from eagle3lab.train.resume import draft_weights


class BestDraft:
    """The best evaluation so far: `meta` = {"step", "epoch", "accept_length"} (epoch: the 0-based pass the step
    belongs to, as in metrics.jsonl) and the draft's weights then; both None before the first evaluation."""

    def __init__(self):
        self.meta: dict | None = None
        self.weights: dict | None = None
        self.stale = 0  # evaluations since the best (the patience rule's count)

    def offer(self, draft, step: int, epoch: int, length: float) -> None:
        """Keep `draft` if its held-out accept length (exact: the kind's walk, train.loop.Trainer.held_out) beats the
        best so far (ties keep the earlier)."""
        if self.meta is None or length > self.meta["accept_length"]:
            self.meta = {"step": step, "epoch": epoch, "accept_length": length}
            self.weights = draft_weights(draft)
            self.stale = 0
        else:
            self.stale += 1

    def state(self) -> dict | None:
        return None if self.meta is None else {**self.meta, "weights": self.weights, "stale": self.stale}

    def restore(self, saved: dict | None) -> None:
        self.meta = None if saved is None else {k: v for k, v in saved.items() if k not in ("weights", "stale")}
        self.weights = None if saved is None else saved["weights"]
        self.stale = 0 if saved is None else saved["stale"]
