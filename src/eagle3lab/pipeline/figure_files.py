"""A finished matplotlib figure written to its file: laid out, its folder made, saved at the pages' resolution, and
closed (a stage that draws many would otherwise hold them all)."""

from __future__ import annotations

from pathlib import Path

DPI = 120


def save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
