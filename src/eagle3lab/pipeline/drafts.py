"""`python -m eagle3lab.pipeline.drafts NAME`: one cell of the grid's training, dvc.yaml's `drafts` stage (one cell per
name of params.yaml's `drafts.cells`): notebooks/cells/draft.ipynb through papermill for that draft, executed into
reports/drafts/NAME.ipynb.

A cell trains one draft of the grid's plan, which is stage 03's (params.yaml's `train_draft`: its kinds, scales, seeds
and recipe) with the keys `drafts.plan` changes for every cell (the grid's own science: drafts to their plateau, more
seeds) and the keys the cell's own entry changes (what places a draft of another kind: `original_scales: [140]` for
original-00140), so adding a draft to the grid changes no other cell's parameters. It trains on the
grid's committed answers (`drafts.train_answers`, `val_answers`, `sampled_answers`: cells of `answers`), to its stop
rule, resuming after a kill; scores its exact offline acceptance on the evaluation set at the sweep's depth
(`benchmark`'s eval keys); and writes a small committed record, metrics/drafts/NAME.json: its place in the plan, why
it stopped, its held-out pick, its acceptance per set and per prompt, and where it ran (CPU, bf16, dtype, threads,
commit, minutes, tokens/s). The draft folder (artifacts/grid/drafts/NAME) is a cached output; the feature cache and
the evaluation set's target answers are caches keyed by what they are computed from, so a fresh machine rebuilds
what it needs and never invalidates a cell by lacking them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from eagle3lab import paths
from eagle3lab.io import InputError, command, read_jsonl, sha256_file, write_json, write_jsonl
from eagle3lab.models.checkpoint import weight_files
from eagle3lab.pipeline import machine, repro_log
from eagle3lab.pipeline.stages import SHARED_SECTION, cell_arguments, check_params, execute, load_params

SECTION = "drafts"
NOTEBOOK = "cells/draft.ipynb"  # under notebooks/
GRID = "grid"  # under artifacts/: the cells' drafts, checkpoints, feature cache, curves and data files
RECORDS = "metrics/drafts"
MIXTURE_TRAIN = "artifacts/mixture/train.jsonl"  # the prompts' order (the scales are its prefixes), original answers
ANSWERS = "answers"
# train_draft's keys that are TrainConfig fields shared by every draft (the plan's keys place a draft instead)
TRAINING = (
    "val_max_records",
    "draft_vocab_size",
    "ttt_length",
    "epochs",
    "min_answer_tokens",
    "max_answer_tokens",
    "lr",
    "warmup_ratio",
    "batch_tokens",
    "max_len",
    "dtype",
    "eval_every",
    "patience",
    "checkpoint_every",
)
EVALUATION = ("eval_sets", "eval_max_new_tokens", "eval_dtype", "sweep_config")  # benchmark's keys a cell reads


@dataclass
class DraftCell:
    """One draft of the plan, with everything its cell reads from params.yaml."""

    name: str
    common: dict
    training: dict  # params.yaml's train_draft section with drafts.plan's keys changed
    evaluation: dict  # benchmark's EVALUATION keys
    answers: dict  # drafts' train_answers, val_answers, sampled_answers
    minutes: dict = field(default_factory=dict)  # train, score: as they ran in this process

    @property
    def artifacts(self) -> Path:
        return paths.ARTIFACTS / GRID

    @property
    def record(self) -> Path:
        return paths.ROOT / RECORDS / f"{self.name}.json"

    def data(self) -> dict[str, str]:
        """The committed answers as the plan reads them (paths relative to the root): the train cells joined in
        their order into one file, the held-out cell, and the sampled cells joined."""
        files = {}
        for role, cells in (("train", self.answers["train_answers"]), ("sampled", self.answers["sampled_answers"])):
            out = self.artifacts / "answers" / f"{role}.jsonl"
            write_jsonl(out, (row for cell in cells for row in read_jsonl(_answers(cell))))
            files[role] = str(out.relative_to(paths.ROOT))
        files["val"] = str(_answers(self.answers["val_answers"]).relative_to(paths.ROOT))
        return files

    def run(self, data: dict[str, str]):
        """The grid plan's draft of this name, planned on the committed answers as stage 03 plans (train.plan)."""
        from eagle3lab.train.answer_tokens import AnswerTokens
        from eagle3lab.train.plan import plan_runs
        from eagle3lab.train.scales import in_input_order

        t = self.training
        regenerated = in_input_order(paths.ROOT, data["train"], MIXTURE_TRAIN, self.artifacts)
        runs, skipped = plan_runs(
            paths.ROOT,
            AnswerTokens(self.common["target"], t["max_len"]),
            train_data=regenerated,
            original_data=MIXTURE_TRAIN,
            scales=t["scales"],
            original_scales=t["original_scales"],
            sampled_data=data["sampled"],
            sampled_scale=t["sampled_scale"],
            source_drafts=t["source_drafts"],
            ablations=t["ablations"],
            dflash_scale=t["dflash_scale"],
            seeds=t["seeds"],
            seed=self.common["seed"],
        )
        found = next((run for run in runs if run.name == self.name), None)
        if found is None:
            why = next((line for line in skipped if line.startswith(f"{self.name}:")), None)
            raise InputError(
                f"{paths.PARAMS}: section '{SECTION}': cell '{self.name}' "
                + (f"cannot be trained: {why}" if why else f"is no draft of the grid's plan ({_names(runs)})")
            )
        return found

    def train(self, run, data: dict[str, str]) -> dict:
        """Train (or resume) the draft to its stop rule: its result and place, as stage 03's train_runs returns."""
        from eagle3lab.train.scales import train_runs

        t = self.training
        settings = {key: t[key] for key in TRAINING} | {
            "target": self.common["target"],
            "device": self.common["device"],
            "seed": self.common["seed"],
            "live_dir": str(self.artifacts / "live") if t["live_dir"] else None,
        }
        own = {"dflash": {"block_size": t["dflash_block_size"]}}
        start = run.overrides.get("init_draft")  # a fine-tuned draft's start, by its bytes: a changed one starts over
        starts = [str(path) for path in weight_files(paths.ROOT / start)] if start else []
        self._resumable(run, [settings, own, vars(run)], [data["val"], run.data, *starts])
        started = time.monotonic()
        result = train_runs([run], settings, paths.ROOT, self.artifacts, data["val"], drafter_settings=own)[self.name]
        self.minutes["train"] = round((time.monotonic() - started) / 60, 2)
        return result

    def _resumable(self, run, inputs: list, files: list[str]) -> None:
        """A cell resumes its own killed run, never a run of other inputs (the loop would refuse its checkpoint): the
        run folder's fingerprint (its settings, its place in the plan, its data files' bytes) is written beside it, and
        a folder of another fingerprint, or of none, is removed before training starts over."""
        folder = self.artifacts / "train" / run.name
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode())
        for name in files:
            digest.update(sha256_file(paths.ROOT / name).encode())
        mark = folder.with_name(f"{run.name}.fingerprint")
        if folder.exists() and (not mark.exists() or mark.read_text() != digest.hexdigest()):
            print(f"{folder}: trained on other inputs than this cell's: starting over")
            shutil.rmtree(folder)
        mark.parent.mkdir(parents=True, exist_ok=True)
        mark.write_text(digest.hexdigest())

    def score(self) -> tuple[list[dict], list[dict], dict]:
        """Exact offline acceptance of the draft on the evaluation set at the sweep's depth: pooled rows per set, the
        per-prompt rows, and the evaluation set's description."""
        from eagle3lab.benchmark import acceptance, eval_set, scoring
        from eagle3lab.decoding.config import SpecConfig
        from eagle3lab.devices import resolve_dtype
        from eagle3lab.models.target import load_target

        e, device, started = self.evaluation, self.common["device"], time.monotonic()
        target = load_target(self.common["target"], dtype=resolve_dtype(e["eval_dtype"], device), device=device)
        records = eval_set.build_eval_set(target, paths.ARTIFACTS / "eval", e["eval_sets"], e["eval_max_new_tokens"])
        loaded = scoring.load_drafts({self.name: self.artifacts / "drafts" / self.name}, target, target.model.dtype)
        rows = scoring.score(loaded, target, records, [SpecConfig.parse(e["sweep_config"]).steps], progress=False)
        described = {"dtype": str(target.model.dtype).removeprefix("torch."), **eval_set.summary(records)}
        self.minutes["score"] = round((time.monotonic() - started) / 60, 2)
        return acceptance.table(rows), acceptance.per_prompt(rows), described

    def write_record(self, result: dict, scored: tuple) -> dict:
        """metrics/drafts/NAME.json: the draft's place, training, stop, pick, acceptance and where it ran."""
        pooled, per_prompt, described = scored
        keep = ("responses", "records", "overrides", "source", "matched_to", "replicate_of", "seed", "drafter")
        record = {
            "name": self.name,
            **{key: result[key] for key in keep},
            "answer_tokens": result["data"]["loss_tokens"],
            "training": {
                "steps": result["steps"],
                "budget_steps": result["budget_steps"],
                # why it stopped: the patience rule (held-out evaluations stopped improving) or its step budget
                "stopped_by": "patience" if result["plateaued"] else "budget",
                "best": result.get("best"),
                "tokens": result["tokens_seen"],
                "answer_tokens_seen": result["answer_tokens_seen"],
                "tokens_per_s": result["tokens_per_s"],
                "final_val": result["final_val"],
                "vocab": result.get("vocab"),
            },
            "acceptance": {
                "config": self.evaluation["sweep_config"],
                "eval_set": described,
                "pooled": pooled,
                "per_prompt": per_prompt,
            },
            "ran": machine.where_ran(paths.ROOT, minutes=self.minutes),
        }
        write_json(self.record, record)
        return record


