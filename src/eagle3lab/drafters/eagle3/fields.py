"""Every draft config.json field an engine reads that can silently change what it serves (each engine's own table:
`engines/<engine>/fields.py`), checked before launch against the draft's own tensors and against the target's
config. A finding names the field, the value, what the draft's weights or its target say it should be, and what each
engine that reads the field does with it (the launch's engine first)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import NamedTuple

from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch
from eagle3lab.engines.registry import ENGINES

# Fields with a check of their own elsewhere in the doctor (check name), so this module does not judge them twice.
CHECKED_ELSEWHERE = {
    "eagle_aux_hidden_state_layer_ids": "aux_layers",
    "eagle_config.eagle_aux_hidden_state_layer_ids": "aux_layers",
    "target_hidden_size": "aux_layers",
    "d2t": "draft_vocab",
    "draft_vocab_size": "draft_vocab",
    "vocab_size": "draft_vocab",
    "tie_word_embeddings": "draft_vocab",
    "max_position_embeddings": "context_length",
    "architectures": "architecture",
}
ROPE_DEFAULT = 10000.0  # what transformers, vLLM and llama.cpp take when a config names no rope_theta


def _value(config: dict, name: str):
    head, _, key = name.partition(".")
    return (config.get(head) or {}).get(key) if key else config.get(name)


def _rope(config: dict) -> tuple[float, dict | None]:
    """(rope_theta, scaling or None) from either transformers' layout (rope_theta/rope_scaling, or rope_parameters)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        return float(params["rope_theta"]), scaling if scaling.get("rope_type", "default") != "default" else None
    scaling = config.get("rope_scaling")
    scaling = scaling if isinstance(scaling, dict) and scaling.get("rope_type", "default") != "default" else None
    return float(config.get("rope_theta") or ROPE_DEFAULT), scaling


def _heads(config: dict) -> tuple[int | None, int | None, int | None]:
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    return heads, config.get("num_key_value_heads") or heads, head_dim


def _weights(draft: DraftInfo, word: str) -> bool:
    return any(word in name for name in draft.shapes)


class Wrong(NamedTuple):
    """What a field should be and why; `certain` False: right only if the draft was not trained that way (the
    config is then the only record of training), so at most a warning."""

    want: object
    why: str
    certain: bool = True


# Each rule: (draft, target) -> Wrong, or None when the field is right (target None: not at hand).
Rule = Callable[[DraftInfo, TargetInfo | None], Wrong | None]


def _flag_needs_weights(name: str, weight: str) -> Rule:
    def rule(d: DraftInfo, t) -> Wrong | None:
        return (
            Wrong(False, f"the checkpoint has no {weight} weights") if d.get(name) and not _weights(d, weight) else None
        )

    return rule


def _trained_without(name: str) -> Rule:
    def rule(d: DraftInfo, t) -> Wrong | None:
        return (
            Wrong(False, "unless the draft's trainer used it: eagle3lab's never does", False) if d.get(name) else None
        )

    return rule


def _use_aux(d: DraftInfo, t) -> Wrong | None:
    use = _value(d.config, "eagle_config.use_aux_hidden_state")
    return Wrong(True, "fc.weight reads the three captured states") if use is False and d.fc_in else None


def _num_aux(d: DraftInfo, t) -> Wrong | None:
    count, width = d.get("num_aux_hidden_states"), d.target_hidden_size
    want = d.fc_in // width if d.fc_in and width else None
    return (
        Wrong(want, "fc.weight's input over the target width") if count is not None and want and count != want else None
    )


def _rope_theta(d: DraftInfo, t: TargetInfo | None) -> Wrong | None:
    stated = d.get("rope_theta") is not None or "rope_parameters" in d.config
    theirs = _rope(t.config)[0] if _states_rope(t) else None
    if not stated:  # a trainer that drops it (SpecForge under transformers 5.8) trained with the target's base
        return Wrong(theirs or "the target's", f"without it the engines take {ROPE_DEFAULT:g}")
    if theirs is not None and _rope(d.config)[0] != theirs:
        return Wrong(theirs, "the target's, unless the draft was trained with another base", False)
    return None


def _states_rope(t: TargetInfo | None) -> bool:
    return t is not None and (t.config.get("rope_theta") is not None or "rope_parameters" in t.config)


