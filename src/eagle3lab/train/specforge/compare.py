"""Our trainer against SpecForge's on the same data: both train on the same conversations (SpecForge reads our
feature cache), with the same draft vocabulary mapping, draft config, capture layers, TTT length and epochs, each at
its own default learning rate, and ours again at SpecForge's; then every draft is benchmarked in each engine asked
for (`eagle3lab bench`: accept length, per-position acceptance, speedup) and checked by the doctor.

    python -m eagle3lab.train.specforge.compare --data TRAIN.jsonl --output DIR [--max-records 150] [--epochs 1]
        [--steps ours,specforge,ours-at-specforge-lr,bench] [--engines local,vllm]

Every step keeps what a finished earlier call made with the same settings, so the steps can run one call at a time;
the table is printed from whatever is there (DIR/compare.json holds it). SpecForge's environment: `make specforge`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from eagle3lab.benchmark.engine_choice import ENGINES
from eagle3lab.benchmark.run import BenchSettings, run_benchmark, split_list
from eagle3lab.benchmark.served import SERVED_COLUMNS, run_served_benchmark
from eagle3lab.benchmark.table import BENCH_COLUMNS, Column, render_rows
from eagle3lab.decoding.config import BASELINE
from eagle3lab.devices import DEVICE_HELP
from eagle3lab.doctor.diagnosis import diagnose
from eagle3lab.drafters import drafter
from eagle3lab.io import InputError, write_json
from eagle3lab.models.checkpoint import read_json
from eagle3lab.models.target import DEFAULT_TARGET
from eagle3lab.options import add_options, from_options, option
from eagle3lab.serving.client import ServerError
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.loop import RESUMABLE, TrainingError
from eagle3lab.train.specforge.inputs import prepare_inputs
from eagle3lab.train.specforge.training import train_specforge

STEPS = ("ours", "specforge", "ours-at-specforge-lr", "bench")


@dataclass
class CompareSettings:
    data: str = option(help="training conversations, ShareGPT-style JSONL")
    output: str = option(help="folder of both trainers' runs, the drafts (drafts/), the benchmarks and compare.json")
    max_records: int | None = option(150, "use the first N conversations of --data")
    epochs: int = option(1, "passes over the data, both trainers")
    ttt_length: int = option(TrainConfig.ttt_length, "training-time-test length, both trainers")
    draft_vocab_size: int = option(TrainConfig.draft_vocab_size, "draft vocabulary, our trainer's (SpecForge's: ours)")
    max_len: int = option(TrainConfig.max_len, "truncate conversations to this many tokens, both trainers")
    target: str = option(DEFAULT_TARGET, "target model: embedded name, local folder or Hugging Face id")
    features_cache: str | None = option(None, "root of our feature cache (default artifacts/features)")
    steps: list[str] = option(STEPS, f"comma-separated, of {','.join(STEPS)}", type=split_list, metavar="STEPS")
    engines: list[str] = option(("local", "vllm"), f"benchmark engines, of {','.join(ENGINES)}", type=split_list)
    sets: list[str] = option(BenchSettings.sets, "comma-separated evaluation sets", type=split_list, metavar="SETS")
    limit: int | None = option(8, "prompts per set")
    max_new_tokens: int = option(BenchSettings.max_new_tokens, "tokens generated per prompt")
    configs: list[str] = option(("1,3,1,4",), "draft shapes, chains 1,k,1,k+1 (the served engines draft chains)")
    dtype: str = option(BenchSettings.dtype, "benchmark model dtype")
    eager: bool = option(BenchSettings.eager, "vllm: --enforce-eager instead of its default compile")
    device: str = option("auto", f"where our trainer and the benchmark run: {DEVICE_HELP}")
    threads: int | None = option(None, "torch threads of our trainer and the benchmark")
    progress: bool = option(True, "show progress")

    def check(self) -> None:
        for name, known, given in (("steps", STEPS, self.steps), ("engines", ENGINES, self.engines)):
            unknown = sorted(set(given) - set(known))
            if unknown:
                raise InputError(f"--{name}: unknown {', '.join(unknown)} (known: {', '.join(known)})")


def _train_config(s: CompareSettings, name: str, lr: float | None) -> TrainConfig:
    cfg = drafter("eagle3").train_config()(  # the EAGLE-3 trainer's own options
        data=s.data,
        output=str(Path(s.output) / name),
        target=s.target,
        device=s.device,
        features_cache=s.features_cache,
        max_records=s.max_records,
        draft_vocab_size=s.draft_vocab_size,
        ttt_length=s.ttt_length,
        epochs=s.epochs,
        max_len=s.max_len,
        threads=s.threads,
        progress=s.progress,
    )
    return cfg if lr is None else replace(cfg, lr=lr)


def _plain(settings: dict) -> dict:
    """Settings as they read back from JSON (tuples become lists), to compare with a stored copy."""
    return json.loads(json.dumps(settings))


def _train_ours(cfg: TrainConfig) -> dict:
    """Our trainer's run, or the finished one already there with these settings."""
    path = Path(cfg.output) / "result.json"
    if path.exists():
        result = read_json(path)
        if all(result["config"].get(k) == v for k, v in _plain(asdict(cfg)).items() if k not in RESUMABLE):
            return result
        raise InputError(f"{path}: a run with other settings; choose another --output")
    # the project's own EAGLE-3 trainer, through the drafter registry (its SpecForge twin is this module's other side)
    return drafter("eagle3").train(replace(cfg, resume=(Path(cfg.output) / "checkpoint.pt").exists()))


