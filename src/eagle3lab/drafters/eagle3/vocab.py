"""The draft vocabulary: vocab sizes against the target, lm_head rows, and the d2t / t2d maps SGLang uses to turn
draft ids into target ids (tied embeddings silently replace the trained head)."""

from __future__ import annotations

from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding


def check_draft_vocab(draft: DraftInfo | None, target: TargetInfo | None) -> list[Finding]:
    if draft is None:
        return []
    cfg = draft.path / "config.json"
    findings = []
    vocab = draft.get("vocab_size")
    dvocab = draft.get("draft_vocab_size") or vocab
    tvocab = target.vocab_size if target and target.vocab_size else vocab
    if draft.get("tie_word_embeddings"):
        findings.append(_tied_head(draft))
    if not isinstance(vocab, int) or not isinstance(dvocab, int):
        return findings + [
            Finding(
                "draft_vocab",
                ERROR,
                "config.json lacks vocab_size / draft_vocab_size",
                [f"{cfg}: vocab_size {vocab!r}, draft_vocab_size {draft.get('draft_vocab_size')!r}"],
                fix=f'set "vocab_size": <target vocab> and "draft_vocab_size": <rows of lm_head.weight> in {cfg}',
            )
        ]
    if target and target.vocab_size and vocab != target.vocab_size:
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                f"draft vocab_size {vocab} != target vocab {target.vocab_size}",
                [f"{cfg}", f"target {target.source}"],
                fix="use the draft trained for this target",
            )
        )
    lm = draft.shapes.get("lm_head.weight")
    if lm is None:
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                "the draft has no lm_head.weight",
                ["SGLang would fall back to the target's head only when draft_vocab_size is unset"],
                fix="export the draft with lm_head.weight [draft_vocab_size, hidden]",
            )
        )
    elif lm[0][0] != dvocab or (draft.hidden_size and lm[0][1] != draft.hidden_size):
        findings.append(
            Finding(
                "draft_vocab",
                ERROR,
                f"lm_head.weight {lm[0]} does not match draft_vocab_size x hidden = [{dvocab}, {draft.hidden_size}]",
                [f"{cfg}: draft_vocab_size {dvocab}, hidden_size {draft.hidden_size}"],
                fix=f'"draft_vocab_size": {lm[0][0]} in {cfg} if lm_head is right, else re-export the draft',
            )
        )
    return findings + _vocab_map(draft, dvocab, tvocab)


def _vocab_map(draft: DraftInfo, dvocab: int, tvocab: int) -> list[Finding]:
    """d2t (draft id -> target id offsets) must be there with one entry per draft id."""
    if dvocab == tvocab and "d2t" not in draft.shapes:
        return [Finding("draft_vocab", OK, f"draft vocab = target vocab ({tvocab}): no d2t mapping needed", [])]
    d2t_shape = draft.shapes.get("d2t")
    if d2t_shape is None:
        return [
            Finding(
                "draft_vocab",
                ERROR,
                f"no d2t tensor: draft ids 0..{dvocab - 1} would be read as target ids",
                [
                    f"draft_vocab_size {dvocab} < target vocab {tvocab}; "
                    "SGLang and vLLM map draft -> target ids only through d2t (vLLM keeps a zero map)"
                ],
                fix="export d2t (int64 [draft_vocab_size], target id = draft id + d2t[draft id]) with the weights",
            )
        ]
    if d2t_shape[0] != [dvocab]:
        return [
            Finding(
                "draft_vocab",
                ERROR,
                f"d2t shape {d2t_shape[0]} != [draft_vocab_size {dvocab}]",
                [],
                fix="re-export d2t from the draft vocab used in training",
            )
        ]
    return _map_consistency(draft, d2t_shape, dvocab, tvocab)


def _map_consistency(draft: DraftInfo, d2t_shape, dvocab: int, tvocab: int) -> list[Finding]:
    """d2t lands in the target vocab one-to-one, and t2d marks exactly the ids d2t reaches (numpy arrays: the static
    doctor imports no torch)."""
    import numpy as np

    ids = draft.array("d2t").astype(np.int64) + np.arange(dvocab, dtype=np.int64)
    ev = [f"d2t {d2t_shape[0]} {d2t_shape[1]}: target ids {int(ids.min())}..{int(ids.max())}"]
    bad = []
    if int(ids.min()) < 0 or int(ids.max()) >= tvocab:
        bad.append(f"d2t maps draft ids outside the target vocab [0, {tvocab})")
    taken = dvocab - len(np.unique(ids))
    if taken:
        bad.append(f"d2t maps {taken} draft ids onto target ids already taken")
    findings = []
    t2d_shape = draft.shapes.get("t2d")
    if t2d_shape is None:
        findings.append(
            Finding(
                "draft_vocab",
                WARNING,
                "no t2d tensor (SGLang ignores it; SpecForge-style tools expect it)",
                [],
                fix="export t2d (bool [target vocab], True for target ids in the draft vocab)",
            )
        )
    elif t2d_shape[0] != [tvocab]:
        bad.append(f"t2d shape {t2d_shape[0]} != [target vocab {tvocab}]")
    else:
        t2d = draft.array("t2d").astype(bool)
        ev.append(f"t2d {t2d_shape[0]}: {int(t2d.sum())} target ids marked")
        if int(t2d.sum()) != dvocab:
            bad.append(f"t2d marks {int(t2d.sum())} target ids, draft_vocab_size is {dvocab}")
        elif not bool(t2d[np.clip(ids, 0, tvocab - 1)].all()):
            bad.append("t2d and d2t disagree: some mapped target ids are not marked in t2d")
    if bad:
        return findings + [
            Finding(
                "draft_vocab",
                ERROR,
                "d2t / t2d are inconsistent with the vocab sizes",
                ev + bad,
                fix="re-export d2t and t2d from the same draft vocab (eagle3lab.models.draft.save_draft)",
            )
        ]
    ok = f"draft vocab {dvocab} -> target vocab {tvocab}: d2t/t2d consistent, lm_head rows match"
    return findings + [Finding("draft_vocab", OK, ok, ev)]


def _tied_head(draft: DraftInfo) -> Finding:
    cfg = draft.path / "config.json"
    return Finding(
        "draft_vocab",
        ERROR,
        "tie_word_embeddings is true: SGLang replaces the draft's lm_head with embed_tokens",
        [
            f"{cfg}: tie_word_embeddings true",
            f"embed_tokens has {draft.get('vocab_size')} rows (target vocab) while the trained lm_head "
            f"has {draft.shapes.get('lm_head.weight', ([None],))[0][0]} rows over the draft vocab; "
            "d2t then maps the wrong ids",
        ],
        fix=f'"tie_word_embeddings": false in {cfg}',
    )