def _rope_scaling(d: DraftInfo, t: TargetInfo | None) -> Wrong | None:
    if not _states_rope(t) or _rope(d.config)[1] == _rope(t.config)[1]:
        return None
    return Wrong(_rope(t.config)[1], "the target's, unless the draft was trained with another scaling", False)


def _eps(d: DraftInfo, t: TargetInfo | None) -> Wrong | None:
    mine, theirs = d.get("rms_norm_eps"), (t.config if t else {}).get("rms_norm_eps")
    numbers = isinstance(mine, (int, float)) and isinstance(theirs, (int, float))
    differs = numbers and not math.isclose(mine, theirs, rel_tol=1e-3)
    return Wrong(theirs, "the target's, unless the draft was trained with another", False) if differs else None


def _head_split(index: int) -> Rule:
    def rule(d: DraftInfo, t: TargetInfo | None) -> Wrong | None:
        same_kind = t is not None and t.config.get("model_type") == d.get("model_type")
        if not same_kind or d.get("hidden_size") != t.config.get("hidden_size"):
            return None  # another architecture (or width) than the target's has an attention shape of its own
        mine, theirs = _heads(d.config)[index], _heads(t.config)[index]
        if theirs is None or mine == theirs:
            return None
        return Wrong(theirs, "the target's: trainers copy its attention shape, and no tensor shows the split", False)

    return rule


def _layers(d: DraftInfo, t) -> Wrong | None:
    n = d.get("num_hidden_layers", 1)
    return Wrong(1, "the checkpoint holds one decoder layer") if n != 1 and not _weights(d, "layers.1.") else None


def _act(d: DraftInfo, t) -> Wrong | None:
    return Wrong("silu", "llama.cpp runs every draft MLP as SiLU") if d.get("hidden_act", "silu") != "silu" else None


def _model_type(d: DraftInfo, t) -> Wrong | None:
    return None if d.get("model_type") else Wrong("llama", "vLLM picks the config class by it")


RULES: dict[str, Rule] = {
    "eagle_config.use_aux_hidden_state": _use_aux,
    "num_aux_hidden_states": _num_aux,
    "norm_before_fc": _flag_needs_weights("norm_before_fc", "input_norm"),
    "fc_norm": _flag_needs_weights("fc_norm", "fc_norm"),
    "bias": _flag_needs_weights("bias", "fc.bias"),
    "attention_bias": _flag_needs_weights("attention_bias", "proj.bias"),
    "norm_before_residual": _trained_without("norm_before_residual"),
    "norm_output": _trained_without("norm_output"),
    "rope_theta": _rope_theta,
    "rope_scaling": _rope_scaling,
    "rms_norm_eps": _eps,
    "num_attention_heads": _head_split(0),
    "num_key_value_heads": _head_split(1),
    "head_dim": _head_split(2),
    "num_hidden_layers": _layers,
    "hidden_act": _act,
    "model_type": _model_type,
}


def _readers(name: str, launch: Launch | None) -> list[tuple[str, object]]:
    """(engine title, its DraftField) for every engine that reads `name`, the launch's engine first."""
    found = [(e.title, f, e.name) for e in ENGINES.values() for f in e.fields if f.name == name]
    first = launch.engine if launch is not None else None
    return [(title, f) for title, f, engine in sorted(found, key=lambda x: x[2] != first)]


def check_draft_fields(draft: DraftInfo | None, target: TargetInfo | None, launch: Launch | None) -> list[Finding]:
    if draft is None:
        return []
    cfg = draft.path / "config.json"
    findings = []
    for name, rule in RULES.items():
        wrong = rule(draft, target)
        if wrong is None:
            continue
        readers = _readers(name, launch)
        here = [f for title, f in readers if launch is None or title == _title(launch)]
        key = name.rpartition(".")[2]
        findings.append(
            Finding(
                "draft_fields",
                ERROR if wrong.certain and any(f.silent for f in here) else WARNING,
                f"{name} {_value(draft.config, name)!r}: expected {wrong.want!r} ({wrong.why})",
                [str(cfg)] + [f"{title}: {f.effect}; {f.when_bad}" for title, f in readers],
                fix=f'"{key}": {json.dumps(wrong.want)} in {cfg}',
            )
        )
    if findings:
        return findings
    return [
        Finding(
            "draft_fields",
            OK,
            f"{len(RULES)} draft config fields agree with the weights and target",
            [", ".join(RULES)],
        )
    ]


def _title(launch: Launch) -> str:
    return ENGINES[launch.engine].title
