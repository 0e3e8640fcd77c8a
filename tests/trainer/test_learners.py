"""The trainer's learn stage is one `Learner` (`mmrl.trainer.learner`): `OnPolicy` for the objectives
that train on the rollout they were given, `OffPolicy` for those that replay transitions (SAC). Both
offer the interface with its signatures, so the loop calls either without asking which it holds; the
checkpoint keys stay the ones older checkpoints have."""

from __future__ import annotations

import inspect

import pytest
import yaml

from mmrl.experiment import build_trainer, load_experiment
from mmrl.trainer.learner import Learner
from mmrl.trainer.off_policy import OffPolicy
from mmrl.trainer.on_policy import OnPolicy
from tests.trainer.test_trainer import tiny_cfg

OFF = ["sim.num_envs=2", "sim.eval_num_envs=2", "warm_start.num_episodes=4", "algorithm.sac.batch_size=8"]


def off_policy_cfg(tmp_path):
    data = yaml.safe_load(open("configs/quickstart_dsrl.yaml"))
    return load_experiment(data, [f"run.output_dir={tmp_path}", "run.name=d", *OFF])


@pytest.mark.parametrize("mode", ["on", "off"])
def test_both_learners_offer_the_learner_interface(tmp_path, mode):
    cfg = tiny_cfg(tmp_path) if mode == "on" else off_policy_cfg(tmp_path)
    trainer = build_trainer(cfg)
    try:
        learner = trainer.learner
        assert type(learner) is (OnPolicy if mode == "on" else OffPolicy)
        assert isinstance(learner, Learner)
        for name, member in vars(Learner).items():
            if callable(member) and not name.startswith("_"):  # the interface's methods, as declared
                want = list(inspect.signature(member).parameters)
                assert list(inspect.signature(getattr(type(learner), name)).parameters) == want, name
        assert learner.checkpoint_key == ("reward_scaler" if mode == "on" else "off_policy")
        assert learner.behaviour(trainer.policy, 0) is not None
    finally:
        trainer.close()
