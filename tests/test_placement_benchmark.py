"""benchmarks/placement.py's synthetic simulator cost (issue 71): ``--sim-ms-per-step`` sets a cost per
env step whatever the policy, ``--sim-ratio`` a multiple of the policy's decision (the device check's
``hybrid`` step calibrates a GPU policy's busy-work with it). Sleep load: its cost does not depend on
how busy the machine is, so the bounds hold on a shared one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("placement_benchmark", ROOT / "benchmarks" / "placement.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["placement_benchmark"] = module
    spec.loader.exec_module(module)
    return module


def test_sim_ms_per_step_sets_the_cost_of_an_env_step(bench):
    policy = bench.build_policy()
    n = 4
    kwargs, _, t_sim = bench.calibrate(policy, n, {"max_episode_steps": 8}, "sleep", ms_per_step=2.0)
    target = n * bench.CHUNK * 2.0 / 1e3  # 4 envs x chunk 4 x 2 ms
    assert 0.8 * target < t_sim < 1.6 * target, (t_sim, target, kwargs)


def test_sim_ratio_sets_the_cost_against_the_policy(bench):
    policy = bench.build_policy()
    _, t_policy, t_sim = bench.calibrate(policy, 4, {"max_episode_steps": 8}, "sleep", ratio=4.0)
    assert 2.0 < t_sim / t_policy < 8.0, (t_policy, t_sim)  # balanced (the default, 1) is far below
