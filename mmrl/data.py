"""Datasets by name.

Each dataset lives in ``datasets/<name>/`` (a short CARD.md and a ``builder.py`` with a ``build``
function whose keyword arguments are the dataset's arguments, every one declared: no ``**kwargs``).
``datasets/`` is deliberately not a Python package (it would shadow Hugging Face ``datasets``), so
builders are imported by file path. A wheel ships the folder as ``mmrl_datasets`` (pyproject.toml),
found by `datasets_dir`. Third-party packages register more through the ``mmrl.datasets``
entry-point group.

The readers of users' text data files live here too (`text_lines`, `read_jsonl_records`): a line
longer than ``max_record_bytes`` (`MAX_RECORD_BYTES` by default) is refused before it is parsed, and
a line that is not UTF-8 is named by file and line.
"""

from __future__ import annotations

import codecs
import importlib.util
import inspect
import json
from functools import cache
from pathlib import Path
from typing import Any

from mmrl.config import ConfigError, _suggest
from mmrl.registry import DATASETS
from mmrl.utils.shipped import shipped_folder

INSTALLED_NAME = "mmrl_datasets"  # what a wheel installs datasets/ as (pyproject.toml, package-dir)


def record_order(episode, step, episode_success=None):
    """Indices that sort a builder's per-decision records by episode, then step (long tensors
    ``episode`` and ``step`` [M]); with ``episode_success`` (bool [E]) only the records of the
    episodes that succeeded (a builder's ``keep_failed=False``)."""
    order = (episode * (step.max() + 1) + step).argsort()
    return order if episode_success is None else order[episode_success[episode[order]]]


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


def check_dataset_choice(key: str, name: str, kwargs: dict) -> None:
    """A config's dataset ``name`` (under ``key``) is registered and ``kwargs`` are arguments its
    builder declares: a misspelt one fails here, before any work."""
    if name not in DATASETS:
        raise ConfigError(f"'{key}' = {name!r} is not a registered dataset: {', '.join(DATASETS.names())}")
    check_dataset_arguments(name, kwargs)


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


def concat_records(first: dict, second: dict) -> dict:
    """The rows of two datasets of one builder as one dataset, ``first``'s rows first: lists and
    tuples joined, tensors and arrays concatenated along rows. Any other value is a summary of a
    dataset (a success rate, a meta dict) and is ``first``'s, not recomputed: the result is for
    reading rows (e.g. `mmrl.policies.base.Policy.warm_start_batch`). Columns must match."""
    if set(first) != set(second):
        raise ValueError(f"datasets to join have different columns: {sorted(first)} and {sorted(second)}")
    out: dict = {}
    for key, a in first.items():
        b = second[key]
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            out[key] = [*a, *b]
        elif getattr(a, "ndim", 0) > 0 and getattr(b, "ndim", 0) > 0:
            import numpy as np
            import torch

            out[key] = torch.cat([a, b]) if isinstance(a, torch.Tensor) else np.concatenate([a, b])
        else:
            out[key] = a
    return out


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


# ---- reading users' text data files (JSONL records, prompt lists) ----------------------------

#: the most bytes one line of a data file (a JSONL record, a prompt) may hold, unless the dataset's
#: ``max_record_bytes`` argument says otherwise: a longer line is refused before it is parsed (a
#: parsed record takes many times its size in memory; one 50 MB line once took 5.6 GB)
MAX_RECORD_BYTES = 16 << 20


def text_lines(path, max_bytes: int = MAX_RECORD_BYTES, limit_arg: str | None = "max_record_bytes"):
    """Yield (line number, text without its line end) for each line of the UTF-8 text file ``path``
    (a leading byte-order mark dropped), one line in memory at a time. ValueError naming the file
    and line for a line of more than ``max_bytes`` bytes (at most ``max_bytes + 2`` of its bytes are
    ever held: it is never decoded or parsed; ``limit_arg``: the dataset argument that raises the
    limit, named in the message) and for a line that is not UTF-8."""
    path = Path(path)
    bom = codecs.BOM_UTF8
    with path.open("rb") as f:
        number = 0
        # the line, its "\r\n", a byte to tell it is longer (and on line 1 a byte-order mark)
        while raw := f.readline(max_bytes + 2 + (len(bom) if number == 0 else 0)):
            number += 1
            line = raw[len(bom) :] if number == 1 and raw.startswith(bom) else raw
            line = line[:-1] if line.endswith(b"\n") else line
            line = line[:-1] if line.endswith(b"\r") else line
            if len(line) > max_bytes:
                size = len(line)
                while not raw.endswith(b"\n") and (raw := f.readline(1 << 20)):  # measured, not kept
                    size += len(raw) - raw.endswith(b"\n")
                raise ValueError(_too_long(path, number, size, max_bytes, limit_arg))
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(_not_utf8(path, number, exc)) from None
            yield number, text


def check_record_limit(max_record_bytes) -> None:
    """ValueError unless ``max_record_bytes`` (a dataset argument) is a whole number of bytes >= 1."""
    if isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int) or max_record_bytes < 1:
        raise ValueError(f"max_record_bytes must be a number of bytes >= 1, got {max_record_bytes!r}")


def read_jsonl_records(path: Path, max_record_bytes: int = MAX_RECORD_BYTES) -> list[tuple[str, Any]]:
    """(where, record) per non-blank line of a JSON lines file, each line checked against
    ``max_record_bytes`` before it is parsed (`text_lines`); a ``.json`` file holding one JSON array
    is read too, whole. Errors name the file and line."""
    if path.suffix.lower() == ".json" and first_byte(path) == b"[":
        try:
            records = json.loads(read_utf8(path))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        return [(f"{path}, record {i}", r) for i, r in enumerate(records)]
    out = []
    for i, line in text_lines(path, max_record_bytes):
        if not line.strip():
            continue
        try:
            out.append((f"{path}, line {i}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {i}: not valid JSON ({exc.msg})") from None
    return out


def first_byte(path) -> bytes:
    """The first byte of the text file ``path`` that is not white space or a byte-order mark (b"" if none)."""
    with Path(path).open("rb") as f:
        head = f.read(len(codecs.BOM_UTF8)).removeprefix(codecs.BOM_UTF8)
        while head or (head := f.read(1 << 16)):
            if head := head.lstrip():
                return head[:1]
    return b""


def read_utf8(path) -> str:
    """The whole UTF-8 text file ``path`` (a leading byte-order mark dropped); ValueError naming
    the file and line where it is not UTF-8."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        raise ValueError(_not_utf8(path, line, exc, exc.start - start)) from None


def _too_long(path: Path, number: int, size: int, max_bytes: int, limit_arg: str | None) -> str:
    raise_it = (
        f", or raise the limit with the dataset argument {limit_arg}: {-(-size // 2**20) * 2**20}" if limit_arg else ""
    )
    mib = f" ({max_bytes >> 20} MiB)" if max_bytes >= 2**20 and max_bytes % 2**20 == 0 else ""
    return (
        f"{path}, line {number}: {size} bytes, over the limit of {max_bytes} bytes{mib} on one record, so it is "
        f"not read (parsed, a record takes many times its size in memory): shorten it (keep images and other "
        f"big values in files, given by path){raise_it}"
    )


def _not_utf8(path: Path, number: int, exc: UnicodeDecodeError, column: int | None = None) -> str:
    column = exc.start if column is None else column
    return (
        f"{path}, line {number}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at byte {column + 1} of the "
        f"line): save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path.name} > utf8_{path.name}"
    )
