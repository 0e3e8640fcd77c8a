"""The trainer's off-policy mode with SAC (`mmrl.trainer.off_policy`, ``algorithm.objective: sac``):
transitions (bootstrapped through a time limit, not through a termination), the temperature, the
target critics, RLPD's demonstration mixing, exact resume and the config check, on tiny Pendulum
runs of the Gaussian policy as SAC's actor."""

import json

import pytest
import torch
import yaml

pytest.importorskip("gymnasium", reason='the "gym" simulator needs gymnasium: pip install "mmrl[gym]"')

from mmrl.batch import Batch
from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.trainer.checkpoint import STATE, latest_path
from mmrl.trainer.objectives import sac_objective
from mmrl.trainer.off_policy import OffPolicy, SoftCritics, transitions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = [
    "sim.num_envs=2",
    "sim.eval_num_envs=2",
    "policy.hidden=16",
    "algorithm.sac.critic_hidden=16",
    "algorithm.sac.batch_size=8",
    "algorithm.sac.learning_starts=16",
    "trainer.rollout_steps=4",
    "trainer.env_steps=40",
    "trainer.eval_episodes=2",
    "trainer.checkpoint_every=2",
]


def config(tmp_path, *extra):
    """configs/gym_pendulum_sac.yaml made tiny."""
    data = yaml.safe_load(open("configs/gym_pendulum_sac.yaml"))
    return load_experiment(data, [f"run.output_dir={tmp_path}", "run.name=s", *TINY, *extra])


def test_sac_runs_on_pendulum_with_the_gaussian_policy(tmp_path):
    trainer = build_trainer(config(tmp_path))
    mode = trainer.learner
    initial_targets = [p.detach().clone() for p in mode.critics.target_q.parameters()]
    actors = []
    collect = trainer.collector.collect
    trainer.collector.collect = lambda policy, it, gen: actors.append(policy) or collect(policy, it, gen)
    results = trainer.run()
    # 2 envs x 4 decisions per iteration: 5 iterations reach 40 env steps; the first 2 act at
    # random (16 = learning_starts), learning starts once they are in: 4 x 8 transitions, utd_ratio 1
    assert trainer.state.iteration == 5 and trainer.state.env_steps == 40
    assert len(mode.buffer) == 40 and mode.learning_rows == 32 and mode.updates == 32
    data = mode.buffer.data
    assert data["state"].shape == (mode.buffer.capacity, 3) and data["actions"].shape[1:] == (1,)
    assert data["actions"][:40].abs().max() <= 1
    # uniform random actions until learning_starts (16) env steps were collected, then the policy
    assert [type(a).__name__ for a in actors] == ["UniformActions"] * 2 + ["GaussianPolicy"] * 3
    # the target critics moved (by Polyak), and are not the online ones
    targets = list(mode.critics.target_q.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(initial_targets, targets))
    assert not all(torch.equal(a, b) for a, b in zip(mode.critics.q.parameters(), targets))
    torch.testing.assert_close(data["discount"][:40], torch.full((40,), 0.99))  # no termination
    # consecutive decisions of an env: the next state of one is the state of the next
    torch.testing.assert_close(data["next_state"][0], data["state"][2])  # rows time-major, 2 envs
    assert results["final"]["env_steps"] == 40


