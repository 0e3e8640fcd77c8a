"""Fixed-length rollouts (trainer.rollout_steps), the env-step budget, state-only policies (the flow
policy's state backbone and the Gaussian MLP) and exact resume across iterations whose episodes go on."""

import pytest
import torch
import yaml

pytest.importorskip("gymnasium", reason='the "gym" simulator needs gymnasium: pip install "mmrl[gym]"')

from mmrl.experiment import build_trainer, load_experiment
from mmrl.simulator import Observation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PENDULUM = [
    "sim.num_envs=2",
    "sim.eval_num_envs=2",
    "sim.kwargs={env_id: Pendulum-v1, render_images: false}",
    "algorithm.epochs=1",
    "algorithm.minibatch_size=8",
    "trainer.rollout_steps=8",
    "trainer.env_steps=40",
    "trainer.eval_episodes=2",
    "trainer.checkpoint_every=1",
]


def pendulum(tmp_path, *extra, policy: str = "flow_vla"):
    """configs/gym_pendulum.yaml made tiny; ``policy="gaussian"`` swaps its policy section for the
    Gaussian MLP's defaults."""
    data = yaml.safe_load(open("configs/gym_pendulum.yaml"))
    if policy == "flow_vla":
        data["policy"].update(dim=16, expert_dim=16, num_steps=2)
    else:
        data["policy"] = {"type": policy}
    return load_experiment(data, [f"run.output_dir={tmp_path}", "run.name=p", *PENDULUM, *extra])


def params(policy):
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def test_episodes_continue_across_iterations_until_the_env_step_budget(tmp_path):
    trainer = build_trainer(pendulum(tmp_path))
    assert not trainer.policy.uses_images  # backbone auto -> the state MLP
    batches = []
    original = trainer.learner.update
    trainer.learner.update = lambda batch, gen: batches.append(batch) or original(batch, gen)
    results = trainer.run()
    # 2 envs x 8 steps per iteration: 3 iterations reach the 40-step budget; Pendulum's episodes
    # last 200 steps, so none ended and each env's episode went on through all three rollouts
    assert trainer.state.iteration == 3 and trainer.state.env_steps == 48
    assert trainer.state.episodes == 0 and trainer.collector.rollout.ep_length.tolist() == [24, 24]
    assert all(b["valid"].all() and tuple(b["rewards"].shape) == (8, 2) for b in batches)
    assert not torch.equal(batches[1]["state"][0], batches[0]["state"][0])  # not reset in between
    assert "image" not in batches[0]  # the state path stores no (all-zero) images
    # observation normalisation: statistics of every state the three rollouts saw
    states = torch.cat([b["state"].reshape(-1, 3) for b in batches]).double()
    torch.testing.assert_close(trainer.policy.obs_norm.mean, states.mean(0), rtol=0, atol=1e-4)
    assert trainer.policy.obs_norm.count.item() == pytest.approx(48, abs=1e-3)
    assert results["final"]["env_steps"] == 48 and results["final"]["length"] == 200


def test_state_policies_replay_their_own_log_probs(tmp_path):
    for policy in ("flow_vla", "gaussian"):
        trainer = build_trainer(pendulum(tmp_path, policy=policy))
        policy = trainer.policy.eval()
        obs = Observation(torch.zeros(5, 1, 1, 3, dtype=torch.uint8), [""] * 5, torch.randn(5, 3))
        out = policy.rollout(obs, torch.Generator().manual_seed(0)).batch
        again = policy.evaluate(out)
        torch.testing.assert_close(again.logp, out["old_logp"])
        torch.testing.assert_close(again.values, out["old_values"])
        torch.testing.assert_close(policy.value(obs), out["old_values"])


def test_rollout_end_is_bootstrapped_from_the_next_observation(tmp_path):
    trainer = build_trainer(pendulum(tmp_path))
    batch, info = trainer.collector.rollout.collect(trainer.policy, torch.Generator().manual_seed(0))
    last = trainer.policy.value(trainer.collector.rollout.obs)
    assert last.abs().sum() > 0
    torch.testing.assert_close(info["last_values"], last)
    assert info["env_steps"] == 16 and len(info["return"]) == 0  # no 200-step episode ended yet


@pytest.mark.parametrize(
    ("policy", "extra"),
    [("flow_vla", ()), ("gaussian", ()), ("flow_vla", ("trainer.lr_schedule=adaptive", "trainer.desired_kl=1e-4"))],
)
def test_resume_mid_episode_is_exact(tmp_path, killed_in_iteration, policy, extra):
    # the adaptive learning rate's scale resumes with the counters (lost, the resumed run's steps differ)
    full = build_trainer(pendulum(tmp_path / "full", *extra, policy=policy))
    full.run()
    with killed_in_iteration(3):
        build_trainer(pendulum(tmp_path / "cut", *extra, policy=policy)).run()
    resumed = build_trainer(pendulum(tmp_path / "cut", *extra, policy=policy))
    resumed.run()
    assert resumed.state.env_steps == full.state.env_steps
    assert resumed.state.lr_scale == full.state.lr_scale
    for k, v in params(full.policy).items():
        torch.testing.assert_close(params(resumed.policy)[k], v, rtol=0, atol=0, msg=k)


def test_fixed_rollouts_refuse_group_estimators(tmp_path):
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match="rollout_steps"):
        pendulum(tmp_path, "algorithm.advantage=grpo", "algorithm.group_size=2", "policy.critic=false")
