"""Build `geometry3k`: Geometry3K diagram problems (hub id ``hiyouga/geometry3k``) for VLM RL.

Hub schema (splits train 2101 / validation 300 / test 601 rows): ``images`` (list of images, one
diagram), ``problem`` (str, starts with ``<image>``), ``answer`` (str, e.g. "3\\sqrt{2}").

``build(split="train", num_samples=None, shuffle=False, seed=0, min_pixels=None, max_pixels=None,
factor=28, data_files=None, path=None)`` -> ``{"prompt", "images", "meta", "solution"}`` (the
`vlm_records` format). ``data_files`` (parquet files / globs) or ``path`` (a local snapshot of the
hub repository) are read with pyarrow; otherwise ``datasets.load_dataset("hiyouga/geometry3k",
split=split)`` (needs ``pip install datasets``). See CARD.md.
"""

from __future__ import annotations

HUB_ID = "hiyouga/geometry3k"
SPLITS = ("train", "validation", "test")
SCHEMA = "columns images (list of images), problem (str), answer (str), as in hiyouga/geometry3k"


def _records():
    from mmrl.data import builder_module

    return builder_module("vlm_records")


def build(
    split: str = "train",
    num_samples: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int = 28,
    data_files=None,
    path=None,
    hub_id: str = HUB_ID,
) -> dict:
    """Geometry3K rows as VLM records: prompt = ``problem`` without its ``<image>`` placeholder,
    images = the row's ``images``, meta = ``{"answer", "source", "split", "row"}``, solution = the
    answer."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    vr = _records()
    source = vr.hub_source(hub_id, split, path=path, data_files=data_files)
    source.require(("images", "problem", "answer"), SCHEMA)
    out = vr.empty_result()
    idx = vr.pick(len(source), num_samples, shuffle, seed)
    for i, (where, row) in zip(idx, source.take(idx)):
        images = row["images"] if isinstance(row["images"], list) else [row["images"]]
        rec = vr.parse_record({"prompt": row["problem"], "images": images, "answer": row["answer"]}, where)
        out["prompt"].append(rec["prompt"])
        out["images"].append(vr.prepare_images(rec["images"], where, None, min_pixels, max_pixels, factor))
        out["meta"].append({"answer": rec["meta"]["answer"], "source": hub_id, "split": split, "row": i})
        out["solution"].append(rec["solution"])
    return out
