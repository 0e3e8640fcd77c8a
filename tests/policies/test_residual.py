"""Residual RL (`mmrl.policies.residual`) and RLPD's recorded demonstrations: a SAC actor adds a
bounded correction to a frozen flow VLA's chunk. Before training it acts as the base; the correction
stays in its bound; a recorded chunk maps back to the correction that acts it; the base gets no
gradient; a dataset of recorded episodes becomes transitions through the policy (next state, episode
ends); a tiny RLPD run on reach mixes those demonstrations into its batches and resumes with them."""

import pytest
import torch
import yaml

from mmrl.config import ConfigError
from mmrl.data import load_dataset
from mmrl.experiment import build_trainer, load_experiment
from mmrl.policies.flow_vla import FlowVLAConfig
from mmrl.policies.residual import ResidualConfig, ResidualPolicy
from mmrl.simulator import Observation
from mmrl.trainer.off_policy import UniformActions, record_transitions
from tests.policies.test_dsrl import TINY, make_obs, sac_step
from tests.policies.test_dsrl import config as dsrl_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_policy(**kw) -> ResidualPolicy:
    torch.manual_seed(0)
    base = FlowVLAConfig(dim=32, expert_dim=32, expert_layers=1, critic=False, chunk_size=3)
    return ResidualPolicy(ResidualConfig(base=base, hidden=16, **kw), action_dim=2, state_dim=2)


def test_before_training_it_acts_as_the_base_from_zero_noise():
    policy = make_policy()
    obs = make_obs()
    base = policy.base.act_from_noise(obs, torch.zeros(6, 3, 2))
    out = policy.rollout(obs, torch.Generator().manual_seed(0), mode="eval")
    torch.testing.assert_close(out.actions, base, rtol=0, atol=0)  # the zero-initialised actor's mean
    assert out.batch["actions"].abs().max() == 0
    prior = make_policy(actor="prior").rollout(obs, torch.Generator().manual_seed(0), mode="train")
    torch.testing.assert_close(prior.actions, base, rtol=0, atol=0)
    train = policy.rollout(obs, torch.Generator().manual_seed(0), mode="train")  # exploration around it
    assert (train.actions - base).abs().max() > 0.05


def test_the_correction_stays_within_its_scale_and_maps_back():
    policy = make_policy(scale=0.3)
    with torch.no_grad():  # a wide actor: |u| far beyond 1 before the squash
        policy.actor[-1].bias.fill_(5.0)
    obs = make_obs(b=8)
    base = policy.base_chunk(obs)
    for mode in ("train", "eval"):
        out = policy.rollout(obs, torch.Generator().manual_seed(1), mode=mode)
        assert (out.actions - base).abs().max() <= 0.3 + 1e-6
        assert (out.actions - base).abs().max() > 0.29  # it does reach toward the bound
    # a recorded chunk within the scale of the base's maps to the correction that acts it
    chunk = base + 0.3 * (torch.rand(8, 3, 2, generator=torch.Generator().manual_seed(2)) * 2 - 1)
    a = policy.replay_actions(obs, chunk)
    torch.testing.assert_close(policy.env_actions(obs, a), chunk)
    far = policy.replay_actions(obs, base + 1.0)  # beyond the scale: the largest correction toward it
    torch.testing.assert_close(far, torch.ones_like(far))
    u = UniformActions(policy).rollout(obs, torch.Generator().manual_seed(0))
    torch.testing.assert_close(u.actions, base + 0.3 * u.batch["actions"])


def test_the_base_gets_no_gradient_and_stays_frozen():
    policy = make_policy()
    policy.after_warm_start()
    sac_step(policy)
    assert all(p.grad is None and not p.requires_grad for p in policy.base.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.actor.parameters())


@pytest.fixture(scope="module")
def records():
    """Recorded reach episodes of a slow demonstrator: some succeed, some hit the time limit."""
    sim_kwargs = {"image_size": 32, "max_episode_steps": 12}
    return load_dataset("reach_demos", num_episodes=12, chunk_size=3, sim_kwargs=sim_kwargs, expert_speed=0.4)


def test_recorded_episodes_carry_rewards_ends_and_final_observations(records):
    ep = records["episode"]
    last = torch.ones_like(ep, dtype=torch.bool)
    last[:-1] = ep[1:] != ep[:-1]
    ends = records["terminated"] | records["truncated"]
    torch.testing.assert_close(ends, last)  # exactly the last row of each episode ends it
    per_episode = torch.zeros(12).index_add_(0, ep, records["rewards"])
    torch.testing.assert_close(per_episode, records["episode_success"].float())
    assert records["episode_success"].any() and not records["episode_success"].all()
    # the final observation is where the episode ended, not the last decision's observation
    assert records["final_image"].shape[0] == 12
    assert not torch.equal(records["final_state"][ep[last]], records["state"][last])


def test_recorded_episodes_become_transitions_through_the_policy(records):
    policy = make_policy()
    policy.after_warm_start()
    out = record_transitions(records, policy, batch_size=5)  # batches cut across episodes
    m = len(records["instruction"])
    obs = Observation(records["image"], records["instruction"], records["state"])
    features = policy.replay_state(obs)
    torch.testing.assert_close(out["state"], features)
    torch.testing.assert_close(out["actions"], policy.replay_actions(obs, records["actions"]))
    ep = records["episode"]
    cont = torch.zeros(m, dtype=torch.bool)
    cont[:-1] = ep[1:] == ep[:-1]
    torch.testing.assert_close(out["next_state"][:-1][cont[:-1]], features[1:][cont[:-1]])
    final = Observation(records["final_image"][ep], records["instruction"], records["final_state"][ep])
    torch.testing.assert_close(out["next_state"][~cont], policy.replay_state(final)[~cont])
    torch.testing.assert_close(out["terminated"], records["terminated"])
    with pytest.raises(ValueError, match="lack"):
        record_transitions({k: v for k, v in records.items() if k != "rewards"}, policy)


def rlpd_run(tmp_path, *extra):
    data = yaml.safe_load(open("configs/quickstart_rlpd.yaml"))
    return load_experiment(
        data, [f"run.output_dir={tmp_path}", "run.name=r", *TINY, "algorithm.sac.demo_episodes=6", *extra]
    )


def test_an_rlpd_run_mixes_the_recorded_demonstrations_and_resumes_with_them(tmp_path):
    trainer = build_trainer(rlpd_run(tmp_path))
    trainer.run()
    demos = trainer.learner.demos
    assert demos is not None and len(demos) > 6  # every recorded decision of the 6 episodes
    mb = trainer.learner.sample(torch.Generator().manual_seed(0))
    assert mb["is_demo"].float().mean() == 0.5
    again = build_trainer(rlpd_run(tmp_path, "trainer.env_steps=400"))
    again.resume()
    for k, v in demos.state_dict().items():
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(again.learner.demos.state_dict()[k], v, rtol=0, atol=0)


def test_dsrl_refuses_recorded_demonstrations_at_load_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="policy.type=residual") as err:
        dsrl_config(tmp_path, "algorithm.sac.demo_dataset=reach_demos")
    assert "\n" not in str(err.value)
