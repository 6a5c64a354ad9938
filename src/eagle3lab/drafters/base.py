"""The drafter interface, in three parts by the layer that asks (a stage depends on every module a kind's door may
import, pipeline.stages.code_deps, and a door must not import the layer that calls it): `Drafter`, what training
asks of a kind; `DrafterChecks`, what the doctor asks (the facts its artifact must hold, the flags that serve it);
`DrafterTools`, what the benchmark layer and the export ask. A kind implements all three in its own folder
(drafters/<kind>/); the registries (drafters/__init__.py, drafters/tools.py) name it; the shared machinery never
does."""

from __future__ import annotations


class Drafter:
    """One drafter kind's training side. `name` is its key in drafters.KINDS and in each engine's table of what it
    calls each kind (vLLM's method, llama.cpp's spec type, SGLang's algorithm)."""

    name: str

    def train_config(self) -> type:
        """The options class its trainer takes (a TrainConfig, or one that extends it with the kind's own)."""
        raise NotImplementedError

    def train(self, config) -> dict:
        """Train (or resume) a draft; the trainer's result."""
        raise NotImplementedError

    def train_summary(self, result: dict) -> str:
        """What `eagle3lab train` prints of the trainer's result."""
        raise NotImplementedError

    def max_drafted(self, draft) -> int | None:
        """The most tokens one round of this draft can draft (a block's size less its anchor); None: no limit."""
        return None


class DrafterChecks:
    """One drafter kind's facts for the doctor."""

    name: str

    def doctor_checks(self, launch, draft, target) -> list:
        """The static checks of a draft folder (DraftInfo) under a launch line (either may be None) against the target
        (TargetInfo or None): the facts this kind's artifact must hold and the flags that serve it, the served context
        (doctor.settings.check_context_length) included where its findings belong."""
        raise NotImplementedError

    def gguf_checks(self, launch, folder, pair, draft_gguf: dict | None, target_gguf: dict | None) -> list:
        """llama.cpp's static checks of this kind's GGUF and the llama-server line: `pair` the draft and target GGUF
        paths (engines.llamacpp.rules.GGUFPair), `draft_gguf` / `target_gguf` their header facts where they were read,
        `folder` the draft folder it was exported from (DraftInfo or None)."""
        raise NotImplementedError

    def served_field_checks(self, launch, draft, target) -> list:
        """Checks of the draft folder's config fields that an engine serving an exported file still reads."""
        return []

    def runtime_advice(self, launch) -> dict:
        """What a probe that finds the draft unused or weak says for this kind: {"causes": [...], "fix": str | None,
        "weak": [...], "check_when_weak": bool (suggest the static checks)}."""
        raise NotImplementedError

    def names_this_kind(self, launch) -> bool:
        """Whether a launch line asks its engine for this kind (its method, spec type or algorithm)."""
        return False


class DrafterTools:
    """One drafter kind's tools: its exact offline acceptance, bench, local decoding, export, tune, and the llama.cpp
    engine that serves it. "Depth" is a kind's tokens drafted a round: a chain's steps, a block's masks."""

    name: str

    def load_for_acceptance(self, folder, target, dtype):
        """A draft folder of this kind loaded for `offline_acceptance` beside the target (models.target.Target), or
        an InputError naming the folder."""
        raise NotImplementedError

    def acceptance_depths(self, draft) -> list[int]:
        """The depths `offline_acceptance` scores a loaded draft at when it is given none."""
        raise NotImplementedError

    def offline_acceptance(
        self, drafts: dict, target, records, depths: list[int] | None, progress: bool = True
    ) -> list:
        """The exact offline acceptance (benchmark.acceptance.PromptAcceptance rows) of loaded drafts of this kind
        (name -> draft) on the evaluation set's `records`, at each of `depths`, or each draft's `acceptance_depths`
        where None; an InputError where a draft cannot draft a depth."""
        raise NotImplementedError

    def bench(self, settings, progress: bool = True) -> tuple[dict, str]:
        """`eagle3lab bench` (benchmark.run.BenchSettings) of drafts of this kind in `settings.engine` against its
        baseline: (the result, its text)."""
        raise NotImplementedError

    def local_engine(self, target, folder, eos_token_ids):
        """A draft folder of this kind in the local engine over the target, greedy: an engine whose
        `generate(prompt_ids, max_new_tokens)` gives a decoding.generation.Generation."""
        raise NotImplementedError

    def export_gguf(self, draft, target: str, out=None):
        """The draft as the GGUF llama.cpp serves, checked against the target; the file's path."""
        raise NotImplementedError

    def tune_settings(self) -> type:
        """The options class `eagle3lab tune` takes for a draft of this kind (benchmark.tune.TuneSettings, or one
        that extends it with the kind's own)."""
        raise NotImplementedError

    def tune(self, settings, progress: bool = True) -> tuple[dict, str]:
        """`eagle3lab tune` for a draft of this kind: (the result, its text)."""
        raise NotImplementedError

    def llamacpp_engine(self, target: str):
        """The llama-server engine (engines.llamacpp.server.LlamaCpp) that exports and serves a draft of this kind."""
        raise NotImplementedError
