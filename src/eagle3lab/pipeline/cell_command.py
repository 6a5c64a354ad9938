"""The command line of a grid cell that runs a notebook: `python -m eagle3lab.pipeline.STAGE NAME [--params P]` checks
the cell's parameters (so a bad cell is named before papermill starts a kernel), executes the stage's notebook for it
into reports/STAGE/NAME.ipynb, logs its minutes and names its record. (`drafts`, `answers` and `costs` keep their own
copies until their next relock: they are in locked cells' code.)"""

from __future__ import annotations

import time
from collections.abc import Callable

from eagle3lab import paths
from eagle3lab.pipeline import repro_log
from eagle3lab.pipeline.stages import cell_arguments, execute


def run_cell(stage: str, doc: str, argv: list[str] | None, cell_help: str, cell_of: Callable, notebook: str,
             parameter: str) -> int:  # fmt: skip
    """Run cell NAME of `stage`: `cell_of(NAME, params_file)` checks it and has its `record`; the notebook (under
    notebooks/) receives NAME as `parameter` and the params file as `params_file`."""
    args = cell_arguments(stage, doc, argv, cell_help)
    cell = cell_of(args.cell, args.params)
    started = time.monotonic()
    report = paths.REPORTS / stage / f"{args.cell}.ipynb"
    parameters = {parameter: args.cell, "params_file": str(args.params)}
    out = execute(paths.NOTEBOOKS / notebook, parameters, report, f"cell '{stage}@{args.cell}'")
    repro_log.stage(f"{stage}@{args.cell}", time.monotonic() - started)
    print(f"{stage} {args.cell}: {cell.record.relative_to(paths.ROOT)}, report {out.relative_to(paths.ROOT)}")
    return 0
