"""Every path the project uses, rooted at the repository (never at a notebook's working directory)."""

from __future__ import annotations

import os
from pathlib import Path


def _find_root() -> Path:
    # DVC_ROOT: DVC gives each stage command its checkout's root, which for a queued or --temp experiment is a copy
    # elsewhere; the package, installed editable, would otherwise find the workspace's params.yaml.
    override = os.environ.get("EAGLE3LAB_ROOT") or os.environ.get("DVC_ROOT")
    if override:
        return Path(override).resolve()
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").exists() and (parent / "params.yaml").exists():
            return parent
    # Installed as a wheel outside a checkout: fall back to the working directory.
    return Path.cwd().resolve()


ROOT = _find_root()
DATA = ROOT / "data"  # immutable raw inputs, tracked by data.dvc
ARTIFACTS = ROOT / "artifacts"  # pipeline outputs: prompts, regenerated data, features, drafts
METRICS = ROOT / "metrics"
REPORTS = ROOT / "reports"  # executed notebooks
FIGURES = ROOT / "figures"
NOTEBOOKS = ROOT / "notebooks"
PARAMS = ROOT / "params.yaml"


def cache_dir() -> Path:
    """Per-user cache for converted models (outside the repo, shared by all checkouts)."""
    base = os.environ.get("EAGLE3LAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "eagle3lab"
    )
    return Path(base)
