"""What every plot module shares: reading a results file and one figure style.

A plot module (``scripts/plots/<area>.py``) holds ``PLOTS = {"file_name.png": function}``; each
function takes no argument, reads only ``benchmarks/results/`` (through `load`) and returns a
matplotlib figure. `build.py` draws them all into ``docs/assets/plots/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

#: colours by role, the same on every page: the method measured, its baselines, a ceiling
COLORS = {"mmrl": "#3b5bdb", "baseline": "#868e96", "ceiling": "#2b8a3e", "other": "#e8590c", "third": "#ae3ec9"}


def load(name: str) -> Any:
    """The parsed JSON of ``benchmarks/results/<name>`` (a missing file fails the docs build)."""
    return json.loads((RESULTS / name).read_text())


def figure(width: float = 6.4, height: float = 3.6, ncols: int = 1):
    """A figure with ``ncols`` axes side by side, in the site's style; returns (fig, axes list)."""
    fig, axes = plt.subplots(1, ncols, figsize=(width, height), squeeze=False)
    for ax in axes[0]:
        ax.spines[["top", "right"]].set_visible(False)
        ax.grid(alpha=0.3)
    return fig, list(axes[0])


def source(fig, *names: str) -> None:
    """Name the results files a figure was drawn from, under it (a reader can open them)."""
    fig.text(0.01, 0.005, "data: " + ", ".join(f"benchmarks/results/{n}" for n in names), fontsize=6, color="#666")
