"""Build `vlm_records`: your own VLM reasoning data (image(s) + question -> checkable answer) from a
JSONL or parquet file, and the image / pixel-budget / hub-row helpers the public VLM recipes share.

``build(path, split=None, num_samples=None, shuffle=False, seed=0, min_pixels=None, max_pixels=None,
factor=28)`` returns a dict of lists, one entry per sample::

    {"prompt":   [str],                        # the question text, image placeholders removed
     "images":   [[uint8 tensor [H, W, 3]]],    # the sample's images, in order (may be empty)
     "meta":     [dict],                        # at least {"answer": ground truth}, + other keys
     "solution": [str]}                         # SFT target; defaults to the answer as text

A record (one JSONL line or one parquet row) has ``prompt`` (str) or ``messages`` (chat messages,
the prompt is the text of the last user message), ``images`` (paths relative to the JSONL file's
folder or absolute, ``{"bytes": base64 str}`` in JSONL / raw bytes in parquet, ``{"path": ...}``),
``answer`` (required), optional ``solution``; every other key goes to meta. See CARD.md.

The recipes (``geometry3k``, ``clevr_counting``, ``refcoco``) load this file by path
(``mmrl.data.builder_module("vlm_records")``) for `fit_pixels`, `resize_image`, `load_image`,
`hub_source` and `pick`.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import glob
import io
import json
import math
import random
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
IMAGE_PLACEHOLDER = "<image>"
MAX_RATIO = 200  # Qwen2-VL's limit on max(h, w) / min(h, w)
_PLACEHOLDER_RE = re.compile(r"[ \t]*<image>[ \t]*\n?")
_RECORD_KEYS = ("prompt", "messages", "images", "image", "solution")


# ---------------------------------------------------------------------------------------------
# Pixel budgets (Qwen2-VL's smart_resize rule)
# ---------------------------------------------------------------------------------------------


def fit_pixels(h: int, w: int, min_pixels: int | None = None, max_pixels: int | None = None,
               factor: int = 28) -> tuple[int, int]:
    """Target (height, width) of an h x w image under a pixel budget, by Qwen2-VL's ``smart_resize``:

    1. each side is rounded to the nearest multiple of ``factor`` (Python ``round``, halves to even),
       at least ``factor``;
    2. if that has more than ``max_pixels`` pixels: beta = sqrt(h * w / max_pixels) and each side
       becomes floor(side / beta / factor) * factor (at least ``factor``);
    3. else if it has fewer than ``min_pixels``: beta = sqrt(min_pixels / (h * w)) and each side
       becomes ceil(side * beta / factor) * factor.

    The aspect ratio is kept as closely as the grid allows. ValueError when max(h, w) / min(h, w)
    exceeds 200. ``None`` means no bound on that side. ``factor`` is patch size x spatial merge
    (Qwen2-VL / Qwen2.5-VL: 14 x 2 = 28; Qwen3-VL: 16 x 2 = 32).
    """
    if h < 1 or w < 1:
        raise ValueError(f"image size must be positive, got {h}x{w}")
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    if max(h, w) / min(h, w) > MAX_RATIO:
        raise ValueError(f"absolute aspect ratio must be at most {MAX_RATIO}, got {max(h, w) / min(h, w):.1f} "
                         f"({h}x{w}); crop or pad the image first")
    lo = 0 if min_pixels is None else min_pixels
    hi = math.inf if max_pixels is None else max_pixels
    if lo > hi:
        raise ValueError(f"min_pixels ({min_pixels}) must not exceed max_pixels ({max_pixels})")
    h2 = max(factor, round(h / factor) * factor)
    w2 = max(factor, round(w / factor) * factor)
    if h2 * w2 > hi:
        beta = math.sqrt(h * w / hi)
        h2 = max(factor, math.floor(h / beta / factor) * factor)
        w2 = max(factor, math.floor(w / beta / factor) * factor)
    elif h2 * w2 < lo:
        beta = math.sqrt(lo / (h * w))
        h2 = math.ceil(h * beta / factor) * factor
        w2 = math.ceil(w * beta / factor) * factor
    return h2, w2


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise ImportError("VLM datasets need Pillow to decode and resize images: pip install pillow") from None
    return Image


def resize_image(img: torch.Tensor, min_pixels: int | None = None, max_pixels: int | None = None,
                 factor: int = 28) -> torch.Tensor:
    """uint8 [H, W, 3] -> uint8 [H2, W2, 3] with (H2, W2) = `fit_pixels` (PIL bicubic); returned
    unchanged when the size already fits."""
    h, w = int(img.shape[0]), int(img.shape[1])
    h2, w2 = fit_pixels(h, w, min_pixels, max_pixels, factor)
    if (h2, w2) == (h, w):
        return img
    Image = _pil()
    out = Image.fromarray(img.contiguous().numpy()).resize((w2, h2), Image.BICUBIC)
    return torch.from_numpy(_np_copy(out))


def _np_copy(pil_img):
    import numpy as np

    return np.array(pil_img, dtype=np.uint8, copy=True)


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------


def _decode_bytes(data: bytes, where: str) -> torch.Tensor:
    Image = _pil()
    try:
        with Image.open(io.BytesIO(data)) as im:
            return torch.from_numpy(_np_copy(im.convert("RGB")))
    except Exception as exc:  # PIL raises several types for bad data
        raise ValueError(f"{where}: not a decodable image ({type(exc).__name__}: {exc}); store a PNG / JPEG / "
                         f"WebP file or its bytes") from None


def _read_path(p, base_dir, where: str) -> torch.Tensor:
    path = Path(p).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        rel = f" (relative paths are resolved against {base_dir})" if base_dir is not None else ""
        raise FileNotFoundError(f"{where}: image file not found: {path}{rel}; fix the path or copy the image there")
    return _decode_bytes(path.read_bytes(), f"{where} ({path})")


def load_image(item: Any, where: str = "image", base_dir=None) -> torch.Tensor:
    """One image item -> uint8 [H, W, 3]. Accepts a path (str / Path; relative to ``base_dir``), a
    ``data:image/...;base64,`` URL, ``{"bytes": raw bytes or base64 str}`` (Hugging Face's Image
    storage; ``{"bytes": None, "path": ...}`` reads the path), ``{"path": ...}``, raw bytes, a PIL
    image, or an array / tensor [H, W, 3] (uint8, or [H, W] grayscale)."""
    if isinstance(item, torch.Tensor) or type(item).__module__ == "numpy":
        t = torch.as_tensor(item)
        if t.dim() == 2:
            t = t.unsqueeze(-1).expand(-1, -1, 3)
        if t.dim() != 3 or t.shape[-1] not in (3, 4) or t.dtype != torch.uint8:
            raise ValueError(f"{where}: an image array must be uint8 [H, W, 3], got {t.dtype} {list(t.shape)}")
        return t[..., :3].contiguous()
    if hasattr(item, "convert") and hasattr(item, "size"):  # PIL image (Hugging Face datasets decodes to these)
        return torch.from_numpy(_np_copy(item.convert("RGB")))
    if isinstance(item, (bytes, bytearray, memoryview)):
        return _decode_bytes(bytes(item), where)
    if isinstance(item, dict):
        data = item.get("bytes")
        if data is not None:
            if isinstance(data, str):
                try:
                    data = base64.b64decode(data.split(",", 1)[1] if data.startswith("data:") else data, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError(f"{where}: \"bytes\" is a string but not valid base64; in JSONL store "
                                     f"base64.b64encode(png_bytes).decode()") from None
            return _decode_bytes(bytes(data), where)
        if item.get("path"):
            return _read_path(item["path"], base_dir, where)
        raise ValueError(f"{where}: an image dict needs \"bytes\" or \"path\" (keys: {sorted(item)})")
    if isinstance(item, str) and item.startswith("data:"):
        return load_image({"bytes": item}, where, base_dir)
    if isinstance(item, (str, Path)):
        return _read_path(item, base_dir, where)
    raise ValueError(f"{where}: cannot read an image from {type(item).__name__}; use a path, "
                     f"{{\"bytes\": ...}} or {{\"path\": ...}}")


def prepare_images(items: Sequence, where: str, base_dir=None, min_pixels=None, max_pixels=None,
                   factor: int = 28) -> list[torch.Tensor]:
    """`load_image` each item, then `resize_image` when a pixel budget is given."""
    out = []
    for k, item in enumerate(items):
        img = load_image(item, f"{where}, image {k}", base_dir)
        if min_pixels is not None or max_pixels is not None:
            img = resize_image(img, min_pixels, max_pixels, factor)
        out.append(img)
    return out


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


def strip_placeholders(text: str) -> str:
    """Remove ``<image>`` placeholders (and the spaces / newline around them) from a prompt."""
    return _PLACEHOLDER_RE.sub(" ", text).strip() if IMAGE_PLACEHOLDER in text else text.strip()


def answer_text(answer: Any) -> str:
    """The ground truth as text (strings as they are, lists as JSON, numbers by ``str``)."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (list, tuple, dict)):
        return json.dumps(answer)
    return str(answer)


