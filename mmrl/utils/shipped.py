"""Where a repository folder that is data, not a package (``datasets/``, ``configs/``), is found: beside
the ``mmrl`` package in a source checkout (an editable install included), else where a wheel installs
it under a name of mmrl's (``mmrl_datasets``, ``mmrl_configs``: pyproject.toml's package-dir)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when mmrl runs from one


def checkout_folder(folder: str) -> Path | None:
    """``ROOT/folder`` when mmrl runs from a source checkout that has it (an editable install
    included), else None (an installed wheel)."""
    return ROOT / folder if (ROOT / "pyproject.toml").is_file() and (ROOT / folder).is_dir() else None


def shipped_folder(folder: str, installed: str, pattern: str) -> Path:
    """``ROOT/folder`` in a source checkout, else the installed namespace folder ``installed`` holding a
    file matching ``pattern`` (located, nothing imported); ``ROOT/folder`` when neither exists."""
    here = checkout_folder(folder)
    if here is not None:
        return here
    spec = importlib.util.find_spec(installed)  # a namespace package: locates, imports nothing
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if any(Path(location).glob(pattern)):
            return Path(location)
    return ROOT / folder
