"""Does the target hand the draft what its fc layer expects? The algorithm vs the draft's kind (EAGLE-3 drafts need
EAGLE3, which captures three aux hidden states), the model class the engine builds from the draft's architecture name,
and the aux layers the engine captures vs the target's depth and width and vs the layers the draft was trained on."""

from __future__ import annotations

from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import EAGLE3_ALGORITHMS, EAGLE_ALGORITHMS, Launch, fix_flags


def _fmt_indices(indices: list[int]) -> str:
    return ", ".join(f"hidden_states[{i}]" for i in indices)


# long: one decision table, algorithm x draft kind, each case a finding with its own evidence
def check_algorithm(launch: Launch, draft: DraftInfo | None, target: TargetInfo | None) -> list[Finding]:
    algo = launch.algorithm
    where = f"{launch.source}: {launch.describe('algorithm')}"
    if draft is None:
        return [_algorithm_without_draft(launch, where)]
    kind = draft.kind
    ev = [
        where,
        f"draft {draft.path}: architectures {draft.architectures or ['(no architectures)']}, fc.weight "
        + (f"{list(draft.shapes['fc.weight'][0])}" if "fc.weight" in draft.shapes else "absent"),
    ]
    right = "EAGLE3" if kind == "eagle3" else "EAGLE"
    if not launch.speculative:
        return [
            Finding(
                "algorithm",
                ERROR,
                "no speculative algorithm: the draft is never loaded",
                ev
                + [f"without {launch.flag('algorithm')} the server runs the target alone (or refuses the draft path)"],
                fix=fix_flags(launch, algorithm=right),
            )
        ]
    ht = target.hidden_size if target else draft.target_hidden_size
    if kind == "eagle3" and algo in EAGLE_ALGORITHMS:
        return [launch.syntax.eagle3_under_eagle(launch, draft, ev) or _fc_bypassed(launch, draft, ht, ev)]
    if kind == "eagle" and algo in EAGLE3_ALGORITHMS:
        return [
            Finding(
                "algorithm",
                ERROR,
                "a non-EAGLE-3 (EAGLE-1/2) draft served with EAGLE3",
                ev
                + [
                    f"under EAGLE3 the target sends 3 x {ht} = {3 * ht} aux features",
                    f"this draft takes the final hidden state ({ht} features) and has no 3 x {ht} fc",
                ],
                fix=fix_flags(launch, algorithm="EAGLE"),
            )
        ]
    if kind == "eagle3" and algo in EAGLE3_ALGORITHMS:
        fc = draft.fc_in
        return [
            Finding(
                "algorithm",
                OK,
                "EAGLE-3 draft served with EAGLE3: the target sends the aux states fc expects",
                ev + [f"fc input {fc}, target sends {fc // ht if fc and ht else 3} x {ht}"],
            )
        ]
    if kind == "eagle" and algo in EAGLE_ALGORITHMS:
        return [Finding("algorithm", OK, f"EAGLE draft served with {algo}", ev)]
    if algo not in EAGLE_ALGORITHMS | EAGLE3_ALGORITHMS:
        return [
            Finding(
                "algorithm",
                ERROR if kind in ("eagle3", "eagle") else WARNING,
                f"{algo} does not run an EAGLE draft",
                ev
                + [f"the draft is an {kind.upper()} checkpoint; {algo} uses a different drafting scheme"]
                + launch.syntax.consequences(algo),
                fix=fix_flags(launch, algorithm=right),
            )
        ]
    return [
        Finding(
            "algorithm",
            WARNING,
            "could not tell whether the draft is EAGLE-3",
            ev + ["neither the architecture name nor the fc width identifies it"],
        )
    ]


def _algorithm_without_draft(launch: Launch, where: str) -> Finding:
    """Without the checkpoint only the draft's path can hint that it is EAGLE-3."""
    algo = launch.algorithm
    if algo in EAGLE_ALGORITHMS and launch.draft_path and "eagle3" in launch.draft_path.lower().replace("-", ""):
        return Finding(
            "algorithm",
            WARNING,
            f"the draft path names an EAGLE-3 draft but the algorithm is {algo}",
            [
                where,
                f"draft path {launch.draft_path}",
                "if it is an EAGLE-3 checkpoint its fc is bypassed (accept length 1.0); pass --draft to check",
            ],
            fix=fix_flags(launch, algorithm="EAGLE3"),
        )
    return Finding(
        "algorithm",
        WARNING,
        "algorithm vs draft not checked: the draft checkpoint is not at hand",
        [where, f"draft path {launch.draft_path or '(none)'}; pass --draft FOLDER"],
    )