def test_transitions_bootstrap_through_a_time_limit_not_a_termination():
    # 2 decisions x 2 envs; env 0 terminates at t=0, env 1 is cut by the time limit at t=0
    state = torch.arange(8.0).reshape(2, 2, 2)
    batch = Batch(
        state=state,
        actions=torch.ones(2, 2, 3, 1),  # chunks of 3: flattened into one action of width 3
        rewards=torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
        terminated=torch.tensor([[True, False], [False, False]]),
        truncated=torch.tensor([[False, True], [False, False]]),
        valid=torch.ones(2, 2, dtype=torch.bool),
        next_state=-torch.arange(8.0).reshape(2, 2, 2),
    )
    rows = transitions(batch, gamma=0.9)
    assert rows["actions"].shape == (4, 3)
    torch.testing.assert_close(rows["discount"], torch.tensor([0.0, 0.9, 0.9, 0.9]))
    torch.testing.assert_close(rows["next_state"], batch["next_state"].reshape(4, 2))
    # 2-step returns: stop at the end of each episode and at the rollout's end
    rows = transitions(batch, gamma=0.9, n=2)
    torch.testing.assert_close(rows["rewards"], torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(rows["discount"], torch.tensor([0.0, 0.9, 0.9, 0.9]))


def test_next_state_of_an_ended_episode_is_its_final_state(tmp_path):
    trainer = build_trainer(config(tmp_path, "sim.kwargs.max_episode_steps=3"))
    rollout = trainer.collector.rollout
    batch, _ = rollout.collect(trainer.policy, torch.Generator().manual_seed(0))
    ended = batch["truncated"][2]  # the time limit cut both envs at the third decision
    assert ended.all() and not batch["terminated"].any()
    # the final state, not the reset state the next decision starts from
    assert not torch.allclose(batch["next_state"][2], batch["state"][3])
    torch.testing.assert_close(batch["next_state"][1], batch["state"][2])


def tiny_mode(tmp_path, *extra) -> OffPolicy:
    """The off-policy mode of a tiny trainer, its buffer filled with 64 random transitions."""
    mode = build_trainer(config(tmp_path, *extra)).learner
    g = torch.Generator().manual_seed(0)
    mode.buffer.add(
        {
            "state": torch.randn(64, 3, generator=g),
            "actions": torch.rand(64, 1, generator=g) * 2 - 1,
            "rewards": torch.randn(64, generator=g),
            "discount": torch.full((64,), 0.99),
            "next_state": torch.randn(64, 3, generator=g),
        }
    )
    return mode


@pytest.mark.parametrize("target_entropy, direction", [(5.0, 1), (-5.0, -1)])
def test_the_temperature_moves_toward_its_target(tmp_path, target_entropy, direction):
    # the initial policy's entropy is about 0.6 nats (std ~1 squashed): alpha rises while it is
    # below the target, falls while above
    mode = tiny_mode(tmp_path, f"algorithm.sac.target_entropy={target_entropy}", "algorithm.sac.learning_starts=0")
    before = mode.critics.log_alpha.item()
    empty = Batch(
        state=torch.zeros(1, 1, 3),
        actions=torch.zeros(1, 1, 1, 1),
        rewards=torch.zeros(1, 1),
        terminated=torch.zeros(1, 1, dtype=torch.bool),
        truncated=torch.zeros(1, 1, dtype=torch.bool),
        valid=torch.zeros(1, 1, dtype=torch.bool),  # nothing added: only the gradient steps
        next_state=torch.zeros(1, 1, 3),
    )
    mode.learning_rows = 10  # ten gradient steps owed
    mode.learn_transitions(empty, 100, torch.Generator().manual_seed(1), torch.Generator().manual_seed(2))
    assert mode.updates == 10
    assert direction * (mode.critics.log_alpha.item() - before) > 0


def test_target_critics_move_by_polyak_and_not_by_gradient(tmp_path):
    mode = tiny_mode(tmp_path, "algorithm.sac.learning_starts=0", "algorithm.sac.tau=0.25")
    critics = mode.critics
    old_target = [p.detach().clone() for p in critics.target_q.parameters()]
    assert not any(p.requires_grad for p in critics.target_q.parameters())
    mb = Batch(mode.sample(torch.Generator().manual_seed(0)))
    loss, _ = sac_objective(mode.agent, mb, mode.algo)
    assert mode.step(mode.optimizer, loss)
    assert all(p.grad is None for p in critics.target_q.parameters())
    critics.polyak(0.25)
    for old, new, online in zip(old_target, critics.target_q.parameters(), critics.q.parameters()):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * online.detach())
    # the critics' target comes from the target critics: moving them changes the critic loss
    mode.agent.generator = torch.Generator().manual_seed(3)
    a = sac_objective(mode.agent, mb, mode.algo)[1]["critic_loss"]
    with torch.no_grad():
        for p in critics.target_q.parameters():
            p.add_(0.5)
    mode.agent.generator = torch.Generator().manual_seed(3)
    b = sac_objective(mode.agent, mb, mode.algo)[1]["critic_loss"]
    assert not torch.isclose(a, b)


