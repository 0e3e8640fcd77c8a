"""Meta-World as a simulator (simulators/metaworld.py): the contract checker on one task and on MT10,
the evaluation protocol pinned against the installed package, seeds -> task and goal variation,
held-out variations apart from the training ones, success at any step, and one line per bad input."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

pytest.importorskip("metaworld")

from mmrl.checks.simulator import check_simulator
from mmrl.errors import UserError
from simulators import metaworld as mw
from simulators.metaworld import INSTRUCTIONS, PROTOCOL, MetaWorldSim

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_protocol_is_meta_worlds_own():
    """Every constant of PROTOCOL, read back from metaworld itself where it holds it; a drift of either
    (a constant edited here, or a metaworld release that changes one) fails."""
    import metaworld
    from metaworld import evaluation
    from metaworld.sawyer_xyz_env import SawyerXYZEnv

    assert PROTOCOL == {
        "max_episode_steps": 500,
        "success": "info['success'] at any step",
        "terminate_on_success": True,
        "episodes_per_task": 50,
        "variations_per_task": 50,
        "goal_observable": True,
        "reward_function_version": "v2",
        "state_dim": 39,
        "action_dim": 4,
    }
    assert SawyerXYZEnv.max_path_length == PROTOCOL["max_episode_steps"]
    assert inspect.signature(evaluation.evaluation).parameters["num_episodes"].default == PROTOCOL["episodes_per_task"]
    assert 'toggle_terminate_on_success", True' in inspect.getsource(evaluation.evaluation)
    assert len(metaworld.MT1("reach-v3", seed=0).train_tasks) == PROTOCOL["variations_per_task"]
    assert metaworld._MT_OVERRIDE == {"partially_observable": not PROTOCOL["goal_observable"]}
    env = metaworld.ALL_V3_ENVIRONMENTS["reach-v3"]()
    assert env.observation_space.shape == (PROTOCOL["state_dim"],) and env.action_space.shape == (
        PROTOCOL["action_dim"],
    )
    assert set(INSTRUCTIONS) == set(metaworld.ALL_V3_ENVIRONMENTS), "an instruction per task"


@pytest.mark.parametrize("task", ["pick-place-v3", "MT10"])
def test_the_contract_checker_passes(task):
    # a short time limit so episodes end inside the checker's steps (auto reset exercised)
    passed = check_simulator(lambda **kw: MetaWorldSim(**{"task": task, "max_episode_steps": 12, **kw}))
    assert "auto_reset" in passed and "episode" in passed


def test_seeds_pick_task_and_variation():
    tasks = mw.resolve_tasks("MT10")
    sim = MetaWorldSim(num_envs=4, task="MT10", max_episode_steps=20)
    obs = sim.reset([0, 1, 10, 11])
    assert [m["task"] for m in obs.meta] == [tasks[0], tasks[1], tasks[0], tasks[1]]
    assert obs.instruction == [INSTRUCTIONS[t] for t in (tasks[0], tasks[1], tasks[0], tasks[1])]
    assert not torch.equal(obs.state[0], obs.state[2]), "seed 10 is task 0's second variation, not its first"
    again = sim.reset([0, 0, 10, 10])  # a GRPO group shares its seed: the same task and variation
    assert torch.equal(again.state[0], again.state[1]) and torch.equal(again.state[0], obs.state[0])
    assert torch.equal(again.state[2], obs.state[2])
    single = MetaWorldSim(num_envs=1, task=tasks[0], max_episode_steps=20)
    assert torch.equal(single.reset(1).state[0], obs.state[2]), "MT10's seed 10 = task 0's variation 1"
    sim.close()
    single.close()


def test_held_out_variations_are_not_the_training_ones():
    def goals(sim):  # the goal position (the observation's last 3 numbers) of each of the 50 variations
        return torch.cat([sim.reset(list(range(k, k + 10))).state[:, -3:] for k in range(0, 50, 10)])

    train = MetaWorldSim(num_envs=10, task="push-v3")
    held = MetaWorldSim(num_envs=10, task="push-v3", split="heldout")
    a, b = goals(train), goals(held)
    assert len({tuple(g.tolist()) for g in a}) == 50, "50 distinct training variations"
    assert torch.cdist(a, b).min() > 1e-4, "no held-out goal equals a training goal"
    default = MetaWorldSim(num_envs=10, task="push-v3", task_seed=0)
    assert torch.equal(goals(default), a), "task_seed 0 is the default"
    default.close()
    assert MetaWorldSim.eval_kwargs == {"split": "heldout", "terminate_on_success": True, "stagger_episodes": False}
    for s in (train, held):
        s.close()


def expert_episode(terminate: bool, rewards: list | None = None, **kwargs) -> tuple[list[bool], list[bool]]:
    """reach-v3 driven by Meta-World's scripted expert: (done, success) per step until the episode
    ends (its rewards appended to ``rewards``)."""
    from metaworld.policies import SawyerReachV3Policy

    sim = MetaWorldSim(num_envs=1, task="reach-v3", terminate_on_success=terminate, max_episode_steps=150, **kwargs)
    obs, expert, done, success = sim.reset(3), SawyerReachV3Policy(), [], []
    for _ in range(150):
        action = torch.as_tensor(expert.get_action(obs.state[0].double().numpy()), dtype=torch.float32)[None]
        res = sim.step(action.clamp(-1, 1))
        done.append(bool(res.done[0]))
        success.append(bool(res.success[0]))
        if rewards is not None:
            rewards.append(float(res.reward[0]))
        if res.done[0]:
            break
        obs = res.obs
    sim.close()
    return done, success


def test_success_at_any_step_and_termination_in_evaluation():
    done, success = expert_episode(terminate=True)
    assert done[-1] and success[-1] and len(done) < 150, "the episode ends at the first success"
    done_free, success_free = expert_episode(terminate=False)
    assert len(done_free) == 150 and success_free[-1], "run to the time limit, success reached earlier still counts"


def test_success_reward_is_one_at_the_first_success_only():
    """reward='success': 1 at the step the task first succeeds, 0 at every other (also after it,
    while the episode runs on); the default is Meta-World's shaped reward."""
    sparse, dense = [], []
    _, success = expert_episode(terminate=False, rewards=sparse, reward="success")
    first = success.index(True)
    assert sparse[first] == 1.0 and sum(sparse) == 1.0 and len(sparse) == 150
    expert_episode(terminate=False, rewards=dense)
    assert sum(dense) > 100, "Meta-World's own reward (0-10 per step) by default"


