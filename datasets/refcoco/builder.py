"""Build `refcoco`: RefCOCO referring-expression grounding ("Output the bounding box of: {expression}"
-> a box checked by IoU) for VLM RL, from ``lmms-lab/RefCOCO`` or ``jxu124/refcoco``.

Two hub schemas are read (picked from the columns):

- ``lmms-lab/RefCOCO`` (splits val / test / testA / testB, images embedded): ``image``, ``answer``
  (list of referring expressions), ``bbox`` (COCO ``[x, y, w, h]``, pixels), ``question_id``,
  ``file_name`` (plus ``question`` / ``segmentation`` / ``iscrowd``, unused).
- ``jxu124/refcoco`` (splits train / validation / test / testB, no pixels): ``image_path``
  (``coco/train2014/COCO_train2014_*.jpg``), ``bbox`` (``[x1, y1, x2, y2]``, pixels), ``captions``
  (list of expressions) or ``sentences`` (``[{"sent", "raw"}]``), ``ref_id`` / ``ann_id`` /
  ``image_id``. Images come from COCO train2014 under ``image_root``.

Every box is returned as ``[x1, y1, x2, y2]`` in absolute pixels of the returned image (origin
top-left, x right, y down, x2 = x + w). See CARD.md.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

DEFAULT_HUB_ID = "lmms-lab/RefCOCO"
DEFAULT_SPLIT = {"lmms-lab/RefCOCO": "val", "jxu124/refcoco": "train"}
QUESTION = "Output the bounding box of: {expression}"
BOX_FORMATS = ("xyxy", "xywh")


def _records():
    from mmrl.data import builder_module

    return builder_module("vlm_records")


def xywh_to_xyxy(box) -> list[float]:
    """COCO ``[x, y, w, h]`` (top-left corner, size) -> ``[x1, y1, x2, y2]`` = ``[x, y, x + w, y + h]``."""
    x, y, w, h = (float(v) for v in box)
    return [x, y, x + w, y + h]


def _parse_list(value, where: str, what: str):
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                try:
                    return ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise ValueError(f"{where}: cannot read {what} from {value!r}") from None
        return [text]
    return list(value) if value is not None else []


def _expressions(row: dict, where: str) -> list[str]:
    for key in ("captions", "answer", "sentences", "raw_sentences"):
        if row.get(key) is None:
            continue
        items = _parse_list(row[key], where, key)
        exprs = []
        for item in items:
            if isinstance(item, dict):
                item = item.get("sent") or item.get("raw")
            if isinstance(item, str) and item.strip():
                exprs.append(item.strip())
        if exprs:
            return exprs
    raise ValueError(f"{where}: no referring expression (looked in captions / answer / sentences)")


def _schema(columns: list[str], name: str) -> str:
    if "bbox" in columns and "image" in columns:
        return "embedded"
    if "bbox" in columns and ("image_path" in columns or "raw_image_info" in columns):
        return "coco_path"
    raise ValueError(
        f"{name}: unknown RefCOCO schema (columns: {columns}); expected lmms-lab/RefCOCO "
        f"(image, answer, bbox [x, y, w, h]) or jxu124/refcoco (image_path, captions, "
        f"bbox [x1, y1, x2, y2])"
    )


def _coco_image(row: dict, image_root, where: str):
    rel = row.get("image_path")
    if rel is None and row.get("raw_image_info"):
        info = row["raw_image_info"]
        rel = (json.loads(info) if isinstance(info, str) else info).get("file_name")
    if rel is None:
        raise ValueError(f"{where}: no image_path / raw_image_info to find the COCO image")
    if image_root is None:
        raise ValueError(
            f"{where}: this RefCOCO schema carries no pixels; pass image_root=<folder holding "
            f"train2014/COCO_train2014_*.jpg> (http://images.cocodataset.org/zips/train2014.zip)"
        )
    root, rel = Path(image_root).expanduser(), Path(rel)
    tail = Path(*rel.parts[1:]) if len(rel.parts) > 1 else rel
    for cand in (root / rel, root / tail, root / "train2014" / rel.name, root / rel.name):
        if cand.is_file():
            return str(cand)
    raise FileNotFoundError(
        f"{where}: image file not found: {rel} under image_root={root} (tried {root / rel}, "
        f"{root / tail}, {root / 'train2014' / rel.name}); fix image_root"
    )


def _check_box(box: list[float], size: tuple[int, int], fmt: str, where: str) -> None:
    w, h = size
    x1, y1, x2, y2 = box
    other = "xywh" if fmt == "xyxy" else "xyxy"
    if not (x2 > x1 and y2 > y1) or x1 < -1 or y1 < -1 or x2 > w + 1 or y2 > h + 1:
        raise ValueError(
            f"{where}: box {box} (read as {fmt}) is not a box inside the {w}x{h} image; "
            f"if the column holds {other} boxes pass box_format={other!r}"
        )


def build(
    split: str | None = None,
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int = 28,
    data_files=None,
    path=None,
    hub_id: str = DEFAULT_HUB_ID,
    image_root=None,
    box_format: str | None = None,
    all_expressions: bool = False,
    question: str = QUESTION,
) -> dict:
    """RefCOCO rows as VLM records. prompt = ``question.format(expression=...)`` (the first
    expression of a row, or one sample per expression with ``all_expressions=True``), images =
    ``[image]`` (resized by the pixel budget when given), meta = ``{"answer": box, "box": box,
    "image_size": [W, H], "box_1000": box in 0-1000 units, "box_format": "xyxy", "expression",
    "source", "split", "row"}`` plus ``orig_box`` / ``orig_image_size`` when resized, solution = the
    box rounded to integers as text (``"[x1, y1, x2, y2]"``). ``box_format`` ("xywh" / "xyxy")
    overrides the schema's convention (lmms-lab: xywh, jxu124: xyxy)."""
    if box_format is not None and box_format not in BOX_FORMATS:
        raise ValueError(f"box_format must be one of {BOX_FORMATS} or None, got {box_format!r}")
    split = split or DEFAULT_SPLIT.get(hub_id, "val")
    vr = _records()
    source = vr.hub_source(hub_id, split, path=path, data_files=data_files)
    schema = _schema(source.columns, source.name)
    fmt = box_format or ("xywh" if schema == "embedded" else "xyxy")
    out = vr.empty_result()
    idx = vr.pick(len(source), num_samples, shuffle, seed)
    for i, (where, row) in zip(idx, source.take(idx)):
        exprs = _expressions(row, where)
        item = row["image"] if schema == "embedded" else _coco_image(row, image_root, where)
        img = vr.load_image(item, f"{where}, image 0")
        size = (int(img.shape[1]), int(img.shape[0]))  # W, H
        raw = [float(v) for v in _parse_list(row["bbox"], where, "bbox")]
        if len(raw) != 4:
            raise ValueError(f"{where}: bbox must have 4 numbers, got {row['bbox']!r}")
        orig = xywh_to_xyxy(raw) if fmt == "xywh" else raw
        _check_box(orig, size, fmt, where)
        if min_pixels is not None or max_pixels is not None:
            img = vr.resize_image(img, min_pixels, max_pixels, factor)
        new_size = (int(img.shape[1]), int(img.shape[0]))
        sx, sy = new_size[0] / size[0], new_size[1] / size[1]
        box = [round(v, 2) for v in (orig[0] * sx, orig[1] * sy, orig[2] * sx, orig[3] * sy)]
        box_1000 = [
            round(orig[0] / size[0] * 1000),
            round(orig[1] / size[1] * 1000),
            round(orig[2] / size[0] * 1000),
            round(orig[3] / size[1] * 1000),
        ]
        extra = {k: row[k] for k in ("question_id", "file_name", "ref_id", "ann_id", "image_id") if k in row}
        for expr in exprs if all_expressions else exprs[:1]:
            meta = {
                "answer": list(box),
                "box": list(box),
                "image_size": list(new_size),
                "box_1000": box_1000,
                "box_format": "xyxy",
                "expression": expr,
                "source": hub_id,
                "split": split,
                "row": i,
                **extra,
            }
            if new_size != size:
                meta["orig_box"] = [round(v, 2) for v in orig]
                meta["orig_image_size"] = list(size)
            out["prompt"].append(question.format(expression=expr))
            out["images"].append([img])
            out["meta"].append(meta)
            out["solution"].append(json.dumps([round(v) for v in box]))
            if num_samples is not None and len(out["prompt"]) >= num_samples:
                return out
    return out
