"""Build `vlm_records`: your own VLM reasoning data (image(s) / video(s) + question -> checkable answer) from a
JSONL / JSON / parquet / CSV file, a folder of them, or a Hugging Face hub dataset, and the image /
pixel-budget / hub-row helpers the public VLM recipes share.

``build(path=None, split=None, data_files=None, subset=None, prompt_key="prompt", answer_key="answer",
image_key=None, video_key=None, eval_fraction=0.0, num_samples=None, shuffle=False, seed=0, min_pixels=None,
max_pixels=None, factor=28, max_record_bytes=MAX_RECORD_BYTES)`` returns a dict of lists, one entry per sample::

    {"prompt":   [str],                        # the question text, image placeholders removed
     "images":   [[uint8 tensor [H, W, 3]]],    # the sample's images, in order (may be empty)
     "meta":     [dict],                        # every other column + {"answer": ground truth}
     "solution": [str],                         # SFT target; defaults to the answer as text
     "videos":   [[source]]}                    # only with videos: undecoded `mmrl.video` sources

A row has the question in ``prompt_key`` (a string, or chat messages; with the default "prompt" a
``messages`` column is read too), its images in ``image_key`` (default ``images``, else ``image``:
paths relative to the data file's folder or absolute, ``{"bytes", "path"}`` as Hugging Face's
``Image()`` feature stores them, base64 in JSONL, PIL images from the hub), the ground truth in
``answer_key`` and an optional ``solution`` (SFT target). Videos are in ``video_key`` (default
``videos``, else ``video``): file paths resolved as image paths are, ``{"path", "bytes"}`` as
``Video(decode=False)`` stores them, or one video as a list of frame image paths; checked at load,
decoded by the policy. Every other column reaches ``meta`` under its own name (JSON values), which
the reward stage hands to the reward. Splits come from the files
(``data_files={"train": ..., "eval": ...}``, ``train.jsonl`` / ``test-*.parquet`` in a folder), a
``split`` column, or the hub; `choose_split` says what an evaluation split the data lacks falls back to.
See CARD.md.

The recipes (``geometry3k``, ``clevr_counting``, ``refcoco``) load this file by path
(``mmrl.data.builder_module("vlm_records")``) for `fit_pixels`, `resize_image`, `load_image`,
`hub_source` and `pick`.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import datetime
import decimal
import glob
import io
import json
import math
import random
import re
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mmrl.data import MAX_RECORD_BYTES, check_record_limit, read_jsonl_records

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv", ".tsv")
RECORD_SUFFIXES = (*JSONL_SUFFIXES, ".json", *PARQUET_SUFFIXES, *CSV_SUFFIXES)
# split keywords in file and folder names (the hub's rules) and, in order of preference, the names an
# evaluation split goes by: split="eval" reads the first of these the data has
SPLIT_WORDS = ("train", "training", "validation", "valid", "val", "dev", "test", "testing", "eval", "evaluation")
EVAL_SPLITS = ("eval", "evaluation", "validation", "valid", "val", "dev", "test", "testing")
HOLDOUT_SEED = "vlm_records eval_fraction"  # fixed: train and eval are complements for every seed
# metadata beside the data in hub snapshots and save_to_disk folders, never rows
_NOT_DATA = ("dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json")
IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
MAX_RATIO = 200  # Qwen2-VL's limit on max(h, w) / min(h, w)
_PLACEHOLDER_RE = re.compile(r"[ \t]*<(?:image|video)>[ \t]*\n?")
# a list of strings with these suffixes in a video column is ONE video given as its frames
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")


# ---------------------------------------------------------------------------------------------
# Pixel budgets (Qwen2-VL's smart_resize rule)
# ---------------------------------------------------------------------------------------------


def fit_pixels(
    h: int, w: int, min_pixels: int | None = None, max_pixels: int | None = None, factor: int = 28
) -> tuple[int, int]:
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
        raise ValueError(
            f"absolute aspect ratio must be at most {MAX_RATIO}, got {max(h, w) / min(h, w):.1f} "
            f"({h}x{w}); crop or pad the image first"
        )
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


def resize_image(
    img: torch.Tensor, min_pixels: int | None = None, max_pixels: int | None = None, factor: int = 28
) -> torch.Tensor:
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
        raise ValueError(
            f"{where}: not a decodable image ({type(exc).__name__}: {exc}); store a PNG / JPEG / WebP file or its bytes"
        ) from None


def _resolve_file(p, base_dir, where: str, what: str, rel_from, copied: str) -> Path:
    """``p`` resolved against ``base_dir`` (a data file's folder) when relative; FileNotFoundError
    naming ``where``, the ``what`` (e.g. "image file"), the folder relative paths are resolved
    against (``rel_from``; None: not said) and the fix when there is no such file."""
    path = Path(p).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        rel = f" (relative paths are resolved against {rel_from})" if rel_from is not None else ""
        raise FileNotFoundError(f"{where}: {what} not found: {path}{rel}; fix the path or copy the {copied} there")
    return path


def _b64_bytes(data: str, where: str, example: str) -> bytes:
    """The bytes of a base64 string (or a ``data:`` URL) from JSONL; one clear error naming ``where``
    and how to store them (``example``: what was encoded, e.g. "png_bytes")."""
    try:
        return base64.b64decode(data.split(",", 1)[1] if data.startswith("data:") else data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(
            f'{where}: "bytes" is a string but not valid base64; in JSONL store base64.b64encode({example}).decode()'
        ) from None


def _read_path(p, base_dir, where: str) -> torch.Tensor:
    path = _resolve_file(p, base_dir, where, "image file", base_dir, "image")
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
                data = _b64_bytes(data, where, "png_bytes")
            return _decode_bytes(bytes(data), where)
        if item.get("path"):
            return _read_path(item["path"], base_dir, where)
        raise ValueError(f'{where}: an image dict needs "bytes" or "path" (keys: {sorted(item)})')
    if isinstance(item, str) and item.startswith("data:"):
        return load_image({"bytes": item}, where, base_dir)
    if isinstance(item, (str, Path)):
        return _read_path(item, base_dir, where)
    raise ValueError(
        f'{where}: cannot read an image from {type(item).__name__}; use a path, {{"bytes": ...}} or {{"path": ...}}'
    )


def prepare_images(
    items: Sequence, where: str, base_dir=None, min_pixels=None, max_pixels=None, factor: int = 28
) -> list[torch.Tensor]:
    """`load_image` each item, then `resize_image` when a pixel budget is given."""
    out = []
    for k, item in enumerate(items):
        img = load_image(item, f"{where}, image {k}", base_dir)
        if min_pixels is not None or max_pixels is not None:
            img = resize_image(img, min_pixels, max_pixels, factor)
        out.append(img)
    return out


# ---------------------------------------------------------------------------------------------
# Videos: checked and resolved here, decoded by the policy (`mmrl.video`, once per iteration)
# ---------------------------------------------------------------------------------------------


def _is_frame_paths(items: Sequence) -> bool:
    """Whether a list in a video column is one video given as its frames (image file paths)."""
    return bool(items) and all(
        isinstance(x, (str, Path)) and Path(str(x)).suffix.lower() in FRAME_SUFFIXES for x in items
    )


def video_items(value: Any, where: str, column: str) -> list:
    """A video column's value -> a list of videos: one video (a path, a ``{"path", "bytes"}`` /
    ``{"frames", "fps"}`` dict, bytes, a list of frame image paths) or a list of them."""
    if value is None:
        return []
    if isinstance(value, (str, Path, dict, bytes, bytearray)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [list(value)] if _is_frame_paths(value) else list(value)
    if isinstance(value, torch.Tensor) or type(value).__module__ == "numpy":
        return [value]  # frames [F, H, W, 3]
    raise ValueError(
        f'{where}: \'{column}\' must be a video or a list of videos (paths, {{"path", "bytes"}} as '
        f"datasets.Video(decode=False) stores them, or lists of frame image paths), got "
        f"{type(value).__name__}; a decoded datasets.Video column: cast it with Video(decode=False)"
    )


def _video_path(p, base_dir, where: str, what: str = "video file") -> str:
    """A video (or frame) path resolved against ``base_dir``, as an absolute path; FileNotFoundError
    naming ``where`` when there is no such file."""
    return str(_resolve_file(p, base_dir, where, what, base_dir or Path.cwd(), "file").absolute())


def _video_bytes(data: Any, where: str) -> bytes:
    if isinstance(data, str):  # JSONL: base64 (or a data: URL)
        return _b64_bytes(data, where, "mp4_bytes")
    return bytes(data)


def _frames(frames: Any, where: str, base_dir) -> Any:
    if isinstance(frames, (list, tuple)):
        if not frames:
            raise ValueError(f"{where}: a video given as frames needs at least one frame")
        return [
            _video_path(f, base_dir, f"{where}, frame {j}", "frame image") if isinstance(f, (str, Path)) else f
            for j, f in enumerate(frames)
        ]
    return frames  # an array [F, H, W, 3]: `mmrl.video` checks it


def prepare_video(item: Any, where: str, base_dir=None) -> Any:
    """One video of a row -> the source `mmrl.video` decodes (lazily, in the policy): an absolute
    file path; ``{"path", "bytes"}`` with raw bytes (base64 in JSONL decoded); a list of frames (image
    paths resolved; arrays kept) or ``{"frames", "fps"}``. Paths are resolved against ``base_dir``
    (the data file's folder; None: the working directory) and must exist."""
    if isinstance(item, str) and item.startswith("data:"):
        return {"path": None, "bytes": _video_bytes(item, where)}
    if isinstance(item, (str, Path)):
        return _video_path(item, base_dir, where)
    if isinstance(item, (bytes, bytearray, memoryview)):
        return {"path": None, "bytes": bytes(item)}
    if isinstance(item, dict):
        if item.get("frames") is not None:
            out = {"frames": _frames(item["frames"], where, base_dir)}
            if item.get("fps") is not None:
                out["fps"] = float(item["fps"])
            return out
        if item.get("bytes") is not None:
            data = _video_bytes(item["bytes"], where)
            if not data:
                raise ValueError(f'{where}: "bytes" is empty')
            return {"path": item.get("path"), "bytes": data}  # the path only names the format (its suffix)
        if item.get("path"):
            return _video_path(item["path"], base_dir, where)
        raise ValueError(f'{where}: a video dict needs "path", "bytes" or "frames" (keys: {sorted(item)})')
    if isinstance(item, (list, tuple)) or isinstance(item, torch.Tensor) or type(item).__module__ == "numpy":
        return _frames(item, where, base_dir)
    raise ValueError(
        f'{where}: cannot read a video from {type(item).__name__}; use a path, {{"path", "bytes"}} '
        f"or a list of frame image paths (a decoded datasets.Video column: cast it with Video(decode=False))"
    )


def prepare_videos(items: Sequence, where: str, base_dir=None, column: str = "videos") -> list:
    """`prepare_video` each video of a row (``where`` names the row, errors add the column and video)."""
    return [prepare_video(item, f"{where}, column '{column}', video {k}", base_dir) for k, item in enumerate(items)]


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


def strip_placeholders(text: str) -> str:
    """Remove ``<image>`` and ``<video>`` placeholders (and the spaces / newline around them) from a prompt."""
    if IMAGE_PLACEHOLDER in text or VIDEO_PLACEHOLDER in text:
        return _PLACEHOLDER_RE.sub(" ", text).strip()
    return text.strip()


def answer_text(answer: Any) -> str:
    """The ground truth as text (strings as they are, lists as JSON, numbers by ``str``)."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, (list, tuple, dict)):
        return json.dumps(answer)
    return str(answer)


# guesses for the error naming a missing column: the column a user most likely means
_PROMPT_GUESSES = (
    "question",
    "problem",
    "query",
    "instruction",
    "input",
    "text",
    "prompt",
    "messages",
    "conversations",
)
_ANSWER_GUESSES = ("answer", "solution", "ground_truth", "gt", "label", "target", "final_answer", "output")
_IMAGE_GUESSES = ("images", "image", "image_path", "image_paths", "img", "picture", "figure")
_VIDEO_GUESSES = ("videos", "video", "video_path", "video_paths", "clip", "clips", "mp4", "frames")


def _columns_hint(rec: dict, key_arg: str, role: str, guesses: Sequence[str], exclude: Sequence[str] = ()) -> str:
    """'(its columns: a, b); set prompt_key: <the question column>, e.g. prompt_key: question'."""
    cols = sorted(map(str, rec))
    guess = next((g for g in guesses if g in rec and g not in exclude), None)
    eg = f", e.g. {key_arg}: {guess}" if guess is not None else ""
    return f"(its columns: {', '.join(cols) or 'none'}); set {key_arg}: <the {role} column>{eg}"


def _check_answer(rec: dict, where: str, answer_key: str = "answer", exclude: Sequence[str] = ()) -> Any:
    if answer_key not in rec:
        raise ValueError(
            f"{where}: no '{answer_key}' column "
            f"{_columns_hint(rec, 'answer_key', 'ground-truth', _ANSWER_GUESSES, exclude)}, or "
            f"answer_key: null for data without one"
        )
    ans = rec[answer_key]
    if ans is None:
        raise ValueError(
            f"{where}: '{answer_key}' is null; every record needs its ground truth (a string or a "
            f"number), or set answer_key: null for data without one"
        )
    if isinstance(ans, str) and not ans.strip():
        raise ValueError(f"{where}: '{answer_key}' is an empty string; give the ground truth")
    if not isinstance(ans, (str, int, float, list, tuple, dict)):
        raise ValueError(f"{where}: '{answer_key}' must be a string or a number, got {type(ans).__name__}")
    return ans


def trl_image_slots(messages, n_images: int):
    """TRL's conversational form with an ``image`` column (``prepare_multimodal_messages``): messages
    that name no image at all, and ``n_images`` images beside them, get one ``{"type": "image"}``
    part per image at the start of the first user message (string contents become text parts).
    Messages that place their images themselves, or carry none beside them, are returned as given."""
    if not n_images or not isinstance(messages, list):
        return messages
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str) and (IMAGE_PLACEHOLDER in content or VIDEO_PLACEHOLDER in content):
            return messages
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in ("image", "video") for p in content
        ):
            return messages
    first = next((j for j, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), None)
    if first is None:
        return messages
    out = [dict(m) if isinstance(m, dict) else m for m in messages]
    content = out[first].get("content")
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    out[first]["content"] = [{"type": "image"} for _ in range(n_images)] + parts
    return out


def _messages_prompt(messages, where: str) -> tuple[str, int, list, int, list]:
    """(text of the last user message, number of image placeholders in all messages, image items
    carried by the image parts themselves, the same two for videos)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f'{where}: \'messages\' must be a non-empty list of {{"role", "content"}} objects')
    count, carried, last_user = 0, [], None
    video_count, video_carried = 0, []
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f'{where}: message {j} must be an object with "role" and "content"')
        content = m["content"]
        if isinstance(content, str):
            count += content.count(IMAGE_PLACEHOLDER)
            video_count += content.count(VIDEO_PLACEHOLDER)
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
                elif kind == "video":
                    video_count += 1
                    if part.get("bytes") is not None:
                        video_carried.append({"path": part.get("path"), "bytes": part["bytes"]})
                    elif part.get("video") is not None:
                        video_carried.append(part["video"])
                    elif part.get("path") is not None:
                        video_carried.append(part["path"])
                else:
                    raise ValueError(
                        f"{where}: message {j} has a content part that is not "
                        f'{{"type": "text", "text": ...}}, {{"type": "image"}} or {{"type": "video"}}: {part!r}'
                    )
            text = "\n".join(strip_placeholders(t) for t in texts if strip_placeholders(t))
        else:
            raise ValueError(f"{where}: message {j} content must be a string or a list of parts")
        if m["role"] == "user":
            last_user = text
    if last_user is None:
        raise ValueError(f"{where}: 'messages' has no message with role \"user\"")
    if not last_user:
        raise ValueError(f"{where}: the last user message has no text")
    return last_user, count, carried, video_count, video_carried


