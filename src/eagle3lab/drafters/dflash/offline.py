"""Exact offline acceptance of a DFlash draft, by the method EAGLE-3's uses (`decoding.offline`): at temperature 0 the
target's answer is fixed, so what each block accepts is fixed by it too. Every block a generation could draft is
drafted at once along the answer, and `decoding.offline.walk` counts the rounds exactly as the engine's greedy
verification does. A block's slots do not see each other's drafts (they are mask tokens), so a hit needs no earlier
hit; the walk still stops each round at the first miss."""

from __future__ import annotations

import torch

from eagle3lab.drafters.dflash.model import DFlashDraft, draft_blocks

ANCHORS_PER_FORWARD = 256  # blocks drafted in one forward: bounds the logits' memory (256 x 15 x 49,152 floats)


def block_hits(
    draft: DFlashDraft, embed, head, features, ids: torch.Tensor, first: int = 0, drafted: int | None = None
) -> torch.Tensor:
    """[drafted, T] bool, in `decoding.offline.draft_hits`' layout: hit[j, t] says the block anchored at t + 1
    (the target's features up to t, token t + 1 emitted) drafts token t + 2 + j correctly. Rows before `first` (the
    prompt, where no block is drafted) and positions past the text are misses. `drafted`: the block's mask tokens
    (default block_size - 1; fewer is the engines' truncated block, `model.draft_blocks`)."""
    t, drafted = ids.numel(), draft.config.drafted if drafted is None else drafted
    hits = torch.zeros(drafted, t, dtype=torch.bool)
    anchors = torch.arange(max(first + 1, 1), t - 1)
    with torch.inference_mode():
        for chunk in anchors.split(ANCHORS_PER_FORWARD):
            predicted = draft_blocks(draft, embed, head, features, ids, chunk, drafted).argmax(-1).cpu()  # [N, drafted]
            for j in range(drafted):
                label = chunk + 1 + j
                inside = label < t
                hits[j, chunk[inside] - 1] = predicted[inside, j] == ids[label[inside]]
    return hits
