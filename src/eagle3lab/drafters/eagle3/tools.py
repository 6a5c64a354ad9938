"""The EAGLE-3 drafter kind's tools (drafters.base.DrafterTools): its exact offline acceptance and bench (chains,
and trees in the local engine), its chain in the local engine, its GGUF, its tune (chains and trees), and the llama.cpp
engine that serves it."""

from __future__ import annotations

from dataclasses import asdict

from eagle3lab.drafters.base import DrafterTools

DEFAULT_DEPTHS = (3, 5)  # the chain depths `eagle3lab acceptance` scores unless --depths says


class Eagle3Tools(DrafterTools):
    name = "eagle3"

    def load_for_acceptance(self, folder, target, dtype):
        from eagle3lab.benchmark.systems import load_bench_draft

        return load_bench_draft(folder, target, dtype, "DRAFT")

    def acceptance_depths(self, draft) -> list[int]:
        return list(DEFAULT_DEPTHS)

    def offline_acceptance(
        self, drafts: dict, target, records, depths: list[int] | None, progress: bool = True
    ) -> list:
        from eagle3lab.drafters.eagle3.acceptance import evaluate

        return evaluate(drafts, target, records, depths or list(DEFAULT_DEPTHS), progress)

    def bench(self, settings, progress: bool = True) -> tuple[dict, str]:
        """Every draft at every config in our engine (trees, adaptive drafting, HF peers), or chains in a served one."""
        if settings.engine == "local":
            from eagle3lab.benchmark.run import format_table, run_benchmark

            result = run_benchmark(settings=settings, progress=progress)
            return result, format_table(result)
        from eagle3lab.benchmark.served import SERVED_COLUMNS, run_served_benchmark
        from eagle3lab.benchmark.table import render_rows

        result = run_served_benchmark(settings)
        return result, render_rows(result["rows"], SERVED_COLUMNS)

    def local_engine(self, target, folder, eos_token_ids):
        """The chain of bench's first drafting shape (1,3,1,4)."""
        from eagle3lab.benchmark.run import DEFAULT_CONFIGS
        from eagle3lab.benchmark.systems import load_bench_draft
        from eagle3lab.decoding.engine import SpecEngine

        draft = load_bench_draft(folder, target, next(target.model.parameters()).dtype, "DRAFT")
        return SpecEngine(target.model, draft, DEFAULT_CONFIGS[1], eos_token_ids=eos_token_ids)

    def export_gguf(self, draft, target: str, out=None):
        from eagle3lab.engines.llamacpp.gguf import export_gguf

        return export_gguf(draft, target, out)

    def tune_settings(self) -> type:
        from eagle3lab.benchmark.tune import TuneSettings

        return TuneSettings

    def tune(self, settings, progress: bool = True) -> tuple[dict, str]:
        """In the local engine: chains and trees from its acceptance and this machine's costs; in a served engine:
        each chain shape timed there."""
        if settings.engine == "local":
            from eagle3lab.benchmark.tune import format_result, tune

            result = tune(settings, progress=progress)
            return result, format_result(result)
        from eagle3lab.benchmark.tune_engine import format_engine_result, tune_in_engine

        result = tune_in_engine(settings) | {"settings": asdict(settings)}
        return result, format_engine_result(result)

    def llamacpp_engine(self, target: str):
        from eagle3lab.engines.llamacpp.server import LlamaCpp

        return LlamaCpp(target_spec=target)


TOOLS = Eagle3Tools()
