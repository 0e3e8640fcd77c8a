"""Real LIBERO scenes (assets from ``scripts/setup_libero_assets.sh``; skipped with the reason
without them): the assets are found with no environment variable, the simulator contract holds on a
real libero_spatial scene, and a multi-task env switches scenes, starting each episode from the
shipped init state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

try:
    import libero  # noqa: F401
except ImportError:
    pytest.skip("libero is not installed (pip install 'mmrl[libero]')", allow_module_level=True)

from simulators import check_simulator
from simulators import libero as L

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not L.assets_expected(), reason="LIBERO scene assets absent: bash scripts/setup_libero_assets.sh"
    ),
]


def test_assets_found_without_a_variable(monkeypatch):
    monkeypatch.delenv(L.ASSETS_ENV, raising=False)
    pypi = L._pypi_assets()
    if not pypi or not L._is_assets(pypi[0]):
        pytest.skip("the assets here come from elsewhere than the PyPI packages")
    assert L.check_assets() == pypi[0].resolve()


def test_contract_on_a_real_libero_spatial_scene():
    factory = lambda: L.LiberoSim(  # noqa: E731
        num_envs=2, suite="libero_spatial", image_size=32, max_episode_steps=20, num_noop_steps=5
    )
    passed = check_simulator(factory, chunk_size=4, verbose=False)
    for name in ("reset_deterministic", "step_chunk", "truncation", "auto_reset", "state_roundtrip"):
        assert name in passed


def test_real_multi_task_env_switches_scene_from_the_shipped_init_state():
    tasks = L.list_tasks("libero_spatial")
    sim = L.LiberoSim(num_envs=1, task_id=[0, 5], split="all", num_noop_steps=0, image_size=32)
    try:
        first = sim.reset(0)  # task 0, init state 0
        flat0 = sim.get_state()["sim"][0]["sim"]
        assert np.array_equal(flat0, L.load_init_states("libero_spatial", 0)[0])
        other = sim.reset(3)  # task 5, init state 1: the worker rebuilds the scene
        assert other.instruction == [tasks[5].language] and other.meta[0]["task"] == "libero_spatial/5"
        assert np.array_equal(sim.get_state()["sim"][0]["sim"], L.load_init_states("libero_spatial", 5)[1])
        assert (other.image.float() - first.image.float()).abs().mean() > 1  # another scene
        res = sim.step_chunk(torch.zeros(1, 3, 7))
        assert res.info["num_steps"].tolist() == [3]
        again = sim.reset(0)  # back to task 0: the same pixels as before the switch
        assert again.instruction == [tasks[0].language] and torch.equal(again.image, first.image)
    finally:
        sim.close()
