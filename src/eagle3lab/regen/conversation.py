"""One conversation regenerated turn by turn (each answer conditioned on the regenerated history): the state both
backends drive."""

from __future__ import annotations

from dataclasses import dataclass, field

from eagle3lab.regen.batching import TurnResult
from eagle3lab.regen.inputs import Job, messages_for


@dataclass
class Conversation:
    job: Job
    history: list[dict] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)

    def next_user(self) -> str | None:
        k = len(self.turns)
        return self.job.users[k] if k < len(self.job.users) else None

    def add(self, result: TurnResult) -> None:
        self.history.append({"role": "assistant", "content": result.text})
        self.turns.append({"finish_reason": result.finish_reason, "new_tokens": result.new_tokens})

    def prompt_messages(self) -> list[dict]:
        self.history.append({"role": "user", "content": self.next_user()})
        return messages_for(self.job.system, self.history)

    def output(self, generation: dict) -> dict:
        return {
            "id": self.job.key,
            "source_id": self.job.source_id,
            **self.job.labels,
            "conversations": messages_for(self.job.system, self.history),
            "turns": self.turns,
            "generation": generation,
        }
