"""The DFlash block drafter's tools (drafters.base.DrafterTools): its exact offline acceptance (whole or truncated
blocks), its bench and local block decoding, its GGUF, its tune (k alone, in every engine), and the llama.cpp engine
that serves it."""

from __future__ import annotations

from eagle3lab.drafters.base import DrafterTools


class DFlashTools(DrafterTools):
    name = "dflash"

    def load_for_acceptance(self, folder, target, dtype):
        from eagle3lab.drafters.dflash.model import load_dflash

        return load_dflash(folder, dtype).to(next(target.model.parameters()).device)

    def acceptance_depths(self, draft) -> list[int]:
        """The whole block."""
        return [draft.config.drafted]

    def offline_acceptance(
        self, drafts: dict, target, records, depths: list[int] | None, progress: bool = True
    ) -> list:
        """Each depth a truncated block, as the engines serve k < block_size - 1."""
        from eagle3lab.drafters.dflash.acceptance import evaluate

        return evaluate(drafts, target, records, progress, ks=depths)

    def bench(self, settings, progress: bool = True) -> tuple[dict, str]:
        """One draft at its whole block against the engine's baseline, outputs compared (`serve.local`, `serve.served`);
        its k is tune's to choose, so the configs are not read."""
        from eagle3lab.benchmark.served import SERVED_COLUMNS
        from eagle3lab.benchmark.table import render_rows
        from eagle3lab.drafters.dflash import serve
        from eagle3lab.io import InputError

        if len(settings.drafts) != 1:
            raise InputError(
                f"--draft: a DFlash bench times one draft against its engine's baseline, not {settings.drafts}"
            )
        result = (serve.local if settings.engine == "local" else serve.served)(settings, settings.drafts[0])
        return result, render_rows(result["rows"], SERVED_COLUMNS)

    def local_engine(self, target, folder, eos_token_ids):
        """The whole block."""
        from eagle3lab.drafters.dflash.engine import DFlashEngine
        from eagle3lab.drafters.dflash.model import load_dflash

        draft = load_dflash(folder, next(target.model.parameters()).dtype)
        return DFlashEngine(target.model, draft, eos_token_ids=eos_token_ids)

    def export_gguf(self, draft, target: str, out=None):
        from eagle3lab.drafters.dflash.export import export_dflash_gguf

        return export_dflash_gguf(draft, target, out)

    def tune_settings(self) -> type:
        from eagle3lab.drafters.dflash.tune import DFlashTuneSettings

        return DFlashTuneSettings

    def tune(self, settings, progress: bool = True) -> tuple[dict, str]:
        from eagle3lab.benchmark.tune_engine import format_engine_result
        from eagle3lab.drafters.dflash.tune import tune_dflash

        result = tune_dflash(settings)
        return result, format_engine_result(result)

    def llamacpp_engine(self, target: str):
        from eagle3lab.drafters.dflash.serve import DFlashLlamaCpp

        return DFlashLlamaCpp(target_spec=target)


TOOLS = DFlashTools()
