"""The results page's "Where it ran" section: the reference run's machine and minutes per stage (metrics/repro.log),
and each cell carried forward since (metrics/cells/, `python -m eagle3lab.pipeline.carry`) with the CPU, native bf16,
dtype and threads it ran with. Cells may come from different sittings and machines; where they do, the section says
so, because bf16 and float32 drafts and timings are not one population (a paired comparison reads cells of one
dtype, or says that it mixes them)."""

from __future__ import annotations

from pathlib import Path

from eagle3lab.pipeline import repro_log
from eagle3lab.pipeline.carry import CELLS, cell_records, reference_run
from eagle3lab.pipeline.report_tables import table

HEADER = ["cell", "minutes", "CPU", "native bf16", "dtype", "threads", "commit", "ended (UTC)"]
STAGE_HEADER = ["stage", "CPU", "dtype", "cells", "minutes in all", "longest cell"]
LONGEST_CELL = 45  # minutes: a cell longer than this on any machine is too long for a sitting that holds several


def stage_minutes(records: list[dict]) -> list[list]:
    """Per stage of the grid (a cell `stage@item`; a whole stage is its own) and CPU kind: the cells run, their
    minutes in all and the longest: what a full run of the cells recorded costs on each kind of machine."""
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        where = record["machine"]
        groups.setdefault((record["cell"].partition("@")[0], where["cpu"], where["auto_dtype"]), []).append(record)
    rows = []
    for (stage, cpu, dtype), cells in groups.items():
        longest = max(cells, key=lambda record: record["minutes"])
        total = round(sum(record["minutes"] for record in cells), 1)
        rows.append([stage, cpu, dtype, len(cells), total, f"{longest['cell']} ({longest['minutes']:g})"])
    return rows


def _cell_row(record: dict) -> list:
    where = record["machine"]
    commit = record["commit"] + (" (uncommitted changes)" if record.get("uncommitted_changes") else "")
    bf16 = "yes" if where["native_bf16"] else "no"
    ended = record["ended"][:16].replace("T", " ")
    return [
        record["cell"],
        record["minutes"],
        where["cpu"],
        bf16,
        where["auto_dtype"],
        where["torch_threads"],
        commit,
        ended,
    ]


def section(metrics: Path) -> str:
    """The section's markdown, from the reference run's log and the cell records under `metrics`."""
    lines = ["### Where it ran", ""]
    reference = reference_run(metrics / Path(repro_log.LOG).name)
    if reference:
        minutes = ", ".join(f"{stage} {m:g}" for stage, m in reference.minutes.items())
        lines.append(
            f"The reference run (`make repro`) began {reference.began[:10]} at {reference.commit} on "
            f"{reference.cpu}; minutes per stage: {minutes}."
        )
    records = cell_records(metrics / Path(CELLS).name)
    if not records:
        lines.append("No cell has been carried forward since: every figure here is the reference run's.")
        return "\n".join(lines) + "\n"
    rows = [_cell_row(r) for r in records]
    cpus = {row[2] for row in rows} | ({reference.cpu} if reference else set())
    dtypes = {row[4] for row in rows}
    lines += ["", f"Cells carried forward since ({len(rows)}, `{CELLS}/`):", "", table(HEADER, rows).rstrip("\n")]
    lines += ["", "Their minutes by stage and CPU kind:", "", table(STAGE_HEADER, stage_minutes(records)).rstrip("\n")]
    too_long = [r["cell"] for r in records if r["minutes"] > LONGEST_CELL]
    if too_long:
        lines += ["", f"Longer than {LONGEST_CELL} minutes, too long for a sitting: {', '.join(too_long)}."]
    if len(cpus) > 1 or len(dtypes) > 1:
        kinds = sorted({row[2] for row in rows})
        elsewhere = f"; the reference run on {reference.cpu}" if reference and reference.cpu not in kinds else ""
        lines += [
            "",
            f"This run mixes machines: the cells ran on {', '.join(kinds)} in {', '.join(sorted(dtypes))}{elsewhere}. "
            "Compare cells of one CPU kind and dtype, or say that a comparison mixes them.",
        ]
    return "\n".join(lines) + "\n"
