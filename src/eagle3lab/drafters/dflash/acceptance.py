"""Exact offline acceptance of DFlash drafts on the evaluation set (`benchmark.eval_set`): the rows, pooling and
tables of `benchmark.acceptance`, with the block's hits in place of the chain's. A block of size B is scored at B - 1
drafts, or at each k of `ks`: the block truncated to the anchor and k masks, as the engines serve it at k (the depths
`eagle3lab acceptance --depths` gives a DFlash draft)."""

from __future__ import annotations

from eagle3lab.benchmark.acceptance import PromptAcceptance
from eagle3lab.benchmark.eval_set import teacher_forced
from eagle3lab.decoding.offline import walk
from eagle3lab.drafters.dflash.offline import block_hits
from eagle3lab.io import InputError


def evaluate(
    drafts: dict, target, records, progress: bool = True, ks: list[int] | None = None
) -> list[PromptAcceptance]:
    """PromptAcceptance of every DFlash draft (name -> DFlashDraft) on every record: one target forward a record
    for every draft that reads the same target layers. `ks`: score each draft at these drafted tokens, each a truncated
    block (rows at depth k), instead of its whole block; a draft whose block drafts fewer is refused."""
    from tqdm import tqdm

    for name, draft in drafts.items():
        beyond = [k for k in ks or [] if not 1 <= k <= draft.config.drafted]
        if beyond:
            size = draft.config.block_size
            raise InputError(
                f"DFlash draft {name}: a block of {size} drafts 1 to {size - 1} tokens a round, not "
                f"{','.join(map(str, beyond))}"
            )

    embed = target.model.get_input_embeddings().weight
    head = target.model.get_output_embeddings().weight
    by_layers: dict[tuple, dict] = {}
    for name, draft in drafts.items():
        by_layers.setdefault(tuple(draft.config.target_layer_ids), {})[name] = draft
    out = []
    for layers, group in by_layers.items():
        for tf in tqdm(teacher_forced(target, records, list(layers)), total=len(records), disable=not progress):
            prompt_tokens, tokens = len(tf.record.prompt_ids), max(tf.answer_tokens - 1, 0)
            for name, draft in group.items():
                for k in ks or [draft.config.drafted]:
                    hits = block_hits(draft, embed, head, tf.aux, tf.ids, first=prompt_tokens - 1, drafted=k)
                    accepted = walk(hits, prompt_tokens, tf.answer_tokens, k)
                    out.append(PromptAcceptance(name, tf.record.set, tf.record.id, k, tokens, accepted, tf.cut))
    return out
