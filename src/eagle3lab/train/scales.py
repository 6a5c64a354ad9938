"""The data-scale experiment of stage train_draft: one draft per scale (a prefix of the regenerated training set),
one on the sources' original answers at `original_scale`, and recipe ablations at one scale; then the pick of the
final draft and metrics/train.json, the record the benchmark, scaling and report stages read."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path

from eagle3lab.io import InputError, atomic_path, read_jsonl
from eagle3lab.train.config import TrainConfig
from eagle3lab.train.loop import train_draft

# TrainConfig fields a run's place in the experiment decides; the rest are shared settings or ablation levers.
PER_RUN = {"data", "val", "output", "features_cache", "max_records", "resume", "progress"}


@dataclass
class DraftRun:
    name: str
    data: str  # relative to the project root
    records: int
    responses: str  # regenerated, original, or ablation (regenerated answers, a recipe lever changed)
    overrides: dict = field(default_factory=dict)  # TrainConfig fields that differ from the shared settings


def _ablation(spec, k: int) -> tuple[int, dict]:
    """(scale, overrides) of ablations[k], e.g. {scale: 1500, epochs: 10}; errors name the entry and field."""
    where = f"train_draft.ablations[{k}]"
    if not isinstance(spec, dict) or not isinstance(spec.get("scale"), int):
        raise InputError(f"{where}: expected a mapping with an integer 'scale' and the settings it changes")
    levers = {f.name for f in fields(TrainConfig)} - PER_RUN
    overrides = {key: value for key, value in spec.items() if key != "scale"}
    unknown = sorted(set(overrides) - levers)
    if unknown or not overrides:
        raise InputError(f"{where}: fields {unknown or '(none)'}: expected one or more of {sorted(levers)}")
    return spec["scale"], overrides


def plan_runs(
    train_data: str,
    original_data: str,
    scales: list[int | str],
    original_scale: int,
    available: int,
    ablations: list[dict] | None = None,
) -> tuple[list[DraftRun], list[int]]:
    """The drafts to train, and the scales skipped for want of data (`available` regenerated conversations).
    A scale "all" is every regenerated conversation, whatever their number."""
    bad = [n for n in scales if n != "all" and (not isinstance(n, int) or n < 1)]
    if bad:
        raise InputError(f"train_draft.scales: {bad}: expected positive integers or 'all'")
    sizes = sorted({available if n == "all" else n for n in scales})
    runs = [DraftRun(f"scale-{n:05d}", train_data, n, "regenerated") for n in sizes if n <= available]
    runs.append(DraftRun(f"original-{original_scale:05d}", original_data, original_scale, "original"))
    skipped = [n for n in sizes if n > available]
    for k, spec in enumerate(ablations or []):
        scale, overrides = _ablation(spec, k)
        if scale > available:
            skipped.append(scale)
            continue
        label = "-".join(f"{key.replace('_', '')}{value}" for key, value in overrides.items())
        runs.append(DraftRun(f"ablation-{label}-{scale:05d}", train_data, scale, "ablation", overrides))
    return runs, skipped


def count_records(path: Path) -> int:
    return sum(1 for _ in read_jsonl(path))


def train_runs(runs: list[DraftRun], settings: dict, root: Path, artifacts: Path, val_data: str, report=print) -> dict:
    """Train (or resume) each draft and copy its SGLang-format folder to artifacts/drafts/NAME. `settings` holds the
    shared TrainConfig fields. Returns name -> train_draft's result plus `responses`, `records` and `overrides`."""
    results = {}
    for run in runs:
        cfg = TrainConfig(
            data=str(root / run.data),
            val=str(root / val_data),
            output=str(artifacts / "train" / run.name),
            features_cache=str(artifacts / "features"),
            max_records=run.records,
            resume=True,
            progress=False,
            **{**settings, **run.overrides},
        )
        result = train_draft(cfg)
        with atomic_path(artifacts / "drafts" / run.name) as tmp:  # the folder the benchmark names
            shutil.copytree(result["draft"], tmp)
        results[run.name] = result | {"responses": run.responses, "records": run.records, "overrides": run.overrides}
        acc = result["final_val"] and result["final_val"]["acc_pos"]
        report(f"{run.name}: {result['steps']} steps, {result['tokens_per_s']:.0f} tok/s, held-out acc {acc}")
    return results


def export_final(results: dict, artifacts: Path) -> str:
    """Copy the largest regenerated-data draft to artifacts/drafts/final; returns its name."""
    regenerated = {name: r for name, r in results.items() if r["responses"] == "regenerated"}
    if not regenerated:
        raise InputError("no regenerated-data draft was trained: every scale exceeds the regenerated data")
    name = max(regenerated, key=lambda n: regenerated[n]["records"])
    with atomic_path(artifacts / "drafts" / "final") as tmp:
        shutil.copytree(artifacts / "drafts" / name, tmp)
    return name


def summary_rows(results: dict) -> list[dict]:
    """One row per draft: data, training throughput, vocab coverage and held-out accuracy per TTT step."""
    return [
        {
            "draft": name,
            "responses": r["responses"],
            "changed": ", ".join(f"{k}={v}" for k, v in r["overrides"].items()),
            "conversations": r["data"]["records"],
            "train tokens": r["tokens_seen"],
            "steps": r["steps"],
            "train tok/s": r["tokens_per_s"],
            "vocab coverage (held-out)": r["vocab"].get("held_out_coverage"),
            **{f"held-out acc step {i}": a for i, a in enumerate((r["final_val"] or {}).get("acc_pos", []))},
        }
        for name, r in results.items()
    ]


def train_metrics(results: dict, artifacts: Path, root: Path) -> dict:
    """metrics/train.json: the final draft and every trained draft (ablations carry the settings they change)."""
    drafts = []
    for name, r in results.items():
        entry = {
            "name": name,
            "path": str((artifacts / "drafts" / name).relative_to(root)),
            "responses": r["responses"],
            "records": r["data"]["records"],
            "tokens": r["tokens_seen"],
            "steps": r["steps"],
            "tokens_per_s": r["tokens_per_s"],
            "final_val": r["final_val"],
            "vocab": r["vocab"],
        }
        if r["overrides"]:
            entry["ablation"] = r["overrides"]
        drafts.append(entry)
    return {"final": str((artifacts / "drafts" / "final").relative_to(root)), "drafts": drafts}
