"""One reward scale per task (``algorithm.reward_norm_by: task``) on Meta-World's MT10, whose dense
rewards differ by two orders of magnitude between tasks: each decision carries the id of its
episode's task (batch key ``task``), each task keeps its own running std, and the per-task stds and
advantage magnitudes are logged; a simulator that names no task gets one line."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("metaworld")

from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.rollout import task_ids
from scripts.param_fingerprints import SHORT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHORT_MT10 = [
    *SHORT["metaworld_mt10"],
    "warm_start.steps=1",
    "trainer.eval_every=0",
    "trainer.checkpoint_every=10",
    "trainer.video_episodes=0",
]


def trainer_for(tmp_path, *extra):
    return build_trainer(
        load_experiment(
            "configs/metaworld_mt10.yaml", [f"run.output_dir={tmp_path}", "run.name=t", *SHORT_MT10, *extra]
        )
    )


def test_each_decision_carries_the_task_of_its_episode(tmp_path):
    trainer = trainer_for(tmp_path, "trainer.rollout_steps=12")  # 12 decisions of 4 steps: episodes of 20 end
    try:
        batch, info = trainer.collector.collect(trainer.policy, 0, torch.Generator().manual_seed(0))
    finally:
        trainer.close()
    task, dones = batch["task"], batch["dones"]
    names = info["task_names"]
    assert len(names) == 10 and all(torch.equal(task_ids([n]), torch.tensor([k])) for k, n in names.items())
    changed = task[1:] != task[:-1]
    assert changed.any(), "the auto resets started episodes of other tasks (else this test shows nothing)"
    # an env's task changes only at the decision after its episode ended: the label is the task of
    # the episode the decision acted in, not the one the auto reset began
    assert not (changed & ~dones[:-1]).any()
    # the episodes that ended are labelled with their own task (train/success/<task> comes from these)
    ended = dones.nonzero().tolist()  # (decision, env), in the order the collector saw them end
    assert len(ended) == len(info["success"]) > 0
    assert info["task"] == [names[int(task[t, i])] for t, i in ended]


def test_per_task_reward_scales_are_kept_and_logged(tmp_path):
    trainer = trainer_for(tmp_path, "trainer.iterations=2")  # the config keeps one std per task
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "train/epochs" in r][-1]
    stds = {k.split("/")[-1]: v for k, v in last.items() if k.startswith("train/reward_std/")}
    adv = {k.split("/")[-1]: v for k, v in last.items() if k.startswith("train/adv_abs/")}
    assert len(stds) == 10 and set(adv) == set(stds)
    # training success per task, from the episodes that ended in the fixed-length rollouts
    assert any(sum(k.startswith("train/success/") for k in r) >= 2 for r in rows)
    # reach-v3 pays about a hundred times what pick-place-v3 pays: their scales say so
    assert stds["reach-v3"] > 10 * stds["pick-place-v3"]
    scaler = trainer.learner.reward_scaler
    assert scaler is not None and len(scaler.stds()) == 10
    shared = trainer_for(tmp_path / "shared", "algorithm.reward_norm_by=all")  # one std for every reward
    assert not shared.learner.reward_scaler.per_key and not shared.learner.reward_scaler.stds()
    shared.close()


def test_per_task_scaling_needs_reward_norm_and_a_simulator_that_names_tasks(tmp_path):
    with pytest.raises(ConfigError, match="reward_norm: true"):
        load_experiment("configs/metaworld_mt10.yaml", ["algorithm.reward_norm=false", "algorithm.reward_norm_by=task"])
    gym = [
        "policy={type: gaussian}",
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "sim.kwargs={env_id: Pendulum-v1, render_images: false}",
        "trainer.rollout_steps=8",
        "trainer.env_steps=16",
        "trainer.eval_every=0",
    ]
    trainer = build_trainer(
        load_experiment(
            "configs/gym_pendulum.yaml", [f"run.output_dir={tmp_path}", *gym, "algorithm.reward_norm_by=task"]
        )
    )
    with pytest.raises(ConfigError, match="names no task.*reward_norm_by=all"):
        trainer.run()
    trainer.close()
