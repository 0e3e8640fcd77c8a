"""Build `clevr_counting`: CLEVR-CoGenT-A counting questions (hub id ``leonardPKU/clevr_cogen_a_train``,
the R1-V counting set, about 70k rows) for VLM RL with an exact numeric answer.

Hub schema (one split, "train"): ``image`` (one rendered CLEVR scene), ``problem`` (str, e.g. "How
many items are there in the image?"), ``solution`` (str, the count in ``<answer> N </answer>``).

``build(split="train", num_samples=None, shuffle=False, seed=0, min_pixels=None, max_pixels=None,
factor=28, data_files=None, path=None, eval_size=500)`` -> ``{"prompt", "images", "meta",
"solution"}``. The hub has no held-out split, so ``split="eval"`` is the last ``eval_size`` rows
and ``split="train"`` the rows before them (``split="all"``: every row). See CARD.md.
"""

from __future__ import annotations

import re

HUB_ID = "leonardPKU/clevr_cogen_a_train"
SPLITS = ("train", "eval", "all")
SCHEMA = "columns image, problem (str), solution (str with <answer> N </answer>), as in " + HUB_ID
_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.S | re.I)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _records():
    from mmrl.data import builder_module

    return builder_module("vlm_records")


def answer_from_solution(solution: str) -> str | None:
    """The number inside ``<answer>...</answer>`` (the last number there; without the tag, the last
    number of the text), or None."""
    m = _ANSWER_TAG.search(solution or "")
    nums = _NUMBER.findall(m.group(1) if m else (solution or ""))
    return nums[-1] if nums else None


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
    eval_size: int = 500,
    hub_id: str = HUB_ID,
) -> dict:
    """CLEVR counting rows as VLM records: prompt = ``problem``, images = ``[image]``, meta =
    ``{"answer": "N", "source", "split", "row"}``, solution = the hub's ``solution`` text as given
    (``<answer> N </answer>``, R1-V's target format)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if eval_size < 0:
        raise ValueError("eval_size must be >= 0")
    vr = _records()
    source = vr.hub_source(hub_id, "train", path=path, data_files=data_files)
    source.require(("image", "problem", "solution"), SCHEMA)
    n = len(source)
    cut = max(n - eval_size, 0)
    rows = {"train": range(cut), "eval": range(cut, n), "all": range(n)}[split]
    if not rows:
        raise ValueError(f"{source.name}: no rows for split={split!r} ({n} rows, eval_size={eval_size})")
    out = vr.empty_result()
    idx = vr.pick(len(rows), num_samples, shuffle, seed, indices=rows)
    for i, (where, row) in zip(idx, source.take(idx)):
        answer = answer_from_solution(row["solution"])
        if answer is None:
            raise ValueError(f"{where}: no number in solution {row['solution']!r}; expected <answer> N </answer>")
        rec = vr.parse_record(
            {"prompt": row["problem"], "images": [row["image"]], "answer": answer, "solution": row["solution"]}, where
        )
        out["prompt"].append(rec["prompt"])
        out["images"].append(vr.prepare_images(rec["images"], where, None, min_pixels, max_pixels, factor))
        out["meta"].append({"answer": answer, "source": hub_id, "split": split, "row": i})
        out["solution"].append(rec["solution"])
    return out
