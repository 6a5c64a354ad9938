"""`python -m eagle3lab.pipeline.answers NAME`: one cell of the grid's regeneration, dvc.yaml's `answers` stage (one
cell per entry of params.yaml's `answers.cells`). The target answers a fixed slice of one mixture split, prompts
[start, start + count), and the answers are committed to git (answers/NAME.jsonl, with the skipped and errors files
that account for every prompt), so a draft cell on any machine trains on the same bytes and never waits for a
regeneration it did not run.

A cell is short (`answers.chunk_size` prompts, minutes on the slowest CPU here) so a larger mixture is regenerated
over several sittings, each cell committed as it finishes. How the target answers (backend, lengths, slots, weights,
dtype) is params.yaml's `regenerate` section: one home for the generation settings, whichever stage reads them. A
killed cell resumes record by record (the output is DVC's `persist`); dvc.lock names a cell only once it finished,
so nothing half-written is trusted. Each cell writes metrics/answers/NAME.json: its accounting, its throughput and
where it ran.

Two stages run these cells, one `Family` each: `answers` slices stage 01's mixture into answers/, and `more_answers`
(issue 66's ten times the data) slices the prompts that grow it (`pipeline.more_mixture`) into answers_more/. The new
answers have a folder of their own because every draft cell depends on the whole answers/ folder: written there, they
would rerun the curve.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from eagle3lab import paths
from eagle3lab.devices import resolve_dtype
from eagle3lab.io import InputError, RunFailed, command, write_json
from eagle3lab.pipeline import machine, repro_log
from eagle3lab.pipeline.stages import SHARED_SECTION, cell_arguments, check_params, load_params, section_at
from eagle3lab.regen.files import RunFiles
from eagle3lab.regen.run import regenerate
from eagle3lab.regen.settings import RegenSettings, resolve_backend

SECTION = "answers"  # params.yaml's: chunk_size, each family's cells


@dataclass(frozen=True)
class Family:
    """One stage's regeneration cells: where params.yaml lists them, the prompts they slice and where they write."""

    stage: str  # dvc.yaml's, and the module that runs its cells
    keys: tuple[str, ...]  # the params path to the mapping that holds `cells`
    mixture: str  # the folder of the prompt splits the cells slice
    splits: tuple[str, ...]
    writer: str  # the stage that writes that folder
    output: str  # OUTPUT/NAME.jsonl and its sidecars, committed
    records: str  # RECORDS/NAME.json

    @property
    def where(self) -> str:
        return ".".join(self.keys)


# stage 01's mixture (train.jsonl, val.jsonl)
FIRST = Family(
    "answers",
    (SECTION,),
    "artifacts/mixture",
    ("train", "val"),
    "stage 01 (dataset_survey)",
    "answers",
    "metrics/answers",
)
# The `regenerate` keys that decide how the target answers (the rest of that section names stage 02's own files).
GENERATION = (
    "backend",
    "max_new_tokens",
    "temperature",
    "max_turns",
    "batch_size",
    "max_context",
    "dtype",
    "engine",
    "server_addresses",
    "concurrency",
    "threads",
    "weights",
)
CELL_FIELDS = {"split", "start", "count", "sampled"}


@dataclass(frozen=True)
class Cell:
    name: str
    split: str  # a mixture split: train or val
    start: int  # the slice's first prompt (0-based line of the split)
    count: int | None  # prompts in the slice; None: to the split's end
    sampled: (
        bool  # answered at regenerate.sampled_temperature (seeded) instead of greedy, regenerate.sampled_limit of them
    )
    family: Family = FIRST

    @property
    def input(self) -> Path:
        return paths.ROOT / self.family.mixture / f"{self.split}.jsonl"

    @property
    def output(self) -> Path:
        return paths.ROOT / self.family.output / f"{self.name}.jsonl"

    @property
    def record(self) -> Path:
        return paths.ROOT / self.family.records / f"{self.name}.json"


def cell_of(params: dict, name: str, params_file: Path, family: Family = FIRST) -> Cell:
    """The cell NAME of the family's params section, checked: its split, a slice start of 0 or more and a count of 1
    or more (default `answers.chunk_size`, every family's; null: to the split's end)."""
    where = f"{params_file}: section '{family.where}'"
    section = section_at(params, family.keys)
    if not isinstance(section, dict) or not isinstance(section.get("cells"), dict):
        raise InputError(f"{where}: expected a mapping `cells` of NAME -> {{split, start, ...}}")
    cells = section["cells"]
    if name not in cells:
        raise InputError(f"{where}: no cell '{name}' (cells: {', '.join(cells)})")
    spec, where = cells[name] or {}, f"{where}: cell '{name}'"
    unknown = sorted(set(spec) - CELL_FIELDS)
    if unknown:
        raise InputError(f"{where}: unknown field(s) {unknown}; a cell has {sorted(CELL_FIELDS)}")
    if spec.get("split") not in family.splits:
        raise InputError(f"{where}: field 'split' must be one of {list(family.splits)}, got {spec.get('split')!r}")
    start = spec.get("start", 0)
    # a sampled cell answers regenerate.sampled_limit prompts unless it says otherwise: that key's one home
    default = (
        (params.get("regenerate") or {}).get("sampled_limit")
        if spec.get("sampled")
        else (params.get(SECTION) or {}).get("chunk_size")
    )
    count = spec.get("count", default)
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise InputError(f"{where}: field 'start' must be a whole number of 0 or more, got {start!r}")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise InputError(f"{where}: field 'count' (or the section's chunk_size) must be 1 or more, got {count!r}")
    return Cell(name, spec["split"], start, count, bool(spec.get("sampled", False)), family)


