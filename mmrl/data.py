"""Datasets by name.

Each dataset lives in ``datasets/<name>/`` (a short CARD.md and a ``builder.py`` with a
``build(**kwargs)`` function). ``datasets/`` is deliberately not a Python package (it would shadow
Hugging Face ``datasets``), so builders are imported by file path. Third-party packages register
more through the ``mmrl.datasets`` entry-point group.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

from mmrl.registry import DATASETS

DATASETS_DIR = Path(__file__).resolve().parent.parent / "datasets"


def _card_summary(folder: Path) -> str:
    card = folder / "CARD.md"
    if not card.exists():
        return ""
    for line in card.read_text().splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line
    return ""


@lru_cache(maxsize=None)
def builder_module(name: str):
    """The module ``datasets/<name>/builder.py``, imported by path (builders reuse each other so)."""
    folder = DATASETS_DIR / name
    spec = importlib.util.spec_from_file_location(f"mmrl_dataset_{name}", folder / "builder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _builder(folder: Path):
    def build(**kwargs: Any):
        return builder_module(folder.name).build(**kwargs)

    build.__doc__ = _card_summary(folder)
    return build


for _folder in sorted(DATASETS_DIR.glob("*/builder.py")):
    DATASETS.register(_folder.parent.name, _builder(_folder.parent), description=_card_summary(_folder.parent))


def load_dataset(name: str, **kwargs: Any):
    """Build dataset ``name`` (see `mmrl list`) with the builder's keyword arguments."""
    return DATASETS.get(name)(**kwargs)
