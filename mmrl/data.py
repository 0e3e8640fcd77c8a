"""Datasets by name.

Each dataset lives in ``datasets/<name>/`` (a short CARD.md and a ``builder.py`` with a ``build``
function whose keyword arguments are the dataset's arguments, every one declared: no ``**kwargs``).
``datasets/`` is deliberately not a Python package (it would shadow Hugging Face ``datasets``), so
builders are imported by file path. A wheel ships the folder as ``mmrl_datasets`` (pyproject.toml),
found by `datasets_dir`. Third-party packages register more through the ``mmrl.datasets``
entry-point group.
"""

from __future__ import annotations

import importlib.util
import inspect
from functools import cache
from pathlib import Path
from typing import Any

from mmrl.config import ConfigError, _suggest
from mmrl.registry import DATASETS
from mmrl.utils.shipped import shipped_folder

INSTALLED_NAME = "mmrl_datasets"  # what a wheel installs datasets/ as (pyproject.toml, package-dir)


def datasets_dir() -> Path:
    """The folder of dataset recipes: ``datasets/`` beside the ``mmrl`` package in a source checkout
    (an editable install included), else the ``mmrl_datasets`` folder a wheel installs (neither: no
    built-in dataset is registered). Never found through an import of ``datasets``, which is Hugging
    Face's."""
    return shipped_folder("datasets", INSTALLED_NAME, "*/builder.py")


DATASETS_DIR = datasets_dir()


def _card_summary(folder: Path) -> str:
    card = folder / "CARD.md"
    if not card.exists():
        return ""
    for line in card.read_text().splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return line
    return ""


@cache
def builder_module(name: str):
    """The module ``datasets/<name>/builder.py``, imported by path (builders reuse each other so)."""
    folder = DATASETS_DIR / name
    spec = importlib.util.spec_from_file_location(f"mmrl_dataset_{name}", folder / "builder.py")
    assert spec is not None and spec.loader is not None  # a .py path always gets a source loader
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


def dataset_arguments(name: str) -> set[str] | None:
    """The keyword arguments dataset ``name``'s builder declares, or None where they cannot be known
    (a dataset another package registers whose callable takes ``**kwargs`` or cannot be inspected).
    Unknown ``name``: `UnknownComponentError` listing the registered datasets."""
    if (DATASETS_DIR / name / "builder.py").is_file():
        fn = builder_module(name).build
    else:
        fn = DATASETS.get(name)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_dataset_arguments(name: str, kwargs: dict) -> None:
    """`ConfigError` (one line) for the first key of ``kwargs`` that dataset ``name`` does not take."""
    valid = dataset_arguments(name)
    if valid is None:
        return
    for key in kwargs:
        if key not in valid:
            raise ConfigError(
                f"dataset '{name}' has no argument '{key}'. Valid: {', '.join(sorted(valid))}"
                f"{_suggest(key, sorted(valid))}"
            )


def declared_kwargs(name: str, **offered: Any) -> dict:
    """The ``offered`` arguments dataset ``name`` declares (all of them where that is unknown): how a
    caller passes context a builder may use (the trainer: seed, num_episodes, chunk_size, ...)."""
    valid = dataset_arguments(name)
    return dict(offered) if valid is None else {k: v for k, v in offered.items() if k in valid}


def recorded_in(name: str) -> str | None:
    """The registered simulator a demonstration dataset records in (its builder module's
    ``SIMULATOR``), or None: not a recording, or a dataset registered by another package."""
    try:
        module = builder_module(name)
    except FileNotFoundError:
        return None
    return getattr(module, "SIMULATOR", None)


def load_dataset(name: str, **kwargs: Any):
    """Build dataset ``name`` (see `mmrl list`) with the builder's keyword arguments; an argument it
    does not declare is a `ConfigError` naming the valid ones."""
    from mmrl.errors import DatasetError, DatasetFileNotFoundError, UserError

    check_dataset_arguments(name, kwargs)
    build = DATASETS.get(name)
    try:
        return build(**kwargs)
    except UserError:
        raise
    except FileNotFoundError as exc:  # the builder's account of the data: one line, no traceback
        raise DatasetFileNotFoundError(f"dataset '{name}': {exc}") from exc
    except ValueError as exc:
        raise DatasetError(f"dataset '{name}': {exc}") from exc
