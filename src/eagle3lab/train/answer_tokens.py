"""Answer tokens: the target tokens of the assistant turns a draft trains on, counted per conversation exactly as
training tokenizes them (`features.tokenize_file`: the target's chat template, truncation at max_len, records with
nothing to learn count 0), so drafts on different data can be matched at equal answer tokens. Only the tokenizer
loads, never the target's weights."""

from __future__ import annotations

from itertools import accumulate
from pathlib import Path

from eagle3lab.models.target import resolve
from eagle3lab.train.features import tokenize_file


def answer_token_counts(path, tokenizer, max_len: int) -> list[int]:
    """Answer tokens of every record of a JSONL file, in file order."""
    records, stats = tokenize_file(path, tokenizer, max_len)
    counts = [0] * stats["records"]
    for record in records:
        counts[record.index] = int(record.loss_mask.sum())
    return counts


def prefix_reaching(counts: list[int], tokens: int) -> int | None:
    """The fewest leading records whose answer tokens reach `tokens`; None when all of them fall short."""
    return next((n for n, total in enumerate(accumulate(counts), 1) if total >= tokens), None)


class AnswerTokens:
    """Per-file answer-token counts for one target and max_len; each file is tokenized once per instance."""

    def __init__(self, target: str, max_len: int):
        self.target = target
        self.max_len = max_len
        self._tokenizer = None
        self._counts: dict[Path, list[int]] = {}

    def __call__(self, path) -> list[int]:
        path = Path(path).resolve()
        if path not in self._counts:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(resolve(self.target))  # as load_target loads it
            self._counts[path] = answer_token_counts(path, self._tokenizer, self.max_len)
        return self._counts[path]
