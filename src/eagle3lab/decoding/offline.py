"""Exact offline acceptance of a greedy chain draft, the part every measure shares (the benchmark's evaluation set,
training's held-out pick): the draft teacher-forced along a fixed answer, and the engine's round walk over it.

At temperature 0 the target's answer does not depend on the draft, so what a chain of depth k accepts in each round
is fixed by that answer: the draft runs teacher-forced along it (every position at once, as training's TTT unroll
does), and each round counts the draft's run of tokens up to its first miss, exactly as the engine's greedy
verification does (a token outside the draft vocabulary is a miss); the walk then moves past the accepted run plus
the target's bonus token. tests/test_acceptance.py checks it against the local engine on SmolLM2 in float32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def draft_hits(draft, aux: torch.Tensor, ids: torch.Tensor, depth: int, first: int = 0) -> torch.Tensor:
    """[depth, T] bool: hit[j, t] says the chain rooted at draft position t (the target's feature at t, token t+1)
    drafts token t+2+j correctly, given tokens t+1..t+1+j were right. Positions past the text are misses, and so are
    the positions before `first` (chains rooted there are not drafted: the walk starts at the prompt's last token)."""
    t = ids.numel()
    parameter = next(draft.parameters())
    ids, aux = ids.to(parameter.device), aux.to(parameter.device)
    with torch.inference_mode():
        hidden = draft.project(aux.to(parameter.dtype))
        inputs = F.pad(ids[1:], (0, 1))
        positions = torch.arange(t, device=ids.device)[None]
        logits = draft.ttt_forward(inputs[None], hidden[None], positions, depth, first)
    hits = torch.zeros(depth, t, dtype=torch.bool)
    for j, step in enumerate(logits):
        predicted = draft.draft_to_target(step[0, step.shape[1] - (t - first) :].argmax(-1))  # positions first..
        n = t - 2 - j - first
        if n > 0:
            hits[j, first : first + n] = (predicted[:n] == ids[first + 2 + j :]).cpu()
    return hits


def last_answer(loss_mask: torch.Tensor) -> tuple[int, int]:
    """(prompt tokens, answer tokens) of a conversation's last assistant turn, from its loss mask."""
    mask = loss_mask.bool().tolist()
    if not any(mask):
        return len(mask), 0
    end = len(mask) - 1 - mask[::-1].index(True)
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return start, end - start + 1


def walk(hits: torch.Tensor, prompt_tokens: int, answer_tokens: int, depth: int) -> list[int]:
    """Draft tokens accepted in each round of a chain of `depth` along an answer of `answer_tokens` tokens.

    The prefill emits the first answer token; each round accepts the draft's leading hits and adds the target's bonus
    token, until the answer is complete (the engine stops the same way, at the answer's length or its stop token)."""
    rounds, emitted, anchor = [], 1, prompt_tokens - 1
    row = hits[:depth].tolist()
    while emitted < answer_tokens:
        m = 0
        while m < depth and row[m][anchor]:
            m += 1
        rounds.append(m)
        emitted += m + 1
        anchor += m + 1
    return rounds