@pytest.mark.parametrize("backup", [True, False])
def test_the_critics_target_carries_the_entropy_bonus_only_with_backup_entropy(tmp_path, backup):
    mode = tiny_mode(tmp_path, f"algorithm.sac.backup_entropy={backup}")
    mb = Batch(mode.sample(torch.Generator().manual_seed(0)))
    mode.agent.generator = torch.Generator().manual_seed(3)
    got = sac_objective(mode.agent, mb, mode.algo)[1]["critic_loss"]
    # by hand: y = r + gamma^m (min Q'(s', a') - alpha log pi(a'|s')), the bonus only with the backup
    with torch.no_grad():
        a, logp = mode.agent.policy.sample_reparameterized(mb["next_state"], torch.Generator().manual_seed(3))
        t1, t2 = mode.critics.target(mb["next_state"], a.flatten(1))
        bonus = mode.critics.log_alpha.exp() * logp
        y = mb["rewards"] + mb["discount"] * (torch.minimum(t1, t2) - (bonus if backup else 0.0))
        q1, q2 = mode.critics(mb["state"], mb["actions"])
    torch.testing.assert_close(got, (0.5 * ((q1 - y) ** 2 + (q2 - y) ** 2)).mean())
    assert bonus.abs().mean() > 0.1  # alpha = 1 here: the two settings differ by a visible amount


def test_the_actor_loss_reaches_the_policy_not_the_critics(tmp_path):
    mode = tiny_mode(tmp_path)
    mb = Batch(mode.sample(torch.Generator().manual_seed(0)))
    alpha_logp = mode.agent.policy.sample_reparameterized(mb["state"], torch.Generator().manual_seed(1))
    q1, q2 = mode.critics.frozen(mb["state"], alpha_logp[0].flatten(1))
    (q1 + q2).sum().backward()
    assert all(p.grad is None for p in mode.critics.q.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in mode.agent.policy.parameters())


def test_demonstrations_are_half_of_every_batch(tmp_path):
    demos = {
        "state": torch.full((10, 3), 7.0),
        "actions": torch.full((10, 1, 1), 0.5),
        "rewards": torch.ones(10),
        "next_state": torch.full((10, 3), 7.0),
        "terminated": torch.zeros(10, dtype=torch.bool),
    }
    torch.save(demos, tmp_path / "demos.pt")
    trainer = build_trainer(config(tmp_path, f"algorithm.sac.demos={tmp_path / 'demos.pt'}"))
    mode = trainer.learner
    seen = []
    original = mode.sample
    mode.sample = lambda g: seen.append(original(g)) or seen[-1]
    trainer.run()
    assert len(seen) == 32
    for mb in seen:
        assert mb["is_demo"].sum() == 4 and mb["state"].shape[0] == 8
        assert (mb["state"][mb["is_demo"]] == 7.0).all() and (mb["state"][~mb["is_demo"]] != 7.0).all()
    rows = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["train/demo_rows"] for r in rows if "train/demo_rows" in r]
    assert len(logged) == 4 and all(v == 0.5 for v in logged)  # the 4 iterations that learned


def run_until_killed(cfg, monkeypatch) -> None:
    """Run ``cfg`` until its learn stage at 32 env steps (iteration 4, after the checkpoint of
    iteration 2: checkpoint_every=2) is interrupted."""
    original = OffPolicy.learn_transitions

    def killed(self, batch, env_steps, noise, indices):
        if env_steps >= 32:
            raise KeyboardInterrupt("killed")
        return original(self, batch, env_steps, noise, indices)

    monkeypatch.setattr(OffPolicy, "learn_transitions", killed)
    with pytest.raises(KeyboardInterrupt):
        build_trainer(cfg).run()
    monkeypatch.setattr(OffPolicy, "learn_transitions", original)