def _fc_bypassed(launch: Launch, draft: DraftInfo, ht: int | None, ev: list[str]) -> Finding:
    """The seeds' bug: an EAGLE-3 draft under EAGLE/NEXTN gets the final hidden state, and fc is skipped."""
    fc, hd, algo = draft.fc_in, draft.hidden_size, launch.algorithm
    n_layers = fc // ht if fc and ht and fc % ht == 0 else 3
    return Finding(
        "algorithm",
        ERROR,
        f"EAGLE-3 draft served with {algo}: fc is bypassed, every draft token is rejected",
        ev
        + [
            f"the draft's fc expects {n_layers} x {ht} = {fc or n_layers * ht} features "
            f"(the target's aux hidden states, concatenated)",
            f"under {algo} the target captures no aux states and sends its final hidden state: {ht} features",
            f"SGLang applies fc only when the width differs from the draft's hidden size ({hd}); "
            + (
                "it does not, so fc is skipped silently"
                if ht == hd
                else "here it differs, so fc receives the wrong tensor and the launch fails or produces garbage"
            ),
            "the draft then predicts from features it was never trained on: accept length 1.0, no error, no warning",
        ],
        fix=fix_flags(launch, algorithm="EAGLE3"),
    )


def check_aux_layers(draft: DraftInfo | None, target: TargetInfo | None, launch: Launch | None) -> list[Finding]:
    if draft is None or draft.kind != "eagle3":
        return []
    if launch is not None and launch.algorithm not in EAGLE3_ALGORITHMS and launch.speculative:
        return []  # no aux states are captured at all; check_algorithm already says so
    ids = draft.aux_layer_ids
    fc = draft.fc_in
    if fc is None:
        return [
            Finding(
                "aux_layers",
                ERROR,
                "the draft has no fc.weight [hidden, 3 x target hidden]",
                [f"tensors: {', '.join(sorted(draft.shapes)[:12])}"],
                fix="export the draft with its fc.weight (eagle3lab.models.draft.save_draft)",
            )
        ]
    for name, value in (
        ("eagle_config.eagle_aux_hidden_state_layer_ids", ids),
        ("eagle_aux_hidden_state_layer_ids (top level, vLLM's)", draft.vllm_aux_layer_ids),
    ):
        if value is not None and (not isinstance(value, list) or not all(isinstance(i, int) for i in value)):
            return [
                Finding(
                    "aux_layers",
                    ERROR,
                    f"{name} is not a list of integers",
                    [f"{draft.path / 'config.json'}: {value!r}"],
                    fix='"eagle_aux_hidden_state_layer_ids": [1, 14, 26]',
                )
            ]
    source = (
        f"explicit eagle_aux_hidden_state_layer_ids {ids} (id i = output of layer i = hidden_states[i+1])"
        if ids is not None
        else "SGLang defaults: the inputs of layers [2, N//2, N-3]"
    )
    if target is None:
        return _aux_without_target(draft, ids, source)
    return _aux_against_target(draft, target, launch, source)


def _aux_without_target(draft: DraftInfo, ids: list[int] | None, source: str) -> list[Finding]:
    """Only the draft's own config to go by: fc against its target_hidden_size."""
    fc, ht = draft.fc_in, draft.target_hidden_size
    n = len(ids) if ids is not None else 3
    sev = OK if fc == n * ht else ERROR
    return [
        Finding(
            "aux_layers",
            WARNING,
            "capture layers not checked against the target (no target config)",
            [source, "pass --target PATH|ID to check that the layers exist"],
        ),
        Finding(
            "aux_layers",
            sev,
            f"fc input width {fc} {'=' if sev == OK else '!='} {n} x {ht} (draft's target_hidden_size)",
            [f"fc.weight {draft.shapes['fc.weight'][0]}"],
        ),
    ]


def _captured(draft: DraftInfo, target: TargetInfo, launch: Launch | None, source: str):
    """(the hidden_states the engine captures, the ones the draft was trained on, why) or an error Finding. The
    trainers (SpecForge, this package) and SGLang read eagle_config's ids alike, so those are the trained layers."""
    from eagle3lab.models.target import TargetError, aux_hidden_indices

    n_layers = target.num_layers
    try:
        trained = aux_hidden_indices(n_layers, draft.aux_layer_ids)
        own = launch.syntax.aux_capture(draft.config, n_layers) if launch is not None else None
        return (own[0], trained, own[1]) if own else (trained, trained, source)
    except TargetError as e:
        default_ids = [i - 1 for i in aux_hidden_indices(n_layers)]
        return Finding(
            "aux_layers",
            ERROR,
            "the draft asks for aux layers the target does not have",
            [source, f"target {target.source}: {n_layers} decoder layers", str(e)],
            fix=f'"eagle_aux_hidden_state_layer_ids": {default_ids} in {draft.path / "config.json"} '
            f"(SGLang's defaults for a {n_layers}-layer target), or retrain the draft on existing layers",
        )


