"""Build the `prompt_list` dataset: your own prompts from a text file or a JSONL file.

``build(path)`` returns ``{"prompt": list[str], "meta": list[dict]}``. A text file has one prompt
per line (blank lines and lines starting with ``#`` skipped); a JSONL file has one JSON object per
line with a ``"prompt"`` string, every other key going to that prompt's meta. See CARD.md.

The readers here (`read_lines`, `read_jsonl`, `select`) are also used by the public prompt-set
recipes (``pickscore_prompts``, ``geneval_prompts``, ``ocr_prompts``), which load this file by path.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from mmrl.data import MAX_RECORD_BYTES, check_record_limit, text_lines

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def _existing_file(path, hint: str = "") -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"prompt file not found: {p}" + (f"\n{hint}" if hint else ""))
    if not p.is_file():
        raise IsADirectoryError(f"expected a prompt file, got a directory: {p}")
    return p


def read_lines(
    path, comments: bool = True, hint: str = "", max_record_bytes: int = MAX_RECORD_BYTES, limit_arg: str | None = None
) -> list[tuple[int, str]]:
    """(line number, prompt) for each non-blank line of a UTF-8 text file, stripped; lines
    starting with ``#`` are skipped when ``comments``. ValueError when there is no prompt, and
    naming the line for one that is not UTF-8 or is longer than ``max_record_bytes`` (`mmrl.data.text_lines`;
    ``limit_arg``: the dataset argument that raises the limit)."""
    p = _existing_file(path, hint)
    out = []
    for i, line in text_lines(p, max_record_bytes, limit_arg):
        line = line.strip()
        if line and not (comments and line.startswith("#")):
            out.append((i, line))
    if not out:
        raise ValueError(f"no prompts in {p}: the file is empty (blank lines and '#' comments are skipped)")
    return out


def read_jsonl(
    path,
    key: str | tuple[str, ...] = "prompt",
    hint: str = "",
    max_record_bytes: int = MAX_RECORD_BYTES,
    limit_arg: str | None = None,
) -> list[tuple[int, dict]]:
    """(line number, record) for each non-blank line of a JSONL file. Every record must be a JSON
    object with a string under ``key`` (or under one of several keys, the first present wins; the
    record then gets it under ``"prompt"``). Errors name the file and the line number; a line is
    checked against ``max_record_bytes`` before it is parsed (as in `read_lines`)."""
    p = _existing_file(path, hint)
    keys = (key,) if isinstance(key, str) else tuple(key)
    out = []
    for i, line in text_lines(p, max_record_bytes, limit_arg):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{p}, line {i}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{p}, line {i}: expected a JSON object, got {type(rec).__name__}")
        found = next((k for k in keys if k in rec), None)
        if found is None:
            raise ValueError(f"{p}, line {i}: no {' or '.join(repr(k) for k in keys)} key (keys: {sorted(rec)})")
        if not isinstance(rec[found], str) or not rec[found].strip():
            raise ValueError(f"{p}, line {i}: {found!r} must be a non-empty string, got {rec[found]!r}")
        text = rec.pop(found).strip()
        out.append((i, {"prompt": text, **rec}))
    if not out:
        raise ValueError(f"no prompts in {p}: the file is empty")
    return out


def select(
    prompts: list[str],
    metas: list[dict],
    num_prompts: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    dedupe: bool = False,
) -> dict:
    """Optionally drop repeated prompts (first kept), shuffle (``random.Random(seed)``) and keep the
    first ``num_prompts``; returns ``{"prompt", "meta"}``."""
    rows = list(zip(prompts, metas))
    if dedupe:
        seen: set[str] = set()
        rows = [r for r in rows if not (r[0] in seen or seen.add(r[0]))]
    if shuffle:
        random.Random(seed).shuffle(rows)
    if num_prompts is not None:
        if num_prompts < 1:
            raise ValueError("num_prompts must be >= 1")
        rows = rows[:num_prompts]
    return {"prompt": [r[0] for r in rows], "meta": [r[1] for r in rows]}


def detect_format(path) -> str:
    return "jsonl" if Path(path).suffix.lower() in JSONL_SUFFIXES else "text"


def build(
    path,
    format: str = "auto",
    num_prompts: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    dedupe: bool = False,
    comments: bool = True,
    split: str = "train",
    eval_path=None,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> dict:
    """Prompts from ``path``: ``format`` "text", "jsonl" or "auto" (".jsonl"/".ndjson" -> JSONL,
    anything else text). Text meta is ``{}``; JSONL meta is the record's other keys. ``dedupe``
    keeps the first of repeated prompts, ``shuffle`` shuffles with ``seed``, ``num_prompts`` keeps
    the first n. ``comments=False`` keeps lines starting with "#". ``split="eval"`` reads
    ``eval_path`` instead when it is given (held-out prompts for evaluation), else ``path``.
    ``max_record_bytes``: the most bytes one line may hold (checked before it is parsed).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    check_record_limit(max_record_bytes)
    if split == "eval" and eval_path is not None:
        path = eval_path
    fmt = detect_format(path) if format == "auto" else format
    if fmt == "jsonl":
        rows = read_jsonl(path, max_record_bytes=max_record_bytes, limit_arg="max_record_bytes")
        prompts = [r["prompt"] for _, r in rows]
        metas = [{k: v for k, v in r.items() if k != "prompt"} for _, r in rows]
    elif fmt == "text":
        rows = read_lines(path, comments=comments, max_record_bytes=max_record_bytes, limit_arg="max_record_bytes")
        prompts = [text for _, text in rows]
        metas = [{} for _ in rows]
    else:
        raise ValueError(f"format must be 'auto', 'text' or 'jsonl', got {format!r}")
    return select(prompts, metas, num_prompts, shuffle, seed, dedupe)
