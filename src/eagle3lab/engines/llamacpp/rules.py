"""llama.cpp's doctor rules that need no server: the draft GGUF against the target GGUF (gguf.draft_mismatches, the
one home of those rules) and against the folder it was trained from, and the line's --spec-* settings.

What llama.cpp 11434 starts without a complaint and then serves badly, measured on real servers (the wheel's Q4_1
SmolLM2-135M, the committed draft; the right line, --spec-type draft-eagle3 --spec-draft-n-max 2, gives 1.52 tokens
per target step on four MT-bench prompts):
- --spec-type draft-simple: the EAGLE-3 GGUF runs as a standalone draft model, without the target's hidden states:
  1.04 (2% of the draft tokens accepted).
- no --spec-type: llama.cpp infers a type from the draft GGUF only for MTP, DFlash and DSpark drafts; the EAGLE-3
  draft is loaded and never used (/slots: speculative false).
- a GGUF whose eagle3.target_layers are not the trained layers: converted against a 24-layer config ([2, 12, 21])
  1.17, from a config with top-level eagle_aux_hidden_state_layer_ids [0, 1, 2] 1.02.
- --spec-draft-p-min 0.99 (1 drafting round in 144 tokens: 1.01; 0.95: 6, 1.04; 0.9: 8, 1.07), and
  --spec-draft-n-min above --spec-draft-n-max (every draft dropped).
- --spec-draft-n-max 0: /health answers, the first request aborts the server.
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3lab.doctor.artifacts import DraftInfo, TargetInfo
from eagle3lab.doctor.findings import ERROR, OK, WARNING, Finding
from eagle3lab.doctor.launch import Launch, fix_flags
from eagle3lab.engines.llamacpp.gguf import (
    DRAFT_ARCH,
    SPEC_TYPE,
    default_target_layers,
    draft_mismatches,
    gguf_facts,
    trained_target_layers,
)
from eagle3lab.engines.llamacpp.launch_line import DEFAULTS, LLAMACPP
from eagle3lab.io import InputError

# at or above this p-min (almost) no round drafts (measured: 0.9 -> 1.07 tokens per target step, 0.99 -> 1.01)
P_MIN_STOPS_DRAFTING = 0.9
EXPORT_FIX = (
    "export the draft folder against this target: eagle3lab export DRAFT_FOLDER --target TARGET --out DRAFT.gguf "
    "(llama.cpp's convert_hf_to_gguf.py with --target-model-dir of this target)"
)


def is_gguf(path) -> bool:
    return bool(path) and str(path).endswith(".gguf")


@dataclass
class GGUFPair:
    """The draft and target GGUF files a llama.cpp diagnosis checks (either may be unknown): the doctor's view of an
    engine's own files (`EngineEntry.files`)."""

    draft: str | None
    target: str | None

    owns = staticmethod(is_gguf)  # an input that is one of these files, not a draft folder or target config

    def target_info(self) -> TargetInfo | None:
        return target_info(self.target) if self.target else None

    def read(self) -> tuple[list[Finding], dict | None, dict | None]:
        """(findings of files that cannot be read, the draft's header facts, the target's): what a drafter kind's
        GGUF checks judge (drafters.base.DrafterChecks.gguf_checks). The target is read only beside a draft."""
        draft = target = None
        findings = []
        if self.draft:
            draft, more = _read(self.draft, "draft")
            findings += more
        if self.target and self.draft:
            target, more = _read(self.target, "target")
            findings += more
        return findings, draft, target


def gguf_pair(launch: Launch | None, draft, target) -> GGUFPair | None:
    """The GGUFs the inputs name: --draft / --target when they are .gguf files, else a llama-server line's -md / -m;
    None when there is neither a GGUF nor a llama-server line (not a llama.cpp diagnosis)."""
    line = launch if launch is not None and launch.engine == LLAMACPP.engine else None
    pair = GGUFPair(
        str(draft) if is_gguf(draft) else line and line.draft_path,
        str(target) if is_gguf(target) else line and line.model_path,
    )
    return pair if line is not None or pair.draft or pair.target else None


