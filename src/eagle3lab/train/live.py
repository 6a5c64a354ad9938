"""Per-step training curves through dvclive, where DVC's tools show them (`dvc plots show`, `dvc plots diff` across
experiments, the VS Code extension). Every draft of the stage logs into one dvclive folder under its run name
(NAME/train/loss.tsv, NAME/val/accept_length.tsv, ...), so one dvc.yaml `plots` entry covers all of them; the
folder's metrics.json (each run's latest values and held-out pick) is a dvc.yaml `metrics` entry, for `dvc exp show`.

The curves are a view of the run's metrics.jsonl, rebuilt from it whenever a run starts or resumes (rows a killed
run logged after its checkpoint are dropped there, so here too); nothing reads them back. Only `log_metric` runs per
step: dvclive's `next_step`/`sync` re-read every curve in the folder (for DVC Studio) and fsync a VS Code signal
file, a cost that grows with the history. Measured on this 2-core machine over 1,000 steps: 0.1-0.2 ms a step here
(metrics.jsonl's row alone: 0.013 ms), 2-6 ms a step with `next_step`; a run's start 0.55 s (the imports), 5-20 ms
after the first."""

from __future__ import annotations

import shutil
from pathlib import Path

from eagle3lab.io import InputError

TRAIN_KEYS = ("loss", "tokens_per_s")
VAL_KEYS = ("loss", "accept_length")


def curve_values(row: dict) -> dict[str, float]:
    """The metrics.jsonl row's values that get curves, by name (EAGLE-3's val rows also per TTT position: acc0, acc1,
    ...). A drafter logs the keys it has: DFlash's held-out row is its accept length alone."""
    split = row["split"]
    keys = TRAIN_KEYS if split == "train" else VAL_KEYS
    values = {f"{split}/{k}": row[k] for k in keys if k in row}
    if split == "val":
        values |= {f"val/acc{i}": a for i, a in enumerate(row.get("acc_pos", []))}
    return values


def _refuse_git_without_dvc(folder) -> None:
    """dvclive runs `dvc init` in a git repository without DVC around the working directory: refuse to start there
    (in a DVC repository, or outside git, as in the smoke run's scratch root, it changes nothing)."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo
    from scmrepo.exceptions import SCMError
    from scmrepo.git import Git

    try:
        Repo.find_root()
        return
    except NotDvcRepoError:
        pass
    try:
        root = Git().root_dir
    except SCMError:
        return
    raise InputError(
        f"live_dir {folder}: the working directory is in git repository {root}, which has no DVC and which dvclive "
        "would `dvc init`; run from a DVC repository (or outside git), or leave live_dir unset"
    )


class LiveCurves:
    """One run's curves in the shared dvclive folder `folder`, under the name `run`."""

    def __init__(self, folder: str | Path, run: str, kept_rows: list[dict]):
        from dvclive import Live
        from dvclive.plots import Metric

        _refuse_git_without_dvc(folder)
        # resume: keep the other runs' curves; no dvc.yaml edits (dvc.yaml names the folder), no experiment commits
        self.live = Live(str(folder), resume=True, save_dvc_exp=False, dvcyaml=None)
        if self.live._dvc_repo is not None:  # opened for experiments and Studio, which this does not use: its open
            self.live._dvc_repo.close()  # files would linger until garbage collection, and git's warn at exit
        self.run = run
        shutil.rmtree(Path(self.live.plots_dir) / Metric.subfolder / run, ignore_errors=True)
        self.live.summary.pop(run, None)
        for row in kept_rows:
            self.log(row)
        self.live.make_summary()

    def log(self, row: dict) -> None:
        self.live.step = row["step"]
        for name, value in curve_values(row).items():
            self.live.log_metric(f"{self.run}/{name}", value)
        if row["split"] == "val":  # the summary (latest values, dvclive's metrics.json) at each evaluation
            self.live.make_summary()

    def close(self, best: dict | None) -> None:
        """The summary's last word on the run: its latest values and, with held-out data, the pick (`best`)."""
        if best is not None:
            self.live.summary.setdefault(self.run, {})["best"] = best
        self.live.make_summary()
