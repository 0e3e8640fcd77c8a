"""Build `shapes_prompts`: every prompt of one split of the synthetic `shapes` grammar, with its
ground truth, for RL (`simulators.prompts.PromptSim` deals them out; `rewards.shapes` scores them).

``build(split="train"|"eval"|"validation", eval_fraction=0.2, tags=None, val_fraction=0.0)`` -> ``{"prompt":
[P str], "meta": [P dict]}`` in a fixed order. The split rule is the `shapes` dataset's (a hash of each
prompt, per tag), so train and eval prompts never overlap; ``val_fraction`` > 0 carves a validation
split ("validation") out of the train prompts, for choosing settings without touching the eval ones.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_shapes = adapter("rewards.shapes")  # rewards/shapes.py, wherever mmrl installed it (mmrl_rewards in a wheel)
describe = _shapes.describe
make_meta = _shapes.make_meta


def _shapes_builder():
    from mmrl.data import builder_module

    return builder_module("shapes")


def build(split: str = "train", eval_fraction: float = 0.2, tags=None, val_fraction: float = 0.0) -> dict:
    if split not in ("train", "eval", "validation"):
        raise ValueError(f"split must be 'train', 'eval' or 'validation', got {split!r}")
    pool = _shapes_builder().spec_pool(split, eval_fraction, val_fraction)
    prompts, meta = [], []
    for tag, specs in pool.items():
        if tags is not None and tag not in tags:
            continue
        for objects in specs:
            prompts.append(describe(objects))
            meta.append(make_meta(objects, tag))
    if not prompts:
        raise ValueError(f"no prompts left for tags={tags!r}; tags: {', '.join(pool)}")
    return {"prompt": prompts, "meta": meta}
