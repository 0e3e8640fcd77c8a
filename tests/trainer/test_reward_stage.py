"""The trainer's reward stage: configured in its own section, checked against the simulator and the
policy before any work, and applied wherever the simulator runs (in process or in sim workers)."""

from __future__ import annotations

import pytest
import torch

from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment

DIFF = [
    "sim.type=prompts",
    "sim.num_envs=4",
    "sim.eval_num_envs=42",
    "sim.kwargs={dataset: shapes_prompts, image_size: 8}",
    "reward={type: shapes, success_threshold: 0.5}",
    "policy.type=diffusion",
    "policy.image_size=8",
    "policy.width=8",
    "policy.num_steps=2",
    "policy.eval_num_steps=2",
    "algorithm.advantage=grpo",
    "algorithm.group_size=2",
    "algorithm.minibatch_size=4",
    "algorithm.epochs=1",
    "trainer.iterations=1",
    "trainer.eval_episodes=42",
    "trainer.video_episodes=0",
    "warm_start.dataset=null",
]


def cfg(tmp_path, *extra):
    return load_experiment(None, [f"run.output_dir={tmp_path}", "run.name=r", *DIFF, *extra])


def test_mismatches_fail_at_load_with_the_fix():
    with pytest.raises(ConfigError, match="'kwargs.reward' is not an argument of simulator 'prompts'"):
        load_experiment(None, [*DIFF, "sim.kwargs={dataset: shapes_prompts, reward: shapes}"])
    with pytest.raises(ConfigError, match="'reward.frames' says how a robot simulator's rendered frames"):
        load_experiment(None, [*DIFF, "reward.frames={timing: step}"])
    with pytest.raises(ConfigError, match="no task reward of its own: add a `reward:` section"):
        load_experiment(None, [*DIFF, "reward=null"])
    with pytest.raises(
        ConfigError, match="policy 'flow_vla' produces chunk actions but simulator 'prompts' takes image"
    ):
        load_experiment(None, [*DIFF, "policy={type: flow_vla}"])
    with pytest.raises(ConfigError, match="not a registered reward"):
        load_experiment(None, [*DIFF, "reward.type=shape"])


def test_a_text_reward_on_an_image_simulator_fails_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="reward 'short_answer' scores text, but the simulator's actions are images"):
        build_trainer(cfg(tmp_path, "reward.type=short_answer"))


def test_success_comes_from_the_reward_threshold(tmp_path):
    trainer = build_trainer(cfg(tmp_path))
    assert trainer.headline() == ("success_rate", "success")
    assert build_trainer(cfg(tmp_path, "reward.success_threshold=null")).headline() == ("return", "mean reward")


def test_sim_workers_are_scored_like_the_in_process_simulator(tmp_path):
    """The reward stage scores in the main process what sim workers return: the same episodes and
    rewards as the collocated run (one stage: the policy draws its noise in the same order)."""
    got = {}
    for mode in ("collocated", "disaggregated"):
        # a random generator draws nothing the shapes reward scores; JPEG size varies per image
        trainer = build_trainer(cfg(tmp_path / mode, f"placement.mode={mode}", "reward={type: jpeg_compressibility}"))
        try:
            trainer.policy.eval()
            batch, info = trainer.collector.collect(trainer.policy, 0, torch.Generator().manual_seed(0))
        finally:
            trainer.close()
        got[mode] = info["return"]
    assert got["collocated"].abs().sum() > 0  # something was scored
    assert torch.equal(got["collocated"], got["disaggregated"])
