"""mmrl.gym_view: the embedded reach simulator as a gymnasium Env / VectorEnv, checked by gymnasium's
own checker and wrappers, compared step by step with the raw simulator, and (when installed) by SB3."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium", reason='mmrl.gym_view needs gymnasium: pip install "mmrl[gym]"')
from gymnasium.utils.env_checker import check_env  # noqa: E402
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402

from mmrl.gym_view import SimulatorEnv, SimulatorVectorEnv  # noqa: E402
from mmrl.registry import SIMULATORS  # noqa: E402
from mmrl.simulator import Observation, Simulator, StepResult  # noqa: E402


def reach(num_envs: int = 1, seed: int = 0, **kwargs):
    return SIMULATORS.build("reach", num_envs=num_envs, seed=seed, device="cpu", **kwargs)


def random_actions(steps: int, shape: tuple, seed: int = 0) -> np.ndarray:
    """Random actions, a third of them beyond [-1, 1] (the simulator clips those)."""
    return np.random.default_rng(seed).uniform(-1.5, 1.5, (steps, *shape)).astype(np.float32)


def expert_or_random(sim, rng: np.random.Generator) -> np.ndarray:
    """Expert actions for even envs (they succeed: terminated), random for odd ones (truncated)."""
    a = sim.expert_action().numpy()
    a[1::2] = rng.uniform(-1, 1, a[1::2].shape)
    return a.astype(np.float32)


def obs_equal(view_obs: dict, image: torch.Tensor, state: torch.Tensor, instruction) -> bool:
    return (
        np.array_equal(view_obs["image"], image.numpy())
        and np.array_equal(view_obs["state"], state.numpy())
        and list(np.atleast_1d(view_obs["instruction"])) == list(np.atleast_1d(instruction))
    )


# ----------------------------------------------------------------------------- gymnasium's checker
# check_env warns about these, truthfully: a simulator declares no state bounds, and a view built from
# an object (not gymnasium.make) has no spec to rebuild itself in other render modes
EXPECTED_WARNINGS = ("minimum value is -infinity", "maximum value is infinity", "not having a spec")


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"chunk_size": 4, "render_mode": "rgb_array"},
        {"keys": {"image": "pixels", "state": "agent_pos"}},
        {"keys": ("image", "instruction"), "sim": {"state_mode": "full", "max_episode_steps": 3}},
    ],
)
def test_check_env_passes_on_the_single_env_view(kwargs):
    kwargs = dict(kwargs)
    env = SimulatorEnv(reach(**kwargs.pop("sim", {})), **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    unexpected = [str(w.message) for w in caught if not any(e in str(w.message) for e in EXPECTED_WARNINGS)]
    assert not unexpected, unexpected
    assert isinstance(env.observation_space, gym.spaces.Dict)
    assert env.action_space.shape == ((kwargs["chunk_size"], 2) if "chunk_size" in kwargs else (2,))


def test_spaces_follow_the_simulator():
    sim = reach(image_size=24, state_mode="full", num_objects=2)
    env = SimulatorEnv(sim)
    space = env.observation_space
    assert set(space.spaces) == {"image", "state", "instruction"}
    assert space["image"].shape == (24, 24, 3) and space["image"].dtype == np.uint8
    assert space["state"].shape == (2 + 3 * 2,) and space["state"].dtype == np.float32
    assert isinstance(space["instruction"], gym.spaces.Text)
    assert env.action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)  # the contract's range
    assert SimulatorEnv(reach(), keys=("state",)).observation_space.spaces.keys() == {"state"}


# ----------------------------------------------------------------------------- the single view
def scripted_action(sim, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Env 0's action towards its named disc ("success"), another disc ("failure": with
    wrong_terminates the episode ends unsuccessfully) or at random ("random": truncated)."""
    if kind == "random":
        return rng.uniform(-1.5, 1.5, 2).astype(np.float32)  # beyond [-1, 1] too: the simulator clips
    target = int(sim.target[0]) if kind == "success" else (int(sim.target[0]) + 1) % sim.num_objects
    a = (sim.objects[0, target] - sim.gripper[0]) / sim.max_speed
    return (a / a.abs().max().clamp(min=1.0)).numpy().astype(np.float32)