_DROP = object()  # a value with no JSON form (bytes, an image): left out of meta


def _jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (numpy scalars and arrays as numbers and lists, dates as ISO
    strings, tuples as lists), or ``_DROP`` when it has no JSON form (bytes, images)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_jsonable(v) for v in value]
        return _DROP if any(v is _DROP for v in items) else items
    if isinstance(value, dict):
        items = {str(k): _jsonable(v) for k, v in value.items()}
        return _DROP if any(v is _DROP for v in items.values()) else items
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return _DROP


def _plain_messages(messages: list) -> Any:
    """Chat messages for meta: image and video parts reduced to ``{"type": "image"}`` /
    ``{"type": "video"}`` (their pixels are the sample's images and videos), everything else as JSON."""
    out = []
    for m in messages:
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            parts = [
                {"type": p["type"]}
                if isinstance(p, dict) and p.get("type") in ("image", "video")
                else {k: v for k, v in p.items() if v is not None}
                if isinstance(p, dict)
                else p
                for p in m["content"]
            ]
            m = {**m, "content": parts}
        out.append(m)
    return _jsonable(out)


def parse_record(
    rec: Any,
    where: str,
    prompt_key: str = "prompt",
    answer_key: str | None = "answer",
    image_key: str | None = None,
    video_key: str | None = None,
) -> dict:
    """Check one record (a row) and split it into ``prompt``, ``images`` (raw items, not decoded yet),
    ``videos`` (raw items, one per video, not resolved yet), ``meta`` and ``solution``. Errors name
    ``where`` (file and line / row) and the fix.

    ``prompt_key``: the question column, a string (``<image>`` / ``<video>`` placeholders allowed) or
    chat messages (TRL's conversational format); with the default "prompt" a ``messages`` column is read
    when there is no prompt. ``answer_key``: the ground-truth column (None: data without one).
    ``image_key``: the image column (None: ``images``, else ``image``, else no images). ``video_key``:
    the video column (None: ``videos``, else ``video``, else no videos). ``meta`` = every other column
    under its own name (JSON values; a column without a JSON form, e.g. a second image column, is left
    out and named in ``dropped``) + ``answer`` (the ``answer_key`` column) + ``messages`` for chat
    prompts."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
    used: set[str] = set()
    # -- prompt -------------------------------------------------------------------------------
    value = rec.get(prompt_key)
    messages = None
    if prompt_key == "prompt" and rec.get("messages") is not None:
        if value is not None:
            raise ValueError(f"{where}: has both 'prompt' and 'messages'; keep one")
        messages, value = rec["messages"], None
        used.add("messages")
    elif prompt_key not in rec:
        more = " (or chat 'messages')" if prompt_key == "prompt" else ""
        raise ValueError(
            f"{where}: no '{prompt_key}' column{more} {_columns_hint(rec, 'prompt_key', 'question', _PROMPT_GUESSES)}"
        )
    elif isinstance(value, list):
        messages, value = value, None  # conversational: [{"role": "user", "content": ...}, ...]
    used.add(prompt_key)
    # -- images -------------------------------------------------------------------------------
    if image_key is None:
        used.update(("images", "image"))
        images = rec.get("images")
        if images is None:
            images = rec.get("image")
    else:
        if image_key not in rec:
            raise ValueError(
                f"{where}: no '{image_key}' column "
                f"{_columns_hint(rec, 'image_key', 'image', _IMAGE_GUESSES)}, or leave image_key "
                f"unset for data without images"
            )
        used.add(image_key)
        images = rec[image_key]
    if images is None:
        images = []
    elif isinstance(images, (str, dict, bytes, bytearray)) or (hasattr(images, "convert") and hasattr(images, "size")):
        images = [images]
    elif not isinstance(images, (list, tuple)):
        col = image_key or "images"
        raise ValueError(
            f"{where}: '{col}' must be an image or a list of images (paths, {{\"bytes\": ...}} or "
            f'{{"path": ...}}), got {type(images).__name__}'
        )
    images = list(images)
    # -- videos -------------------------------------------------------------------------------
    if video_key is None:
        used.update(("videos", "video"))
        video_col = "videos" if rec.get("videos") is not None else "video"
        videos = video_items(rec.get(video_col), where, video_col)
    else:
        if video_key not in rec:
            raise ValueError(
                f"{where}: no '{video_key}' column "
                f"{_columns_hint(rec, 'video_key', 'video', _VIDEO_GUESSES)}, or leave video_key "
                f"unset for data without videos"
            )
        used.add(video_key)
        video_col = video_key
        videos = video_items(rec[video_key], where, video_key)
    # -- prompt text and image / video placeholders -------------------------------------------
    if messages is not None:
        messages = trl_image_slots(messages, len(images))
        prompt, n_slots, carried, n_video_slots, video_carried = _messages_prompt(messages, where)
        if not images and carried:
            images = carried
        if not videos and video_carried:
            videos = video_carried
        if n_slots != len(images):
            raise ValueError(
                f"{where}: the messages have {n_slots} image placeholder(s) but the record has "
                f'{len(images)} image(s); give one {{"type": "image"}} part (or "<image>" in a '
                f"string content) per image, in order"
            )
        if n_video_slots != len(videos):
            raise ValueError(
                f"{where}: the messages have {n_video_slots} video placeholder(s) but the record has "
                f'{len(videos)} video(s); give one {{"type": "video"}} part (or "<video>" in a '
                f"string content) per video, in order"
            )
    else:
        if not isinstance(value, str) or not strip_placeholders(value):
            raise ValueError(f"{where}: '{prompt_key}' must be a non-empty string or chat messages, got {value!r}")
        n_slots = value.count(IMAGE_PLACEHOLDER)
        if n_slots and n_slots != len(images):
            raise ValueError(
                f'{where}: the prompt has {n_slots} "<image>" placeholder(s) but the record has '
                f"{len(images)} image(s); use one placeholder per image (or none: images go first)"
            )
        n_video_slots = value.count(VIDEO_PLACEHOLDER)
        if n_video_slots and n_video_slots != len(videos):
            raise ValueError(
                f'{where}: the prompt has {n_video_slots} "<video>" placeholder(s) but the record has '
                f"{len(videos)} video(s) ('{video_col}'); use one placeholder per video (or none: videos go first)"
            )
        prompt = strip_placeholders(value)
    # -- ground truth, meta, SFT target -------------------------------------------------------
    if answer_key == "answer" and "answer" not in rec and rec.get("solution") is not None:
        answer_key = "solution"  # TRL's column for the ground truth (its accuracy_reward reads `solution`)
    answer = None if answer_key is None else _check_answer(rec, where, answer_key, exclude=tuple(used))
    meta, dropped = {}, []
    for k, v in rec.items():
        if k in used:
            continue
        j = _jsonable(v)
        if j is _DROP:
            dropped.append(str(k))
        else:
            meta[str(k)] = j
    if messages is not None:
        meta["messages"] = _plain_messages(messages)  # kept whole: system prompts and earlier turns live there
    if answer_key is not None:
        meta["answer"] = _jsonable(answer)
    solution = answer_text(answer) if answer_key == "solution" else rec.get("solution")
    if solution is None:
        solution = "" if answer is None else answer_text(answer)
    elif isinstance(solution, (int, float)):
        solution = answer_text(solution)
    elif not isinstance(solution, str):
        raise ValueError(f"{where}: 'solution' must be a string (the full target completion)")
    return {
        "prompt": prompt,
        "images": images,
        "videos": videos,
        "video_column": video_col,
        "meta": meta,
        "solution": solution,
        "where": where,
        "dropped": dropped,
    }


# ---------------------------------------------------------------------------------------------
# Reading files, and where the splits come from
# ---------------------------------------------------------------------------------------------


def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading parquet needs pyarrow: pip install pyarrow") from None
    return pq


def read_parquet_records(path: Path, limit: int | None = None) -> list[tuple[str, dict]]:
    pq = _pq()
    out: list[tuple[str, dict]] = []
    for batch in pq.ParquetFile(path).iter_batches(batch_size=256):
        for row in batch.to_pylist():
            out.append((f"{path}, row {len(out)}", row))
            if limit is not None and len(out) >= limit:
                return out
    return out


def read_csv_records(path: Path) -> list[tuple[str, dict]]:
    """(where, row) per row of a ``.csv`` / ``.tsv`` file with a header line, typed as pandas would
    (a column of numbers is numbers; read by pyarrow)."""
    try:
        import pyarrow.csv as pcsv
    except ImportError:
        raise ImportError("reading csv needs pyarrow: pip install pyarrow") from None
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        table = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter))
    except Exception as exc:  # pyarrow.lib.ArrowInvalid and friends
        raise ValueError(
            f"{path}: not a readable {path.suffix.lower()[1:]} file with a header line ({str(exc).splitlines()[0]})"
        ) from None
    return [(f"{path}, line {i + 2}", row) for i, row in enumerate(table.to_pylist())]


def read_rows(files: Sequence[Path], max_record_bytes: int = MAX_RECORD_BYTES) -> list[tuple[str, Any, Path]]:
    """(where, row, folder relative image paths resolve against) for every row of ``files``."""
    rows: list[tuple[str, Any, Path]] = []
    for f in files:
        suffix = f.suffix.lower()
        if suffix in PARQUET_SUFFIXES:
            found = read_parquet_records(f)
        elif suffix in JSONL_SUFFIXES or suffix == ".json":
            found = read_jsonl_records(f, max_record_bytes)
        elif suffix in CSV_SUFFIXES:
            found = read_csv_records(f)
        else:
            raise ValueError(f"{f}: unknown record file type {suffix!r}; use {', '.join(RECORD_SUFFIXES)}")
        rows += [(w, r, f.parent) for w, r in found]
    return rows


def _split_of(rel: Path, want: str | None) -> str | None:
    """The split a data file of a folder belongs to, by the Hugging Face hub's file-name rules:
    ``<split>-00000-of-00001.<ext>`` (any split name), a file or folder named by a split keyword
    (``train.jsonl``, ``test-part1.csv``, ``validation/x.parquet``), or the asked-for split's own
    name (``mini.jsonl`` for split "mini"); None: the file names no split."""
    stem = rel.name[: -len("".join(rel.suffixes[-1:]))] if rel.suffix else rel.name
    m = re.fullmatch(r"(.+?)-\d{5}-of-\d{5}", stem)
    if m:
        return m.group(1)
    if want is not None and (stem == want or stem.startswith(f"{want}-")):
        return want
    m = re.match(r"[A-Za-z]+", stem)
    if m and m.group(0).lower() in SPLIT_WORDS and (len(stem) == m.end() or stem[m.end()] in "-_. "):
        return m.group(0).lower()
    for part in rel.parts[:-1]:
        if part.lower() in SPLIT_WORDS:
            return part.lower()
    return None


def _folder_splits(folder: Path, want: str | None) -> tuple[dict[str, list[Path]], bool]:
    """(split -> data files of ``folder``, whether the split names came from the file names); files
    that name no split form "train" when none does."""
    files = sorted(
        f
        for f in folder.rglob("*")
        if f.suffix.lower() in RECORD_SUFFIXES
        and f.is_file()
        and not any(p.startswith(".") for p in f.relative_to(folder).parts)
    )
    splits: dict[str, list[Path]] = defaultdict(list)
    for f in files:
        name = _split_of(f.relative_to(folder), want)
        if name is not None:
            splits[name].append(f)
    if splits:
        return dict(splits), True
    files = [f for f in files if f.name not in _NOT_DATA]
    if not files:
        raise FileNotFoundError(f"no data file ({', '.join(RECORD_SUFFIXES)}) in {folder}")
    return {"train": files}, False


def _expand_files(data_files, base: Path | None = None) -> list[Path]:
    items = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
    files: list[Path] = []
    for item in items:
        p = Path(item).expanduser()
        if base is not None and not p.is_absolute():
            p = base / p
        s = str(p)
        if any(c in s for c in "*?["):
            matched = sorted(glob.glob(s, recursive=True))
            if not matched:
                raise FileNotFoundError(f"no file matches {s}")
            files += [Path(m) for m in matched]
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"data file not found: {s}")
    return files


def _looks_local(path: str) -> bool:
    """Whether ``path`` names a local file or folder rather than a hub id ("name" or "owner/name")."""
    return (
        path.startswith((".", "/", "~"))
        or "\\" in path
        or path.count("/") > 1
        or Path(path).suffix.lower() in RECORD_SUFFIXES
    )


class _Part:
    """The rows of one split: ``len(part)``, ``part.take(indices)`` -> (where, row, image base folder)."""

    def __init__(self, what: str, rows: list | None = None, indices: list[int] | None = None, hf=None):
        self.what, self._rows, self._hf = what, rows, _undecoded_videos(hf)
        self.indices = list(range(len(rows) if hf is None else len(hf))) if indices is None else list(indices)
        self.local = hf is None

    def take(self, indices: Sequence[int]) -> list[tuple[str, Any, Path | None]]:
        rows = [self.indices[i] for i in indices]
        if self._hf is None:
            return [self._rows[i] for i in rows]
        return [(f"{self.what}, row {i}", row, None) for i, row in zip(rows, self._hf.select(rows))]


def _undecoded_videos(ds):
    """A Hugging Face dataset with its ``datasets.Video`` columns cast to ``Video(decode=False)``: rows
    then hold ``{"path", "bytes"}``, which `mmrl.video` decodes (decoded values are torchcodec
    decoders, and torchcodec is not a dependency). Metadata only: no data is read."""
    features = getattr(ds, "features", None)
    video = getattr(sys.modules.get("datasets"), "Video", None)
    if not features or video is None:
        return ds
    for name, feature in features.items():
        if isinstance(feature, video) and getattr(feature, "decode", False):
            ds = ds.cast_column(name, video(decode=False))
    return ds


def _local_parts(path, data_files, split: str | None, limit: int) -> tuple[str, dict[str, Callable[[], _Part]]]:
    """(what to call the data in messages, split -> a maker of its rows) of local files. A single
    file or a list of files is one split, "train", unless its rows carry a ``split`` column (a JSON
    line holds at most ``limit`` bytes)."""

    def rows_of(files):
        return read_rows(files, limit)

    base = None
    if path is not None:
        base = Path(path).expanduser()
        if data_files is not None and not base.is_dir():
            raise ValueError(
                f"data_files is given, so path= must be the folder they are relative to (or unset); "
                f"{base} is not a folder"
            )
    if data_files is not None:
        if isinstance(data_files, dict):
            files = {str(k): _expand_files(v, base) for k, v in data_files.items()}
            what = f"data_files {{{', '.join(files)}}}"
            return what, {k: (lambda fs=fs, k=k: _Part(f"{what} [{k}]", rows_of(fs))) for k, fs in files.items()}
        files, named = {"train": _expand_files(data_files, base)}, False
        what = str(files["train"][0]) + (f" (+{len(files['train']) - 1} more)" if len(files["train"]) > 1 else "")
    elif base.is_file():
        files, named, what = {"train": [base]}, False, str(base)
    elif base.is_dir() and saved_by_datasets(base):  # Dataset / DatasetDict .save_to_disk(folder)
        return _saved_parts(base)
    elif base.is_dir():
        (files, named), what = _folder_splits(base, split), str(base)
    else:
        raise FileNotFoundError(
            f"VLM record file not found: {base} (a {' / '.join(RECORD_SUFFIXES)} file, a folder "
            f"of them, or a hub dataset id)"
        )
    if named:
        return what, {k: (lambda fs=fs, k=k: _Part(f"{what} [{k}]", rows_of(fs))) for k, fs in files.items()}
    rows = rows_of(files["train"])
    if not rows:
        raise ValueError(f"no records in {what}: the file is empty")
    column = [r.get("split") if isinstance(r, dict) else None for _, r, _ in rows]
    if all(v is None for v in column):
        return what, {"train": lambda: _Part(what, rows)}
    by_split: dict[str, list[int]] = defaultdict(list)  # a `split` column: its values are the splits
    for i, v in enumerate(column):
        by_split["train" if v is None else str(v)].append(i)
    return what, {k: (lambda ix=ix: _Part(what, rows, ix)) for k, ix in by_split.items()}


def saved_by_datasets(folder: Path) -> bool:
    """Whether ``folder`` is what Hugging Face ``Dataset.save_to_disk`` (``dataset_info.json`` and
    ``state.json``) or ``DatasetDict.save_to_disk`` (``dataset_dict.json``) writes."""
    return (folder / "dataset_dict.json").is_file() or (
        (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file()
    )


def _saved_parts(folder: Path) -> tuple[str, dict[str, Callable[[], _Part]]]:
    """The splits of a ``save_to_disk`` folder (a `DatasetDict`'s, or a `Dataset`'s as "train"), read
    by ``datasets.load_from_disk``; images come back decoded by the dataset's features, as from the hub."""
    try:
        hf = _hf_datasets()
    except ImportError:
        raise ImportError(
            f"{folder} was written by Hugging Face datasets' save_to_disk: pip install datasets"
        ) from None
    loaded = hf.load_from_disk(str(folder))
    what = str(folder)
    if isinstance(loaded, hf.DatasetDict):
        return what, {str(k): (lambda k=k: _Part(f"{what} [{k}]", hf=loaded[k])) for k in loaded}
    return what, {"train": lambda: _Part(what, hf=loaded)}