_READ_FIX = {
    "draft": "-md (or --draft): the draft's GGUF (eagle3lab export DRAFT_FOLDER writes one)",
    "target": "-m (or --target): the target's GGUF",
}


def target_info(path: str) -> TargetInfo | None:
    """The target GGUF as the generic checks know a target (layers, width, vocab, trained context); None: unreadable."""
    try:
        facts = gguf_facts(path)
    except InputError:
        return None
    if not (facts["block_count"] and facts["embedding_length"]):
        return None
    config = {k: v for k, v in facts["config"].items() if v is not None}
    return TargetInfo(
        path, facts["block_count"], facts["embedding_length"], facts["vocab_size"], facts["context_length"], config
    )


def _read(path: str, what: str) -> tuple[dict | None, list[Finding]]:
    try:
        return gguf_facts(path), []
    except InputError as e:
        return None, [Finding("gguf", ERROR, f"the {what} GGUF cannot be read", [str(e)], fix=_READ_FIX[what])]


def _facts_text(facts: dict) -> str:
    if facts["architecture"] == DRAFT_ARCH:
        head = facts["draft_vocab_size"]
        d2t = "d2t" if facts["d2t_max_target_id"] is not None else "no d2t"
        return (
            f"{facts['path']}: eagle3, target_layers {facts['target_layers']}, target_hidden_size "
            f"{facts['target_hidden_size']}, vocab {facts['vocab_size']}, head {head} ({d2t})"
        )
    return (
        f"{facts['path']}: {facts['architecture']}, {facts['block_count']} layers, embedding_length "
        f"{facts['embedding_length']}, vocab {facts['vocab_size']}"
    )


def check_fit(draft: dict, target: dict, folder: DraftInfo | None) -> list[Finding]:
    """The draft GGUF against the target GGUF (draft_mismatches), and against what its folder was trained on."""
    n_layers = target["block_count"]
    trained = trained_target_layers(folder.config, n_layers) if folder is not None and n_layers else None
    ev = [_facts_text(draft), _facts_text(target)]
    if trained is not None:
        ev.append(f"{folder.path / 'config.json'}: trained on the inputs of target layers {trained}")
    where = f"draft {draft['path']}: "  # draft_mismatches names the file first; the evidence names both
    problems = draft_mismatches(draft, target, trained)
    if problems:
        return [Finding("gguf", ERROR, p.removeprefix(where), ev, fix=EXPORT_FIX) for p in problems]
    layers, defaults = draft["target_layers"], default_target_layers(n_layers or 0)
    if trained is None and n_layers and layers != defaults:
        return [
            Finding(
                "gguf",
                WARNING,
                f"eagle3.target_layers {layers} are not the defaults for a {n_layers}-layer target ({defaults})",
                ev
                + [
                    "right only if the draft was trained on them; llama.cpp serves a GGUF naming other layers without "
                    "a complaint (top-level ids [0, 1, 2] for a draft trained on the defaults: 1.02 measured)",
                    "pass --draft FOLDER (the folder it was exported from) to check",
                ],
            )
        ]
    return [Finding("gguf", OK, "the draft GGUF fits the target GGUF", ev)]