def test_single_view_episodes_equal_the_raw_simulator():
    """Episodes that succeed, fail and time out, through the view and through the simulator itself:
    the same rewards, flags, success, last observations and, on reset() without a seed, the
    simulator's own next episodes."""
    kwargs = {"max_episode_steps": 12, "wrong_terminates": True}
    env, raw = SimulatorEnv(reach(**kwargs)), reach(**kwargs)
    obs, _ = env.reset(seed=7)
    raw_obs = raw.reset([7])
    assert obs_equal(obs, raw_obs.image[0], raw_obs.state[0], raw_obs.instruction[0])
    ends, rng = [], np.random.default_rng(1)
    for kind in ["success", "failure", "random"] * 2:
        while True:
            a = scripted_action(raw, kind, rng)
            obs, reward, term, trunc, info = env.step(a)
            res = raw.step(torch.from_numpy(a)[None])
            assert reward == res.reward.item() and term == res.terminated.item() and trunc == res.truncated.item()
            assert info == {"success": res.success.item(), "num_steps": 1}
            if term or trunc:
                break
            assert obs_equal(obs, res.obs.image[0], res.obs.state[0], res.obs.instruction[0])
        ends.append("success" if info["success"] else "failure" if term else "truncated")
        final = res.final_obs
        assert obs_equal(obs, final.image[0], final.state[0], final.instruction[0])
        obs, _ = env.reset()  # the episode the simulator already started
        assert obs_equal(obs, res.obs.image[0], res.obs.state[0], res.obs.instruction[0])
    assert ends == ["success", "failure", "truncated"] * 2


def test_single_view_reaches_success_with_the_expert():
    sim = reach()
    env = SimulatorEnv(sim)
    env.reset(seed=3)
    for _ in range(sim.max_episode_steps):
        obs, reward, term, trunc, info = env.step(sim.expert_action()[0].numpy())
        if term or trunc:
            break
    assert term and not trunc and info["success"] is True and reward == 1.0


def test_chunked_single_view_equals_step_chunk():
    env, raw = SimulatorEnv(reach(), chunk_size=5), reach()
    env.reset(seed=11)
    raw.reset([11])
    for a in random_actions(12, (5, 2), seed=2):
        obs, reward, term, trunc, info = env.step(a)
        res = raw.step_chunk(torch.from_numpy(a)[None])
        assert (reward, term, trunc) == (res.reward.item(), res.terminated.item(), res.truncated.item())
        assert info["num_steps"] == res.info["num_steps"].item()
        if term or trunc:
            env.reset()


def test_single_view_order_and_argument_errors():
    with pytest.raises(ValueError, match="num_envs=1"):
        SimulatorEnv(reach(num_envs=3))
    env = SimulatorEnv(reach(max_episode_steps=1))
    with pytest.raises(gym.error.ResetNeeded):
        env.step(np.zeros(2, np.float32))
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        env.step(np.zeros(3, np.float32))
    _, _, _, truncated, _ = env.step(np.zeros(2, np.float32))
    assert truncated
    with pytest.raises(gym.error.ResetNeeded):  # the simulator already runs the next episode
        env.step(np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="keys"):
        SimulatorEnv(reach(), keys=("image", "depth"))
    with pytest.raises(ValueError, match="render_mode"):
        SimulatorEnv(reach(), render_mode="human")


def test_instruction_outside_the_text_space_is_named():
    env = SimulatorEnv(reach(), instruction_charset="abcdefghijklmnopqrstuvwxyz")  # no space character
    with pytest.raises(ValueError, match=r"instruction 'reach the \w+ target' is outside .*\(characters ' '\)"):
        env.reset(seed=0)