def _answers(cell: str) -> Path:
    path = paths.ROOT / ANSWERS / f"{cell}.jsonl"
    if not path.exists():
        raise InputError(f"{path}: no such file: the answers cell '{cell}' has not run (make carry runs it)")
    return path


def _names(runs) -> str:
    return ", ".join(run.name for run in runs)


def cell_of(name: str, params_file: Path | None = None) -> DraftCell:
    """The cell NAME of params.yaml's `drafts` section, with the sections it reads; the params file is checked as a
    stage's is."""
    params_file = Path(params_file or paths.PARAMS)
    params = load_params(params_file)
    check_params(params, params_file)
    section = params.get(SECTION)
    where = f"{params_file}: section '{SECTION}'"
    if not isinstance(section, dict) or not isinstance(section.get("cells"), dict):
        raise InputError(
            f"{where}: expected the answers cells it trains on and a mapping `cells` of draft names to their own keys"
        )
    if name not in section["cells"]:
        raise InputError(f"{where}: no cell '{name}' (cells: {', '.join(map(str, section['cells']))})")
    answers = {key: section.get(key) for key in ("train_answers", "val_answers", "sampled_answers")}
    if not answers["train_answers"] or not answers["val_answers"]:
        raise InputError(f"{where}: `train_answers` (a list of answers cells) and `val_answers` (one) are needed")
    answers["sampled_answers"] = answers["sampled_answers"] or []
    evaluation = evaluation_of(params, params_file)
    return DraftCell(name, params.get(SHARED_SECTION) or {}, _grid_plan(params, where, name), evaluation, answers)