def _aux_against_target(draft: DraftInfo, target: TargetInfo, launch: Launch | None, source: str) -> list[Finding]:
    """The layers the engine will capture exist in the target, there are three, fc takes exactly their width, and
    they are the layers the draft was trained on."""
    captured = _captured(draft, target, launch, source)
    if isinstance(captured, Finding):
        return [captured]
    indices, trained, source = captured
    fc = draft.fc_in
    n_layers = target.num_layers
    findings = [] if indices == trained else [_capture_differs(draft, indices, trained, source)]
    expected = len(indices) * target.hidden_size
    ev = [
        source,
        f"target {target.source}: {n_layers} layers, hidden {target.hidden_size}",
        f"captured: {_fmt_indices(indices)} -> {len(indices)} x {target.hidden_size} = {expected} features",
        f"draft fc.weight {draft.shapes['fc.weight'][0]}: takes {fc}",
    ]
    if len(indices) != 3:
        findings.append(
            Finding(
                "aux_layers",
                ERROR,
                f"{len(indices)} aux layers, but SGLang's EAGLE-3 fc takes exactly 3",
                ev,
                fix="list exactly three layer ids in eagle_aux_hidden_state_layer_ids",
            )
        )
    elif fc != expected:
        dth = draft.config.get("target_hidden_size")
        why = f"the draft was built for a target of hidden {fc // 3}" if fc % 3 == 0 else "fc width is not 3 x anything"
        if dth and dth != target.hidden_size:
            why += f" (config target_hidden_size {dth}); this target has hidden {target.hidden_size}"
        findings.append(
            Finding(
                "aux_layers",
                ERROR,
                f"fc input width {fc} != {len(indices)} x {target.hidden_size} = {expected}",
                ev + [why],
                fix="serve the draft with the target it was trained on, or retrain it for this target",
            )
        )
    else:
        ok = f"aux layers exist and fc width matches: {len(indices)} x {target.hidden_size} = {fc}"
        findings.append(Finding("aux_layers", OK, ok, ev))
    if draft.config.get("target_hidden_size") is None and draft.hidden_size != target.hidden_size:
        findings.append(_no_target_hidden_size(draft, target))
    return findings


def _capture_differs(draft: DraftInfo, captured: list[int], trained: list[int], source: str) -> Finding:
    """vLLM reads layer ids its own way (top-level key first, no +1): the target may hand over other layers."""
    cfg = draft.path / "config.json"
    shifted = len(captured) == len(trained) and all(c == t - 1 for c, t in zip(captured, trained))
    ev = [
        source,
        f"vLLM captures {_fmt_indices(captured)}",
        f"the draft was trained on {_fmt_indices(trained)} (eagle_config's ids as the trainers read them, "
        "or the defaults)",
    ]
    fix = (
        f'"eagle_aux_hidden_state_layer_ids": {trained} at the top level of {cfg} '
        "(vLLM reads it first, as hidden_states indices; SGLang ignores it)"
    )
    if shifted:
        return Finding(
            "aux_layers",
            WARNING,
            "vLLM captures each aux state one layer earlier than the draft was trained on",
            ev + ["the neighbouring layer's residual stream is similar: a small, silent loss of acceptance"],
            fix=fix,
        )
    return Finding(
        "aux_layers",
        ERROR,
        "vLLM captures other target layers than the draft was trained on",
        ev + ["fc mixes features the draft never saw: acceptance collapses without an error or a warning"],
        fix=fix,
    )


def _no_target_hidden_size(draft: DraftInfo, target: TargetInfo) -> Finding:
    """SGLang sizes fc from config.target_hidden_size, falling back to the draft's own hidden size."""
    return Finding(
        "aux_layers",
        ERROR,
        "config.json lacks target_hidden_size while the draft hidden differs from the target's",
        [
            f"draft hidden {draft.hidden_size}, target hidden {target.hidden_size}: "
            f"SGLang builds fc as 3 x {draft.hidden_size}"
        ],
        fix=f'"target_hidden_size": {target.hidden_size} in {draft.path / "config.json"}',
    )
