"""check_simulator catches broken simulators with a message naming the problem."""

from __future__ import annotations

import pytest
import torch

from simulators import check_simulator
from simulators.reach import ReachSim


class FloatImage(ReachSim):
    def _observe(self):
        obs = super()._observe()
        obs.image = obs.image.float()
        return obs


class RewardShape(ReachSim):
    def step(self, actions):
        res = super().step(actions)
        res.reward = res.reward[:, None]
        return res


class FloatFlags(ReachSim):  # flags of the wrong dtype
    def step(self, actions):
        res = super().step(actions)
        res.success = res.success.float()
        return res


class NaiveChunk(ReachSim):
    """Runs every action of the chunk, even after the episode ended."""

    def step_chunk(self, actions):
        every_env = torch.ones(self.num_envs, dtype=torch.bool)
        results = [self._run(actions[:, i : i + 1], every_env) for i in range(actions.shape[1])]
        res = results[-1]
        res.reward = sum(r.reward for r in results)
        return res


class SharedState(ReachSim):
    """get_state hands out a live tensor that stepping mutates."""

    def get_state(self):
        state = super().get_state()
        state["elapsed"] = self.elapsed
        return state


class NoAutoReset(ReachSim):
    def _run(self, actions, active):
        self._frozen = True
        try:
            return super()._run(actions, active)
        finally:
            self._frozen = False

    def _reset_rows(self, rows, seeds):
        if not getattr(self, "_frozen", False):
            super()._reset_rows(rows, seeds)


class NondeterministicReset(ReachSim):
    def reset(self, seed=None):
        return super().reset(None)


class NoClip(ReachSim):
    def _run(self, actions, active):
        return super()._run(actions / 3, active)


class Rejecting(ReachSim):
    def _run(self, actions, active):
        if actions.abs().max() > 1:
            raise ValueError("actions out of range")
        return super()._run(actions, active)


class Wrapped:
    """Duck-typed adapter (no Simulator base, no get_state) that may misreport its time limit."""

    def __init__(self, reported_max: int | None = None, **kwargs):
        self.inner = ReachSim(**kwargs)
        for name in ("num_envs", "action_dim", "image_shape", "state_dim", "device"):
            setattr(self, name, getattr(self.inner, name))
        self.max_episode_steps = reported_max or self.inner.max_episode_steps

    def reset(self, seed=None):
        return self.inner.reset(seed)

    def step(self, actions):
        return self.inner.step(actions)

    def step_chunk(self, actions):
        return self.inner.step_chunk(actions)

    def close(self):
        pass


@pytest.mark.parametrize(
    "factory, check, words",
    [
        (lambda: FloatImage(num_envs=4), "reset", ["image must be uint8", "float32"]),
        (lambda: RewardShape(num_envs=4), "step", ["reward shape", "(4, 1)"]),
        (lambda: FloatFlags(num_envs=4), "step", ["success must be bool"]),
        (lambda: NaiveChunk(num_envs=4, max_episode_steps=8), "truncation", ["without ending"]),
        (lambda: SharedState(num_envs=4), "state_roundtrip", ["return copies"]),
        (lambda: NoAutoReset(num_envs=4, max_episode_steps=6), "truncation", ["not reset"]),
        (lambda: NondeterministicReset(num_envs=4), "reset_deterministic", ["different observations"]),
        (lambda: NoClip(num_envs=4), "action_bounds", ["neither rejected nor clipped"]),
        (lambda: Wrapped(reported_max=9, num_envs=4, max_episode_steps=10), "episode", ["without ending"]),
        (lambda: Wrapped(reported_max=11, num_envs=4, max_episode_steps=10), "episode", ["truncation must happen"]),
        (lambda: _attr_broken(), "attributes", ["action_dim"]),
    ],
    ids=[
        "float-image",
        "reward-shape",
        "flag-dtype",
        "chunk-overrun",
        "state-views",
        "no-auto-reset",
        "nondeterministic-reset",
        "no-clip",
        "truncation-late",
        "truncation-early",
        "attributes",
    ],
)
def test_broken_simulators_are_caught(factory, check, words):
    with pytest.raises(AssertionError) as err:
        check_simulator(factory, verbose=False)
    msg = str(err.value)
    assert msg.startswith(f"check_simulator[{check}]"), msg
    for w in words:
        assert w in msg, msg


def _attr_broken():
    sim = ReachSim(num_envs=2)
    sim.action_dim = 0
    return sim


def test_rejecting_and_duck_typed_sims_pass():
    passed = check_simulator(lambda: Rejecting(num_envs=4), verbose=False)
    assert passed.action_bounds == "rejected" and "action_bounds" in passed
    passed = check_simulator(Wrapped(num_envs=4, max_episode_steps=8), verbose=False)
    assert "state_roundtrip" not in passed and "chunk_mid_episode_end" in passed
    assert any("get_state" in n for n in passed.notes)
    # a capped number of steps skips the truncation check with a note
    passed = check_simulator(ReachSim(num_envs=4), num_steps=5, verbose=False)
    assert "truncation" not in passed and any("num_steps" in n for n in passed.notes)
