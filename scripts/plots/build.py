"""Draw every documentation plot from ``benchmarks/results/`` into ``docs/assets/plots/``.

    python scripts/plots/build.py [--out DIR]

Each module beside this file with a ``PLOTS`` mapping (``{"file_name.png": function}``) contributes;
two modules naming the same file is an error. The docs build runs this first (``hook.py``), so a plot
whose data is missing fails the build instead of showing an old picture.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parents[1] / "docs" / "assets" / "plots"


def plot_functions() -> dict:
    """File name -> function, from every plot module here."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # the modules import `common`
    found: dict = {}
    for path in sorted(HERE.glob("*.py")):
        if path.stem in ("build", "hook", "common"):
            continue
        spec = importlib.util.spec_from_file_location(f"mmrl_docs_plots_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name, fn in getattr(module, "PLOTS", {}).items():
            if name in found:
                raise ValueError(f"plot {name} is drawn by two modules ({path.name} and another): rename one")
            found[name] = fn
    return found


def build(out: Path = OUT) -> list[Path]:
    """Draw every plot into ``out``; returns the files written."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fn in sorted(plot_functions().items()):
        fig = fn()
        path = out / name
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="folder for the PNG files (default: docs/assets/plots)")
    args = ap.parse_args()
    for path in build(args.out):
        print(path)


if __name__ == "__main__":
    main()