def _hub_parts(path: str, subset: str | None, data_files) -> tuple[str, dict[str, Callable[[], _Part]]]:
    """Splits of a Hugging Face hub dataset (or any `datasets.load_dataset` path: "json", "parquet",
    "csv" with ``data_files``); rows come back with images decoded to PIL by the dataset's features."""
    try:
        hf = _hf_datasets()
    except ImportError:
        raise ImportError(
            f"{path!r} is not a local file or folder; read as a Hugging Face dataset id it needs pip install datasets"
        ) from None
    what = path + ("" if subset is None else f" ({subset})")
    what += "" if data_files is None else f" data_files={data_files}"
    try:
        names = hf.get_dataset_split_names(path, subset, data_files=data_files)
    except Exception as exc:  # the hub client raises many types (not found, offline, gated, ...)
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(
            f"{path!r} is not a local file or folder and could not be opened as a Hugging Face dataset "
            f"({type(exc).__name__}: {first}); check the path or the hub id"
        ) from exc

    def part(name: str) -> _Part:
        return _Part(f"{what} [{name}]", hf=hf.load_dataset(path, subset, split=name, data_files=data_files))

    return what, {str(n): (lambda n=n: part(n)) for n in names}


def choose_split(names: Sequence[str], split: str | None, eval_fraction: float, what: str) -> tuple[str, str | None]:
    """(split to read, ``held_out``) for the asked-for ``split`` among the data's split ``names``.

    ``split`` found: it. None: "train" (or the only split). An evaluation name ("eval", "validation",
    "val", "test", ...) the data does not have: its evaluation split by another name (in the order of
    `EVAL_SPLITS`); with none, the training rows: ``held_out`` "eval" (only the ``eval_fraction`` held
    out) when ``eval_fraction`` > 0, else all of them, with a warning that evaluation scores are then
    training scores. For the training split ``held_out`` is "train" (the held-out rows dropped) when
    ``eval_fraction`` > 0. Any other name the data lacks: ValueError naming its splits."""
    names = list(names)
    evals = [s for s in EVAL_SPLITS if s in names]
    if eval_fraction and evals:
        raise ValueError(
            f"eval_fraction={eval_fraction} holds rows out for evaluation, but {what} has its own "
            f"evaluation split '{evals[0]}'; drop eval_fraction"
        )
    train = "train" if "train" in names else (names[0] if len(names) == 1 else None)
    if split is None:
        if train is None:
            raise ValueError(f"{what} has the splits {', '.join(names)} and none is 'train'; choose one with split")
        return train, ("train" if eval_fraction else None)
    if split in names:
        return split, ("train" if eval_fraction and split == train else None)
    if split.lower() in EVAL_SPLITS and evals:
        return evals[0], None
    if split.lower() in EVAL_SPLITS and train is not None:
        if eval_fraction:
            return train, "eval"
        warnings.warn(
            f"{what} has no evaluation split, so evaluation (split '{split}') uses its training rows and "
            f"reports training scores; to hold data out give data_files: {{train: ..., eval: ...}}, a "
            f"'split' column, or eval_fraction: 0.1",
            stacklevel=3,
        )
        return train, None
    raise ValueError(
        f"{what} has no split '{split}' (its splits: {', '.join(names)}); use one of them, or give "
        f"data_files: {{{split}: <files>}}"
    )


