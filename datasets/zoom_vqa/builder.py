"""Build `zoom_vqa`: one small coloured shape in a larger scene, whose shape is only legible at full
resolution (the multi-turn tool task of `simulators.tool_env` with ``env: zoom``). Nothing is downloaded.

``build(num_samples=256, split="train", seed=0, image_size=64, object_size=7)`` -> ``{"prompt": [str],
"images": [[uint8 [S, S, 3]]], "meta": [dict], "solution": [str]}`` (the `vlm_records` format). The
question ("What shape is the small red object? Answer circle, square or triangle.") needs the
object's shape: the ``zoom`` environment shows the image at 16 px, where a 7 px shape is a 2 px
blob, and its ``zoom(x, y)`` tool returns the full-resolution crop. Splits: ``eval`` holds the
(colour, shape) combinations `HELD_OUT` (one per shape) that ``train`` never shows, so colour alone
cannot answer them. Sample i depends only on (seed, split, i) and the options.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_shapes = adapter("rewards.shapes")
COLORS, SHAPES = tuple(_shapes.COLORS), tuple(_shapes.SHAPES)
SPLITS = ("train", "eval")
#: (colour, shape) combinations only the eval split shows: one per shape
HELD_OUT = (("blue", "circle"), ("yellow", "square"), ("purple", "triangle"))


def combos(split: str) -> list[tuple[str, str]]:
    """The (colour, shape) combinations of ``split``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    every = [(c, s) for c in COLORS for s in SHAPES]
    return [x for x in every if (x in HELD_OUT) == (split == "eval")]


def build(
    num_samples: int = 256, split: str = "train", seed: int = 0, image_size: int = 64, object_size: int = 7
) -> dict:
    """See the module docstring."""
    if num_samples < 1 or not 3 <= object_size <= image_size // 2:
        raise ValueError(
            f"num_samples must be >= 1 and object_size in 3..image_size/2, got {num_samples}, {object_size}"
        )
    from mmrl.data import builder_module

    render = builder_module("shapes").render
    pool = combos(split)
    color, shape, box, meta = [], [], [], []
    for i in range(num_samples):
        rng = random.Random(f"zoom_vqa|{split}|{seed}|{i}")
        c, s = rng.choice(pool)
        x0, y0 = rng.randrange(image_size - object_size + 1), rng.randrange(image_size - object_size + 1)
        color.append(COLORS.index(c))
        shape.append(SHAPES.index(s))
        box.append([x0, y0, object_size])
        meta.append(
            {
                "answer": s,
                "color": c,
                "shape": s,
                "box": [x0, y0, x0 + object_size, y0 + object_size],
                "split": split,
                "index": i,
            }
        )
    images = render(
        torch.tensor(color)[:, None],
        torch.tensor(shape)[:, None],
        torch.tensor(box)[:, None],
        torch.ones(num_samples, 1, dtype=torch.bool),
        image_size,
    )
    prompts = [f"What shape is the small {m['color']} object? Answer circle, square or triangle." for m in meta]
    return {"prompt": prompts, "images": [[im] for im in images], "meta": meta, "solution": [m["answer"] for m in meta]}


if __name__ == "__main__":
    data = build(num_samples=4)
    for p, m in zip(data["prompt"], data["meta"]):
        print(p, "->", m["answer"], m["box"])
