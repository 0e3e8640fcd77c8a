"""DSRL (`mmrl.policies.dsrl`): SAC over the initial noise of a frozen flow VLA. The noise -> action map
is the base's own ODE; the base gets no gradient and stays frozen through a resume; the noise stays
within its bound; the replayed state is the base's features of image, instruction and state; a tiny
warm-started run on the reach task trains, checkpoints and resumes bit-identically."""

import pytest
import torch
import yaml

from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.policies.dsrl import DSRLConfig, DSRLPolicy
from mmrl.policies.flow_vla import FlowVLAConfig
from mmrl.simulator import Observation
from mmrl.trainer.objectives import sac_objective
from mmrl.trainer.off_policy import OffPolicy, SACAgent, SoftCritics, UniformActions

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_obs(b=6, size=32, state_dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (b, size, size, 3), generator=g, dtype=torch.uint8)
    colors = ["red", "green", "blue"]
    return Observation(
        image, [f"reach the {colors[i % 3]} disc" for i in range(b)], torch.randn(b, state_dim, generator=g)
    )


def make_policy(**kw) -> DSRLPolicy:
    torch.manual_seed(0)
    base = FlowVLAConfig(dim=32, expert_dim=32, expert_layers=1, critic=False, chunk_size=3)
    return DSRLPolicy(DSRLConfig(base=base, hidden=16, **kw), action_dim=2, state_dim=2)


def test_prior_actor_acts_exactly_as_the_base_ode_sampler():
    policy = make_policy(actor="prior")
    obs = make_obs()
    for mode in ("train", "eval"):
        mine = policy.rollout(obs, torch.Generator().manual_seed(3), mode=mode).actions
        base = policy.base.rollout(obs, torch.Generator().manual_seed(3), mode="eval").actions
        torch.testing.assert_close(mine, base, rtol=0, atol=0)


def test_act_from_noise_is_the_base_ode_from_that_noise():
    policy = make_policy()
    obs = make_obs()
    noise = torch.randn(6, 3, 2, generator=torch.Generator().manual_seed(4))
    base = policy.base
    gen = torch.Generator().manual_seed(4)  # the base's eval rollout draws this same noise first
    torch.testing.assert_close(base.act_from_noise(obs, noise), base.rollout(obs, gen, mode="eval").actions)
    # the learned actor's eval action: the ODE from w = noise_bound * tanh(mean)
    out = policy.rollout(obs, torch.Generator().manual_seed(0), mode="eval")
    w = policy.cfg.noise_bound * out.batch["actions"]
    torch.testing.assert_close(out.actions, base.act_from_noise(obs, w))
    other = policy.rollout(obs, torch.Generator().manual_seed(9), mode="eval")  # tanh of the mean: no draw
    torch.testing.assert_close(other.actions, out.actions, rtol=0, atol=0)


def test_noise_stays_within_its_bound():
    policy = make_policy(noise_bound=0.5, spread_draws=0)  # the actor's noise only, not the diagnostic's
    with torch.no_grad():  # a wide actor: |u| far beyond the bound before the squash
        policy.actor[-1].bias.fill_(5.0)
    obs = make_obs(b=32)
    seen = []

    def spy(o, noise):
        seen.append(noise)
        return real(o, noise)

    real = policy.base.act_from_noise
    policy.base.act_from_noise = spy
    policy.rollout(obs, torch.Generator().manual_seed(1), mode="train")
    policy.rollout(obs, torch.Generator().manual_seed(1), mode="eval")
    policy.env_actions(obs, torch.ones(32, 3, 2))
    assert len(seen) == 3 and all(w.abs().max() <= 0.5 + 1e-6 for w in seen)
    assert seen[0].abs().max() > 0.45  # it does reach toward the bound
    a, logp = policy.sample_reparameterized(policy.replay_state(obs), torch.Generator().manual_seed(2))
    assert a.abs().max() <= 1 and torch.isfinite(logp).all()


def test_uniform_actions_before_learning_starts_are_uniform_noise_through_the_base():
    policy = make_policy()
    obs = make_obs()
    out = UniformActions(policy).rollout(obs, torch.Generator().manual_seed(0))
    a = out.batch["actions"]  # what is replayed: uniform in [-1, 1], the noise over its bound
    assert a.abs().max() <= 1 and a.std() > 0.4
    torch.testing.assert_close(out.actions, policy.base.act_from_noise(obs, policy.cfg.noise_bound * a))


def test_replay_state_is_the_base_features_of_image_and_instruction():
    policy = make_policy()
    obs = make_obs(b=2)
    same = Observation(obs.image, [obs.instruction[1], obs.instruction[1]], obs.state)
    f, g = policy.replay_state(obs), policy.replay_state(same)
    assert f.shape == (2, policy.replay_dim) and not f.requires_grad
    assert not torch.allclose(f[0], g[0])  # the instruction changes the features
    flipped = Observation(obs.image.flip(1), obs.instruction, obs.state)
    assert not torch.allclose(f, policy.replay_state(flipped))  # so does the image


