"""GymSim: gymnasium envs through the simulator contract (action mapping, images, chunks, errors)."""

from __future__ import annotations

import importlib.util
import inspect
import os

import numpy as np
import pytest
import torch

gym = pytest.importorskip("gymnasium", reason='the "gym" simulator needs gymnasium: pip install "mmrl[gym]"')
from gymnasium import spaces  # noqa: E402
from gymnasium.utils import EzPickle  # noqa: E402

from simulators import check_simulator  # noqa: E402
from simulators.gym_env import GymSim, action_dim_of, to_env_action  # noqa: E402

needs_pygame = pytest.mark.skipif(
    importlib.util.find_spec("pygame") is None,
    reason='rendering classic-control envs needs pygame: pip install "gymnasium[classic-control]"',
)
needs_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None, reason='the MuJoCo envs need mujoco: pip install "mmrl[gym]"'
)


# ---------------------------------------------------------------------------- tiny test envs
class CounterEnv(gym.Env):
    """obs = steps taken in this episode; reward 1 per step; action 1 ends it with is_success."""

    def __init__(self):
        self.observation_space = spaces.Box(0.0, 100.0, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.t], np.float32), {}

    def step(self, action):
        self.t += 1
        done = int(action) == 1
        info = {"is_success": True} if done else {}
        return np.array([self.t], np.float32), 1.0, done, False, info


class InfBoxEnv(CounterEnv):
    def __init__(self):
        super().__init__()
        self.action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)


class DictActionEnv(CounterEnv):
    def __init__(self):
        super().__init__()
        self.action_space = spaces.Dict({"a": spaces.Discrete(2)})


class EzCounterEnv(CounterEnv, EzPickle):
    """Pickles as its constructor arguments (as Box2D / Atari envs do): a pickle copy is a fresh env."""

    def __init__(self):
        CounterEnv.__init__(self)
        EzPickle.__init__(self)


class NoGLEnv(CounterEnv):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode=None):
        super().__init__()
        self.render_mode = render_mode

    def render(self):
        raise RuntimeError("no OpenGL context")


for _name, _cls in (
    ("Counter", CounterEnv),
    ("InfBox", InfBoxEnv),
    ("DictAction", DictActionEnv),
    ("EzCounter", EzCounterEnv),
    ("NoGL", NoGLEnv),
):
    if f"MmrlTest/{_name}-v0" not in gym.registry:
        gym.register(id=f"MmrlTest/{_name}-v0", entry_point=_cls, max_episode_steps=10)


# ---------------------------------------------------------------------------- contract checker
@needs_pygame
@pytest.mark.parametrize("env_id", ["Pendulum-v1", "CartPole-v1"])
def test_check_simulator_classic_control(env_id):
    sim = GymSim(3, env_id=env_id, image_size=32, max_episode_steps=12)
    try:
        result = check_simulator(sim)
    finally:
        sim.close()
    assert "chunk_mid_episode_end" in result and "state_roundtrip" in result
    assert result.action_bounds == "clipped"
    assert not any("weak check" in n or "skipped" in n for n in result.notes), result.notes


def test_check_simulator_async_without_images():
    sim = GymSim(3, env_id="CartPole-v1", vectorization="async", render_images=False, max_episode_steps=12)
    try:
        result = check_simulator(sim)
        with pytest.raises(NotImplementedError, match="async"):
            sim.get_state()
    finally:
        sim.close()
    assert "auto_reset" in result
    assert sim.action_dim == 1 and sim.state_dim == 4


# ---------------------------------------------------------------------------- MuJoCo envs, snapshots
def _steps(sim, actions):
    """Everything the trainer sees of ``sim.step(a)`` for each ``a``, as a list of tensors."""
    out = []
    for a in actions:
        r = sim.step(a)
        final = r.final_obs.state if r.final_obs is not None else torch.zeros(0)
        out.append([r.obs.state, r.obs.image, r.reward, r.terminated, r.truncated, final])
    return out