def _check_answer(rec: dict, where: str) -> Any:
    if rec.get("answer") is None:
        raise ValueError(f"{where}: no 'answer' key (keys: {sorted(rec)}); every record needs its ground truth, "
                         f"e.g. \"answer\": \"42\" (a string or a number)")
    ans = rec["answer"]
    if isinstance(ans, str) and not ans.strip():
        raise ValueError(f"{where}: 'answer' is an empty string; give the ground truth")
    if not isinstance(ans, (str, int, float, list, tuple)):
        raise ValueError(f"{where}: 'answer' must be a string or a number, got {type(ans).__name__}")
    return ans


def _messages_prompt(messages, where: str) -> tuple[str, int, list]:
    """(text of the last user message, number of image placeholders in all messages, image items
    carried by the image parts themselves)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: 'messages' must be a non-empty list of {{\"role\", \"content\"}} objects")
    count, carried, last_user = 0, [], None
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"{where}: message {j} must be an object with \"role\" and \"content\"")
        content = m["content"]
        if isinstance(content, str):
            count += content.count(IMAGE_PLACEHOLDER)
            text = strip_placeholders(content)
        elif isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    texts.append(str(part.get("text", "")))
                elif kind == "image":
                    count += 1
                    if part.get("bytes") is not None:
                        carried.append({"bytes": part["bytes"]})
                    elif part.get("image") is not None:
                        carried.append(part["image"])
                    elif part.get("path") is not None:
                        carried.append({"path": part["path"]})
                else:
                    raise ValueError(f"{where}: message {j} has a content part that is not "
                                     f"{{\"type\": \"text\", \"text\": ...}} or {{\"type\": \"image\"}}: {part!r}")
            text = "\n".join(strip_placeholders(t) for t in texts if strip_placeholders(t))
        else:
            raise ValueError(f"{where}: message {j} content must be a string or a list of parts")
        if m["role"] == "user":
            last_user = text
    if last_user is None:
        raise ValueError(f"{where}: 'messages' has no message with role \"user\"")
    if not last_user:
        raise ValueError(f"{where}: the last user message has no text")
    return last_user, count, carried


def parse_record(rec: Any, where: str) -> dict:
    """Check one record and split it into ``prompt``, ``images`` (raw items, not decoded yet),
    ``meta`` and ``solution``. Errors name ``where`` (file and line / row) and the fix."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
    answer = _check_answer(rec, where)
    images = rec.get("images")
    if images is None and rec.get("image") is not None:
        images = [rec["image"]]
    if images is None:
        images = []
    elif isinstance(images, (str, dict, bytes)):
        images = [images]
    elif not isinstance(images, (list, tuple)):
        raise ValueError(f"{where}: 'images' must be a list (of paths, {{\"bytes\": ...}} or {{\"path\": ...}})")
    images = list(images)
    if rec.get("messages") is not None:
        if rec.get("prompt") is not None:
            raise ValueError(f"{where}: has both 'prompt' and 'messages'; keep one")
        prompt, n_slots, carried = _messages_prompt(rec["messages"], where)
        if not images and carried:
            images = carried
        if n_slots != len(images):
            raise ValueError(f"{where}: the messages have {n_slots} image placeholder(s) but the record has "
                             f"{len(images)} image(s); give one {{\"type\": \"image\"}} part (or \"<image>\" in a "
                             f"string content) per entry of 'images', in order")
    elif rec.get("prompt") is not None:
        raw = rec["prompt"]
        if not isinstance(raw, str) or not strip_placeholders(raw):
            raise ValueError(f"{where}: 'prompt' must be a non-empty string, got {raw!r}")
        n_slots = raw.count(IMAGE_PLACEHOLDER)
        if n_slots and n_slots != len(images):
            raise ValueError(f"{where}: the prompt has {n_slots} \"<image>\" placeholder(s) but the record has "
                             f"{len(images)} image(s); use one placeholder per image (or none: images go first)")
        prompt = strip_placeholders(raw)
    else:
        raise ValueError(f"{where}: no 'prompt' or 'messages' key (keys: {sorted(rec)}); add the question as "
                         f"\"prompt\": \"...\" or as chat \"messages\"")
    meta = {k: v for k, v in rec.items() if k not in _RECORD_KEYS}
    if rec.get("messages") is not None:
        meta["messages"] = rec["messages"]  # kept whole: system prompts and earlier turns live there
    meta["answer"] = answer
    solution = rec.get("solution")
    if solution is not None and not isinstance(solution, str):
        raise ValueError(f"{where}: 'solution' must be a string (the full target completion)")
    return {"prompt": prompt, "images": images, "meta": meta,
            "solution": solution if solution is not None else answer_text(answer), "where": where}