def sac_step(policy: DSRLPolicy) -> None:
    """One SAC loss on random replayed rows, backward."""
    g = torch.Generator().manual_seed(0)
    d, w = policy.replay_dim, 6
    mb = {
        "state": torch.randn(8, d, generator=g),
        "actions": torch.rand(8, w, generator=g) * 2 - 1,
        "rewards": torch.randn(8, generator=g),
        "discount": torch.full((8,), 0.99),
        "next_state": torch.randn(8, d, generator=g),
    }
    from mmrl.batch import Batch
    from mmrl.experiment import AlgorithmConfig

    agent = SACAgent(policy, SoftCritics(d, w, 16), -6.0, g)
    loss, _ = sac_objective(agent, Batch(mb), AlgorithmConfig(objective="sac"))
    loss.backward()


def test_the_base_gets_no_gradient_and_stays_frozen():
    policy = make_policy()
    policy.after_warm_start()  # the warm start's end freezes the base
    sac_step(policy)
    assert all(p.grad is None and not p.requires_grad for p in policy.base.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.actor.parameters())
    policy.train()
    assert not policy.base.training  # a frozen base stays in eval mode
    # a policy built again (a resume) and given these weights is frozen as well
    again = make_policy()
    assert all(p.requires_grad for p in again.base.parameters())
    again.load_state_dict(policy.state_dict())
    assert not any(p.requires_grad for p in again.base.parameters())


def test_a_bad_base_fails_at_load_in_one_line(tmp_path):
    data = yaml.safe_load(open("configs/quickstart_dsrl.yaml"))
    data["policy"]["base"] = {"type": "gaussian"}
    with pytest.raises(ConfigError, match="'base.type' = 'gaussian' has no deterministic noise") as err:
        load_experiment(data, [f"run.output_dir={tmp_path}"])
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="set algorithm.objective=sac"):  # PPO cannot train the actor
        load_experiment(
            yaml.safe_load(open("configs/quickstart_dsrl.yaml")),
            [f"run.output_dir={tmp_path}", "algorithm.objective=ppo", "trainer.rollout_steps=0"],
        )


TINY = [
    "run.threads=1",
    "sim.num_envs=2",
    "sim.eval_num_envs=2",
    "sim.kwargs.max_episode_steps=8",
    "warm_start.num_episodes=8",
    "warm_start.steps=4",
    "warm_start.batch_size=8",
    "warm_start.candidates=1",
    "policy.hidden=16",
    "policy.base.dim=16",
    "policy.base.expert_dim=16",
    "policy.base.expert_layers=1",
    "algorithm.sac.critic_hidden=16",
    "algorithm.sac.batch_size=8",
    "algorithm.sac.learning_starts=16",
    "algorithm.sac.utd_ratio=0.5",
    "trainer.rollout_steps=2",
    "trainer.env_steps=64",  # 2 envs x 2 decisions x 4 steps: 16 per iteration, 4 iterations
    "trainer.eval_every=0",
    "trainer.eval_episodes=2",
    "trainer.checkpoint_every=2",
]


def config(tmp_path, *extra):
    data = yaml.safe_load(open("configs/quickstart_dsrl.yaml"))
    return load_experiment(data, [f"run.output_dir={tmp_path}", "run.name=d", *TINY, *extra])


def test_a_dsrl_run_on_reach_trains_checkpoints_and_resumes_bit_identical(tmp_path, monkeypatch, off_policy_tensors):
    full = build_trainer(config(tmp_path / "full"))
    base_after_warm_start = {}
    original_freeze = DSRLPolicy.freeze_base

    def remember(self):
        base_after_warm_start.update({k: v.clone() for k, v in self.base.state_dict().items()})
        original_freeze(self)

    monkeypatch.setattr(DSRLPolicy, "freeze_base", remember)
    full.run()
    monkeypatch.setattr(DSRLPolicy, "freeze_base", original_freeze)
    mode = full.learner
    assert full.state.iteration == 4 and full.state.env_steps == 64
    # 2 x 2 decisions per iteration into the buffer; the first iteration acts at random (16 env
    # steps = learning_starts), every learn stage learns (env steps counted first): utd 0.5
    assert len(mode.buffer) == 16 and mode.learning_rows == 16 and mode.updates == 8
    data = mode.buffer.data
    assert data["state"].shape[1] == full.policy.replay_dim == 16 + 2  # pooled prefix + state
    assert data["actions"].shape[1] == 4 * 2 and data["actions"][:16].abs().max() <= 1
    # the base did not move during RL; the actor did
    for k, v in full.policy.base.state_dict().items():
        torch.testing.assert_close(v, base_after_warm_start[k], rtol=0, atol=0, msg=k)
    assert not any(p.requires_grad for p in full.policy.base.parameters())
    # the mode's Adam holds the actor alone (built after the freeze)
    actor = {id(p) for p in full.policy.actor.parameters()}
    assert {id(p) for p in mode.optimizer.param_groups[0]["params"]} == actor

    original = OffPolicy.learn_transitions

    def killed(self, batch, env_steps, noise, indices):
        if env_steps >= 48:  # iteration 4, after the checkpoint of iteration 2
            raise KeyboardInterrupt("killed")
        return original(self, batch, env_steps, noise, indices)

    monkeypatch.setattr(OffPolicy, "learn_transitions", killed)
    with pytest.raises(KeyboardInterrupt):
        build_trainer(config(tmp_path / "cut")).run()
    monkeypatch.setattr(OffPolicy, "learn_transitions", original)
    resumed = build_trainer(config(tmp_path / "cut"))
    resumed.run()
    assert resumed.state.env_steps == 64 and resumed.learner.updates == mode.updates
    assert not any(p.requires_grad for p in resumed.policy.base.parameters())
    a, b = off_policy_tensors(full), off_policy_tensors(resumed)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
    for k, v in mode.buffer.state_dict()["data"].items():
        torch.testing.assert_close(resumed.learner.buffer.state_dict()["data"][k], v, rtol=0, atol=0, msg=k)


