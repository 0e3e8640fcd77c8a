"""The initial action std chosen from a fresh run's first rollouts (``action_log_std_init: auto``,
`mmrl.trainer.exploration`): the rule on hand-made measurements, the measurement of a batch, and the
trainer on a tiny gymnasium task whose noise cost can be set (`NoiseCostEnv`): it keeps std 1 where
ending an episode does not pay (the same run as a fixed std 1), moves down where it does (Ant's case)
and trains on the rollout of the std it keeps, keeps std 1 where the costs are the task's own, counts
every probe rollout, never probes again on resume, and refuses background rollouts."""

import json
import math

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("gymnasium", reason='the "gym" simulator needs gymnasium: pip install "mmrl[gym]"')

import gymnasium as gym

from mmrl.batch import Batch
from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.policies.base import log_std_grid
from mmrl.trainer.exploration import NoiseMeasurement, choose_initial_std, ending_pays, measure, noise_was_the_cause
from mmrl.trainer.objectives import valid_samples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class NoiseCostEnv(gym.Env):
    """Pays ``bonus`` per step minus ``cost`` x the mean squared action; an action at a bound ends
    the episode (as Ant's noisy actions throw it over). At cost 4 the reward per step of N(0, s^2)
    actions is about -1.1 / -0.4 / +0.5 at s = 1 / 0.61 / 0.37, and episodes end often at s = 1. With
    ``fall`` an episode ends with that probability at every step instead, whatever the action."""

    def __init__(self, cost: float = 4.0, bonus: float = 1.0, fall: float | None = None):
        self.cost, self.bonus, self.fall = float(cost), float(bonus), fall
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.normal(size=2).astype(np.float32), {}

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        reward = self.bonus - self.cost * float(np.mean(a**2))
        if self.fall is None:
            terminated = bool(np.abs(a).max() >= 0.99)
        else:  # a body that falls whatever the noise (Walker2d's untrained policy)
            terminated = bool(self.np_random.random() < self.fall)
        return self.np_random.normal(size=2).astype(np.float32), reward, terminated, False, {}


if "MmrlTest/NoiseCost-v0" not in gym.registry:
    gym.register(id="MmrlTest/NoiseCost-v0", entry_point=NoiseCostEnv, max_episode_steps=50)

ROLLOUT = 4 * 16  # env steps of one rollout: 4 envs x 16 steps


def config(tmp_path, *extra, cost=4.0, bonus=1.0, fall=None, name="r"):
    """configs/gym_inverted_pendulum.yaml (the state template, action_log_std_init auto by default)
    made tiny, on `NoiseCostEnv`, one iteration."""
    data = yaml.safe_load(open("configs/gym_inverted_pendulum.yaml"))
    data["policy"].update(dim=16, expert_dim=16, num_steps=2)
    data["sim"]["kwargs"] = {
        "env_id": "MmrlTest/NoiseCost-v0",
        "render_images": False,
        "env_kwargs": {"cost": cost, "bonus": bonus, "fall": fall},
    }
    return load_experiment(
        data,
        [
            f"run.output_dir={tmp_path}",
            f"run.name={name}",
            "sim.num_envs=4",
            "sim.eval_num_envs=2",
            "algorithm.epochs=1",
            "algorithm.minibatch_size=32",
            "trainer.rollout_steps=16",
            f"trainer.env_steps={ROLLOUT}",
            "trainer.eval_episodes=2",
            "trainer.checkpoint_every=1",
            *extra,
        ],
    )


def run(cfg):
    """Build and run ``cfg``; also returns each update's batch with the policy's log-probs of it
    just before that update (the ratio's numerator at the first minibatch)."""
    trainer = build_trainer(cfg)
    seen = []
    original = trainer.learner.update

    def update(batch, gen):
        rows = valid_samples(batch)
        with torch.no_grad():
            seen.append((rows, trainer.policy.evaluate(rows.to(trainer.device)).logp))
        return original(batch, gen)

    trainer.learner.update = update
    trainer.run()
    return trainer, seen


def m(std, reward, terminated=3):
    return NoiseMeasurement(std=std, reward_per_step=reward, terminated=terminated, env_steps=64)