@needs_mujoco
def test_mujoco_snapshot_reproduces_the_next_steps_through_auto_resets():
    # gymnasium's MuJoCo envs are EzPickle: a plain pickle copy is a fresh env (qpos of the model,
    # a new np_random, the time limit's step count at 0). max_episode_steps=3 puts truncations and
    # auto resets (noise drawn from np_random) inside the replayed window.
    sim = GymSim(2, env_id="InvertedPendulum-v5", render_images=False, max_episode_steps=3)
    try:
        g = torch.Generator().manual_seed(0)
        sim.reset(5)
        sim.step(torch.rand(2, 1, generator=g) * 2 - 1)  # mid-episode: one step taken, off the start pose
        snap = sim.get_state()
        actions = [torch.rand(2, 1, generator=g) * 2 - 1 for _ in range(6)]
        first = _steps(sim, actions)
        assert first[1][4].all() and first[4][4].all()  # truncated at steps 3 and 6 of the episode
        for _ in range(2):  # a snapshot restores any number of times
            sim.set_state(snap)
            again = _steps(sim, actions)
            for t, (a, b) in enumerate(zip(first, again)):
                assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {t} differs after set_state"
    finally:
        sim.close()


@needs_mujoco
def test_check_simulator_mujoco_state_only():
    sim = GymSim(3, env_id="Hopper-v5", render_images=False, max_episode_steps=10)
    try:
        result = check_simulator(sim, verbose=False)
    finally:
        sim.close()
    assert "state_roundtrip" in result and "auto_reset" in result and "truncation" in result
    assert not any("skipped" in n for n in result.notes), result.notes


@needs_mujoco
def test_check_simulator_mujoco_with_images(monkeypatch):
    for var in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.setenv(var, "")  # as on a headless machine; restored afterwards
    try:
        sim = GymSim(
            3, env_id="InvertedPendulum-v5", image_size=16, max_episode_steps=6, env_kwargs={"width": 32, "height": 32}
        )
    except RuntimeError as exc:
        if "could not render a frame" not in str(exc) or os.environ["MUJOCO_GL"] != "egl":
            raise
        pytest.skip(f"no OpenGL for MuJoCo on this machine (EGL or OSMesa): {exc}")
    try:
        assert os.environ["MUJOCO_GL"] == "egl"  # picked on a machine without a display
        # same seed, same images (gymnasium aims each env's camera at its first rendered pose);
        # after set_state the renderer draws the restored physics, not the discarded one
        result = check_simulator(sim, verbose=False)
        obs = sim.reset([1, 1, 2])
        assert torch.equal(obs.image[0], obs.image[1]) and obs.image.float().std() > 0
    finally:
        sim.close()
    assert "state_roundtrip" in result and "reset_seed_list" in result
    assert not any("skipped" in n for n in result.notes), result.notes


@needs_mujoco
def test_mujoco_renders_at_the_policy_size_unless_env_kwargs_set_it(monkeypatch):
    for var in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.setenv(var, "")
    sims = []
    try:
        for kwargs in ({}, {"env_kwargs": {"width": 40, "height": 40}}):
            sims.append(GymSim(1, env_id="InvertedPendulum-v5", image_size=24, max_episode_steps=4, **kwargs))
    except RuntimeError as exc:
        pytest.skip(f"no OpenGL for MuJoCo on this machine (EGL or OSMesa): {exc}")
    try:
        drawn = [sim._vec.single_observation_space["frame"].shape for sim in sims]  # what render() draws
        assert drawn == [(24, 24, 3), (40, 40, 3)]
        for sim in sims:
            obs = sim.reset(0)
            assert obs.image.shape == (1, 24, 24, 3) and obs.image.float().std() > 0
    finally:
        for sim in sims:
            sim.close()


@needs_mujoco
def test_a_closed_mujoco_sim_leaves_the_others_drawing(monkeypatch):
    """Closing (then collecting) one rendering sim frees its GL objects in its own context: gymnasium
    left them to the garbage collector, which freed them in the context of the sim drawing then,
    whose framebuffers have the same ids, and every later frame of that sim was black."""
    import gc

    for var in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.setenv(var, "")

    def make():
        return GymSim(1, env_id="InvertedPendulum-v5", image_size=16, max_episode_steps=4)

    try:
        first, second = make(), make()
    except RuntimeError as exc:
        pytest.skip(f"no OpenGL for MuJoCo on this machine (EGL or OSMesa): {exc}")
    try:
        assert second.reset(0).image.float().std() > 0
        first.close()
        assert second.reset(0).image.float().std() > 0  # `second` is the current context now
        del first
        gc.collect()
        assert second.reset(0).image.float().std() > 0
        third = make()
        second.close()
        del second
        gc.collect()
        assert third.reset(0).image.float().std() > 0
        third.close()
    finally:
        gc.collect()