def test_slots_share_envs_so_memory_follows_slots_not_tasks():
    """Each slot holds one MuJoCo env; the task it leaves goes to a bounded idle pool. Ten slots
    walking through MT10's ten tasks used to keep 100 envs (about 19 MB each) alive."""
    before = mw.LIVE_ENVS[0]
    sim = MetaWorldSim(num_envs=10, task="MT10")
    for k in range(10):  # round k: slot i plays task k (seed k + 10 i), so every slot visits every task
        obs = sim.reset([k + 10 * i for i in range(10)])
        assert {m["task"] for m in obs.meta} == {sim.tasks[k]}
    live = mw.LIVE_ENVS[0] - before
    assert live <= 10 + mw.IDLE_PER_TASK * 10, f"{live} envs alive for 10 slots"
    sim.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reward": "sparse"}, "reward must be one of dense, success"),
        ({"task": "pick-plase"}, "did you mean pick-place-v3"),
        ({"task": ["reach-v3", "reach"]}, "repeat"),
        ({"split": "test"}, "split must be 'train' or 'heldout'"),
        ({"max_episode_steps": 600}, "max_episode_steps must be 1..500"),
    ],
)
def test_bad_input_is_one_line(kwargs, message):
    with pytest.raises(UserError, match=message) as info:
        MetaWorldSim(num_envs=1, **kwargs)
    assert "\n" not in str(info.value)


def test_a_missing_package_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_metaworld(name, *args, **kwargs):
        if name == "metaworld" or name.startswith("metaworld."):
            raise ImportError("No module named 'metaworld'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_metaworld)
    with pytest.raises(ImportError, match=r"pip install 'mmrl\[metaworld\]'"):
        mw.variations(["reach-v3"], "train", 12345)  # a seed no test drew before (its pools are cached)


def test_rendering_or_one_line(monkeypatch):
    """Pixels where OpenGL renders (OSMesa or EGL); otherwise the error is one line naming the fixes."""
    try:
        sim = MetaWorldSim(num_envs=1, task="reach-v3", render_images=True, image_size=32)
    except UserError as exc:
        assert "MUJOCO_GL" in str(exc) and "render_images=False" in str(exc) and "\n" not in str(exc)
        return
    obs = sim.reset(0)
    assert obs.image.shape == (1, 32, 32, 3) and obs.image.float().std() > 1, "a real frame, not zeros"
    sim.close()
    monkeypatch.setenv("MUJOCO_GL", "glfw")  # no display: cannot render
    with pytest.raises(UserError, match="MUJOCO_GL='glfw'"):
        MetaWorldSim(num_envs=1, task="reach-v3", render_images=True, image_size=32)


def test_default_gl_is_osmesa_only_where_libosmesa_is(monkeypatch):
    """Without MUJOCO_GL, OSMesa where libOSMesa is installed, else EGL (a machine without libosmesa6
    still renders through Mesa's or a GPU's EGL instead of failing)."""
    import ctypes.util

    from simulators.metaworld import default_gl

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert default_gl() == "egl"
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: "libOSMesa.so.8" if name == "OSMesa" else None)
    assert default_gl() == "osmesa"


def test_no_snapshots_rather_than_wrong_ones():
    sim = MetaWorldSim(num_envs=1)
    with pytest.raises(NotImplementedError, match="does not reproduce"):
        sim.get_state()
    sim.close()


def test_suite_tasks_for_mmrl_eval():
    assert MetaWorldSim.suite_tasks(task="MT10") == mw.resolve_tasks("MT10") and len(mw.resolve_tasks("MT10")) == 10
    assert len(MetaWorldSim.suite_tasks(task="MT50")) == 50
    assert MetaWorldSim.suite_tasks(task="reach") == ["reach-v3"]
    assert np.isfinite(MetaWorldSim(num_envs=1).reset(0).state.numpy()).all()
