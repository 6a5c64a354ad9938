"""The DFlash block drafter's tools (drafters.base.DrafterTools): its GGUF, its tune (k alone, in every engine), and
the llama.cpp engine that serves it."""

from __future__ import annotations

from eagle3lab.drafters.base import DrafterTools


class DFlashTools(DrafterTools):
    name = "dflash"

    def export_gguf(self, draft, target: str, out=None):
        from eagle3lab.drafters.dflash.export import export_dflash_gguf

        return export_dflash_gguf(draft, target, out)

    def tune(self, settings, progress: bool = True) -> tuple[dict, str]:
        from eagle3lab.benchmark.tune_engine import format_engine_result
        from eagle3lab.drafters.dflash.tune import tune_dflash

        result = tune_dflash(settings)
        return result, format_engine_result(result)

    def llamacpp_engine(self, target: str):
        from eagle3lab.drafters.dflash.serve import DFlashLlamaCpp

        return DFlashLlamaCpp(target_spec=target)


TOOLS = DFlashTools()
