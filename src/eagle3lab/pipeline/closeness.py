"""`python -m eagle3lab.pipeline.closeness`: dvc.yaml's `closeness` stage, issue 65's finding from committed records
only (metrics/points/*.json, metrics/point_drafts/*.json): notebooks/cells/closeness.ipynb through papermill into
reports/closeness.ipynb, writing metrics/closeness.json and figures/closeness.png. `benchmark.closeness` holds the
science (each signal's rank correlation with the point drafts' acceptance, its interval and verdict); this module its
settings (`drafts.closeness`: boot, bootstrap_seeds), its record and its figure. Points whose drafts have not run yet
wait, and the record says which.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from eagle3lab import paths
from eagle3lab.benchmark.closeness import closeness
from eagle3lab.io import InputError, command, require, write_json
from eagle3lab.pipeline import repro_log
from eagle3lab.pipeline.figure_files import save
from eagle3lab.pipeline.point_drafts import RECORDS as DRAFTS
from eagle3lab.pipeline.points import RECORDS as POINTS
from eagle3lab.pipeline.points import closeness_params
from eagle3lab.pipeline.stages import cell_arguments, execute

NOTEBOOK = "cells/closeness.ipynb"  # under notebooks/
RECORD = "metrics/closeness.json"
FIGURE = "figures/closeness.png"
SIGNAL = "answer_nll"  # the survey's closeness score: the figure's x axis


def _records(folder: Path) -> dict[str, dict]:
    """Every committed record of a folder, by file stem; an unreadable one is named."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: not JSON ({error})") from None
    return found


def run(params_file: str | Path) -> dict:
    """The finding over the records committed now, written to metrics/closeness.json."""
    _, _, section, where = closeness_params(Path(params_file))
    boot, seeds = require(section, "boot", where, int), require(section, "bootstrap_seeds", where, list)
    measured = _records(paths.ROOT / POINTS)
    planned = {name: measured[name] for name in section["points"] if name in measured}
    result = closeness(planned, list(_records(paths.ROOT / DRAFTS).values()), boot=boot, seeds=seeds)
    result["unmeasured_points"] = [name for name in section["points"] if name not in measured]
    write_json(paths.ROOT / RECORD, result)
    return result


def figure(result: dict, path: Path) -> Path:
    """Per set: each point's closeness score against its drafts' accept length, each with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = result["sets"]
    fig, axes = plt.subplots(1, len(sets), figsize=(4.6 * len(sets), 3.8), squeeze=False)
    for ax, set_name in zip(axes[0], sets):
        for row in result["points"]:
            accept, score = row["accept_length"].get(set_name), row["signals"].get(SIGNAL)
            if not accept or not score:
                continue
            x, y = score["estimate"], accept["mean"]
            ax.errorbar(x, y, xerr=[[x - score["low"]], [score["high"] - x]], yerr=[[y - accept["low"]],
                        [accept["high"] - y]], fmt="o", capsize=3)  # fmt: skip
            ax.annotate(
                f"{row['name']} ({row['seeds']})", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        said = next((r for r in result["correlations"] if r["signal"] == SIGNAL and r["set"] == set_name), {})
        rho = "rho n/a" if said.get("rho") is None else f"rho {said['rho']:+.2f}, p {said['p_value']:.3f}"
        ax.set(title=f"{set_name}: {rho}, {said.get('verdict', 'not shown')}", xlabel="target NLL of the answers "
               "(nats/token)", ylabel="accept length")  # fmt: skip
    return save(fig, path)


@command("python -m eagle3lab.pipeline.closeness")
def main(argv: list[str] | None = None) -> int:
    args = cell_arguments("closeness", __doc__, argv)
    started = time.monotonic()
    out = execute(paths.NOTEBOOKS / NOTEBOOK, {"params_file": str(args.params)}, paths.REPORTS / "closeness.ipynb",
                  "stage 'closeness'")  # fmt: skip
    repro_log.stage("closeness", time.monotonic() - started)
    print(f"closeness: {RECORD}, {FIGURE}, report {out.relative_to(paths.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