def test_ezpickle_env_snapshot_is_refused_not_wrong():
    sim = GymSim(2, env_id="MmrlTest/EzCounter-v0", render_images=False)
    try:
        with pytest.raises(NotImplementedError, match=r"MmrlTest/EzCounter-v0 contains EzCounterEnv.*EzPickle"):
            sim.get_state()
        result = check_simulator(sim, verbose=False)
    finally:
        sim.close()
    assert "state_roundtrip: skipped: get_state/set_state not implemented" in result.notes


def test_render_failure_is_one_clear_error():
    with pytest.raises(
        RuntimeError,
        match=r"MmrlTest/NoGL-v0 could not render a frame \(RuntimeError: no OpenGL "
        r"context\).*render_images=False",
    ):
        GymSim(2, env_id="MmrlTest/NoGL-v0")


def test_an_env_argument_at_the_top_level_is_told_to_go_under_env_kwargs():
    with pytest.raises(
        TypeError,
        match=r"^'sutton_barto_reward' is not an argument of simulator 'gym'; arguments "
        r"of the gymnasium env go under env_kwargs: "
        r"env_kwargs=\{'sutton_barto_reward': True\} .*Valid: device, env_id, "
        r"env_kwargs, image_size",
    ):
        GymSim(1, env_id="CartPole-v1", render_images=False, sutton_barto_reward=True)
    with pytest.raises(TypeError, match=r"'a', 'b' are not arguments .*env_kwargs=\{'x': 0, 'a': 1, 'b': 2\}"):
        GymSim(1, env_id="CartPole-v1", render_images=False, env_kwargs={"x": 0}, a=1, b=2)
    sim = GymSim(1, env_id="CartPole-v1", render_images=False, env_kwargs={"sutton_barto_reward": True})
    sim.close()


def test_the_declared_signature_keeps_unknown_arguments_out():
    """The catch-all that names env_kwargs is not a declared argument: `mmrl check` and the config
    still list the real ones and reject a stray key before building anything."""
    from mmrl.cli import main
    from mmrl.config import ConfigError
    from mmrl.experiment import SimConfig, constructor_arguments

    assert "unknown" not in inspect.signature(GymSim).parameters
    assert constructor_arguments(GymSim) == [
        "device",
        "env_id",
        "env_kwargs",
        "image_size",
        "instruction",
        "max_episode_steps",
        "num_envs",
        "render_images",
        "seed",
        "stagger_episodes",
        "success_key",
        "vectorization",
    ]
    with pytest.raises(ConfigError, match="'kwargs.bogus' is not an argument of simulator 'gym'"):
        SimConfig(type="gym", kwargs={"bogus": 1}).validate()
    assert main(["check", "simulator", "gym:CartPole-v1", "bogus=1"]) == 2


# ---------------------------------------------------------------------------- action mapping
def test_box_mapping_is_linear_and_clipped():
    box = spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
    assert action_dim_of(box) == 2
    np.testing.assert_allclose(to_env_action(box, np.array([-1.0, -1.0])), [-2.0, 0.0])
    np.testing.assert_allclose(to_env_action(box, np.array([1.0, 1.0])), [2.0, 10.0])
    np.testing.assert_allclose(to_env_action(box, np.array([0.0, 0.5])), [0.0, 7.5])
    np.testing.assert_allclose(to_env_action(box, np.array([-3.0, 9.0])), [-2.0, 10.0])  # clipped
    assert to_env_action(box, np.zeros(2)).dtype == np.float32