# ---------------------------------------------------------------------------- the rule
def test_the_rule_moves_down_only_while_the_noise_makes_ending_pay():
    stds = log_std_grid(0.0)
    assert stds == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-1.5), math.exp(-2.0)])
    asked = []

    def roll_out(rewards, terminated=(30, 20, 4, 1, 0)):
        def at(k):
            asked.append(k)
            return m(stds[k], rewards[k], terminated[k]), f"rollout {k}"

        return at

    first = (m(1.0, -1.0, 30), "first")
    # Ant's case: a step costs at 1 and 0.61 and earns from 0.37, where the terminations fell from
    # 30 to 4: the first std at which a step earns is kept, and nothing past it rolls out
    rewards = [-1.0, -0.2, 0.5, 0.8, 0.9]
    assert choose_initial_std(stds, first, roll_out(rewards))[::2] == (2, "rollout 2")
    assert asked == [1, 2]
    # a reward of exactly 0 is not a cost; terminations at exactly half the rate are the noise's
    asked.clear()
    assert choose_initial_std(stds, first, roll_out([-1.0, 0.0, 1, 1, 1], (30, 15, 4, 1, 0)))[0] == 1
    # Walker2d's case: a step earns at 0.37 but the episodes end about as often (the body falls
    # whatever the noise): std 1 and its rollout stay, and the scan stops there
    asked.clear()
    chosen, measured, kept = choose_initial_std(stds, first, roll_out(rewards, (30, 29, 28, 27, 26)))
    assert (chosen, len(measured), kept) == (0, 3, "first") and asked == [1, 2]
    asked.clear()
    assert choose_initial_std(stds, first, roll_out(rewards, (30, 29, 16, 1, 0)))[0] == 0  # not quite half
    # no termination (HalfCheetah, Swimmer, Pendulum) or a reward that pays (Hopper): std 1, no rollout
    asked.clear()
    for only in (m(1.0, -0.4, terminated=0), m(1.0, 0.8)):
        chosen, measured, kept = choose_initial_std(stds, (only, "first"), roll_out(rewards))
        assert (chosen, measured, kept) == (0, [only], "first")
    assert asked == []
    # the costs are the task's own (a step penalty until a goal ends the episode): every std is tried,
    # none earns, std 1 and its rollout stay
    chosen, measured, kept = choose_initial_std(stds, first, roll_out([-1.0] * 5))
    assert (chosen, len(measured), kept) == (0, 5, "first") and asked == [1, 2, 3, 4]
    assert ending_pays(m(1.0, -0.01)) and not ending_pays(m(1.0, -5.0, terminated=0))
    assert noise_was_the_cause(m(0.5, 0.0, 1), m(1.0, -1.0, 2)) and not noise_was_the_cause(m(0.5, -0.1, 0), first[0])


def test_measure_counts_valid_decisions_only():
    valid = torch.tensor([[True, True], [True, False]])
    batch = Batch(
        rewards=torch.tensor([[1.0, -2.0], [-4.0, 100.0]]),
        env_steps=torch.tensor([[1, 2], [1, 5]]),  # a chunk of 2 steps in env 1's first decision
        terminated=torch.tensor([[False, True], [True, True]]),
        valid=valid,
    )
    got = measure(batch, 0.5)
    assert got == NoiseMeasurement(std=0.5, reward_per_step=(1.0 - 2.0 - 4.0) / 4, terminated=2, env_steps=4)


# ---------------------------------------------------------------------------- the trainer
def test_where_noise_makes_falling_pay_rl_starts_quieter_on_the_kept_rollout(tmp_path):
    trainer, seen = run(config(tmp_path, "trainer.lr=1e-12"))  # lr ~0: the std stays as chosen
    state = trainer.state.exploration
    stds = log_std_grid(0.0)
    rewards = [x["reward_per_step"] for x in state["measurements"]]
    assert state["chosen_std"] == pytest.approx(stds[2]), state  # 0.37: -1.1 / -0.4 / +0.5 per step
    assert rewards[0] < 0 and rewards[1] < 0 and rewards[2] >= 0 and state["measurements"][0]["terminated"] > 0
    assert trainer.policy.action_std().tolist() == pytest.approx([stds[2]] * 4)
    # every rollout counts; RL trained once, on the rollout of the kept std: the policy's log-probs
    # of that batch equal the stored ones (ratio 1), which a rollout at std 1 would not give
    assert trainer.state.env_steps == 3 * ROLLOUT and trainer.state.iteration == 1 and len(seen) == 1
    batch, logp = seen[0]
    torch.testing.assert_close(logp, batch["old_logp"].to(logp.device), rtol=0, atol=1e-5)
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/action_std_init"] for r in rows if "train/action_std_init" in r] == pytest.approx([stds[2]])