def evaluation_of(params: dict, params_file: Path) -> dict:
    """benchmark's EVALUATION keys, which every draft cell (the grid's, the points', the grown ones) is scored by."""
    benchmark = params.get("benchmark") or {}
    missing = [key for key in EVALUATION if key not in benchmark]
    if missing:
        raise InputError(f"{params_file}: section 'benchmark': missing {missing}, which the draft cells read")
    return {key: benchmark[key] for key in EVALUATION}


def _grid_plan(params: dict, where: str, name: str) -> dict:
    """train_draft's keys as cell `name` trains: `drafts.plan` changes some of them for every cell (e.g. the step
    ceiling, the seeds) and the cell's own entry some more (the key placing its kind of draft), so stage 03, the
    reference run, keeps its own plan and each cell's parameters are the plan's and its own only."""
    plan = params.get("train_draft") or {}
    for key, changed in (("plan", params[SECTION].get("plan")), (f"cells.{name}", params[SECTION]["cells"][name])):
        changed = changed or {}
        if not isinstance(changed, dict):
            raise InputError(f"{where}: `{key}`: expected a mapping of train_draft's keys to the grid's values")
        unknown = sorted(set(changed) - set(params.get("train_draft") or {}))
        if unknown:
            raise InputError(f"{where}: `{key}`: {unknown} are no keys of section 'train_draft'")
        plan = plan | changed
    return plan


@command("python -m eagle3lab.pipeline.drafts")
def main(argv: list[str] | None = None) -> int:
    args = cell_arguments("drafts", __doc__, argv, "a name of params.yaml's drafts.cells, e.g. scale-00022")
    cell = cell_of(args.cell, args.params)  # a bad cell is named before papermill starts a kernel
    started = time.monotonic()
    parameters = {"draft": args.cell, "params_file": str(args.params)}
    report = paths.REPORTS / "drafts" / f"{args.cell}.ipynb"
    out = execute(paths.NOTEBOOKS / NOTEBOOK, parameters, report, f"cell '{SECTION}@{args.cell}'")
    repro_log.stage(f"{SECTION}@{args.cell}", time.monotonic() - started)
    print(f"drafts {args.cell}: {cell.record.relative_to(paths.ROOT)}, report {out.relative_to(paths.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
