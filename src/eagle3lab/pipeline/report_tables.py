"""The report's table helpers: a metrics file read, a Markdown table written, a table's rows picked from records, a
figure linked. Every report module (`report`, `report_engines`, `report_scaling`, `compare`) writes through these."""

from __future__ import annotations

import json
import math
from pathlib import Path

# The results page is docs/results.md: its figure links climb one folder to figures/.
FIGURES = "../figures"
# the columns every benchmark table opens with: which row, and what it measured
ROW_KEYS = ("set", "system", "config", "accept_length", "tokens_per_s", "speedup_vs_baseline")


def figure(alt: str, name: str) -> str:
    """A figure of figures/ as the results page links it."""
    return f"![{alt}]({FIGURES}/{name})"


def load_metrics(metrics: Path, name: str) -> dict | None:
    path = metrics / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def load_folder(folder: Path) -> list[dict]:
    """Every record of a folder of cell records (metrics/drafts/, metrics/points/, ...), by name, each with its cell."""
    return [json.loads(p.read_text()) | {"cell": p.stem} for p in sorted(folder.glob("*.json"))]


def table(header: list[str], rows: list[list]) -> str:
    def cell(v):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if isinstance(v, float):
            if v.is_integer() and abs(v) < 1e6:
                return f"{int(v):,}"
            return f"{v:,.2f}" if abs(v) < 1e6 else f"{v:.3g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def cells(records: list[dict], keys: tuple[str, ...]) -> list[list]:
    """A table's rows: the fields `keys` of each record, in that order."""
    return [[r[k] for k in keys] for r in records]
