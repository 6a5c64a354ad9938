"""Launch settings against the draft: the served context vs the draft's positions, steps/topk/num-draft-tokens (through
eagle3lab.decoding.config, the one home of that rule), a line that asks for speculation and names no draft, and --draft
vs the draft the launch line serves."""

from __future__ import annotations

from pathlib import Path

from eagle3lab.decoding.config import SpecConfig
from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch, fix_flags

HF_LLAMA_DEFAULT_MAX_POSITIONS = 2048  # what a Llama config without max_position_embeddings falls back to


def check_context_length(draft: DraftInfo | None, target: TargetInfo | None, launch: Launch | None) -> list[Finding]:
    if draft is None:
        return []
    cfg = draft.path / "config.json"
    draft_max = draft.get("max_position_embeddings")
    ev = []
    if draft_max is None:
        draft_max = HF_LLAMA_DEFAULT_MAX_POSITIONS
        ev.append(f"{cfg} has no max_position_embeddings: Llama configs default to {draft_max}")
    if launch is not None and launch.context_length:
        served, why = launch.context_length, f"{launch.describe('context_length')} ({launch.source})"
    elif target is not None and target.max_position_embeddings:
        flag = launch.flag("context_length") if launch else "--context-length"
        served, why = (
            target.max_position_embeddings,
            f"target max_position_embeddings {target.max_position_embeddings} (no {flag})",
        )
    else:
        return [
            Finding(
                "context_length",
                WARNING,
                "served context length unknown: draft positions not checked",
                ev + [f"draft max_position_embeddings {draft_max}; pass --launch with --context-length or --target"],
            )
        ]
    ev += [f"draft max_position_embeddings {draft_max}", f"served context: {why}"]
    if draft_max < served:
        return [
            Finding(
                "context_length",
                ERROR,
                f"the draft's positions stop at {draft_max} but the server accepts {served} tokens",
                ev + ["beyond the draft's rotary range acceptance collapses on long inputs, silently"],
                fix=f'"max_position_embeddings": {served} in {cfg}'
                + (f"\nor serve with {launch.corrected(context_length=draft_max)}" if launch and launch.argv else ""),
            )
        ]
    return [Finding("context_length", OK, f"draft positions {draft_max} cover the served context {served}", ev)]


def check_spec_params(launch: Launch | None) -> list[Finding]:
    if launch is None or not launch.speculative:
        return []
    values = {key: getattr(launch, key) for key in ("num_steps", "topk", "num_draft_tokens")}
    given = {k: v for k, v in values.items() if v is not None}
    ev = [f"{launch.source}: {launch.syntax.describe_spec(launch)}"]
    if not given and launch.syntax.missing_spec_params:
        return [
            Finding(
                "spec_params",
                ERROR,
                f"no draft length: {launch.flag('num_steps')} is missing",
                ev + [launch.syntax.missing_spec_params],
                fix=fix_flags(launch, num_steps=3),
            )
        ]
    if not given:
        return [Finding("spec_params", OK, "steps/topk/num-draft-tokens left to SGLang's per-model defaults", ev)]
    if len(given) < 3:
        steps = launch.num_steps or 3
        return [
            Finding(
                "spec_params",
                ERROR,
                "set all three of steps / topk / num-draft-tokens, or none",
                ev + ["SGLang auto-chooses them only when none is given; a partial set fails or mixes with defaults"],
                fix=fix_flags(launch, num_steps=steps, topk=1, num_draft_tokens=steps + 1),
            )
        ]
    bad = [f"{launch.flag(k)} {v} must be >= 1" for k, v in values.items() if v < 1]
    if bad:
        return [
            Finding(
                "spec_params",
                ERROR,
                "non-positive speculative parameters",
                ev + bad,
                fix=fix_flags(launch, num_steps=3, topk=1, num_draft_tokens=4),
            )
        ]
    spec = SpecConfig(1, launch.num_steps, launch.topk, launch.num_draft_tokens)
    try:
        spec.validate_shape()
    except ValueError as e:
        return [_spec_mismatch(launch, spec, ev + [f"eagle3lab.decoding.config: {e}"])]
    return [
        Finding(
            "spec_params",
            OK,
            f"steps {spec.steps}, topk {spec.topk}, num-draft-tokens {spec.num_draft_tokens} are consistent",
            ev,
        )
    ]


def _spec_mismatch(launch: Launch, spec: SpecConfig, ev: list[str]) -> Finding:
    """Word what SpecConfig.validate rejected as SGLang users see it, with the nearest valid num-draft-tokens."""
    steps, topk, ndraft = spec.steps, spec.topk, spec.num_draft_tokens
    if topk == 1:
        return Finding(
            "spec_params",
            WARNING,
            f"topk 1 needs num-draft-tokens = steps + 1 = {steps + 1}, got {ndraft}",
            ev + [f"SGLang silently overrides it to {steps + 1}: what you benchmark is not what you set"],
            fix=fix_flags(launch, num_draft_tokens=steps + 1),
        )
    if ndraft > spec.max_draft_tokens:
        return Finding(
            "spec_params",
            WARNING,
            f"num-draft-tokens {ndraft} exceeds the draft tree "
            f"(1 + topk + (steps - 1) x topk^2 = {spec.max_draft_tokens})",
            ev,
            fix=fix_flags(launch, num_draft_tokens=spec.max_draft_tokens),
        )
    return Finding(
        "spec_params",
        WARNING,
        f"num-draft-tokens {ndraft} leaves no draft token to verify",
        ev,
        fix=fix_flags(launch, num_draft_tokens=topk + 1),
    )


def check_draft_named(launch: Launch, draft_arg: str | None) -> list[Finding]:
    """A line that asks for speculation and names no draft: each engine says what it then does (its LaunchSyntax's
    missing_draft, read from its pinned source); --draft does not help, the engine never sees it."""
    why = launch.syntax.missing_draft(launch)
    if not why:
        return []
    given = [f"--draft {draft_arg}: checked here, but the launch line does not pass it"] if draft_arg else []
    named = {"draft_path": draft_arg or launch.syntax.draft_placeholder}
    if not launch.speculative:  # drafting settings alone: the fix turns EAGLE-3 on as well
        named["algorithm"] = "EAGLE3"
    return [
        Finding(
            "draft",
            ERROR,
            f"{launch.describe('algorithm')}: the line asks for speculation and names no draft, so none runs",
            [f"{launch.source}: {launch.describe('draft_path')}", *why, *given],
            fix=fix_flags(launch, **named),
        )
    ]


def check_launch_vs_draft_path(launch: Launch, draft_arg: str | None) -> list[Finding]:
    if not draft_arg or not launch.draft_path:
        return []
    a, b = Path(draft_arg).expanduser(), Path(launch.draft_path).expanduser()
    same = a.exists() and b.exists() and a.resolve() == b.resolve()
    if same or str(a) == str(b):
        return []
    return [
        Finding(
            "draft",
            WARNING,
            "--draft is not the draft the launch line serves",
            [
                f"--draft {draft_arg}",
                f"{launch.source}: {launch.describe('draft_path')}",
                "the checks use --draft; make sure it is the same checkpoint",
            ],
        )
    ]