def generation_settings(params: dict, cell: Cell, params_file: Path) -> RegenSettings:
    """How the target answers this cell: `common`'s target, seed and device, `regenerate`'s generation keys, and the
    sampled temperature for a sampled cell. Always resumable: a killed cell continues where it stopped."""
    section = params.get("regenerate") or {}
    missing = [k for k in GENERATION if k not in section]
    if missing:
        raise InputError(f"{params_file}: section 'regenerate': missing {missing}, which the answers cells read")
    shared = params.get(SHARED_SECTION) or {}
    values = {k: section[k] for k in GENERATION}
    if cell.sampled:
        values["temperature"] = section.get("sampled_temperature")
    values["dtype"] = resolve_dtype(values["dtype"], shared.get("device", "auto"))
    values["backend"] = resolve_backend(values["backend"], shared.get("device", "auto"))
    return RegenSettings(
        **values,
        target=shared.get("target"),
        seed=shared.get("seed", 0),
        device=shared.get("device", "auto"),
        resume=True,
    )


def write_slice(cell: Cell, out: Path) -> int:
    """The cell's prompts, lines [start, start + count) of its split as they are (regen checks each), into `out`."""
    if not cell.input.exists():
        raise InputError(f"{cell.input}: no such file: {cell.family.writer} writes it")
    with open(cell.input, "rb") as src, open(out, "wb") as dst:
        lines = [line for line in src if line.strip()]
        stop = None if cell.count is None else cell.start + cell.count
        chosen = list(itertools.islice(lines, cell.start, stop))
        dst.writelines(chosen)
    if not chosen:
        raise InputError(
            f"{cell.input}: cell '{cell.name}' starts at prompt {cell.start}, past the split's {len(lines)}"
        )
    return len(chosen)


def run_cell(name: str, params_file: Path | None = None, family: Family = FIRST) -> dict:
    """Answer one cell's prompts into its family's OUTPUT/NAME.jsonl and write its record; returns the record."""
    params_file = Path(params_file or paths.PARAMS)
    params = load_params(params_file)
    check_params(params, params_file)
    cell = cell_of(params, name, params_file, family)
    settings = generation_settings(params, cell, params_file)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"answers-{name}-") as scratch:
        prompts = Path(scratch) / f"{name}.jsonl"
        n = write_slice(cell, prompts)
        result = regenerate(prompts, cell.output, settings)
    if not result.accounting.ok:
        raise RunFailed(f"{cell.output}: {result.accounting.line()}; rerun the cell, it resumes")
    progress = RunFiles(cell.output).progress
    minutes = (time.monotonic() - started) / 60
    record = {
        "cell": name,
        "split": cell.split,
        "start": cell.start,
        "prompts": n,
        "settings": {k: v for k, v in dataclasses.asdict(settings).items() if k in (*GENERATION, "target", "seed")},
        "weights": _progress_field(progress, "weights"),
        **result.figures(),
        "minutes": round(minutes, 2),
        "ran": machine.where_ran(paths.ROOT),
    }
    write_json(cell.record, record)
    repro_log.stage(f"{family.stage}@{name}", minutes * 60)
    return record


def _progress_field(progress: Path, field: str):
    return json.loads(progress.read_text()).get(field) if progress.exists() else None


def cell_command(family: Family, doc: str, argv: list[str] | None, example: str) -> int:
    """A family's command line, `python -m eagle3lab.pipeline.STAGE NAME [--params P]`: one cell run, one line said."""
    args = cell_arguments(family.stage, doc, argv, f"a cell of params.yaml's {family.where}.cells, e.g. {example}")
    record = run_cell(args.cell, args.params, family)
    print(
        f"{family.stage} {args.cell}: {record['success']} answered, {record['skipped']} skipped of "
        f"{record['prompts']} prompts in {record['minutes']:.1f} min ({record['tokens_per_s']:.0f} tok/s): "
        f"{family.output}/{args.cell}.jsonl"
    )
    return 0


@command("python -m eagle3lab.pipeline.answers")
def main(argv: list[str] | None = None) -> int:
    return cell_command(FIRST, __doc__, argv, "train-000")


if __name__ == "__main__":
    sys.exit(main())