def test_dsrl_from_a_base_checkpoint(tmp_path):
    # a tiny quickstart run (the flow VLA warm-started, no RL) is the base of a run without a warm start
    quick = yaml.safe_load(open("configs/quickstart.yaml"))
    base_run = [
        o.replace("policy.base.", "policy.")
        for o in TINY
        if o.startswith(("run.", "sim.", "warm_start.", "policy.base."))
    ]
    first = build_trainer(
        load_experiment(quick, [f"run.output_dir={tmp_path}", "run.name=q", *base_run, "trainer.iterations=0"])
    )
    first.run()
    trainer = build_trainer(config(tmp_path, f"policy.base_checkpoint={tmp_path / 'q'}", "warm_start.dataset=null"))
    base = trainer.policy.base
    assert not any(p.requires_grad for p in base.parameters())
    for k, v in first.policy.state_dict().items():
        torch.testing.assert_close(base.state_dict()[k], v, rtol=0, atol=0, msg=k)
    assert trainer.policy.cfg.base.dim == 16 and trainer.policy.cfg.base.critic  # the checkpoint's section
    trainer.run()
    assert trainer.state.env_steps == 64
    for k, v in first.policy.state_dict().items():
        torch.testing.assert_close(trainer.policy.base.state_dict()[k], v, rtol=0, atol=0, msg=k)
    # a DSRL run's checkpoint is no base: one line at build
    with pytest.raises(ConfigError, match="holds a 'dsrl' policy"):
        build_trainer(config(tmp_path / "third", f"policy.base_checkpoint={tmp_path / 'd'}", "warm_start.dataset=null"))
    # the loaded base is frozen: a warm start of it is refused in one line
    with pytest.raises(ConfigError, match="keeps frozen"):
        build_trainer(config(tmp_path / "fourth", f"policy.base_checkpoint={tmp_path / 'q'}")).run()


def test_the_steering_spread_is_the_bases_action_spread_over_the_bound_measured_once():
    from mmrl.policies.dsrl import action_spread

    obs = make_obs()
    spreads = {}
    for bound in (0.05, 4.0):
        policy = make_policy(noise_bound=bound, spread_draws=5)
        torch.manual_seed(1)
        policy.rollout(obs, torch.Generator().manual_seed(0))
        after = torch.rand(1)  # the measurement drew from its own generator, not the global one
        torch.manual_seed(1)
        assert torch.equal(after, torch.rand(1))
        stats = policy.rollout_stats()
        assert policy.rollout_stats() == {}  # logged once
        policy.rollout(obs, torch.Generator().manual_seed(0))
        assert policy.rollout_stats() == {}  # and measured once
        g = torch.Generator().manual_seed(0)  # by hand: the documented draws, 4 observations x 5
        box = bound * (2 * torch.rand(20, 3, 2, generator=g) - 1)
        prior = torch.randn(20, 3, 2, generator=g)
        rows = obs.index(torch.arange(4).repeat_interleave(5))
        for key, w in (("steer_spread", box), ("base_spread", prior)):
            expect = action_spread(policy.base.act_from_noise(rows, w).reshape(4, 5, 3, 2))
            assert stats[key] == pytest.approx(expect, rel=1e-6)
        spreads[bound] = stats
    assert spreads[0.05]["base_spread"] == pytest.approx(spreads[4.0]["base_spread"])  # the same base
    assert spreads[0.05]["steer_spread"] < 0.1 * spreads[4.0]["steer_spread"]
    with pytest.raises(ConfigError, match="spread_draws"):
        DSRLConfig(spread_draws=1).validate()
    off = make_policy(spread_draws=0)
    off.rollout(obs, torch.Generator().manual_seed(0))
    assert off.rollout_stats() == {}