def check_spec_type(launch: Launch, draft: dict | None) -> list[Finding]:
    """Only draft-eagle3 hands an EAGLE-3 draft the target's hidden states; llama.cpp takes any other type, or none."""
    if launch.draft_path is None:
        return []
    types = launch.spec_config["types"]
    kind = f"draft {launch.draft_path}: " + (f"general.architecture {draft['architecture']!r}" if draft else "unread")
    ev = [f"{launch.source}: {launch.describe('algorithm')}", kind]
    if types == [SPEC_TYPE]:
        return [Finding("algorithm", OK, f"--spec-type {SPEC_TYPE}: the draft reads the target's hidden states", ev)]
    fix = fix_flags(launch, algorithm="EAGLE3")
    if not types:
        why = [
            "llama.cpp infers a type from the draft GGUF only for MTP, DFlash and DSpark drafts "
            "(common_speculative_types_from_gguf): an EAGLE-3 draft is loaded and never drafts",
            "the server starts and answers at the target's own speed; /slots reports speculative false",
        ]
        return [
            Finding("algorithm", ERROR, "no --spec-type: llama.cpp never runs the EAGLE-3 draft", ev + why, fix=fix)
        ]
    why = [f"only {SPEC_TYPE} hands the draft the target's hidden states (the three captured layers fc reads)"]
    if "draft-simple" in types:
        why.append(
            "draft-simple runs the EAGLE-3 GGUF as a standalone draft model: it starts without a complaint and "
            "every draft token is rejected (1.04 tokens per target step measured)"
        )
    if SPEC_TYPE in types:
        why.append(
            f"{SPEC_TYPE} beside another draft type fails every request (HTTP 500: failed to process speculative "
            "batch, measured with draft-simple)"
        )
    title = f"--spec-type {','.join(types)}: the EAGLE-3 draft is not run as EAGLE-3"
    return [Finding("algorithm", ERROR, title, ev + why, fix=fix)]


def check_draft_length(launch: Launch) -> list[Finding]:
    """--spec-draft-n-max / -n-min / -p-min: llama.cpp takes values under which no round drafts, or it aborts."""
    if not launch.speculative or launch.syntax.missing_draft(launch):  # no draft runs: its length is moot
        return []
    spec = launch.spec_config
    n_max, n_min, p_min = spec["n_max"], spec["n_min"], spec["p_min"]
    ev = [f"{launch.source}: " + ", ".join(LLAMACPP.describe(launch, key) for key in DEFAULTS)]
    findings = []
    if n_max < 1:
        why = "GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) in llama_context::decode"
        findings.append(
            Finding(
                "spec_params",
                ERROR,
                f"--spec-draft-n-max {n_max}: llama-server starts, then aborts on the first request",
                ev + [f"/health answers; the first completion kills the server ({why})"],
                fix=fix_flags(launch, num_steps=DEFAULTS["n_max"]),
            )
        )
    elif n_min > n_max:
        findings.append(
            Finding(
                "spec_params",
                ERROR,
                f"--spec-draft-n-min {n_min} > --spec-draft-n-max {n_max}: every draft is dropped",
                ev
                + [
                    "llama.cpp drafts up to n-max tokens, then drops a draft shorter than n-min: the draft runs "
                    "every round and nothing is ever verified (0 drafting rounds measured)"
                ],
                fix=fix_flags(launch, n_min=0),
            )
        )
    if p_min >= P_MIN_STOPS_DRAFTING:
        findings.append(
            Finding(
                "spec_params",
                ERROR,
                f"--spec-draft-p-min {p_min:g}: (almost) no round drafts",
                ev
                + [
                    "llama.cpp stops a draft where the draft's top token is below p-min (its probability among the "
                    "top 10); with the committed draft 0.9 drafted in 8 rounds of 144 tokens, 0.95 in 6, 0.99 in 1",
                    "its log's mean len counts drafting rounds only and rises with p-min: judge tokens per target step",
                ],
                fix=fix_flags(launch, p_min=0.0),
            )
        )
    if findings:
        return findings
    return [Finding("spec_params", OK, f"the draft proposes up to {n_max} tokens per round", ev)]


def eagle3_gguf_checks(launch: Launch | None, folder, pair: GGUFPair, draft: dict | None, target: dict | None):
    """An EAGLE-3 GGUF against the target's (or a warning that it is not checked), and the line's --spec-* settings."""
    findings = []
    if draft is not None and target is not None:
        findings += check_fit(draft, target, folder)
    elif draft is not None and not pair.target:
        findings.append(
            Finding(
                "gguf",
                WARNING,
                "the draft GGUF is not checked against a target",
                [_facts_text(draft)],
                fix="--target TARGET.gguf, or --launch with the llama-server line (-m)",
            )
        )
    if launch is not None and launch.engine == LLAMACPP.engine:
        findings += check_spec_type(launch, draft) + check_draft_length(launch)
    return findings