def _trainer_lr(result: dict) -> tuple[str, float]:
    """(trainer, learning rate) of a run's result.json, ours (TrainConfig's lr) or SpecForge's (the one it used)."""
    if result.get("trainer") == "specforge":
        return "specforge", result["learning_rate"]
    return "ours", result["config"]["lr"]


def _link(output: Path, result: dict) -> None:
    """drafts/<trainer>-lr<lr>: the draft under a name the benchmark's tables show."""
    trainer, lr = _trainer_lr(result)
    link = output / "drafts" / f"{trainer}-lr{lr:g}"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(Path(result["draft"]).resolve(), link.parent))


def train_all(s: CompareSettings) -> None:
    out = Path(s.output)
    if "ours" in s.steps:
        _link(out, _train_ours(_train_config(s, "ours", None)))
    if "specforge" in s.steps:
        prepare_inputs(out / "ours", out / "specforge-inputs")
        _link(out, train_specforge(out / "specforge-inputs", out / "specforge", progress=s.progress))
    if "ours-at-specforge-lr" in s.steps:
        lr = read_json(out / "specforge" / "result.json")["learning_rate"]
        _link(out, _train_ours(_train_config(s, "ours-at-specforge-lr", lr)))


def bench_all(s: CompareSettings) -> None:
    """Each engine's benchmark of every draft in drafts/, kept when made with the same settings."""
    out = Path(s.output)
    drafts = sorted(str(p) for p in (out / "drafts").iterdir()) if (out / "drafts").is_dir() else []
    if not drafts:
        raise InputError(f"{out / 'drafts'}: no drafts to benchmark yet; run the training steps first")
    for engine in s.engines:
        settings = BenchSettings(
            target=s.target,
            sets=s.sets,
            limit=s.limit,
            max_new_tokens=s.max_new_tokens,
            configs=[BASELINE.label, *s.configs],
            drafts=drafts,
            peers=[],
            dtype=s.dtype,
            threads=s.threads,
            device=s.device,
            engine=engine,
            eager=s.eager,
        )
        path = out / f"bench-{engine}.json"
        if path.exists() and read_json(path).get("settings") == _plain(asdict(settings)):
            continue
        if engine == "local":
            result = run_benchmark(settings=settings, progress=s.progress)
        else:
            result = run_served_benchmark(settings)
        write_json(path, {**result, "settings": asdict(settings)})


TRAINED_COLUMNS = (
    Column("draft", "draft", 24, left=True),
    Column("trainer", "trainer", 9, left=True),
    Column("lr", "lr", 8, ".1e"),
    Column("steps", "steps", 6),
    Column("train s", "seconds", 8, ".0f"),
    Column("doctor", "doctor", 6, left=True),
)


def _trained_row(draft: Path, target: str) -> dict:
    result = read_json(draft.resolve().parent / "result.json")
    report = diagnose(draft=draft, target=target)
    trainer, lr = _trainer_lr(result)
    return {
        "draft": draft.name,
        "trainer": trainer,
        "lr": lr,
        "steps": result["steps"],
        "seconds": result.get("train_seconds", result.get("wall_seconds")),
        "doctor": "pass" if report.exit_code == 0 else "FAIL",
        "doctor_errors": [f.title for f in report.errors],
    }


def table(s: CompareSettings) -> str:
    """The comparison as text, from what is in the output folder; also written to OUTPUT/compare.json."""
    out = Path(s.output)
    drafts = sorted((out / "drafts").iterdir()) if (out / "drafts").is_dir() else []
    trained = [_trained_row(d, s.target) for d in drafts]
    parts = ["trained (train s: our loop's time; SpecForge's whole command)", render_rows(trained, TRAINED_COLUMNS)]
    engines = {}
    for engine in ENGINES:
        path = out / f"bench-{engine}.json"
        if path.exists():
            engines[engine] = read_json(path)["rows"]
            columns = BENCH_COLUMNS if engine == "local" else SERVED_COLUMNS
            parts += [f"\n{engine} engine", render_rows(engines[engine], columns)]
    write_json(out / "compare.json", {"settings": asdict(s), "trained": trained, "engines": engines})
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eagle3lab.train.specforge.compare",
        description="Train drafts with our trainer and SpecForge's on the same data; benchmark and compare them.",
    )
    add_options(parser, CompareSettings)
    s = from_options(parser.parse_args(argv), CompareSettings)
    try:
        s.check()
        train_all(s)
        if "bench" in s.steps:
            bench_all(s)
        print(table(s))
    except (InputError, ValueError) as e:
        print(f"eagle3lab specforge compare: {e}", file=sys.stderr)
        return 2
    except (TrainingError, ServerError) as e:
        print(f"eagle3lab specforge compare: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
