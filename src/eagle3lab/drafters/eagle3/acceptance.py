"""Exact offline acceptance of EAGLE-3 drafts on the evaluation set (benchmark.eval_set): each draft walks the
target's own greedy answers as a chain (decoding.offline.draft_hits, then the engine's round walk) into
benchmark.acceptance's rows, at every depth from one pass of its deepest chain."""

from __future__ import annotations

from eagle3lab.benchmark.acceptance import PromptAcceptance
from eagle3lab.decoding.offline import draft_hits, walk


def evaluate(drafts: dict, target, records, depths: list[int], progress: bool = True) -> list[PromptAcceptance]:
    """PromptAcceptance of every draft (name -> Eagle3Draft) at every depth on every record. One target forward per
    record serves every draft that reads the same target layers."""
    from tqdm import tqdm

    from eagle3lab.benchmark.eval_set import teacher_forced
    from eagle3lab.models.target import aux_hidden_indices

    by_layers: dict[tuple, dict] = {}
    for name, draft in drafts.items():
        layers = tuple(aux_hidden_indices(target.num_layers, draft.config.aux_layer_ids))
        by_layers.setdefault(layers, {})[name] = draft
    deepest = max(depths)
    out = []
    for group in by_layers.values():
        forced = teacher_forced(target, records, next(iter(group.values())).config.aux_layer_ids)
        for tf in tqdm(forced, total=len(records), disable=not progress, desc="acceptance"):
            prompt_tokens, tokens = len(tf.record.prompt_ids), max(tf.answer_tokens - 1, 0)
            for name, draft in group.items():
                hits = draft_hits(draft, tf.aux, tf.ids, deepest, first=prompt_tokens - 1)
                for depth in depths:
                    accepted = walk(hits, prompt_tokens, tf.answer_tokens, depth)
                    out.append(PromptAcceptance(name, tf.record.set, tf.record.id, depth, tokens, accepted, tf.cut))
    return out