def test_where_ending_does_not_pay_the_run_is_the_fixed_std_run(tmp_path):
    auto, _ = run(config(tmp_path, cost=0.0, name="auto"))  # +1 a step, whatever the noise
    fixed, _ = run(config(tmp_path, "policy.action_log_std_init=0", cost=0.0, name="fixed"))
    assert auto.state.exploration["chosen_std"] == 1.0 and len(auto.state.exploration["measurements"]) == 1
    assert fixed.state.exploration == {} and auto.state.env_steps == fixed.state.env_steps == ROLLOUT
    a, b = auto.policy.state_dict(), fixed.policy.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_where_the_costs_are_the_tasks_own_std_1_and_its_rollout_stay(tmp_path):
    trainer, seen = run(config(tmp_path, "trainer.lr=1e-12", cost=1.0, bonus=-1.0))  # negative at any noise
    state = trainer.state.exploration
    assert state["chosen_std"] == 1.0 and len(state["measurements"]) == 5
    assert trainer.policy.action_std().tolist() == pytest.approx([1.0] * 4)
    assert trainer.state.env_steps == 5 * ROLLOUT
    batch, logp = seen[0]
    torch.testing.assert_close(logp, batch["old_logp"].to(logp.device), rtol=0, atol=1e-5)


def test_where_the_body_falls_whatever_the_noise_std_1_and_its_rollout_stay(tmp_path):
    trainer, seen = run(config(tmp_path, "trainer.lr=1e-12", fall=0.3))
    state = trainer.state.exploration
    measured = state["measurements"]
    assert state["chosen_std"] == 1.0 and len(measured) == 3, measured  # a step earns at 0.37: the scan stops
    assert measured[0]["reward_per_step"] < 0 <= measured[2]["reward_per_step"]
    assert measured[2]["terminated"] > 0.5 * measured[0]["terminated"]
    assert trainer.state.env_steps == 3 * ROLLOUT
    batch, logp = seen[0]
    torch.testing.assert_close(logp, batch["old_logp"].to(logp.device), rtol=0, atol=1e-5)


def test_where_std_1_stays_after_probing_the_run_goes_on_as_the_fixed_std_run(tmp_path):
    """The probe's rollouts moved the envs on; keeping std 1, the episodes go back to where its kept
    rollout left them, so three iterations after a 3-rollout probe (5 rollouts of budget) end with the
    weights of the fixed-std run's three iterations, bit for bit (Walker2d: 767 with std 1 on the
    reported seeds, 523 while the envs went on from the probe's last rollout)."""
    auto, _ = run(config(tmp_path, f"trainer.env_steps={5 * ROLLOUT}", fall=0.3, name="auto"))
    fixed, _ = run(config(tmp_path, f"trainer.env_steps={3 * ROLLOUT}", "policy.action_log_std_init=0", fall=0.3))
    assert len(auto.state.exploration["measurements"]) == 3 and auto.state.exploration["chosen_std"] == 1.0
    assert auto.state.iteration == fixed.state.iteration == 3 and auto.state.env_steps == 5 * ROLLOUT
    a, b = auto.policy.state_dict(), fixed.policy.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    assert auto.state.results["final"]["return"] == fixed.state.results["final"]["return"]


def test_a_resumed_run_does_not_probe_again_and_matches_the_uninterrupted_one(tmp_path, monkeypatch):
    from mmrl.trainer.trainer import Trainer

    budget = f"trainer.env_steps={3 * ROLLOUT + 2 * ROLLOUT}"  # the probe's 3 rollouts, then 2 iterations
    full, _ = run(config(tmp_path, budget, name="full"))
    assert full.state.iteration == 3
    original = Trainer.learn
    calls = []

    def killed(self, it, batch, info, gen):
        calls.append(it)
        if it == 1:
            raise KeyboardInterrupt("killed in iteration 2, after iteration 1's checkpoint")
        return original(self, it, batch, info, gen)

    monkeypatch.setattr(Trainer, "learn", killed)
    with pytest.raises(KeyboardInterrupt):
        build_trainer(config(tmp_path, budget, name="cut")).run()
    monkeypatch.setattr(Trainer, "learn", original)
    probes = []
    monkeypatch.setattr(Trainer, "choose_exploration", lambda self, *a: probes.append(a) or a[1:])
    resumed = build_trainer(config(tmp_path, budget, name="cut"))
    resumed.run()
    assert probes == [] and resumed.state.exploration == full.state.exploration
    assert resumed.state.env_steps == full.state.env_steps
    a, b = full.policy.state_dict(), resumed.policy.state_dict()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


def test_background_rollouts_are_refused_with_the_probe(tmp_path):
    with pytest.raises(ConfigError, match="action_log_std_init"):
        config(tmp_path, "trainer.rollout_steps=0", "trainer.async_staleness=1")
    config(tmp_path, "trainer.rollout_steps=0", "trainer.async_staleness=1", "policy.action_log_std_init=0")
    with pytest.raises(ConfigError, match="log_std_init"):
        gaussian = "policy={type: gaussian, log_std_init: auto}"
        config(tmp_path, "trainer.rollout_steps=0", "trainer.async_staleness=1", gaussian)