def test_resume_after_an_interruption_is_bit_identical(tmp_path, monkeypatch, off_policy_tensors):
    full = build_trainer(config(tmp_path / "full"))
    full.run()
    run_until_killed(config(tmp_path / "cut"), monkeypatch)
    resumed = build_trainer(config(tmp_path / "cut"))
    resumed.run()
    assert resumed.state.env_steps == full.state.env_steps == 40
    assert resumed.learner.updates == full.learner.updates
    a, b = off_policy_tensors(full), off_policy_tensors(resumed)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
    for k, v in full.learner.buffer.state_dict()["data"].items():
        torch.testing.assert_close(resumed.learner.buffer.state_dict()["data"][k], v, rtol=0, atol=0)
    sa, sb = full.learner.optimizer.state_dict()["state"], resumed.learner.optimizer.state_dict()["state"]
    for i in sa:
        torch.testing.assert_close(sb[i]["exp_avg_sq"], sa[i]["exp_avg_sq"], rtol=0, atol=0)


def test_without_the_buffer_in_checkpoints_a_resume_refills_it_before_learning(tmp_path, monkeypatch):
    run_until_killed(config(tmp_path, "algorithm.sac.checkpoint_buffer=false"), monkeypatch)
    original = OffPolicy.learn_transitions
    saved = torch.load(latest_path(tmp_path / "s") / STATE, weights_only=False)["extra"]
    assert saved["off_policy"]["buffer"] is None and saved["off_policy"]["buffer_rows"] == 16
    # the same command resumes: the buffer starts empty, and learning waits for as many rows as it
    # started with (16: learning_starts of 2 envs' single steps), at least batch_size (8)
    resumed = build_trainer(config(tmp_path, "algorithm.sac.checkpoint_buffer=false", "trainer.env_steps=64"))
    resumed.resume()
    mode = resumed.learner
    assert len(mode.buffer) == 0 and mode.refill_rows == 16
    updates, logged = mode.updates, []
    monkeypatch.setattr(
        OffPolicy, "learn_transitions", lambda self, *a: logged.append(original(self, *a)) or logged[-1]
    )
    resumed.run()
    # 2 envs x 4 decisions = 8 rows per iteration: the first after the resume refills without an
    # update; the second fills the buffer to 16 and learns, as learning started at the run's start
    assert [row["train/buffer_size"] for row in logged[:2]] == [8, 16]
    assert "train/gradient_steps" not in logged[0]
    assert all("train/gradient_steps" in row for row in logged[1:]) and mode.updates > updates
    assert len(logged) == 6 and resumed.state.env_steps == 64


def test_chunks_are_one_flattened_action(tmp_path):
    trainer = build_trainer(config(tmp_path, "policy.chunk_size=2"))
    trainer.run()
    assert trainer.learner.buffer.data["actions"].shape[1:] == (2,)
    assert trainer.learner.agent.target_entropy == -2.0


@pytest.mark.parametrize(
    "extra, says",
    [
        (["trainer.rollout_steps=0"], "'algorithm.objective' = 'sac' (the off-policy mode): set trainer.rollout_steps"),
        (["algorithm.sac.n_step=8"], "rollout_steps >= algorithm.sac.n_step"),
        (["policy.squash=false"], "policy.squash=true"),
        (["algorithm.reward_norm=true"], "algorithm.reward_norm=false"),
        (["algorithm.sac.tau=0"], "'tau' = 0"),
        (["algorithm.sac.demos=/no/such/file.pt"], "is not a file"),
    ],
)
def test_a_bad_sac_config_fails_at_load_in_one_line(tmp_path, extra, says):
    with pytest.raises(ConfigError) as err:
        config(tmp_path, *extra)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_ppo_refuses_the_squashed_actor_in_one_line(tmp_path):
    data = yaml.safe_load(open("configs/gym_pendulum.yaml"))
    data["policy"] = {"type": "gaussian", "squash": True}
    with pytest.raises(ConfigError, match="use algorithm.objective=sac"):
        load_experiment(data, [f"run.output_dir={tmp_path}"])


