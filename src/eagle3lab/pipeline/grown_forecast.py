"""`python -m eagle3lab.pipeline.grown_forecast`: dvc.yaml's `grown_forecast` stage, issue 66's prediction of the grown
draft from the curve alone, made before that draft trains. Per prompt set, the accept length at the grown scale (the
conversations a grown draft trains on: the lines of the committed answers of `drafts.train_answers`' cells and of
`answers.more.cells`') read off the form the curve's own rolling forecasts choose (`benchmark.forecast.choose`),
fitted on every scale of the curve (metrics/drafts), with its bootstrap interval under each bootstrap seed (prompts
and training seeds resampled; `drafts.forecast`'s draws and seeds). Past the largest scale measured it is a
projection, and the record says so. Where the curve cannot choose a form yet, the record says why and predicts nothing.

Written to metrics/grown_forecast.json. A grown draft cell from scratch copies this record into its own before it
trains (`pipeline.grown_drafts`), so the comparison reads what was predicted before the draft existed, whatever the
curve says once more of it is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from eagle3lab import paths
from eagle3lab.benchmark.forecast import ALL, FORMS, Curve, choose, curves, read_records, rolling_errors
from eagle3lab.benchmark.scaling import LEVEL, quantiles
from eagle3lab.io import InputError, command, read_jsonl, write_json
from eagle3lab.pipeline import forecast
from eagle3lab.pipeline.answers import FIRST
from eagle3lab.pipeline.drafts import RECORDS, SECTION
from eagle3lab.pipeline.grown_drafts import PREDICTION
from eagle3lab.pipeline.more_answers import MORE
from eagle3lab.pipeline.stages import cell_arguments, load_params, section_at

STAGE = "grown_forecast"
RECORD = PREDICTION  # what a draft from scratch reads before it trains


def grown_scale(params: dict, params_file: Path, root: Path) -> int:
    """The conversations a grown draft trains on: the lines of every committed training answers file it joins."""
    names = [(FIRST, cell) for cell in (params.get(SECTION) or {}).get("train_answers") or []]
    names += [(MORE, cell) for cell in (section_at(params, MORE.keys) or {}).get("cells") or {}]
    if not names:
        raise InputError(f"{params_file}: sections '{SECTION}' and '{MORE.where}': no answers cells to train on")
    files = [root / family.output / f"{cell}.jsonl" for family, cell in names]
    absent = [path for path in files if not path.exists()]
    if absent:
        raise InputError(f"{absent[0]}: no such file: the grown scale counts every answers cell ({len(absent)} absent)")
    return sum(1 for path in files for _ in read_jsonl(path))


def predict(curve: Curve, size: int, ceiling: float, boot: int, seeds: list[int]) -> dict:
    """One set's prediction at `size`: the form chosen by its rolling forecasts, fitted on every scale, the point
    forecast and its interval under each bootstrap seed; no prediction (and why) where no form can be chosen."""
    chosen, why = choose(rolling_errors(curve, len(curve.sizes), ceiling))
    said = {"fitted_on": curve.sizes, "seeds": [len(t) for t in curve.taus], "chosen": chosen, "why": why}
    if chosen is None:
        return said | {"predicted": None, "intervals": []}
    form = FORMS[chosen]
    intervals = []
    for seed in seeds:
        draws = form.predict(curve.sizes, curve.draws(np.random.default_rng(seed), boot), size, ceiling)
        intervals.append({"seed": seed, "interval": list(quantiles(draws[~np.isnan(draws)]))})
    predicted = float(form.predict(curve.sizes, curve.means(), size, ceiling)[0])
    return said | {"predicted": predicted, "intervals": intervals}


def run(params_file: Path, root: Path = paths.ROOT) -> dict:
    """metrics/grown_forecast.json from the curve's committed records and the committed answers."""
    said = forecast.settings(params_file)
    size = grown_scale(load_params(params_file), params_file, root)
    drafts = read_records(root / RECORDS)
    if not drafts:
        raise InputError(f"{root / RECORDS}: no record of a draft on regenerated answers (the grid's scale cells)")
    sets = {
        name: predict(curve, size, said["ceiling"], said["boot"], said["seeds"])
        for name, curve in curves(drafts).items()
    }
    largest = max(draft["records"] for draft in drafts)
    record = {
        "level": LEVEL,
        "scale": size,
        "largest_measured": largest,
        "projection": size > largest,  # read past the curve's last scale: labelled as such wherever it is shown
        "boot": said["boot"],
        "bootstrap_seeds": said["seeds"],
        "sets": sets,
    }
    write_json(root / RECORD, record)
    return record


@command("python -m eagle3lab.pipeline.grown_forecast")
def main(argv: list[str] | None = None) -> int:
    args = cell_arguments(STAGE, __doc__, argv)
    record = run(args.params)
    everything = record["sets"][ALL]
    if everything["predicted"] is None:
        print(f"grown_forecast: no prediction at {record['scale']:,} conversations: {everything['why']}")
    else:
        low, high = everything["intervals"][0]["interval"]
        print(
            f"grown_forecast: {everything['chosen']} predicts {everything['predicted']:.3f} [{low:.3f}, {high:.3f}] "
            f"on all sets at {record['scale']:,} conversations (curve to {record['largest_measured']:,})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
