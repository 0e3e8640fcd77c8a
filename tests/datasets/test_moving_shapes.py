"""The `moving_shapes` videos: fields, determinism, shapes that stay in frame and move the prompt's
way, train / eval prompt pools that are disjoint and compositional, the prompt dataset, the preview."""

from __future__ import annotations

import math

import pytest
import torch

from mmrl.data import DATASETS_DIR, builder_module, load_dataset
from mmrl.registry import DATASETS
from rewards.moving_shapes import DIRECTION_VECTORS, DIRECTIONS, MIN_TRAVEL, MovingShapesReward, parse_prompt
from rewards.shapes import COLORS, SHAPES


@pytest.fixture(scope="module")
def moving():
    return builder_module("moving_shapes")


def key(meta: dict) -> tuple:
    return meta["color"], meta["shape"], meta["direction"]


def test_fields_and_types(moving):
    d = moving.build(20, num_frames=6, image_size=32, seed=0)
    assert set(d) == {"video", "prompt", "meta"}
    assert d["video"].dtype == torch.uint8 and d["video"].shape == (20, 6, 32, 32, 3)
    assert len(d["prompt"]) == len(d["meta"]) == 20
    for prompt, meta in zip(d["prompt"], d["meta"]):
        assert parse_prompt(prompt) == {k: meta[k] for k in ("color", "shape", "direction")}
        assert set(meta) == {"color", "shape", "direction", "side", "travel", "start", "noisy"}


def test_sample_i_depends_only_on_seed_and_i(moving):
    small, big = moving.build(5, seed=4), moving.build(1030, seed=4)  # past the first 1024-sample block
    assert torch.equal(small["video"], big["video"][:5]) and small["meta"] == big["meta"][:5]
    assert torch.equal(moving.build(1030, seed=4)["video"], big["video"])
    assert not torch.equal(moving.build(5, seed=5)["video"], small["video"])
    assert moving.build_prompts(1030, seed=4)["prompt"] == big["prompt"]  # the same prompts
    assert torch.equal(moving.draw(big["meta"], seed=4), big["video"])  # draw reproduces build


def test_one_shape_stays_whole_in_frame_and_moves_its_way(moving):
    frames, size = 8, 16
    d = moving.build(200, num_frames=frames, image_size=size, seed=1)
    on = d["video"].amax(-1) > 0  # [M, F, H, W]: the shape's pixels (the background is black)
    area = on.sum((2, 3))
    assert (area == area[:, :1]).all() and (area > 0).all()  # never clipped by the frame edge
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    cx = (on * xs).sum((2, 3)) / area
    cy = (on * ys).sum((2, 3)) / area
    least = math.ceil(MIN_TRAVEL * size)
    speeds = set()
    for i, meta in enumerate(d["meta"]):
        dx, dy = DIRECTION_VECTORS[meta["direction"]]
        along, across = (cx[i], cy[i]) if dx else (cy[i], cx[i])
        steps = (along[1:] - along[:-1]) * (dx or dy)
        assert (steps >= 0).all() and (across == across[0]).all(), meta  # straight, never back
        moved = float(along[-1] - along[0]) * (dx or dy)
        assert moved == meta["travel"] and least <= moved <= size - meta["side"], meta
        speeds.add(meta["travel"])
    assert len(speeds) >= 4  # speeds vary
    assert {m["direction"] for m in d["meta"]} == set(DIRECTIONS)


def test_pools_are_disjoint_and_cover_every_attribute_and_pair_in_train(moving):
    train, held = moving.spec_pool("train"), moving.spec_pool("eval")
    assert len(train) == 48 and len(held) == 12 and len(moving.spec_pool("all")) == 60
    assert not {key(m) for m in train} & {key(m) for m in held}
    assert {key(m) for m in train} | {key(m) for m in held} == {key(m) for m in moving.spec_pool("all")}
    for attr, vocab in (("color", COLORS), ("shape", SHAPES), ("direction", DIRECTIONS)):
        assert {m[attr] for m in train} == set(vocab), attr
    for a, b in (("color", "shape"), ("color", "direction"), ("shape", "direction")):
        pairs = {(m[a], m[b]) for m in moving.spec_pool("all")}
        assert {(m[a], m[b]) for m in train} == pairs, (a, b)  # every pair of attributes seen in train
    assert moving.spec_pool("eval") == held  # fixed
    with pytest.raises(ValueError, match="split must be one of"):
        moving.spec_pool("test")


