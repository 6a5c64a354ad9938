"""The DFlash block drafter's facts for the doctor (drafters.base.DrafterChecks), from drafters.dflash.doctor."""

from __future__ import annotations

from eagle3lab.drafters.base import DrafterChecks


class DFlashChecks(DrafterChecks):
    name = "dflash"

    def doctor_checks(self, launch, draft, target) -> list:
        from eagle3lab.doctor.settings import check_context_length
        from eagle3lab.drafters.dflash.doctor import check_dflash

        return check_dflash(launch, draft, target) + check_context_length(draft, target, launch)

    def gguf_checks(self, launch, folder, pair, draft_gguf, target_gguf) -> list:
        from eagle3lab.drafters.dflash.doctor import check_dflash

        target = pair.target_info() if target_gguf else None
        return check_dflash(launch, folder, target, pair.draft if draft_gguf else None)

    def runtime_advice(self, launch) -> dict:
        from eagle3lab.drafters.dflash.doctor import DFLASH_CAUSES, DFLASH_WEAK, dflash_method_fix

        return {
            "causes": [DFLASH_CAUSES],
            "fix": dflash_method_fix(launch),
            "weak": DFLASH_WEAK,
            "check_when_weak": True,
        }

    def names_this_kind(self, launch) -> bool:
        from eagle3lab.drafters.dflash.doctor import METHODS

        return launch is not None and launch.algorithm in METHODS.values()


CHECKS = DFlashChecks()