def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading parquet needs pyarrow: pip install pyarrow") from None
    return pq


def read_jsonl_records(path: Path) -> list[tuple[str, Any]]:
    """(where, record) per non-blank line; a ``.json`` file holding one JSON array is read too."""
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
        return [(f"{path}, record {i}", r) for i, r in enumerate(records)]
    out = []
    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((f"{path}, line {i}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {i}: not valid JSON ({exc.msg})") from None
    return out


def read_parquet_records(path: Path, limit: int | None = None) -> list[tuple[str, dict]]:
    pq = _pq()
    out: list[tuple[str, dict]] = []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
        for row in batch.to_pylist():
            out.append((f"{path}, row {len(out)}", row))
            if limit is not None and len(out) >= limit:
                return out
    return out


def _record_files(path, split) -> list[Path]:
    p = Path(path).expanduser()
    if p.is_file():
        return [p]
    if not p.exists():
        raise FileNotFoundError(f"VLM record file not found: {p} (a .jsonl / .parquet file, or a folder with "
                                f"<split>.jsonl / <split>.parquet / <split>-*.parquet)")
    name = split or "train"
    for pattern in (f"{name}.jsonl", f"{name}.ndjson", f"{name}.parquet", f"{name}-*.parquet",
                    f"data/{name}.jsonl", f"data/{name}.parquet", f"data/{name}-*.parquet"):
        found = sorted(p.glob(pattern))
        if found:
            return found
    raise FileNotFoundError(f"no {name}.jsonl, {name}.parquet or {name}-*.parquet in {p}")


def pick(n: int, num_samples: int | None = None, shuffle: bool = False, seed: int = 0,
         indices: Sequence[int] | None = None) -> list[int]:
    """Row indices to keep: ``indices`` (default all n), shuffled by ``random.Random(seed)`` when
    ``shuffle``, the first ``num_samples``."""
    idx = list(range(n) if indices is None else indices)
    if shuffle:
        random.Random(seed).shuffle(idx)
    if num_samples is not None:
        if num_samples < 1:
            raise ValueError("num_samples must be >= 1")
        idx = idx[:num_samples]
    return idx


def empty_result() -> dict:
    return {"prompt": [], "images": [], "meta": [], "solution": []}


def build(path, split: str | None = None, num_samples: int | None = None, shuffle: bool = False, seed: int = 0,
          min_pixels: int | None = None, max_pixels: int | None = None, factor: int = 28) -> dict:
    """Records from a ``.jsonl`` / ``.ndjson`` / ``.parquet`` file (or a folder holding
    ``<split>.jsonl``, ``<split>.parquet`` or ``<split>-*.parquet``, split default "train").

    With a file, ``split`` keeps the records whose ``"split"`` key equals it. ``shuffle`` uses
    ``random.Random(seed)``; ``num_samples`` keeps the first n after that. Every record is checked;
    images are decoded only for the records kept, resized by `fit_pixels` / `resize_image` when
    ``min_pixels`` or ``max_pixels`` is given. Returns ``{"prompt", "images", "meta", "solution"}``.
    """
    files = _record_files(path, split)
    rows: list[tuple[str, Any, Path]] = []
    for f in files:
        suffix = f.suffix.lower()
        if suffix in PARQUET_SUFFIXES:
            limit = num_samples if (num_samples and not shuffle and split is None and len(files) == 1) else None
            rows += [(w, r, f.parent) for w, r in read_parquet_records(f, limit)]
        elif suffix in JSONL_SUFFIXES or suffix == ".json":
            rows += [(w, r, f.parent) for w, r in read_jsonl_records(f)]
        else:
            raise ValueError(f"{f}: unknown record file type {suffix!r}; use .jsonl or .parquet")
    if not rows:
        raise ValueError(f"no records in {', '.join(map(str, files))}: the file is empty")
    parsed = [(parse_record(r, w), base) for w, r, base in rows]
    if split is not None and len(files) == 1 and files[0] == Path(path).expanduser():
        if not any("split" in p["meta"] for p, _ in parsed):
            raise ValueError(f"split={split!r} given but no record of {files[0]} has a \"split\" key; drop split= "
                             f"or point path= at a folder with {split}.jsonl / {split}.parquet")
        parsed = [(p, b) for p, b in parsed if p["meta"].get("split") == split]
        if not parsed:
            raise ValueError(f"no record of {files[0]} has \"split\": {split!r}")
    out = empty_result()
    for i in pick(len(parsed), num_samples, shuffle, seed):
        rec, base = parsed[i]
        out["prompt"].append(rec["prompt"])
        out["images"].append(prepare_images(rec["images"], rec["where"], base, min_pixels, max_pixels, factor))
        out["meta"].append(rec["meta"])
        out["solution"].append(rec["solution"])
    return out


# ---------------------------------------------------------------------------------------------
# Public sets: local parquet files in the hub's schema, or the hub through Hugging Face datasets
# ---------------------------------------------------------------------------------------------


class RowSource:
    """Rows of one split of a public set, read lazily: ``len(source)``, ``source.columns`` and
    ``source.take(indices)`` -> list of (where, row dict)."""

    def __init__(self, name: str, length: int, columns: list[str], take: Callable[[list[int]], list]):
        self.name, self._len, self.columns, self._take = name, length, list(columns), take

    def __len__(self) -> int:
        return self._len

    def take(self, indices: Sequence[int]) -> list[tuple[str, dict]]:
        return self._take(list(indices))

    def require(self, columns: Sequence[str], schema_hint: str) -> None:
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise ValueError(f"{self.name}: missing column(s) {missing} (columns: {self.columns}); expected "
                             f"{schema_hint}")


def _expand_files(data_files) -> list[Path]:
    items = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
    files: list[Path] = []
    for item in items:
        s = str(Path(item).expanduser())
        if any(c in s for c in "*?["):
            matched = sorted(glob.glob(s, recursive=True))
            if not matched:
                raise FileNotFoundError(f"no file matches {s}")
            files += [Path(m) for m in matched]
        elif Path(s).is_file():
            files.append(Path(s))
        else:
            raise FileNotFoundError(f"data file not found: {s}")
    return files


def _split_files(folder: Path, split: str, hub_id: str) -> list[Path]:
    """Parquet files of ``split`` in a local snapshot of a hub dataset repository (``<split>-*.parquet``
    or ``<split>.parquet`` anywhere below, or any parquet in a folder named after the split)."""
    found = sorted({f for f in folder.rglob("*.parquet")
                    if f.name.startswith(f"{split}-") or f.stem == split or f.parent.name == split})
    if not found:
        raise FileNotFoundError(
            f"no {split}-*.parquet under {folder}; download the set with `huggingface-cli download {hub_id} "
            f"--repo-type dataset --local-dir {folder}` or pass data_files=[...]")
    return found


def _parquet_source(files: list[Path]) -> RowSource:
    pq = _pq()
    handles = [pq.ParquetFile(f) for f in files]
    counts = [h.metadata.num_rows for h in handles]
    starts = [0]
    for c in counts:
        starts.append(starts[-1] + c)
    columns = handles[0].schema_arrow.names

    def take(indices: list[int]) -> list[tuple[str, dict]]:
        out: list = [None] * len(indices)
        by_file: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for pos, i in enumerate(indices):
            f = bisect.bisect_right(starts, i) - 1
            by_file[f].append((pos, i - starts[f]))
        for f, items in by_file.items():
            table = pq.read_table(files[f])
            for (pos, j), row in zip(items, table.take([j for _, j in items]).to_pylist()):
                out[pos] = (f"{files[f]}, row {j}", row)
        return out

    name = str(files[0]) if len(files) == 1 else f"{files[0]} (+{len(files) - 1} more)"
    return RowSource(name, starts[-1], columns, take)


def _hf_datasets():
    had = "datasets" in sys.modules
    try:
        import datasets as hf
    except ImportError:
        hf = None
    if hf is None or not hasattr(hf, "load_dataset"):
        # without Hugging Face datasets installed, `import datasets` can find this repository's own
        # datasets/ folder (a namespace package, no load_dataset) when run from the repository root;
        # forget it again so a later `import datasets` is not fooled
        if hf is not None and not had:
            sys.modules.pop("datasets", None)
        raise ImportError("loading from the hub needs Hugging Face datasets: pip install datasets "
                          "(or pass path=<local snapshot folder> / data_files=<parquet files> in the hub schema)")
    return hf


def hub_source(hub_id: str, split: str, path=None, data_files=None) -> RowSource:
    """The rows of ``split`` of ``hub_id``: from ``data_files`` (parquet files / globs) or ``path`` (a
    local snapshot folder or one parquet file) read with pyarrow, else from the hub by
    ``datasets.load_dataset(hub_id, split=split)`` (images come back as PIL images)."""
    if data_files is not None:
        return _parquet_source(_expand_files(data_files))
    if path is not None:
        p = Path(path).expanduser()
        if p.is_file():
            return _parquet_source([p])
        if not p.is_dir():
            raise FileNotFoundError(f"{hub_id}: local path not found: {p}")
        return _parquet_source(_split_files(p, split, hub_id))
    hf = _hf_datasets()
    ds = hf.load_dataset(hub_id, split=split)

    def take(indices: list[int]) -> list[tuple[str, dict]]:
        sub = ds.select(indices)
        return [(f"{hub_id} [{split}] row {i}", row) for i, row in zip(indices, sub)]

    return RowSource(f"{hub_id} [{split}]", len(ds), list(ds.column_names), take)