class BufferSim(Simulator):
    """A one-env counter that renders into the same tensors every step, as simulators with
    preallocated buffers do: the view must hand out copies (check_env's `returned data not reused`)."""

    num_envs, action_dim, max_episode_steps, image_shape, state_dim = 1, 1, 3, (4, 4, 3), 1

    def __init__(self):
        self.t = 0
        self.image = torch.zeros(1, 4, 4, 3, dtype=torch.uint8)
        self.state = torch.zeros(1, 1)

    def _observe(self):
        self.image.fill_(self.t)
        self.state.fill_(self.t)
        return Observation(self.image, ["count"], self.state)

    def reset(self, seed=None):
        self.t = 0
        return self._observe()

    def _step_masked(self, actions, active):
        self.t += int(active[0])
        final = self._observe() if self.t >= self.max_episode_steps else None
        done = torch.tensor([final is not None])
        if final is not None:
            final = Observation(final.image.clone(), list(final.instruction), final.state.clone())
            self.t = 0
        return StepResult(
            self._observe(),
            torch.ones(1),
            torch.zeros(1, dtype=torch.bool),
            done,
            torch.zeros(1, dtype=torch.bool),
            final,
        )


def test_observations_are_copies_of_reused_simulator_buffers():
    env = SimulatorEnv(BufferSim())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env)
    envs = SimulatorVectorEnv(BufferSim())
    first, _ = envs.reset(seed=0)
    second, *_ = envs.step(np.zeros((1, 1), np.float32))
    assert first["image"].max() == 0 and first["state"][0, 0] == 0  # not overwritten by the step
    assert second["image"].max() == 1 and second["state"][0, 0] == 1


def test_a_text_simulator_has_no_view():
    class Answers(Simulator):  # single-turn VLM tasks: actions are text, not a float Box
        num_envs, action_dim, max_episode_steps, image_shape, action_type = 1, 1, 1, (8, 8, 3), "text"

    with pytest.raises(ValueError, match="action_type 'chunk'"):
        SimulatorEnv(Answers())


def test_render_shows_the_last_returned_observation():
    env = SimulatorEnv(reach(max_episode_steps=2), render_mode="rgb_array")
    obs, _ = env.reset(seed=5)
    assert np.array_equal(env.render(), obs["image"])
    env.step(np.zeros(2, np.float32))
    obs, *_ = env.step(np.zeros(2, np.float32))  # truncated: the last observation
    assert np.array_equal(env.render(), obs["image"])
    obs, _ = env.reset()
    assert np.array_equal(env.render(), obs["image"])


# ----------------------------------------------------------------------------- the vector view
def test_vector_view_same_step_autoreset_equals_the_raw_simulator():
    n = 6
    sim = reach(n, max_episode_steps=5)
    envs, raw = SimulatorVectorEnv(sim), reach(n, max_episode_steps=5)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, info = envs.reset(seed=100)
    raw_obs = raw.reset(100)
    assert obs in envs.observation_space and info == {}
    assert obs_equal(obs, raw_obs.image, raw_obs.state, raw_obs.instruction)
    rng, seen_done = np.random.default_rng(0), 0
    for _ in range(15):
        a = expert_or_random(raw, rng)
        obs, reward, term, trunc, infos = envs.step(a)
        res = raw.step(torch.from_numpy(a))
        assert obs in envs.observation_space
        assert np.array_equal(reward, res.reward.numpy()) and reward.dtype == np.float64
        assert np.array_equal(term, res.terminated.numpy()) and np.array_equal(trunc, res.truncated.numpy())
        assert obs_equal(obs, res.obs.image, res.obs.state, res.obs.instruction)  # already reset
        done = term | trunc
        if done.any():
            seen_done += 1
            assert np.array_equal(infos["_final_obs"], done) and np.array_equal(infos["_final_info"], done)
            for i in range(n):
                if done[i]:
                    f = res.final_obs
                    assert obs_equal(infos["final_obs"][i], f.image[i], f.state[i], f.instruction[i])
                    assert infos["final_obs"][i] in envs.single_observation_space
                    assert infos["final_info"]["success"][i] == res.success[i].item()
                else:
                    assert infos["final_obs"][i] is None
        else:
            assert "final_obs" not in infos
        if not done.all():
            assert np.array_equal(infos["_success"], ~done)
            assert np.array_equal(infos["success"], res.success.numpy() & ~done)
    assert seen_done >= 3


