"""Strict JSON for every file mmrl writes: NaN and infinities become ``null`` (Python's ``json``
would write ``NaN``, which other JSON readers reject)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (at any depth of dicts, lists, tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs) -> str:
    """``json.dumps`` that always writes strict JSON (non-finite floats as ``null``)."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)


def write_json(path: Path, data: Any) -> None:
    """Strict JSON, indented, replaced atomically: a kill never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(data, indent=2))
    tmp.replace(path)
