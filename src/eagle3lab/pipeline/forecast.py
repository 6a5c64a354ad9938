"""`python -m eagle3lab.pipeline.forecast`: dvc.yaml's `forecast` stage, the data bet's backtested forecast from the
grid's committed draft records (metrics/drafts/*.json) only: notebooks/cells/forecast.ipynb through papermill into
reports/forecast.ipynb, writing metrics/forecast.json and figures/forecast_backtest.png (`benchmark.forecast` holds
the science; this module its settings, record and figure). Each engine's break-even accept length, with its timing
noise, comes from the grid's cost cells (metrics/costs/*.json); an engine without a cost record has no break-even.
The record also holds the grid's controlled pairs (`benchmark.pairs`: the original-answer and T=0.7 draft cells
against their regenerated partners), read from the same records with the same bootstrap settings.

Its settings are params.yaml's `drafts.forecast` (the grid's section: the forecast reads the grid's drafts), and the
chain's ceiling is the sweep's depth + 1 (`benchmark.sweep_config`, where the cells score acceptance).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from eagle3lab import paths
from eagle3lab.benchmark.forecast import forecast, read_records
from eagle3lab.benchmark.pairs import PAIRED_RESPONSES, controlled_pairs
from eagle3lab.benchmark.timed_costs import read_cost_cells
from eagle3lab.decoding.config import SpecConfig
from eagle3lab.io import InputError, command, require, write_json
from eagle3lab.pipeline import repro_log
from eagle3lab.pipeline.costs import RECORDS as COSTS
from eagle3lab.pipeline.drafts import RECORDS, SECTION
from eagle3lab.pipeline.figure_files import save
from eagle3lab.pipeline.stages import cell_arguments, check_params, execute, load_params

STAGE = "forecast"
NOTEBOOK = "cells/forecast.ipynb"  # under notebooks/
RECORD = "metrics/forecast.json"
FIGURE = "figures/forecast_backtest.png"


def settings(params_file: Path) -> dict:
    """drafts.forecast's keys and the chain's ceiling, checked: an InputError names the file, section and key."""
    params = load_params(params_file)
    check_params(params, params_file)
    where = f"{params_file}: section '{SECTION}': forecast"
    section = require(params.get(SECTION) or {}, "forecast", f"{params_file}: section '{SECTION}'", dict)
    held_out, boot = require(section, "held_out", where, int), require(section, "boot", where, int)
    seeds = require(section, "bootstrap_seeds", where, list)
    if held_out < 1 or boot < 2 or not seeds or not all(isinstance(s, int) for s in seeds):
        raise InputError(f"{where}: expected a held_out scale >= 1, boot >= 2 draws and a list of integer seeds")
    sweep = require(params.get("benchmark") or {}, "sweep_config", f"{params_file}: section 'benchmark'", str)
    return {"held_out": held_out, "boot": boot, "seeds": seeds, "ceiling": SpecConfig.parse(sweep).steps + 1}


def run(params_file: str | Path) -> dict:
    """The forecast of the records committed now, and the controlled pairs among them, written to
    metrics/forecast.json."""
    costs = read_cost_cells(paths.ROOT / COSTS)
    said = settings(Path(params_file))
    result = forecast(paths.ROOT / RECORDS, **said, costs=costs)
    paired = read_records(paths.ROOT / RECORDS, responses=("regenerated", *PAIRED_RESPONSES))
    result["controlled_pairs"] = controlled_pairs(paired, boot=said["boot"], seeds=said["seeds"])
    write_json(paths.ROOT / RECORD, result)
    return result


def figure(result: dict, path: Path) -> Path:
    """Per set: the measured means (over seeds and prompts) and each form's forecast of the held-out scale with its
    interval (bootstrap seed 0), beside the value measured there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = result["sets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.6), squeeze=False)
    for ax, (name, s) in zip(axes[0], sets.items()):
        ax.plot(s["sizes"], s["means"], "o-", color="black", label="measured (mean of seeds)")
        test = s["backtest"]
        for offset, (form, f) in enumerate((test or {}).get("forms", {}).items()):
            low, high = f["intervals"][0]["predicted"]
            x, y = test["held_out"] * (1.08 + 0.08 * offset), f["predicted"]
            fitted = f"{min(test['fitted_on'])}-{max(test['fitted_on'])}"
            ax.errorbar(
                x, y, [[y - low], [high - y]], fmt="s", capsize=3, label=f"{form} from {fitted}: {f['verdict']}"
            )
        ax.set_xscale("log")
        ax.set(title=name, xlabel="training conversations", ylabel="accept length")
        ax.legend(fontsize=7)
    return save(fig, path)


@command("python -m eagle3lab.pipeline.forecast")
def main(argv: list[str] | None = None) -> int:
    params_file = cell_arguments("forecast", __doc__, argv).params
    settings(params_file)  # bad settings are named before papermill starts a kernel
    started = time.monotonic()
    report = paths.REPORTS / f"{STAGE}.ipynb"
    execute(paths.NOTEBOOKS / NOTEBOOK, {"params_file": str(params_file)}, report, f"stage '{STAGE}'")
    repro_log.stage(STAGE, time.monotonic() - started)
    print(f"{STAGE}: {RECORD}, {FIGURE}, report {report.relative_to(paths.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
