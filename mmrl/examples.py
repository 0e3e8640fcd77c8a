"""The example experiment configs (the repository's ``configs/``), for a pip user with no checkout.

A wheel ships ``configs/*.yaml`` as the data folder ``mmrl_configs`` (pyproject.toml), as it ships
``datasets/`` as ``mmrl_datasets``; `configs_dir` finds it, or ``configs/`` beside the ``mmrl``
package in a source checkout. ``mmrl init NAME`` writes one into the current folder (`write_example`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mmrl.config import _suggest
from mmrl.errors import UserError
from mmrl.utils.shipped import shipped_folder

INSTALLED_NAME = "mmrl_configs"  # what a wheel installs configs/ as (pyproject.toml, package-dir)


def configs_dir() -> Path:
    """``configs/`` of a source checkout (an editable install included), else the wheel's ``mmrl_configs``."""
    return shipped_folder("configs", INSTALLED_NAME, "*.yaml")


def example_names() -> list[str]:
    return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def write_example(name: str, dest: str | Path = ".", force: bool = False) -> Path:
    """Copy example ``name`` (``quickstart``, ``vlm_quickstart``, ...) to ``dest`` (a folder, or a
    ``.yaml`` path); an existing file is kept unless ``force``. Returns the file written."""
    names = example_names()
    name = name.removesuffix(".yaml")
    if name not in names:
        raise UserError(f"no example config '{name}'{_suggest(name, names)}; examples: {', '.join(names)}")
    dest = Path(dest)
    target = dest if dest.suffix in (".yaml", ".yml") else dest / f"{name}.yaml"
    if target.is_dir():
        raise UserError(f"--to {dest}: {target} is a folder; give the folder to write into, or a new .yaml file path")
    if target.exists() and not force:
        raise UserError(f"{target} exists: keep it, or pass --force to overwrite it with the example")
    blocking = next((p for p in [*reversed(target.parents)] if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise UserError(f"--to {dest}: {blocking} is a file, not a folder; give a folder (new or existing)")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(configs_dir() / f"{name}.yaml", target)
    except OSError as exc:  # no permission, a full disk, a read-only file system
        raise UserError(f"cannot write {target}: {exc.strerror or exc}; choose another --to") from None
    return target
