"""The semantic-reward experiment keeps success out of the reward model: reach_clip captions are
absolute descriptions built without the simulator's goal, success or distances (checked by
poisoning those fields), the tiny CLIP's training batches are CLIP's InfoNCE over (image, caption)
pairs, the RL-time goal texts are zero-shot, and the CLIP config keeps the quickstart's RL settings."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from mmrl.data import load_dataset
from simulators.reach import ReachSim

ROOT = Path(__file__).resolve().parents[2]
#: words of the goal relation / instruction that no pretraining caption may contain
GOAL_WORDS = {"target", "reach", "on", "far", "near", "close", "touch", "goal", "success", "same", "away"}


def builder():
    from mmrl.data import builder_module

    return builder_module("reach_clip")


def _raise(*_, **__):
    raise AssertionError("the pretraining data read a goal / success field of the simulator")


def poison(mp):
    """ReachSim with every goal / success path raising and another disc instructed."""
    mp.setattr(ReachSim, "success_radius", property(_raise, lambda self, v: None), raising=False)
    for name in ("goal_position", "expert_action", "expert_chunk", "_run", "step", "step_chunk"):
        mp.setattr(ReachSim, name, _raise)
    original = ReachSim._sample_init

    def shifted_goal(self, seeds):
        init = original(self, seeds)
        return {**init, "target": (init["target"] + 1) % self.num_objects}

    mp.setattr(ReachSim, "_sample_init", shifted_goal)


def test_grid_cells_and_captions_hand_values():
    b = builder()
    xy = torch.tensor([[-0.9, 0.9], [0.0, 0.0], [0.9, -0.9], [0.5, 0.1], [-1.0, -1.0]])
    assert b.grid_cells(xy).tolist() == [0, 4, 8, 5, 6]
    assert b.cell_names()[0] == "top left" and b.cell_names()[4] == "center" and b.cell_names()[5] == "middle right"
    caps = b.captions_of([0, 8], ["red", "blue"], 0, [1, 0])
    assert caps == [
        "the blue disc is at the bottom right, the red disc is at the top left and the gripper is at the top left",
        "blue disc: bottom right. red disc: top left. gripper: top left.",
        "bottom right: the blue disc. top left: the red disc and the gripper.",
    ]


def test_relations_hand_values():
    """Where the gripper is relative to a disc, from the drawn sizes (disc radius 0.15, cross arm
    0.13), never the success radius (0.1): centre inside the disc is ``on``, a cross overlapping it
    ``touching``, else the dominant direction (y up)."""
    b = builder()
    assert b.relation_of((0.12, 0.05), 0.15, 0.13) == "on"  # 0.13 away: on the drawn disc, no success
    assert b.relation_of((0.2, -0.1), 0.15, 0.13) == "touching"
    assert b.relation_of((-0.5, 0.2), 0.15, 0.13) == "left of"
    assert b.relation_of((0.5, -0.6), 0.15, 0.13) == "below"
    assert b.relation_of((0.1, 0.9), 0.15, 0.13) == "above"
    caps = b.captions_of([0, 8], ["red", "blue"], 0, [1, 0], relations=["on", "right of"], nearest=0)
    assert caps[:3] == b.captions_of([0, 8], ["red", "blue"], 0, [1, 0])
    assert caps[3:] == ["the gripper is right of the blue disc and on the red disc", "the gripper is on the red disc"]


def test_relational_captions_describe_every_disc_alike(monkeypatch):
    """The relational caption names the gripper's relation to each disc in the picture, built with
    the goal / success fields poisoned (so it cannot depend on which disc is instructed), for the same
    frames as the default captions."""
    clean = load_dataset("reach_clip", num_samples=200, seed=4, relations=True)
    with monkeypatch.context() as mp:
        poison(mp)
        dirty = load_dataset("reach_clip", num_samples=200, seed=4, relations=True)
    assert clean["captions"] == dirty["captions"] and torch.equal(clean["image"], dirty["image"])
    assert clean["phrasings"] == [*builder().PHRASINGS, "relations", "nearest"]
    plain = load_dataset("reach_clip", num_samples=200, seed=4)
    assert torch.equal(plain["image"], clean["image"])  # the same frames, one more caption each
    assert [c[:3] for c in clean["captions"]] == plain["captions"]
    relations = [c[3] for c in clean["captions"]]
    assert sum(" on the " in r for r in relations) >= 5 and sum("touching" in r for r in relations) >= 5
    for caps in clean["captions"]:
        assert caps[3].startswith("the gripper is ") and caps[3].count(" disc") == 3
        assert caps[4].startswith("the gripper is ") and caps[4].count(" disc") == 1 and caps[4][15:] in caps[3]
    # "the gripper is on the red disc" is now a caption (of frames whose gripper is on a red disc,
    # whichever disc the episode names): the goal wording asks about a relation pretraining described
    from rewards.train_tiny_clip import GOAL_WORDINGS

    seen = {t for caps in clean["captions"] for t in caps}
    assert GOAL_WORDINGS[0][0].format(color="red") in seen or GOAL_WORDINGS[0][0].format(color="blue") in seen
    with pytest.raises(ValueError, match="labelled frames carry no captions"):
        load_dataset("reach_clip", num_samples=4, seed=0, labelled=True, relations=True)


def test_pretraining_pairs_and_batches_ignore_goal_and_success(monkeypatch):
    clean = load_dataset("reach_clip", num_samples=80, seed=5, batch_size=64)
    with monkeypatch.context() as mp:
        poison(mp)
        dirty = load_dataset("reach_clip", num_samples=80, seed=5, batch_size=64)  # nothing raised
    assert set(dirty) == {"image", "captions", "gripper_cell", "disc_cell", "phrasings", "cells", "meta"}
    assert torch.equal(clean["image"], dirty["image"]) and clean["captions"] == dirty["captions"]
    # a training batch is (images[i], tokens[i, phrasing]) with indices drawn from the seed alone and
    # train_tiny_clip reads nothing else (test_pretraining_reads_only_images_and_captions): equal
    # images and tokens give equal batches
    from rewards.train_tiny_clip import build_model, tokenize_captions

    _, tok, cfg = build_model()
    ctx = cfg["text_cfg"]["context_length"]
    assert torch.equal(tokenize_captions(clean["captions"], tok, ctx), tokenize_captions(dirty["captions"], tok, ctx))


def test_captions_describe_the_picture_not_the_goal():
    b = builder()
    data = load_dataset("reach_clip", num_samples=200, seed=1)
    cells = b.cell_names()
    for caps, gc, dc in zip(data["captions"], data["gripper_cell"].tolist(), data["disc_cell"].tolist()):
        assert len(caps) == len(b.PHRASINGS)
        for text in caps:
            words = set(text.replace(",", " ").replace(".", " ").replace(":", " ").split())
            assert not words & GOAL_WORDS, text
            assert "gripper" in words and cells[gc] in text and all(cells[c] in text for c in dc)
    # the gripper cell a caption names is where the gripper is drawn: its white cross has a pixel in
    # that row of cells and one in that column of cells (a cross on a corner has none in the corner cell)
    white = (data["image"] == 255).all(-1)  # [M, 32, 32]
    for i, cell in enumerate(data["gripper_cell"].tolist()):
        rows, cols = white[i].nonzero().unbind(1)
        assert (rows * 3 // 32 == cell // 3).any() and (cols * 3 // 32 == cell % 3).any()
    # no RL-time goal sentence is a pretraining caption
    from rewards.train_tiny_clip import GOAL_WORDINGS

    seen = {t for caps in data["captions"] for t in caps}
    for color in ReachSim(num_envs=1).color_names:
        for pos, neg in GOAL_WORDINGS:
            assert pos.format(color=color) not in seen and neg.format(color=color) not in seen


def test_labelled_frames_are_separate_and_correct():
    data = load_dataset("reach_clip", num_samples=300, seed=0, labelled=True)
    assert "captions" not in data
    assert data["success"].equal(data["goal_distance"] <= data["success_radius"])
    assert 0.15 < data["success"].float().mean() < 0.6
    for text, color in zip(data["instruction"], data["goal_color_name"]):
        assert color in text.split()
    assert torch.equal(load_dataset("reach_clip", num_samples=300, seed=0, labelled=True)["image"], data["image"])


def test_clip_loss_hand_values():
    from rewards.train_tiny_clip import clip_loss

    img = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    txt = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    # unit: i0 = (1, 0), i1 = (0, 1); t0 = (1, 0), t1 = (1, 1) / sqrt 2; s = 2
    c = 1 / math.sqrt(2)
    logits = 2 * torch.tensor([[1.0, c], [0.0, c]])
    row = -(torch.log_softmax(logits, 1)[0, 0] + torch.log_softmax(logits, 1)[1, 1]) / 2
    col = -(torch.log_softmax(logits.T, 1)[0, 0] + torch.log_softmax(logits.T, 1)[1, 1]) / 2
    assert clip_loss(img, txt, torch.tensor(2.0)).item() == pytest.approx(((row + col) / 2).item(), abs=1e-6)


def test_pretraining_reads_only_images_and_captions(tmp_path):
    from rewards.train_tiny_clip import load_model, train_tiny_clip

    data = load_dataset("reach_clip", num_samples=48, seed=0)
    torch.manual_seed(0)
    m1, info = train_tiny_clip(
        {"image": data["image"], "captions": data["captions"]}, tmp_path / "a", steps=3, batch_size=16, log_every=0
    )
    noisy = {**data, "success": torch.rand(48) > 0.5, "goal_distance": torch.rand(48)}
    m2, _ = train_tiny_clip(noisy, None, steps=3, batch_size=16, log_every=0)
    from rewards.train_tiny_clip import build_model

    fresh = build_model(seed=0)[0]
    sd1, sd2, sd0 = m1.state_dict(), m2.state_dict(), fresh.state_dict()
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    assert any(not torch.equal(sd1[k], sd0[k]) for k in sd1)  # it did train
    assert info["steps"] == 3 and math.isfinite(info["loss"])
    model, tok = load_model(tmp_path / "a")
    assert all(torch.equal(v, sd1[k]) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="context"):
        train_tiny_clip({"image": data["image"][:2], "captions": [["a " * 60] * 3] * 2}, None, steps=1, batch_size=2)


def test_select_goal_setting_picks_the_best_validation_correlation():
    from rewards.train_tiny_clip import quantile_window, select_goal_setting

    success = torch.tensor([1, 1, 0, 0, 0, 1], dtype=torch.bool)
    good = torch.tensor([-0.3, -0.2, 0.1, 0.2, 0.3, -0.1])  # d = c_neg - c_pos: low on success frames
    bad = -good
    choice = select_goal_setting({0: bad, 1: good}, success, [(0.0, 1.0)])
    assert choice["wording"] == 1 and choice["corr_success"] > 0.9 and len(choice["candidates"]) == 2
    assert quantile_window(good, 0.0, 1.0) == pytest.approx((-0.3, 0.3))


def test_shaping_config_keeps_the_quickstart_rl_settings(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_semantic", ROOT / "benchmarks" / "semantic_reward.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.rl_settings_differences() == []  # the shipped configs
    changed = tmp_path / "shaped.yaml"
    text = (ROOT / "configs" / "quickstart_clip_shaping.yaml").read_text()
    changed.write_text(
        text.replace("clip_low: 0.2", "clip_low: 0.3").replace("max_episode_steps: 20", "max_episode_steps: 30")
    )
    diff = bench.rl_settings_differences(shaped_path=changed)
    assert any(d.startswith("algorithm.clip_low") for d in diff) and any(d.startswith("sim.kwargs") for d in diff)
    # the CLIP-alone example config keeps them too
    assert bench.rl_settings_differences(shaped_path=ROOT / "configs" / "quickstart_clip_reward.yaml") == []


def test_steps_to_level_and_the_ratio_count_what_was_reached():
    spec = importlib.util.spec_from_file_location("bench_semantic", ROOT / "benchmarks" / "semantic_reward.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    curve = [{"env_steps": 0, "success": 0.4}, {"env_steps": 100, "success": 0.86}, {"env_steps": 200, "success": 0.8}]
    assert bench.steps_to_level(curve, 0.85) == 100 and bench.steps_to_level(curve, 0.9) is None

    def arm(reached, total):
        return {"steps_to_level": reached, "env_steps": total}

    runs = [
        {"arms": {"sparse": arm(400, 1000), "shaped": arm(200, 1000)}},
        {"arms": {"sparse": arm(None, 1000), "shaped": arm(500, 1000)}},  # sparse never reached it: a bound
    ]
    r = bench.ratio(runs, "shaped")
    assert r["per_seed"] == [0.5, 0.5] and r["mean"] == 0.5
    assert r["reached"][1] == {"shaped": True, "sparse": False}


def test_tiny_clip_training_saves_a_loadable_model(tmp_path):
    """The pretrained tiny CLIP loads by name as configs load it and scores like the built model
    (its dataset and pretraining are tested above)."""
    from rewards.clip_goal import CLIPContrastGoal
    from rewards.train_tiny_clip import goal_meta, goal_reward_stats, load_model, train_tiny_clip

    pairs = load_dataset("reach_clip", num_samples=64, seed=0)
    _, info = train_tiny_clip(pairs, tmp_path / "clip", steps=3, batch_size=16, log_every=0)
    assert info["steps"] == 3
    frames = load_dataset("reach_clip", num_samples=64, seed=1, labelled=True)
    model, tok = load_model(tmp_path / "clip")
    reward = CLIPContrastGoal(model=model, tokenizer=tok, positive=None, negative=None, t_min=-0.1, t_max=0.1)
    stats = goal_reward_stats(reward, frames)
    assert stats["n"] == 64 and -1 <= stats["corr_success"] <= 1
    by_name = CLIPContrastGoal(
        model_name=f"local-dir:{tmp_path / 'clip'}",
        pretrained=None,
        positive=None,
        negative=None,
        t_min=-0.1,
        t_max=0.1,
    )  # how configs load it
    meta = goal_meta(frames["instruction"][:4])
    assert torch.allclose(
        by_name(frames["image"][:4], frames["instruction"][:4], meta),
        reward(frames["image"][:4], frames["instruction"][:4], meta),
    )