def test_discrete_binning_edges():
    d2, d3 = spaces.Discrete(2), spaces.Discrete(3, start=-1)
    assert action_dim_of(d2) == 1
    assert [int(to_env_action(d2, np.array([a]))) for a in (-1.0, -0.01, 0.0, 1.0)] == [0, 0, 1, 1]
    # [-1, 1] in three bins [-1, -1/3), [-1/3, 1/3), [1/3, 1]; start=-1 shifts the values
    assert [int(to_env_action(d3, np.array([a]))) for a in (-1.0, -0.34, 0.0, 0.32, 0.34, 1.0)] == [-1, -1, 0, 0, 1, 1]


def test_multidiscrete_and_multibinary():
    md = spaces.MultiDiscrete([2, 5])
    assert action_dim_of(md) == 2
    assert to_env_action(md, np.array([-1.0, 1.0])).tolist() == [0, 4]
    assert to_env_action(md, np.array([1.0, -0.5])).tolist() == [1, 1]  # floor(0.25 * 5) = 1
    mb = spaces.MultiBinary(3)
    assert to_env_action(mb, np.array([-1.0, 0.0, 0.5])).tolist() == [0, 1, 1]


def test_infinite_bounds_and_unsupported_space_errors():
    with pytest.raises(ValueError, match=r"MmrlTest/InfBox-v0.*infinite bounds.*ActionWrapper"):
        GymSim(2, env_id="MmrlTest/InfBox-v0", render_images=False)
    with pytest.raises(NotImplementedError, match=r"MmrlTest/DictAction-v0.*Dict"):
        GymSim(2, env_id="MmrlTest/DictAction-v0", render_images=False)
    with pytest.raises(ValueError, match="vectorization"):
        GymSim(2, env_id="MmrlTest/Counter-v0", vectorization="threads")


# ---------------------------------------------------------------------------- observations
@needs_pygame
def test_rendered_images_and_state():
    sim = GymSim(3, env_id="Pendulum-v1", image_size=24, instruction="swing up")
    try:
        obs = sim.reset([1, 1, 2])
        assert obs.image.dtype == torch.uint8 and tuple(obs.image.shape) == (3, 24, 24, 3)
        assert obs.image.float().std() > 0  # not a constant image
        assert obs.instruction == ["swing up"] * 3
        assert obs.state.dtype == torch.float32 and tuple(obs.state.shape) == (3, 3)
        assert torch.equal(obs.state[0], obs.state[1]) and torch.equal(obs.image[0], obs.image[1])
        assert not torch.equal(obs.state[0], obs.state[2])
        assert sim.max_episode_steps == 200  # from the env spec
    finally:
        sim.close()


def test_no_render_gives_zero_images_and_default_instruction():
    sim = GymSim(2, env_id="CartPole-v1", image_size=16, render_images=False)
    try:
        obs = sim.reset(0)
        assert tuple(obs.image.shape) == (2, 16, 16, 3) and not obs.image.any()
        assert obs.instruction[0] == "control the CartPole-v1 environment to maximise reward"
    finally:
        sim.close()


# ---------------------------------------------------------------------------- chunks, success
@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_chunk_ignores_actions_after_episode_end(vectorization):
    sim = GymSim(
        2, env_id="MmrlTest/Counter-v0", render_images=False, vectorization=vectorization, success_key="is_success"
    )
    try:
        assert sim.has_success and not sim.has_images
        sim.reset(0)
        # Discrete(2): a < 0 -> 0 (continue), a >= 0 -> 1 (end with success)
        chunk = torch.tensor([[[1.0], [-1.0], [-1.0]], [[-1.0], [-1.0], [1.0]]])
        res = sim.step_chunk(chunk)
        assert res.reward.tolist() == [1.0, 3.0]  # env 0 ended at its first step
        assert res.terminated.tolist() == [True, True] and res.success.tolist() == [True, True]
        assert res.info["num_steps"].tolist() == [1, 3]
        assert res.final_obs.state[:, 0].tolist() == [1.0, 3.0]
        assert res.obs.state[:, 0].tolist() == [0.0, 0.0]  # fresh episodes, not advanced
        res = sim.step(torch.tensor([[-1.0], [-1.0]]))
        assert res.obs.state[:, 0].tolist() == [1.0, 1.0] and not res.success.any()
        assert res.final_obs is None
    finally:
        sim.close()


