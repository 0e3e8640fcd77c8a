"""An installed mmrl, run from outside its checkout (the checkout is not on ``sys.path``, as for any
user of the installed package): every simulator that starts processes of its own passes its contract
checker, and placement's spawned sim workers train.

Before the fix every spawned ManiSkill / LIBERO / placement worker died with ``ModuleNotFoundError:
No module named 'simulators'``: the parent imported the adapters by the repository's name (by file
location) and the workers unpickled their targets by it. CI's other tests all run from the repository
root, where that name imports, so none of them saw it. Here the console script of this interpreter's
environment (an editable install in CI, as `scripts/setup.sh` makes it) runs in a temporary folder
with ``PYTHONPATH`` removed; `scripts/check_wheel.sh` does the same for the built wheel."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MMRL = Path(sys.executable).with_name("mmrl")

pytestmark = pytest.mark.skipif(not MMRL.is_file(), reason=f"no mmrl console script beside {sys.executable}")


def run_outside(args: list[str], where: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``mmrl ARGS`` in ``where`` (outside the checkout) with no ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(MMRL), *args], cwd=where, env=env, capture_output=True, text=True, timeout=timeout)


def assert_outside(where: Path) -> None:
    """The test can only fail the way the bug did if the repository's names do not import there."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import importlib.util as u; print(u.find_spec('simulators') is None)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=where, env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "True", f"`simulators` imports from {where}: not outside the checkout"


def passed(res: subprocess.CompletedProcess, name: str) -> None:
    tail = (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 0 and f"simulator '{name}' passed" in res.stdout, tail
    assert "ModuleNotFoundError" not in res.stderr, tail


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="mani_skill is not installed")
def test_maniskill_cpu_workers_from_outside_the_checkout(tmp_path):
    assert_outside(tmp_path)
    passed(run_outside(["check", "simulator", "maniskill:PickCube-v1"], tmp_path), "maniskill:PickCube-v1")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="libero is not installed")
def test_libero_real_scene_workers_from_outside_the_checkout(tmp_path):
    sys.path.insert(0, str(ROOT))  # only to ask where the assets are; the check itself runs outside
    try:
        from simulators import libero as L
    finally:
        sys.path.remove(str(ROOT))
    if not L.assets_expected():
        pytest.skip("LIBERO scene assets absent: bash scripts/setup_libero_assets.sh")
    assert_outside(tmp_path)
    args = ["check", "simulator", "libero:libero_spatial", "num_envs=2", "image_size=32"]
    res = run_outside([*args, "max_episode_steps=20", "num_noop_steps=5"], tmp_path)
    passed(res, "libero:libero_spatial")


@pytest.mark.skipif(importlib.util.find_spec("gymnasium") is None, reason="gymnasium is not installed")
def test_gym_async_vector_env_from_outside_the_checkout(tmp_path):
    assert_outside(tmp_path)
    res = run_outside(["check", "simulator", "gym:CartPole-v1", "vectorization=async"], tmp_path)
    passed(res, "gym:CartPole-v1")


def test_placement_sim_workers_train_from_outside_the_checkout(tmp_path):
    assert_outside(tmp_path)
    short = ["run.threads=1", "trainer.iterations=1", "trainer.eval_every=0", "trainer.video_episodes=0"]
    short += ["sim.num_envs=8", "sim.eval_num_envs=4", "trainer.eval_episodes=4", "warm_start.num_episodes=8"]
    short += ["warm_start.steps=5", "algorithm.minibatch_size=16", f"run.output_dir={tmp_path / 'runs'}"]
    config = str(ROOT / "configs" / "quickstart.yaml")
    res = run_outside(["train", config, "placement.mode=disaggregated", *short], tmp_path)
    tail = (res.stdout + res.stderr)[-3000:]
    assert res.returncode == 0, tail
    assert "ModuleNotFoundError" not in res.stderr, tail
    assert list((tmp_path / "runs").rglob("state.pt")), tail
