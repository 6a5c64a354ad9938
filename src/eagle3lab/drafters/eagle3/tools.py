"""The EAGLE-3 drafter kind's tools (drafters.base.DrafterTools): its GGUF, its tune (chains and trees), and the
llama.cpp engine that serves it."""

from __future__ import annotations

from dataclasses import asdict

from eagle3lab.drafters.base import DrafterTools


class Eagle3Tools(DrafterTools):
    name = "eagle3"

    def export_gguf(self, draft, target: str, out=None):
        from eagle3lab.engines.llamacpp.gguf import export_gguf

        return export_gguf(draft, target, out)

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
