"""Build `moving_shapes_prompts`: every prompt of one split of the synthetic `moving_shapes` grammar,
with its ground truth, for RL (`rewards.moving_shapes.MovingShapesReward` scores the generated videos).

``build(split="train"|"validation"|"eval", val_fraction=0.0)`` -> ``{"prompt": [P str], "meta": [P
dict]}`` (``color``, ``shape``, ``direction``) in a fixed order. The split rule is the
`moving_shapes` dataset's (`held_out` and `validation` in its builder), so no two splits overlap:
48 train and 12 eval prompts; with ``val_fraction=0.2``, 36 train and 12 validation.
"""

from __future__ import annotations


def _moving_shapes_builder():
    from mmrl.data import builder_module

    return builder_module("moving_shapes")


def build(split: str = "train", val_fraction: float = 0.0) -> dict:
    if split not in ("train", "validation", "eval"):
        raise ValueError(f"split must be 'train', 'validation' or 'eval', got {split!r}")
    builder = _moving_shapes_builder()
    meta = builder.spec_pool(split, val_fraction)
    return {"prompt": [builder.describe(**m) for m in meta], "meta": meta}
