"""vLLM's own doctor findings on a draft folder: the model class it builds from the architecture name under the
launch's method, and what `"method": "eagle"` does to an EAGLE-3 draft (vLLM refuses it, unlike SGLang)."""

from __future__ import annotations

from eagle3lab.doctor.artifacts import DraftInfo
from eagle3lab.doctor.findings import ERROR, OK, Finding
from eagle3lab.doctor.launch import Launch, fix_flags
from eagle3lab.engines.vllm import fields


def eagle3_under_eagle(launch: Launch, draft: DraftInfo, ev: list[str]) -> Finding:
    """vLLM under method eagle builds an EAGLE-1 class for the draft, which an EAGLE-3 checkpoint cannot fill."""
    arch = (draft.architectures or ["(none)"])[0]
    resolved = fields.draft_architecture("eagle", arch)
    why = f"vLLM {'builds' if resolved in fields.DRAFT_CLASSES else 'looks for'} {resolved} for it: " + (
        "an EAGLE-1 class with a 2 x H fc and no d2t, so the weights do not load"
        if resolved in fields.DRAFT_CLASSES
        else f"Model architectures ['{resolved}'] are not supported"
    )
    return Finding(
        "algorithm",
        ERROR,
        f"EAGLE-3 draft served with method {fields.ALGORITHM_METHODS[launch.algorithm]!r}: vLLM will not start",
        ev + [why, 'EAGLE-3 drafts need "method": "eagle3" (the target then captures the three aux states)'],
        fix=fix_flags(launch, algorithm="EAGLE3"),
    )


def check_architecture(launch: Launch | None, draft: DraftInfo | None) -> list[Finding]:
    """vLLM picks the draft's model class from its config's architecture name (prefixed for the method); a name that
    maps to another family's class starts without a complaint, with the layers this checkpoint lacks left at init."""
    if launch is None or draft is None or draft.kind not in fields.LLAMA_CLASSES:
        return []
    method = fields.ALGORITHM_METHODS.get(launch.algorithm or "")
    if method is None or (method == "eagle" and draft.kind == "eagle3"):
        return []  # check_algorithm reports the method
    cfg = draft.path / "config.json"
    qwen3 = fields.QWEN3_MARK in draft.shapes
    want = "Eagle3Qwen3ForCausalLM" if qwen3 else fields.LLAMA_CLASSES[method]
    fix = f'"architectures": ["{want if qwen3 else fields.LLAMA_NAMES[method]}"] in {cfg}'
    if not draft.architectures:
        return [
            Finding(
                "architecture",
                ERROR,
                "config.json names no architectures: vLLM cannot build the draft",
                [str(cfg)],
                fix=fix,
            )
        ]
    resolved = fields.draft_architecture(method, draft.architectures[0])
    cls = fields.DRAFT_CLASSES.get(resolved)
    ev = [
        f"{cfg}: architectures {draft.architectures}",
        f'under "method": "{method}" vLLM resolves {draft.architectures[0]} -> {resolved}'
        + (f", run by {cls}" if cls else ""),
        f"the checkpoint holds one {'Qwen3' if qwen3 else 'Llama'} decoder layer: it needs {want}",
    ]
    if cls is None:
        return [
            Finding("architecture", ERROR, f"vLLM refuses to start: {resolved} is not a draft it knows", ev, fix=fix)
        ]
    if cls != want:
        ev.append("vLLM starts without a complaint; the layers this checkpoint lacks keep their initial values")
        return [Finding("architecture", ERROR, f"vLLM builds the draft as {cls}, not {want}", ev, fix=fix)]
    return [Finding("architecture", OK, f"vLLM builds the draft as {cls}", ev)]
