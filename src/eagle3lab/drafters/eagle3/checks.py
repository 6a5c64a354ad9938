"""The EAGLE-3 drafter kind's facts for the doctor (drafters.base.DrafterChecks): the algorithm against the draft
(the seeds' EAGLE vs EAGLE3), capture layers, the vocab maps, config fields, the shape, and its llama.cpp GGUF."""

from __future__ import annotations

from eagle3lab.drafters.base import DrafterChecks

CAUSES = (
    "usual causes: an EAGLE-3 draft served with EAGLE/NEXTN (fc bypassed), capture layers or a vocab map "
    "(d2t) other than the draft was trained with, or a draft for another target"
)
WEAK = [
    "a data/quality issue, not a flag bug",
    "more on-policy training data (target-regenerated responses) raises it",
]
CONFIRM = "(if the draft is EAGLE-3; run the doctor with --draft to confirm)"


class Eagle3Checks(DrafterChecks):
    name = "eagle3"

    def doctor_checks(self, launch, draft, target) -> list:
        from eagle3lab.doctor.settings import check_context_length, check_spec_params
        from eagle3lab.drafters.eagle3.algorithm import check_algorithm, check_aux_layers
        from eagle3lab.drafters.eagle3.fields import check_draft_fields
        from eagle3lab.drafters.eagle3.vocab import check_draft_vocab

        findings = []
        if launch is not None and (launch.speculative or draft is not None):
            findings += check_algorithm(launch, draft, target)
        if launch is not None and draft is not None:
            findings += launch.syntax.draft_checks(launch, draft, target)
        findings += check_aux_layers(draft, target, launch)
        findings += check_draft_vocab(draft, target)
        findings += check_draft_fields(draft, target, launch)
        return findings + check_context_length(draft, target, launch) + check_spec_params(launch)

    def gguf_checks(self, launch, folder, pair, draft_gguf, target_gguf) -> list:
        from eagle3lab.engines.llamacpp.rules import eagle3_gguf_checks

        return eagle3_gguf_checks(launch, folder, pair, draft_gguf, target_gguf)

    def served_field_checks(self, launch, draft, target) -> list:
        from eagle3lab.drafters.eagle3.fields import check_draft_fields

        return check_draft_fields(draft, target, launch)

    def runtime_advice(self, launch) -> dict:
        from eagle3lab.doctor.launch import EAGLE_ALGORITHMS, fix_flags

        fix = None
        if launch is not None and launch.algorithm in EAGLE_ALGORITHMS:
            fix = fix_flags(launch, algorithm="EAGLE3") + "\n" + CONFIRM
        return {"causes": [CAUSES], "fix": fix, "weak": WEAK, "check_when_weak": False}


CHECKS = Eagle3Checks()
