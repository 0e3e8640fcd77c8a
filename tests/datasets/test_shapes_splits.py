"""The `shapes` builder keeps held-out prompts out of pretraining data by default (captions, noisy
captions and drawn images), and `draw` renders images the reward finds fully correct."""

from __future__ import annotations

import json

import pytest

from mmrl.data import builder_module
from rewards.shapes import ShapesReward


@pytest.fixture(scope="module")
def shapes():
    return builder_module("shapes")


def canonical(objects: list[dict]) -> tuple:
    return tuple(sorted(json.dumps(o, sort_keys=True) for o in objects))


def held_out(shapes) -> set:
    return {canonical(objs) for specs in shapes.spec_pool("eval").values() for objs in specs}


def test_images_default_to_the_train_prompts_noisy_captions_included(shapes):
    data = shapes.build(1500, seed=1, caption_noise=0.5)
    noisy = [m for m in data["meta"] if m["noisy"]]
    assert 500 < len(noisy) < 1000
    captions = {canonical(m["objects"]) for m in data["meta"]}
    drawn = {canonical(m.get("drawn", m["objects"])) for m in data["meta"]}
    assert not captions & held_out(shapes) and not drawn & held_out(shapes)
    assert not {canonical(m["objects"]) for m in noisy} & held_out(shapes)
    train = {canonical(objs) for specs in shapes.spec_pool("train").values() for objs in specs}
    assert captions <= train and len(captions) > 150  # nearly all 168 train prompts appear
    # the held-out prompts are still there when asked for
    assert {canonical(m["objects"]) for m in shapes.build(300, seed=1, split="all")["meta"]} & held_out(shapes)


def test_draw_renders_correct_images_of_given_prompts(shapes):
    metas = shapes.build_prompts(64, seed=2, split="eval")["meta"]
    images = shapes.draw([m["objects"] for m in metas], seed=0, image_size=16)
    assert images.shape == (64, 16, 16, 3)
    prompts = [shapes.describe(m["objects"]) for m in metas]
    reward = ShapesReward()
    assert reward(images, prompts, metas).min().item() == 1.0  # the ceiling
    assert reward(images.roll(1, 0), prompts, metas).mean().item() < 0.5  # another prompt's images
    assert (shapes.draw([m["objects"] for m in metas], seed=0) == images).all()
    with pytest.raises(ValueError, match="at least one"):
        shapes.draw([])


def pool(shapes, split, val_fraction=0.0) -> set:
    return {canonical(objs) for specs in shapes.spec_pool(split, 0.2, val_fraction).values() for objs in specs}


def test_a_validation_split_comes_out_of_the_train_prompts_only(shapes):
    """``val_fraction`` carves "validation" out of the train pool: eval is untouched, the three are disjoint,
    and neither pretraining images nor RL prompts of that run contain a validation prompt."""
    train, val, evaluation = pool(shapes, "train", 0.2), pool(shapes, "validation", 0.2), pool(shapes, "eval", 0.2)
    assert evaluation == held_out(shapes)  # the reported split does not move
    assert not train & val and not train & evaluation and not val & evaluation
    assert train | val == pool(shapes, "train") and len(val) == 42
    data = shapes.build(1500, seed=1, caption_noise=0.5, val_fraction=0.2)
    seen = {canonical(m["objects"]) for m in data["meta"]} | {
        canonical(m.get("drawn", m["objects"])) for m in data["meta"]
    }
    assert not seen & val and not seen & evaluation
    rl = shapes.build_prompts(500, seed=2, val_fraction=0.2)
    assert not {canonical(m["objects"]) for m in rl["meta"]} & val
    prompts = builder_module("shapes_prompts").build(split="validation", val_fraction=0.2)
    assert {canonical(m["objects"]) for m in prompts["meta"]} == val
    with pytest.raises(ValueError, match="needs val_fraction > 0"):
        shapes.spec_pool("validation")