def test_success_is_undefined_without_a_success_key():
    sim = GymSim(2, env_id="MmrlTest/Counter-v0", render_images=False)
    try:
        assert not sim.has_success
        sim.reset(0)
        res = sim.step_chunk(torch.ones(2, 1, 1))  # ends both episodes with info["is_success"]
        assert res.terminated.all() and not res.success.any()
    finally:
        sim.close()


def test_truncation_at_max_episode_steps():
    sim = GymSim(2, env_id="MmrlTest/Counter-v0", render_images=False, max_episode_steps=3)
    try:
        sim.reset(0)
        res = sim.step_chunk(-torch.ones(2, 5, 1))
        assert res.truncated.all() and not res.terminated.any() and not res.success.any()
        assert res.reward.tolist() == [3.0, 3.0] and res.final_obs.state[:, 0].tolist() == [3.0, 3.0]
        with pytest.raises(ValueError, match="NaN"):
            sim.step(torch.full((2, 1), float("nan")))
    finally:
        sim.close()


def _episode_ends(sim, steps: int) -> list[list[int]]:
    """The step counts at which each env's episodes ended (Counter: action -1 never ends one)."""
    ends: list[list[int]] = [[] for _ in range(sim.num_envs)]
    for t in range(1, steps + 1):
        res = sim.step(-torch.ones(sim.num_envs, 1))
        assert not res.terminated.any()
        for i in res.truncated.nonzero().flatten().tolist():
            ends[i].append(t)
    return ends


def test_staggered_first_episodes_spread_the_envs_over_the_episode():
    """stagger_episodes cuts each env's first episode (truncated) at a seeded random length, env 0
    at the time limit; every later episode runs to the limit, so the envs stay spread. Off (the
    default, and always for evaluation: eval_kwargs), every env ends at the limit together."""
    from simulators.gym_env import first_episode_limits

    limits = first_episode_limits(8, 10, seed=3)
    assert limits[0] is None and all(1 <= k <= 10 for k in limits[1:]) and len(set(limits[1:])) > 2
    assert first_episode_limits(8, 10, seed=3) == limits and first_episode_limits(8, 10, seed=4) != limits
    sim = GymSim(
        8, env_id="MmrlTest/Counter-v0", render_images=False, max_episode_steps=10, seed=3, stagger_episodes=True
    )
    try:
        sim.reset(0)  # the collector's first reset keeps the cuts
        ends = _episode_ends(sim, 30)
        for i, k in enumerate(limits):
            first = k or 10
            assert ends[i][:2] == [first, first + 10], (i, k, ends[i])
    finally:
        sim.close()
    assert GymSim.eval_kwargs["stagger_episodes"] is False
    sim = GymSim(8, env_id="MmrlTest/Counter-v0", render_images=False, max_episode_steps=10, seed=3)
    try:
        sim.reset(0)
        assert _episode_ends(sim, 20) == [[10, 20]] * 8
    finally:
        sim.close()


# ---------------------------------------------------------------------------- trainer smoke run
@needs_pygame
@pytest.mark.slow
def test_trainer_two_iterations_on_pendulum(tmp_path):
    from mmrl.experiment import build_trainer, load_experiment

    cfg = load_experiment(
        "configs/quickstart.yaml",
        [
            f"run.output_dir={tmp_path}",
            "sim.type=gym",
            "sim.num_envs=4",
            "sim.eval_num_envs=4",
            "sim.kwargs={env_id: Pendulum-v1, image_size: 32, max_episode_steps: 16}",
            "warm_start.dataset=null",
            "policy.dim=16",
            "policy.expert_dim=16",
            "policy.expert_layers=1",
            "policy.chunk_size=4",
            "algorithm.minibatch_size=16",
            "algorithm.epochs=1",
            "trainer.iterations=2",
            "trainer.eval_episodes=4",
            "trainer.video_episodes=2",
        ],
    )
    results = build_trainer(cfg).run()
    assert set(results) == {"start", "final"}
    assert np.isfinite(results["final"]["return"])
