"""Meta-World's scripted-expert demonstrations in LeRobot's public format: recorded one sim step per
frame (``datasets/metaworld_demos``), written by LeRobot itself (``lerobot_dataset``'s `write`),
read back through LeRobot's ``LeRobotDataset`` by the ``lerobot_dataset`` builder and checked
against the records: every frame's state, action and instruction, and, read as decisions of 4
frames, the same states and rewards the builder records when it chunks by 4 itself.

Runs in the LeRobot venv with Meta-World (``bash scripts/setup_lerobot.sh``); skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lerobot", reason="the LeRobot venv: bash scripts/setup_lerobot.sh")
pytest.importorskip("metaworld", reason="Meta-World: pip install 'mmrl[metaworld]'")

from mmrl.config import ConfigError
from mmrl.data import builder_module

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# two tasks, a slow noisy demonstrator and a short time limit: some episodes succeed (terminated),
# some run out of time, and the lengths differ
DEMOS = dict(sim_kwargs={"task": ["reach-v3", "push-v3"], "max_episode_steps": 30}, expert_noise=0.2, expert_speed=0.5)


def test_metaworld_demos_round_trip_through_lerobot(tmp_path):
    mw, lr = builder_module("metaworld_demos"), builder_module("lerobot_dataset")
    frames = mw.build(4, chunk_size=1, **DEMOS)
    root = mw.write_lerobot(frames, tmp_path / "metaworld")
    back = lr.build(root=root, chunk_size=4, image_keys=[])
    assert back["meta"]["fps"] == mw.FPS and back["meta"]["episodes"] == [0, 1, 2, 3]
    assert torch.equal(back["state"], frames["state"].float())
    assert torch.equal(back["actions"][:, 0], frames["actions"][:, 0])
    assert back["instruction"] == frames["instruction"]
    assert torch.equal(back["episode"], frames["episode"]) and torch.equal(back["step"], frames["step"])
    assert back["image"].shape == (len(frames["state"]), 1, 1, 3)  # no camera: one shared zero frame

    # records in any order are written by episode, then step: the same dataset comes back
    shuffle = torch.randperm(len(frames["state"]), generator=torch.Generator().manual_seed(0))
    rows = shuffle.tolist()
    shuffled = {k: v[shuffle] if isinstance(v, torch.Tensor) and len(v) == len(rows) else v for k, v in frames.items()}
    shuffled["instruction"] = [frames["instruction"][i] for i in rows]
    again = lr.build(root=mw.write_lerobot(shuffled, tmp_path / "shuffled"), chunk_size=4, image_keys=[])
    for key in ("state", "actions", "episode", "step"):
        assert torch.equal(again[key], back[key]), key
    assert again["instruction"] == back["instruction"]

    # decisions of 4 frames are what the builder itself records with chunk_size 4 (the expert runs
    # closed loop either way): the same states at the chunks' starts, the same summed rewards, the
    # same actions wherever a chunk does not run past its episode's end (padded differently there)
    decisions = lr.build(root=root, chunk_size=4, image_keys=[], transitions=True, reward_key="next.reward")
    chunked = mw.build(4, chunk_size=4, **DEMOS)
    assert torch.equal(decisions["state"], chunked["state"].float())
    assert torch.allclose(decisions["rewards"], chunked["rewards"], rtol=1e-6, atol=1e-6)
    last = torch.cat([decisions["episode"][1:] != decisions["episode"][:-1], torch.tensor([True])])
    assert torch.equal(decisions["actions"][~last], chunked["actions"][~last])


def test_writing_needs_one_action_per_frame_and_a_new_folder(tmp_path):
    mw = builder_module("metaworld_demos")
    chunked = mw.build(1, chunk_size=4, **DEMOS)
    with pytest.raises(ConfigError, match="chunk_size 1"):
        mw.write_lerobot(chunked, tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("a user's file")
    with pytest.raises(ConfigError, match="already holds files"):
        mw.write_lerobot(mw.build(1, chunk_size=1, **DEMOS), tmp_path / "b")
    assert (tmp_path / "b" / "keep.txt").read_text() == "a user's file"