def held_out(n: int, fraction: float, what: str) -> set[int]:
    """The positions (of n rows) held out for evaluation by ``eval_fraction``: round(n * fraction),
    at least 1 and at most n - 1, drawn by a fixed ``random.Random`` (the same for every call, so the
    training and evaluation splits are complements whatever ``seed`` is)."""
    if n < 2:
        raise ValueError(f"eval_fraction needs at least 2 rows to hold some out, {what} has {n}")
    k = min(n - 1, max(1, round(n * fraction)))
    order = list(range(n))
    random.Random(HOLDOUT_SEED).shuffle(order)
    return set(order[:k])


def pick(
    n: int, num_samples: int | None = None, shuffle: bool = False, seed: int = 0, indices: Sequence[int] | None = None
) -> list[int]:
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


def build(
    path=None,
    split: str | None = None,
    data_files=None,
    subset: str | None = None,
    prompt_key: str = "prompt",
    answer_key: str | None = "answer",
    image_key: str | None = None,
    video_key: str | None = None,
    eval_fraction: float = 0.0,
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int = 28,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> dict:
    """Your VLM data -> ``{"prompt", "images", "meta", "solution"}`` (see the module docstring and CARD.md).

    ``path``: a ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` / ``.tsv`` file, a folder of them (splits by
    the hub's file-name rules), or a Hugging Face dataset id (read by ``datasets.load_dataset``).
    ``data_files``: files or globs (one split, "train"), or ``{split: files}``; relative to ``path`` when
    that is a folder. ``split``: None = "train"; an evaluation split the data lacks falls back as
    `choose_split` says (never an error). ``subset``: the hub dataset's configuration.
    ``prompt_key`` / ``answer_key`` / ``image_key``: the columns (see `parse_record`). ``eval_fraction``:
    hold this fraction out of "train" as the evaluation split when the data has none. ``shuffle`` uses
    ``random.Random(seed)``; ``num_samples`` keeps the first n after it. Images are decoded only for the
    rows kept, resized by `fit_pixels` when ``min_pixels`` or ``max_pixels`` is given.
    ``max_record_bytes``: the most bytes a JSON line may hold, checked before it is parsed."""
    if not 0 <= eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    check_record_limit(max_record_bytes)
    for arg, key in (
        ("prompt_key", prompt_key),
        ("answer_key", answer_key),
        ("image_key", image_key),
        ("video_key", video_key),
    ):
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"{arg} must be a column name, got {key!r}")
    if path is None and data_files is None:
        raise ValueError(
            "vlm_records needs path= (a .jsonl / .json / .parquet / .csv file, a folder, or a hub "
            "dataset id) or data_files="
        )
    if (
        path is not None
        and not isinstance(path, Path)
        and not Path(str(path)).expanduser().exists()
        and not _looks_local(str(path))
    ):
        what, parts = _hub_parts(str(path), subset, data_files)
    else:
        if subset is not None:
            raise ValueError(
                f"subset={subset!r} names a configuration of a hub dataset, but {path or data_files} "
                f"is local; drop subset"
            )
        what, parts = _local_parts(path, data_files, split, max_record_bytes)
    name, hold = choose_split(list(parts), split, eval_fraction, what)
    part = parts[name]()
    positions = list(range(len(part.indices)))
    if hold is not None:
        out_rows = held_out(len(positions), eval_fraction, part.what)
        positions = [p for p in positions if (p in out_rows) == (hold == "eval")]
    if not positions:
        raise ValueError(f"no records in {part.what}")
    keys = dict(prompt_key=prompt_key, answer_key=answer_key, image_key=image_key, video_key=video_key)
    if part.local:  # every record is checked; the images of the kept ones are decoded below
        parsed = {p: (parse_record(r, w, **keys), base) for p, (w, r, base) in zip(positions, part.take(positions))}
        chosen = pick(len(positions), num_samples, shuffle, seed)
        kept = [parsed[positions[i]] for i in chosen]
    else:  # a hub split can be large: read and check only the rows kept
        chosen = [positions[i] for i in pick(len(positions), num_samples, shuffle, seed)]
        kept = [(parse_record(r, w, **keys), base) for w, r, base in part.take(chosen)]
    out, dropped, videos = empty_result(), set(), []
    for rec, base in kept:
        out["prompt"].append(rec["prompt"])
        out["images"].append(prepare_images(rec["images"], rec["where"], base, min_pixels, max_pixels, factor))
        videos.append(prepare_videos(rec["videos"], rec["where"], base, rec["video_column"]))
        out["meta"].append(rec["meta"])
        out["solution"].append(rec["solution"])
        dropped.update(rec["dropped"])
    if dropped:
        warnings.warn(
            f"{what}: column(s) {', '.join(sorted(dropped))} hold bytes or images, not JSON values, and are "
            f"left out of meta (image_key names the image column)",
            stacklevel=2,
        )
    if video_key is not None or any(videos):  # sources, decoded by the policy (`mmrl.video`)
        out["videos"] = videos
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
            raise ValueError(
                f"{self.name}: missing column(s) {missing} (columns: {self.columns}); expected {schema_hint}"
            )


def _split_files(folder: Path, split: str, hub_id: str) -> list[Path]:
    """Parquet files of ``split`` in a local snapshot of a hub dataset repository (``<split>-*.parquet``
    or ``<split>.parquet`` anywhere below, or any parquet in a folder named after the split)."""
    found = sorted(
        {
            f
            for f in folder.rglob("*.parquet")
            if f.name.startswith(f"{split}-") or f.stem == split or f.parent.name == split
        }
    )
    if not found:
        raise FileNotFoundError(
            f"no {split}-*.parquet under {folder}; download the set with `huggingface-cli download {hub_id} "
            f"--repo-type dataset --local-dir {folder}` or pass data_files=[...]"
        )
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
        raise ImportError(
            "loading from the hub needs Hugging Face datasets: pip install datasets "
            "(or pass path=<local snapshot folder> / data_files=<parquet files> in the hub schema)"
        )
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
