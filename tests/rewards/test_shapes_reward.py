"""ShapesReward and its pure parts: hand-drawn 8x8 cases, ground truth vs mismatched prompts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rewards.shapes import (
    BACKGROUND,
    COLORS,
    ShapesReward,
    classify_colors,
    component_stats,
    connected_components,
    describe,
    palette_tensor,
    parse_prompt,
    region_masks,
    shape_from_fill,
)

ROOT = Path(__file__).resolve().parents[2]
RED, BLUE = COLORS["red"], COLORS["blue"]


def _builder():
    spec = importlib.util.spec_from_file_location("shapes_builder_for_reward", ROOT / "datasets/shapes/builder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def shapes():
    return _builder()


def hand_image() -> torch.Tensor:
    """8x8, black: a red 3x3 square at rows 1-3, cols 0-2 (left, top) and a blue plus (5 px, fill
    5/9) centred at row 5, col 6 (right, bottom)."""
    img = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    img[0, 1:4, 0:3] = torch.tensor(RED, dtype=torch.uint8)
    for y, x in [(4, 6), (5, 5), (5, 6), (5, 7), (6, 6)]:
        img[0, y, x] = torch.tensor(BLUE, dtype=torch.uint8)
    return img


# ---------------------------------------------------------------------------------------------
# pure functions
# ---------------------------------------------------------------------------------------------


def test_classify_colors_hand_case():
    img = torch.tensor([[[230, 30, 30], [0, 0, 0], [190, 70, 60], [128, 128, 128]]], dtype=torch.uint8).view(1, 1, 4, 3)
    # exact red; background; red off by (40, 40, 30) -> distance 64.03 > 60 -> -1 at max_dist 60,
    # red at max_dist 70; grey is at least 148 from every colour -> -1
    got = classify_colors(img, palette_tensor(), BACKGROUND, max_dist=60.0)
    assert got.tolist() == [[[0, -1, -1, -1]]]
    assert classify_colors(img, palette_tensor(), BACKGROUND, max_dist=70.0).tolist() == [[[0, -1, 0, -1]]]


def test_connected_components_hand_case():
    m = torch.zeros(1, 4, 4, dtype=torch.bool)
    m[0, 0, 0] = m[0, 0, 1] = m[0, 1, 1] = True  # an L: flat indices 0, 1, 5
    m[0, 2, 2] = True  # diagonal to (1, 1): a separate 4-component, flat index 10
    m[0, 3, 0] = m[0, 3, 1] = True  # flat 12, 13
    expected = torch.tensor([[6, 6, 0, 0], [0, 6, 0, 0], [0, 0, 11, 0], [14, 14, 0, 0]])
    assert torch.equal(connected_components(m)[0], expected)
    # classes: equal neighbours join, different classes never do
    cls = torch.tensor([[[0, 0, 1], [-1, 1, 1]]])
    assert connected_components(cls).tolist() == [[[2, 2, 6], [0, 6, 6]]]


def test_component_stats_and_shape_from_fill():
    labels = connected_components(torch.tensor([[[0, 0, 0, -1, 1], [0, 0, 0, -1, -1], [0, 0, 0, -1, -1]]]))
    st = component_stats(labels, min_area=2)
    square, dot = 13, 5  # 1 + largest flat index: (2, 2) -> 12, (0, 4) -> 4
    assert st["size"][0, square] == 9 and st["size"][0, dot] == 1
    assert st["fill"][0, square] == pytest.approx(1.0) and st["fill"][0, dot] == pytest.approx(1.0)
    assert st["kept"][0].nonzero().flatten().tolist() == [square]  # the 1-px dot is below min_area
    fills = torch.tensor([0.5, 0.64, 0.65, 0.8, 0.91, 0.92, 1.0])
    assert shape_from_fill(fills).tolist() == [2, 2, 0, 0, 0, 1, 1]  # triangle, circle, square


def test_region_masks_8x8():
    r = region_masks(8, 8)
    assert r.shape == (5, 8, 8)
    assert r[0, :, :4].all() and not r[0, :, 4:].any()  # left
    assert r[1, :, 4:].all() and not r[1, :, :4].any()  # right
    assert r[2, :4].all() and not r[2, 4:].any()  # top
    assert r[3, 4:].all() and not r[3, :4].any()  # bottom
    assert r[4].sum() == 16 and r[4, 2:6, 2:6].all()  # center box [2, 6)^2


# ---------------------------------------------------------------------------------------------
# the reward on the hand-drawn image (min_area 2; red square 9 px, blue plus 5 px, 14 in all)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("a red square and a blue triangle", 1.0),  # all parts 1, purity 14/14
        ("a red square on the left", 9 / 14),  # parts 1, purity 9/14
        ("a red square at the top", 9 / 14),  # rows 1-3 are all in the top half
        ("a red square in the center", (2 + 2 / 9) / 3 * 9 / 14),  # (2, 2), (3, 2) are in [2, 6)^2
        ("two red squares", 0.5 * 9 / 14),  # count 1 - 1/2, shape min(1, 2)/2
        ("a blue circle at the top", (1 + 0 + 0) / 3 * 5 / 14),  # a plus reads as triangle; rows 4-6
        ("a green circle", 0.0),
        ("a red circle and a blue triangle", (1 / 2 + 1) / 2),  # red: count 1, shape 0
    ],
)
def test_hand_image_scores(prompt, expected):
    r = ShapesReward(min_area=2)
    assert r(hand_image(), [prompt]).item() == pytest.approx(expected, abs=1e-6)


def test_components_and_purity_switch():
    img, prompt = hand_image(), ["a red square on the left"]
    comps = ShapesReward(min_area=2).components(img, prompt)
    assert {k: round(v.item(), 6) for k, v in comps.items()} == {
        "count": 1.0,
        "shape": 1.0,
        "position": 1.0,
        "purity": round(9 / 14, 6),
        "objects": 1.0,
        "score": round(9 / 14, 6),
    }
    assert ShapesReward(min_area=2, use_purity=False)(img, prompt).item() == 1.0
    parts = ShapesReward(min_area=2).parts(img, prompt)
    assert set(parts) == {"shapes", "shapes/count", "shapes/shape", "shapes/position", "shapes/purity"}


def test_noise_pixels_below_min_area_are_ignored():
    img = hand_image()
    img[0, 7, 0] = torch.tensor(RED, dtype=torch.uint8)  # a stray red pixel, not touching the square
    assert ShapesReward(min_area=2)(img, ["a red square and a blue triangle"]).item() == 1.0
    assert ShapesReward(min_area=1)(img, ["a red square and a blue triangle"]).item() == pytest.approx((0.5 + 1) / 2)


# ---------------------------------------------------------------------------------------------
# the grammar
# ---------------------------------------------------------------------------------------------


def test_parse_prompt_examples():
    m = parse_prompt("A green triangle at the top.")
    assert m["tag"] == "position" and m["objects"] == [
        {"color": "green", "shape": "triangle", "count": 1, "position": "top"}
    ]
    assert (m["color"], m["shape"], m["count"], m["position"]) == ("green", "triangle", 1, "top")
    assert parse_prompt("three blue squares")["objects"][0]["count"] == 3
    assert parse_prompt("three blue squares")["tag"] == "counting"
    two = parse_prompt("a red circle and a blue square")
    assert two["tag"] == "color_attr" and [o["color"] for o in two["objects"]] == ["red", "blue"]
    for bad in ["a pink circle", "a red hexagon", "four red circles", "a red circle somewhere", ""]:
        with pytest.raises(ValueError, match="cannot parse shapes prompt"):
            parse_prompt(bad)


def test_every_dataset_prompt_round_trips(shapes):
    for prompt in shapes.prompt_pool("all"):
        assert describe(parse_prompt(prompt)["objects"]) == prompt


# ---------------------------------------------------------------------------------------------
# against the dataset
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("image_size, n", [(16, 128), (32, 32)])
def test_ground_truth_scores_high_and_other_prompts_low(shapes, image_size, n):
    d = shapes.build(n, seed=5, image_size=image_size)
    r = ShapesReward()
    own = r(d["image"], d["prompt"], d["meta"])
    assert own.dtype == torch.float32 and own.shape == (n,)
    assert own.mean().item() >= 0.9 and own.min().item() >= 0.0 and own.max().item() <= 1.0
    shift = lambda xs: xs[1:] + xs[:1]  # noqa: E731 - each image scored against its neighbour's prompt
    other = r(d["image"], shift(d["prompt"]), shift(d["meta"]))
    assert other.mean().item() < 0.4
    assert own.mean().item() - other.mean().item() > 0.5
    # meta missing -> the prompt is parsed, same scores
    assert torch.equal(r(d["image"], d["prompt"]), own)


def test_swapped_colours_score_half(shapes):
    # "a red circle and a blue square" drawn as a red square and a blue circle
    color = torch.tensor([[0, 2]])
    rgb = shapes.palette_rgb()[color]
    box = torch.tensor([[[1, 1, 7], [9, 9, 7]]])
    img = shapes.render(rgb, torch.tensor([[1, 0]]), box, torch.tensor([[True, True]]), 16)
    r = ShapesReward()
    assert r(img, ["a red square and a blue circle"]).item() == 1.0
    assert r(img, ["a red circle and a blue square"]).item() == pytest.approx(0.5)


def test_batch_independent_and_deterministic(shapes):
    d = shapes.build(12, seed=2)
    r = ShapesReward()
    batched = r(d["image"], d["prompt"], d["meta"])
    alone = torch.cat([r(d["image"][i : i + 1], d["prompt"][i : i + 1], d["meta"][i : i + 1]) for i in range(12)])
    assert torch.equal(batched, alone)
    assert torch.equal(batched, r(d["image"], d["prompt"], d["meta"]))
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = r(d["image"][perm], [d["prompt"][i] for i in perm], [d["meta"][i] for i in perm])
    assert torch.equal(shuffled, batched[perm])


def test_passes_the_reward_contract_checker():
    from mmrl.checks.reward import check_reward

    assert "rejects_bad_input" in check_reward(ShapesReward, kind="image")


def test_bad_inputs_raise_value_error():
    r = ShapesReward()
    with pytest.raises(ValueError, match="uint8"):
        r(torch.zeros(1, 8, 8, 3), ["a red circle"])
    with pytest.raises(ValueError, match="prompts"):
        r(torch.zeros(2, 8, 8, 3, dtype=torch.uint8), ["a red circle"])
    with pytest.raises(ValueError, match="cannot parse"):
        r(torch.zeros(1, 8, 8, 3, dtype=torch.uint8), ["a photo of a cat"])
    with pytest.raises(ValueError, match="unknown object"):
        r(torch.zeros(1, 8, 8, 3, dtype=torch.uint8), ["x"], [{"objects": [{"color": "pink", "shape": "circle"}]}])
