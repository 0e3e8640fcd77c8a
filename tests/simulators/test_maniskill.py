"""ManiSkillSim: the contract checker on PickCube-v1 (state) and PushCube-v1 (rgb) with CPU worker
processes, the in-process single env, instructions and the missing-asset error.

Skipped as a whole, with the reason, when mani_skill is not installed or its renderer cannot start
(ManiSkill needs a Vulkan driver even for state observations: `bash scripts/install_sim_deps.sh`).
Env creation is slow (~10 s per worker process, ~15 s more for the first rgb render on software
Vulkan), so the simulators are module-scoped fixtures.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

import pytest
import torch

if importlib.util.find_spec("mani_skill") is None:
    pytest.skip("mani_skill is not installed (pip install 'mmrl[sim]')", allow_module_level=True)

from mmrl.registry import SIMULATORS
from simulators import check_simulator

pytestmark = [
    pytest.mark.slow,
    # ManiSkill itself calls np.isnan on a torch tensor for every CPU action (numpy 2 deprecation)
    pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning"),
]

PROBE = """
import gymnasium as gym, mani_skill.envs
env = gym.make("PickCube-v1", num_envs=1, obs_mode="state", render_backend="cpu")
env.reset(seed=0)
env.close()
print("PROBE-OK")
"""


def _probe_error() -> str | None:
    """Create a PickCube env in a subprocess; None if it works, else the error line."""
    try:
        p = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return "creating PickCube-v1 timed out after 240 s"
    if p.returncode == 0 and "PROBE-OK" in p.stdout:
        return None
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or [f"exit code {p.returncode}"])[-1].strip()


@pytest.fixture(scope="module", autouse=True)
def _maniskill_usable():
    err = _probe_error()
    if err is not None:
        pytest.skip(
            f"ManiSkill cannot create PickCube-v1 here ({err}); it needs a Vulkan driver: "
            "bash scripts/install_sim_deps.sh"
        )


@pytest.fixture(scope="module")
def pick_state():
    from simulators.maniskill import ManiSkillSim

    sim = ManiSkillSim(num_envs=2, task="PickCube-v1", obs_mode="state")
    yield sim
    sim.close()


@pytest.fixture(scope="module")
def push_rgb():
    from simulators.maniskill import ManiSkillSim

    sim = ManiSkillSim(num_envs=2, task="PushCube-v1", obs_mode="rgb", image_size=64, max_episode_steps=16)
    yield sim
    sim.close()


def _rate(sim, steps: int) -> float:
    sim.reset(0)
    t = time.perf_counter()
    for _ in range(steps):
        sim.step(torch.rand(sim.num_envs, sim.action_dim) * 2 - 1)
    return steps * sim.num_envs / (time.perf_counter() - t)


def test_registered():
    assert "maniskill" in SIMULATORS.names()


def test_pickcube_state_contract(pick_state, capsys):
    res = check_simulator(pick_state)
    assert {"state_roundtrip", "truncation", "chunk_mid_episode_end", "auto_reset"} <= set(res), res.notes
    assert res.action_bounds == "clipped"
    assert pick_state.max_episode_steps == 50 and pick_state.image_shape == (64, 64, 3)
    obs = pick_state.reset(0)
    assert obs.image.eq(0).all()  # state mode renders nothing unless render_images=True
    assert obs.instruction == ["pick up the red cube and move it to the green goal"] * 2
    with capsys.disabled():
        print(f"\nManiSkill PickCube-v1 state, 2 CPU workers: {_rate(pick_state, 40):.0f} env-steps/s")


def test_pushcube_rgb_contract(push_rgb, capsys):
    res = check_simulator(push_rgb)
    assert {"state_roundtrip", "truncation", "chunk_mid_episode_end", "auto_reset"} <= set(res), res.notes
    obs = push_rgb.reset([3, 3])
    assert obs.image.shape == (2, 64, 64, 3) and obs.image.dtype == torch.uint8
    assert obs.image.float().std() > 5  # a rendered scene, not a blank frame
    assert torch.equal(obs.image[0], obs.image[1])  # equal seeds, equal initial states
    assert obs.state.shape == (2, push_rgb.state_dim)
    assert obs.instruction == ["push the blue cube to the red and white target"] * 2
    with capsys.disabled():
        print(f"\nManiSkill PushCube-v1 rgb 64 px, 2 CPU workers: {_rate(push_rgb, 6):.1f} env-steps/s")


def test_single_env_in_process_and_instruction_override():
    from simulators.maniskill import ManiSkillSim

    sim = ManiSkillSim(num_envs=1, task="PickCube-v1", instruction="lift the cube", max_episode_steps=4)
    try:
        assert sim._pool.local is not None  # num_envs=1 on CPU runs without a worker process
        obs = sim.reset(5)
        assert obs.instruction == ["lift the cube"]
        res = sim.step_chunk(torch.zeros(1, 6, sim.action_dim))
        assert res.truncated.tolist() == [True] and res.info["num_steps"].tolist() == [4]
        assert res.final_obs is not None and res.obs.instruction == ["lift the cube"]
    finally:
        sim.close()


def test_missing_assets_raise_without_prompt(monkeypatch):
    from mani_skill.utils.registration import REGISTERED_ENVS

    from simulators.maniskill import ManiSkillSim, MissingAssetError, _check_assets

    def missing(task: str) -> bool:
        try:
            _check_assets(task)
        except MissingAssetError:
            return True
        return False

    task = next((t for t in sorted(REGISTERED_ENVS) if REGISTERED_ENVS[t].asset_download_ids and missing(t)), None)
    if task is None:
        pytest.skip("every ManiSkill task's assets are downloaded here")

    def no_input(*_):
        raise AssertionError("ManiSkill prompted on stdin")

    monkeypatch.setattr("builtins.input", no_input)
    t = time.perf_counter()
    with pytest.raises(MissingAssetError, match=f"python -m mani_skill.utils.download_asset {task}"):
        ManiSkillSim(num_envs=1, task=task)
    assert time.perf_counter() - t < 60