def test_soft_critics_shapes():
    critics = SoftCritics(3, 2, hidden=8, layers=2, layer_norm=True, init_temperature=0.5)
    q1, q2 = critics(torch.zeros(5, 3), torch.zeros(5, 2))
    assert q1.shape == q2.shape == (5,)
    assert any(isinstance(m, torch.nn.LayerNorm) for m in critics.q[0])
    assert critics.log_alpha.exp().item() == pytest.approx(0.5)


def test_the_squashed_log_prob_carries_the_tanh_correction(tmp_path):
    policy = build_trainer(config(tmp_path)).policy
    state = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    action, logp = policy.sample_reparameterized(state, torch.Generator().manual_seed(1))
    assert action.shape == (6, 1, 1) and logp.shape == (6,) and action.abs().max() < 1
    dist = policy._dist(state)
    squashed = torch.distributions.TransformedDistribution(dist, torch.distributions.TanhTransform())
    torch.testing.assert_close(logp, squashed.log_prob(action).sum((1, 2)), rtol=0, atol=1e-4)
    # the rollout draws from the same distribution: same noise, same action and log-prob
    from mmrl.simulator import Observation

    obs = Observation(torch.zeros(6, 1, 1, 3, dtype=torch.uint8), [""] * 6, state)
    out = policy.rollout(obs, torch.Generator().manual_seed(1)).batch
    torch.testing.assert_close(out["actions"], action.detach())
    torch.testing.assert_close(out["old_logp"], logp.detach())


def test_the_actor_climbs_the_critics(tmp_path, monkeypatch):
    # critics held fixed at Q(s, a) = 10 a: the actor's step raises the mean action
    mode = tiny_mode(tmp_path, "algorithm.sac.init_temperature=0.001")
    monkeypatch.setattr(mode.critics, "frozen", lambda s, a: (10 * a.sum(-1), 10 * a.sum(-1)))
    state = mode.buffer.data["state"][:64]
    before = torch.tanh(mode.policy._dist(state).mean).mean().item()
    opt = torch.optim.SGD(mode.policy.parameters(), lr=0.05)
    for i in range(5):
        mode.agent.generator = torch.Generator().manual_seed(i)
        loss, _ = sac_objective(mode.agent, Batch(mode.sample(torch.Generator().manual_seed(i))), mode.algo)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.tanh(mode.policy._dist(state).mean).mean().item() > before + 0.05


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["ckpt.after_rename:3", "log.after_row:6"])
def test_kill_9_then_the_same_command_resumes_bit_identical(tmp_path, monkeypatch, fault):
    """``kill -9`` of ``mmrl train`` (the kill harness of tests/reliability) after the checkpoint of
    iteration 2, or after iteration 5's log row: the same command resumes and ends with the same
    checkpoints (policy, replay buffer, critics and targets, temperature, optimizers, RNG), results
    and log rows as the uninterrupted run."""
    from tests.reliability import kill_harness as kh

    def argv(out):
        return ["train", "configs/gym_pendulum_sac.yaml", f"run.output_dir={out.parent}", f"run.name={out.name}"] + [
            *TINY,
            "run.threads=1",
        ]

    monkeypatch.setattr(kh, "train_argv", argv)
    ref, out = tmp_path / "ref" / "s", tmp_path / "cut" / "s"
    assert kh.attempt(ref).returncode == 0
    killed = kh.attempt(out, fault)
    assert killed.returncode == kh.KILLED, killed.output[-2000:]
    again = kh.attempt(out)
    assert again.returncode == 0 and "resumed from checkpoint" in again.output, again.output[-2000:]
    # everything but the gym simulator's own snapshot (pickled env bytes, which pickling an unpickled
    # env does not reproduce byte for byte; the states it led to are compared through the buffer)
    problems = kh.compare(ref, out)
    assert [p for p in problems if ".extra.rollout.sim." not in p] == []