def test_pretraining_data_holds_out_the_eval_prompts(moving):
    held = {key(m) for m in moving.spec_pool("eval")}
    drawn = {key(m) for m in moving.build(600, seed=2)["meta"]}
    assert not drawn & held and len(drawn) == 48  # every train prompt, no held-out one
    assert {key(m) for m in moving.build_prompts(300, seed=2)["meta"]} <= {key(m) for m in moving.spec_pool("train")}
    assert {key(m) for m in moving.build_prompts(100, split="eval", seed=2)["meta"]} == held
    assert {key(m) for m in moving.build(300, seed=2, split="all")["meta"]} & held  # when asked for


def test_gold_videos_of_every_prompt_score_one(moving):
    metas = moving.spec_pool("all")
    videos = moving.draw(metas, seed=7)
    prompts = [moving.describe(**m) for m in metas]
    assert MovingShapesReward()(videos, prompts, metas).min().item() >= 0.95


def test_registered_datasets_and_the_prompt_dataset():
    names = dict(DATASETS.describe())
    for name in ("moving_shapes", "moving_shapes_prompts"):
        assert names[name] and (DATASETS_DIR / name / "CARD.md").is_file()
    d = load_dataset("moving_shapes", num_samples=3, seed=1, num_frames=4)
    assert d["video"].shape == (3, 4, 16, 16, 3)
    train, held = load_dataset("moving_shapes_prompts"), load_dataset("moving_shapes_prompts", split="eval")
    assert len(train["prompt"]) == 48 and len(held["prompt"]) == 12 and not set(train["prompt"]) & set(held["prompt"])
    assert [parse_prompt(p) for p in held["prompt"]] == held["meta"]


def test_bad_arguments(moving):
    for kwargs, match in (
        ({"num_frames": 1}, "num_frames must be >= 2"),
        ({"image_size": 15}, "image_size must be even"),
        ({"image_size": 80}, "image_size must be even"),
        ({"caption_noise": 1.5}, "caption_noise must be in"),
        ({"split": "test"}, "split must be one of"),
    ):
        with pytest.raises(ValueError, match=match):
            moving.build(2, **kwargs)
    with pytest.raises(ValueError, match="num_samples must be >= 1"):
        moving.build(0)


def test_preview_gif(moving, tmp_path, capsys):
    import imageio.v2 as imageio

    out = tmp_path / "runs" / "moving_shapes.gif"
    moving.main(["--num", "3", "--num-frames", "5", "--preview", str(out)])
    frames = imageio.mimread(out)
    assert len(frames) == 5 and frames[0].shape[:2] == (17 * 4, 3 * 17 * 4)  # 3 videos in a row, 4x
    assert "3 videos (5 frames, 16 px, split train)" in capsys.readouterr().out


def test_caption_noise_keeps_the_clips_and_swaps_train_captions(moving):
    clean = moving.build(400, seed=2)
    noisy = moving.build(400, seed=2, caption_noise=0.5)
    assert torch.equal(clean["video"], noisy["video"])  # the clips are what was drawn either way
    swapped = [i for i, m in enumerate(noisy["meta"]) if m["noisy"]]
    assert 150 < len(swapped) < 250 and not any(m["noisy"] for m in clean["meta"])
    train = set(moving.prompt_pool("train"))
    for i in swapped:
        m = noisy["meta"][i]
        assert noisy["prompt"][i] != clean["prompt"][i] and noisy["prompt"][i] in train
        drawn = {k: clean["meta"][i][k] for k in ("color", "shape", "direction")}
        assert m["drawn"] == drawn and {k: m[k] for k in drawn} != drawn
    for i in set(range(400)) - set(swapped):
        assert noisy["prompt"][i] == clean["prompt"][i]
    assert moving.build(3, num_episodes=None, seed=2, caption_noise=0.5)["prompt"] == noisy["prompt"][:3]
    assert len(moving.build(num_episodes=5)["prompt"]) == 5  # the warm start's keyword
