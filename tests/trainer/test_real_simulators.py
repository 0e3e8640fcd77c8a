"""The quickstart trainer runs a few iterations on the real simulators (smoke: no error, logs, eval)."""

import pytest

from mmrl.experiment import build_trainer, load_experiment

SMALL = [
    "warm_start.dataset=null",
    "policy.dim=16",
    "policy.expert_dim=16",
    "policy.expert_layers=1",
    "policy.num_steps=2",
    "algorithm.minibatch_size=16",
    "algorithm.epochs=1",
    "trainer.iterations=2",
    "trainer.video_episodes=0",
]


@pytest.mark.slow
@pytest.mark.parametrize("obs_mode, num_envs", [("state", 2), ("rgb", 1)])
def test_quickstart_trainer_on_maniskill_pickcube(tmp_path, obs_mode, num_envs):
    pytest.importorskip("mani_skill", reason="needs mmrl[sim] (mani-skill) and scripts/install_sim_deps.sh")
    cfg = load_experiment(
        "configs/quickstart.yaml",
        [
            f"run.output_dir={tmp_path}",
            "sim.type=maniskill",
            f"sim.num_envs={num_envs}",
            f"sim.eval_num_envs={num_envs}",
            f"trainer.eval_episodes={num_envs}",
            f"sim.kwargs={{task: PickCube-v1, obs_mode: {obs_mode}, max_episode_steps: 8, image_size: 32}}",
            *SMALL,
        ],
    )
    trainer = build_trainer(cfg)
    try:
        results = trainer.run()
    finally:
        trainer.sim.close()
        trainer.eval_sim.close()
    assert results["final"]["episodes"] == num_envs and trainer.state.iteration == 2
    assert trainer.state.skipped_steps == 0