def test_vector_view_infos_equal_gymnasium_sync_vector_env_of_single_views():
    """gymnasium's own SAME_STEP implementation over single views is the oracle: up to the first
    episode end (after which the auto-reset initial states are drawn differently), the batched view
    returns the same observations, rewards, flags and infos, final_obs / final_info included."""
    n = 4
    ours = SimulatorVectorEnv(reach(n, max_episode_steps=9))
    oracle = SyncVectorEnv(
        [lambda: SimulatorEnv(reach(1, max_episode_steps=9))] * n, autoreset_mode=AutoresetMode.SAME_STEP
    )
    obs_a, info_a = ours.reset(seed=40)
    obs_b, info_b = oracle.reset(seed=40)
    assert gym.utils.env_checker.data_equivalence(obs_a, obs_b, exact=True) and info_a == info_b == {}
    rng = np.random.default_rng(3)
    for _ in range(ours.sim.max_episode_steps):
        a = expert_or_random(ours.sim, rng)
        out_a, out_b = ours.step(a), oracle.step(a)
        done = out_a[2] | out_a[3]
        if done.any():
            keep = ~done  # rows that did not reset: identical in both
            assert all(np.array_equal(out_a[0][k][keep], out_b[0][k][keep]) for k in ("image", "state"))
            assert gym.utils.env_checker.data_equivalence(out_a[1:], out_b[1:], exact=True)
            assert set(out_a[4]) >= {"final_obs", "final_info"}
            break
        assert gym.utils.env_checker.data_equivalence(out_a, out_b, exact=True)
    else:
        pytest.fail("no episode ended")


def test_vector_view_is_deterministic_under_a_seed():
    def run(seed):
        envs = SimulatorVectorEnv(reach(5, max_episode_steps=4, seed=99), chunk_size=2)
        out = [envs.reset(seed=seed)]
        out += [envs.step(a) for a in random_actions(10, (5, 2, 2), seed=4)]  # through auto resets
        return out

    a, b, c = run(1), run(1), run(2)
    assert gym.utils.env_checker.data_equivalence(a, b, exact=True)
    assert not np.array_equal(a[0][0]["state"], c[0][0]["state"])


def test_vector_view_reset_seeds_and_errors():
    envs = SimulatorVectorEnv(reach(3))
    with pytest.raises(gym.error.ResetNeeded):
        envs.step(np.zeros((3, 2), np.float32))
    obs_int, _ = envs.reset(seed=10)
    obs_list, _ = envs.reset(seed=[10, 11, 12])
    assert np.array_equal(obs_int["state"], obs_list["state"])
    with pytest.raises(ValueError, match="3 int seeds"):
        envs.reset(seed=[1, None, 3])
    with pytest.raises(ValueError, match="not supported"):
        envs.reset(options={"reset_mask": np.ones(3, bool)})
    with pytest.raises(ValueError, match=r"shape \(3, 2\)"):
        envs.step(np.zeros((2, 2), np.float32))


def test_record_episode_statistics_counts_the_simulator_episodes():
    """A gymnasium wrapper that reads metadata["autoreset_mode"] gets episode returns and lengths
    right, which it would not if the view declared the wrong mode."""
    n = 4
    envs = gym.wrappers.vector.RecordEpisodeStatistics(SimulatorVectorEnv(reach(n, max_episode_steps=7)))
    raw = reach(n, max_episode_steps=7)
    envs.reset(seed=0)
    raw.reset(0)
    ret, length, episodes, rng = np.zeros(n), np.zeros(n, int), [], np.random.default_rng(1)
    for _ in range(30):
        a = expert_or_random(raw, rng)
        _, _, _, _, infos = envs.step(a)
        res = raw.step(torch.from_numpy(a))
        ret += res.reward.numpy()
        length += 1
        for i in np.flatnonzero(res.done.numpy()):
            episodes.append((ret[i], length[i]))
            assert infos["episode"]["r"][i] == ret[i] and infos["episode"]["l"][i] == length[i]
            ret[i], length[i] = 0, 0
    assert len(envs.return_queue) == len(episodes) >= 8


def test_vector_render_gives_one_frame_per_env_with_final_frames():
    envs = SimulatorVectorEnv(reach(2, max_episode_steps=1), render_mode="rgb_array")
    envs.reset(seed=0)
    _, _, _, trunc, infos = envs.step(np.zeros((2, 2), np.float32))
    assert trunc.all()
    frames = envs.render()
    assert len(frames) == 2 and all(np.array_equal(f, infos["final_obs"][i]["image"]) for i, f in enumerate(frames))


# ----------------------------------------------------------------------------- Stable-Baselines3
@pytest.mark.skipif(
    importlib.util.find_spec("stable_baselines3") is None,
    reason='Stable-Baselines3 is not installed (pip install "mmrl[bench]")',
)
def test_stable_baselines3_checks_and_trains_on_the_view():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    # SB3 has no Text space: the view without the instruction; SB3's CNN needs images of 36x36 or more
    env = SimulatorEnv(reach(image_size=36), keys=("image", "state"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_check_env(env)
    assert not [str(w.message) for w in caught if "stable_baselines3" in w.filename], caught
    model = PPO("MultiInputPolicy", env, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(64)
    action, _ = model.predict(env.reset(seed=0)[0], deterministic=True)
    assert action.shape == (2,)


def test_gymnasium_make_builds_the_view_of_a_registered_simulator():
    """``gymnasium.make("mmrl/reach-v0", ...)``: view arguments go to the view, the rest to the
    simulator; the episode is the raw simulator's, through gymnasium's own wrappers."""
    env = gym.make("mmrl/reach-v0", seed=5, keys=("image", "state"), max_episode_steps=12)
    assert env.spec.id == "mmrl/reach-v0" and isinstance(env.unwrapped, SimulatorEnv)
    raw = reach(seed=5, max_episode_steps=12)
    obs, _ = env.reset(seed=3)
    raw_obs = raw.reset([3])
    assert set(obs) == {"image", "state"} and np.array_equal(obs["image"], raw_obs.image[0].numpy())
    for a in random_actions(12, (2,)):
        obs, reward, term, trunc, info = env.step(a)
        res = raw.step(torch.from_numpy(a)[None])
        assert reward == res.reward.item() and (term, trunc) == (res.terminated.item(), res.truncated.item())
        if term or trunc:
            break
        assert np.array_equal(obs["state"], res.obs.state[0].numpy())
    assert term or trunc  # the simulator's own time limit ends it
    vec = gym.make_vec(
        "mmrl/reach-v0", num_envs=4, vectorization_mode="vector_entry_point", seed=5, keys=("image", "state")
    )
    assert isinstance(vec, SimulatorVectorEnv) and vec.num_envs == 4
    vobs, _ = vec.reset(seed=3)
    assert np.array_equal(vobs["image"][0], raw_obs.image[0].numpy())  # env i gets seed 3 + i
    with pytest.raises(ValueError, match="'text' actions"):
        gym.make("mmrl/qa-v0")
    assert "mmrl/gym-v0" not in gym.registry  # a gymnasium env already


def test_a_fresh_process_makes_the_view_by_module_qualified_id():
    import subprocess
    import sys

    code = (
        "import gymnasium as gym; env = gym.make('mmrl.gym_view:mmrl/reach-v0', keys=('image',)); "
        "print(env.reset(seed=0)[0]['image'].shape)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "(32, 32, 3)", out.stderr[-2000:]


@pytest.mark.skipif(
    importlib.util.find_spec("stable_baselines3") is None,
    reason="stable-baselines3 is not installed (pip install 'mmrl[bench]'; CI installs it)",
)
def test_stable_baselines3_trains_on_the_registered_id():
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    envs = make_vec_env("mmrl/reach-v0", n_envs=2, seed=0, env_kwargs={"keys": ("image", "state"), "image_size": 36})
    model = PPO("MultiInputPolicy", envs, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(32)
    assert model.num_timesteps >= 32
