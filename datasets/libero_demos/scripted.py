"""Scripted LIBERO demonstrations: a privileged-state pick-and-place controller whose episodes are
replayed through mmrl's own `LiberoSim` and written in the official LIBERO HDF5 layout.

No package ships LIBERO's human demonstrations, so this makes demos for behaviour-cloning warm
starts of tasks whose goal is one ``(On <object> <object>)`` predicate (all of libero_spatial):

1. Goal: `pick_place_goal` parses the task's BDDL ``(:goal (And (On <obj> <target>)))``.
2. Controller (`PickPlaceController`): it reads the object, target and end-effector positions from
   LIBERO's raw observation dict (``<obj>_pos``, ``<target>_pos``, ``robot0_eef_pos``) and drives
   OSC_POSE deltas ``[dx, dy, dz, 0, 0, 0, gripper]`` in [-1, 1] (gripper -1 open, +1 close; the
   rotation is left to OSC, which holds its orientation goal while rotation deltas are 0) through
   the phases `PHASES`: above the object's grasp point, down, close, lift, carry the object over the
   target (closed loop on the object's own position), lower, open, retreat. A phase ends at its
   goal, when its error stops shrinking (blocked, out of reach) or after a step cap; a grasp that
   loses the object is retried from above (``max_grasps``). Per-task tweaks live in `TASK_PARAMS`
   (libero_spatial task 4 grasps the rim at +x: the drawer's front blocks +y). The phase and target
   math are pure functions (`grasp_point`, `phase_goal`, `position_action`, `next_phase`,
   `grasp_lost`).
3. Generation runs in this process on the env start the adapter's workers use: `_build_env` of
   the same LIBERO kwargs, `_EnvRunner.reset(init_state, libero_index)` (seeded reset, init state,
   ``num_noop_steps`` no-ops), then ``env.step`` without rendering, for at most the suite's
   ``max_episode_steps``. Episode k uses LIBERO's initial state k (``split="all"``).
4. Verification: every successful action sequence is replayed open loop through
   ``LiberoSim(num_envs=1, split="all", image_flip="none")`` (``reset(k)``, then ``step`` per
   action), recording the observation *before* each action: both cameras as raw OpenGL frames
   (upside down, ``macros_image_convention = "opengl"``) and the 8-dim state. Only sequences whose
   replay reaches success are kept, cut at the success step.
5. `write_task_file` writes ``<root>/<suite>/<task name>_demo.hdf5`` atomically (temporary file,
   then ``os.replace``), merging with demos already in the file, in the layout that ``builder.py``
   reads (``data/demo_<k>/actions``, ``obs/agentview_rgb``, ``obs/eye_in_hand_rgb``,
   ``obs/ee_states``, ``obs/gripper_states``, ...). ``demo_<k>`` is the demo of initial state k.

Unlike the official files (CARD.md: the observation *after* each action, the first 5 steps skipped),
record t here pairs the observation before action t with action t, as OpenVLA's regenerated data does.

CLI::

    python datasets/libero_demos/scripted.py --suite libero_spatial --tasks 0 1 --episodes 3 \\
        --image-size 128 --out /data/libero_scripted

then ``builder.build(..., root="/data/libero_scripted")`` reads them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_libero = adapter("simulators.libero")  # simulators/libero.py, wherever mmrl installed it (mmrl_simulators in a wheel)
DEMO_CAMERAS = _libero.DEMO_CAMERAS
MAX_EPISODE_STEPS = _libero.MAX_EPISODE_STEPS
SUITES = _libero.SUITES
LiberoSim = _libero.LiberoSim
TaskInfo = _libero.TaskInfo
_build_env = _libero._build_env
_EnvRunner = _libero._EnvRunner
_EnvSpec = _libero._EnvSpec
check_assets = _libero.check_assets
ensure_libero_config = _libero.ensure_libero_config
list_tasks = _libero.list_tasks
load_init_states = _libero.load_init_states
offscreen_env_kwargs = _libero.offscreen_env_kwargs
proprio_state = _libero.proprio_state
resolve_render_backend = _libero.resolve_render_backend

CAMERAS = DEMO_CAMERAS  # (simulator camera name, key under data/demo_<i>/obs), in image order
SUPPORTED = (
    "a goal that is a single (On <object> <target>) predicate, optionally inside (And ...), "
    "with both names declared under (:objects ...) of the BDDL file (a movable object placed "
    "on another object, e.g. libero_spatial's (On akita_black_bowl_1 plate_1))"
)
PHASES = ("approach", "descend", "grasp", "lift", "carry", "lower", "release", "retreat")
GRIPPER_OPEN, GRIPPER_CLOSE = -1.0, 1.0


class UnsupportedTaskError(ValueError):
    """The task's goal is not a pick-and-place this controller can do."""


# ---------------------------------------------------------------------------------- BDDL goal
def parse_sexpr(text: str) -> list:
    """A BDDL / PDDL text as nested lists of atoms (strings); ``;`` comments dropped."""
    text = "\n".join(line.split(";", 1)[0] for line in text.splitlines())
    tokens = text.replace("(", " ( ").replace(")", " ) ").split()
    stack: list[list] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise ValueError("unbalanced ')' in BDDL text")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(tok)
    if len(stack) != 1:
        raise ValueError("unbalanced '(' in BDDL text")
    return stack[0]


def _section(tree: list, key: str) -> list | None:
    """The first list anywhere in ``tree`` whose head is ``key`` (case-insensitive)."""
    for node in tree:
        if isinstance(node, list):
            if node and isinstance(node[0], str) and node[0].lower() == key:
                return node
            found = _section(node, key)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class PickPlace:
    """Pick ``obj`` and place it on ``target`` (LIBERO object names, e.g. ``akita_black_bowl_1``)."""

    obj: str
    target: str


def pick_place_goal(bddl_text: str, task: str = "the task") -> PickPlace:
    """The object and target of a BDDL goal ``(:goal (And (On <obj> <target>)))`` (or without
    ``And``); `UnsupportedTaskError` naming ``task`` for any other goal."""
    tree = parse_sexpr(bddl_text)
    goal = _section(tree, ":goal")
    body = goal[1:] if goal else []
    if len(body) == 1 and isinstance(body[0], list) and body[0] and str(body[0][0]).lower() == "and":
        body = body[0][1:]
    ok = (
        len(body) == 1
        and isinstance(body[0], list)
        and len(body[0]) == 3
        and all(isinstance(x, str) for x in body[0])
        and body[0][0].lower() == "on"
    )
    objects = _objects(_section(tree, ":objects"))
    if ok and body[0][1] in objects and body[0][2] in objects:
        return PickPlace(body[0][1], body[0][2])
    shown = " ".join(_unparse(x) for x in body) if goal else "no (:goal ...) section"
    raise UnsupportedTaskError(
        f"{task}: goal {shown} is not supported by the scripted controller; supported: {SUPPORTED}"
    )


def _objects(section: list | None) -> set[str]:
    """Object names of ``(:objects a b - type c - type)``: every atom not a type (after ``-``)."""
    if section is None:
        return set()
    names, skip = set(), False
    for tok in section[1:]:
        if not isinstance(tok, str):
            continue
        if tok == "-":
            skip = True
        elif skip:
            skip = False
        else:
            names.add(tok)
    return names


def _unparse(node) -> str:
    return node if isinstance(node, str) else "(" + " ".join(_unparse(x) for x in node) + ")"


def task_goal(task: TaskInfo) -> PickPlace:
    """`pick_place_goal` of a task's BDDL file, errors naming the suite, id and task name."""
    return pick_place_goal(Path(task.bddl_file).read_text(), f"{task.suite} task {task.task_id} ({task.name})")


# ---------------------------------------------------------------------------------- controller math
@dataclass(frozen=True)
class ControllerParams:
    """Distances in metres (world frame); the defaults fit libero_spatial's black bowl and plate."""

    grasp_offset: tuple[float, float] = (0.0, 0.045)  # grasp point - object origin, xy: the bowl's rim
    hover: float = 0.10  # approach height above the grasp height
    grasp_height: float = 0.005  # eef z - object z when closing
    lift: float = 0.20  # carry height above max(object z at grasp, target z)
    place_height: float = 0.05  # object z - target z when opening
    retreat: float = 0.10  # rise after opening
    gain: float = 30.0  # action per metre of error (1.5 at 5 cm: OSC_POSE moves 5 cm per unit action)
    tol: float = 0.01  # a position goal is reached within this distance
    approach_tol: float = 0.005  # tighter above the object: the descent is straight down
    close_steps: int = 15
    open_steps: int = 10
    #: per phase, the steps after which it stops waiting for its goal (blocked descents, slow settling)
    phase_steps: tuple[tuple[str, int], ...] = (
        ("approach", 60),
        ("descend", 30),
        ("lift", 40),
        ("carry", 60),
        ("lower", 40),
    )
    stall_steps: int = 8  # a phase also ends once its error has not improved by 1 mm for this many steps
    slip: float = 0.04  # the grasp failed once the object is this much further from the eef than at closing
    max_grasps: int = 3  # grasp attempts before giving up (the episode then runs out of steps)


#: measured per-task changes to the defaults: in libero_spatial task 4 the bowl sits in an open
#: drawer whose front wall blocks the fingers at the rim's +y side, so it is grasped at +x
TASK_PARAMS: dict[tuple[str, int], dict] = {("libero_spatial", 4): {"grasp_offset": (0.045, 0.0)}}


def task_params(task: TaskInfo, params: ControllerParams | None = None) -> ControllerParams:
    """``params`` if given, else the defaults with the task's `TASK_PARAMS` entry applied."""
    if params is not None:
        return params
    return dataclasses.replace(ControllerParams(), **TASK_PARAMS.get((task.suite, task.task_id), {}))


def grasp_point(obj_pos: np.ndarray, p: ControllerParams) -> np.ndarray:
    """Where the gripper closes: the object's origin shifted by ``grasp_offset`` in xy, ``grasp_height`` up."""
    return np.asarray(obj_pos, dtype=np.float64) + np.array([p.grasp_offset[0], p.grasp_offset[1], p.grasp_height])


def phase_goal(
    phase: str, eef: np.ndarray, obj: np.ndarray, target: np.ndarray, memo: dict, p: ControllerParams
) -> tuple[np.ndarray, float]:
    """(end-effector goal position, gripper command) of ``phase``.

    ``memo`` holds ``grasp`` (grasp point, fixed when the grasp phase starts) and ``carry_z`` (the
    carry height). Carrying and lowering are closed loop on the object: the end effector is moved
    by the object's own error to its goal over the target.
    """
    eef, obj, target = (np.asarray(x, dtype=np.float64) for x in (eef, obj, target))
    if phase == "approach":
        return grasp_point(obj, p) + np.array([0.0, 0.0, p.hover]), GRIPPER_OPEN
    if phase == "descend":
        return grasp_point(obj, p), GRIPPER_OPEN
    if phase == "grasp":
        return memo["grasp"], GRIPPER_CLOSE
    if phase == "lift":
        return np.array([memo["grasp"][0], memo["grasp"][1], memo["carry_z"]]), GRIPPER_CLOSE
    if phase in ("carry", "lower"):
        z = memo["carry_z"] if phase == "carry" else eef[2] + (target[2] + p.place_height - obj[2])
        return np.array([eef[0] + target[0] - obj[0], eef[1] + target[1] - obj[1], z]), GRIPPER_CLOSE
    if phase == "release":
        return memo["release"], GRIPPER_OPEN
    if phase == "retreat":
        return memo["release"] + np.array([0.0, 0.0, p.retreat]), GRIPPER_OPEN
    raise ValueError(f"unknown phase {phase!r}; phases: {PHASES}")


def position_action(eef: np.ndarray, goal: np.ndarray, gain: float) -> np.ndarray:
    """``clip(gain * (goal - eef), -1, 1)``: the OSC_POSE position delta toward ``goal``."""
    return np.clip(gain * (np.asarray(goal, dtype=np.float64) - np.asarray(eef, dtype=np.float64)), -1.0, 1.0)


def next_phase(phase: str, steps_in_phase: int, error: float, p: ControllerParams, stalled: bool = False) -> str:
    """The phase after this step: timed phases (grasp, release) move on after their step count,
    the others once the goal is within ``tol`` (``approach_tol`` for approach), when ``stalled``
    (blocked or out of reach) or after their ``phase_steps``; retreat is last."""
    i = PHASES.index(phase)
    if phase == "retreat":
        return phase
    if phase == "grasp":
        done = steps_in_phase >= p.close_steps
    elif phase == "release":
        done = steps_in_phase >= p.open_steps
    else:
        tol = p.approach_tol if phase == "approach" else p.tol
        done = error < tol or stalled or steps_in_phase >= dict(p.phase_steps).get(phase, 60)
    return PHASES[i + 1] if done else phase


def grasp_lost(eef: np.ndarray, obj: np.ndarray, held_distance: float, p: ControllerParams) -> bool:
    """True when the object is ``slip`` further from the end effector than when the gripper closed
    (it stayed behind, or fell, while lifting / carrying / lowering)."""
    return float(np.linalg.norm(np.asarray(obj) - np.asarray(eef))) > held_distance + p.slip


class PickPlaceController:
    """Phase machine over LIBERO's raw observation dict; ``act(raw)`` returns one 7-dim action."""

    def __init__(self, goal: PickPlace, params: ControllerParams | None = None):
        self.goal, self.p = goal, params or ControllerParams()
        self.reset()

    def reset(self) -> None:
        self.phase, self.steps_in_phase, self.memo = PHASES[0], 0, {}
        self.grasps, self.best = 0, (np.inf, 0)
        self.phase_log: list[str] = []

    def positions(self, raw: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keys = ("robot0_eef_pos", f"{self.goal.obj}_pos", f"{self.goal.target}_pos")
        missing = [k for k in keys if k not in raw]
        if missing:
            raise UnsupportedTaskError(
                f"LIBERO's observation has no {', '.join(missing)} (objects observed: "
                f"{sorted(k[:-4] for k in raw if k.endswith('_pos') and not k.startswith('robot'))}); "
                f"supported: {SUPPORTED}"
            )
        return tuple(np.asarray(raw[k], dtype=np.float64) for k in keys)

    def act(self, raw: dict) -> np.ndarray:
        eef, obj, target = self.positions(raw)
        p = self.p
        if self.phase == "lift" and "held" not in self.memo:  # the first step after closing
            self.memo["held"] = float(np.linalg.norm(obj - eef))
        if (
            self.phase in ("lift", "carry", "lower")
            and grasp_lost(eef, obj, self.memo["held"], p)
            and self.grasps < p.max_grasps
        ):
            self.phase, self.steps_in_phase, self.memo = "approach", 0, {}  # try again from above
            self.best = (np.inf, 0)
        if self.phase == "grasp" and "grasp" not in self.memo:
            self.grasps += 1
            self.memo["grasp"] = eef.copy()
            self.memo["carry_z"] = max(obj[2], target[2]) + p.lift
        if self.phase == "release" and "release" not in self.memo:
            self.memo["release"] = eef.copy()
        goal, grip = phase_goal(self.phase, eef, obj, target, self.memo, p)
        err = float(np.linalg.norm(goal - eef))  # carry / lower: == the object's distance to its goal
        action = np.zeros(7)
        action[:3] = position_action(eef, goal, p.gain)
        action[6] = grip
        self.phase_log.append(self.phase)
        self.steps_in_phase += 1
        if self.steps_in_phase == 1 or err < self.best[0] - 0.001:
            self.best = (err, self.steps_in_phase)
        stalled = self.steps_in_phase - self.best[1] >= p.stall_steps
        nxt = next_phase(self.phase, self.steps_in_phase, err, p, stalled)
        if nxt != self.phase:
            self.phase, self.steps_in_phase = nxt, 0
        return action


# ---------------------------------------------------------------------------------- generation
@dataclass
class Episode:
    """One controller run from LIBERO initial state ``index``."""

    index: int
    actions: np.ndarray  # float64 [T, 7]: up to and including the success step (all steps if none)
    success: bool
    states: np.ndarray  # float32 [T, 8]: `proprio_state` before each action
    sim_states: np.ndarray  # float64 [T, D]: flattened MuJoCo state before each action
    joint_states: np.ndarray  # float64 [T, 7]
    phases: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.actions)


class GenerationEnv:
    """An in-process LIBERO env started exactly like a `LiberoSim` worker, stepped without rendering."""

    def __init__(
        self,
        task: TaskInfo,
        image_size: int = 128,
        camera_names: Sequence[str] = tuple(c for c, _ in CAMERAS),
        num_noop_steps: int = 10,
        render_backend: str = "auto",
    ):
        assets = check_assets()
        self.task = task
        # the reset's one observation is rendered at 8 px from one camera: rendering never changes the physics
        self.spec = _EnvSpec(
            offscreen_env_kwargs(task, image_size, camera_names),
            (camera_names[0],),
            8,
            int(num_noop_steps),
            resolve_render_backend(render_backend),
            "none",
            str(ensure_libero_config().parent),
            str(assets),
        )
        self.env = _build_env(self.spec)
        self.runner = _EnvRunner(self.env, self.spec)
        self.init_states = load_init_states(task.suite, task.task_id)

    def reset(self, index: int) -> dict:
        """The adapter's reset to initial state ``index``; returns LIBERO's raw observation dict."""
        self.runner.reset(self.init_states[index], int(index))
        return self.runner._raw_env()._get_observations()

    def run(self, index: int, controller: PickPlaceController, max_steps: int) -> Episode:
        raw = self.reset(index)
        controller.reset()
        actions, states, sims, joints = [], [], [], []
        success = False
        for _ in range(int(max_steps)):
            a = controller.act(raw)
            states.append(proprio_state(raw))
            sims.append(np.array(self.env.get_sim_state(), dtype=np.float64))
            joints.append(np.asarray(raw.get("robot0_joint_pos", np.zeros(7)), dtype=np.float64))
            actions.append(a)
            raw, _, done, _ = self.env.step(a)
            if done:  # LIBERO: the goal predicates hold
                success = True
                break
        return Episode(
            int(index),
            np.array(actions, dtype=np.float64).reshape(-1, 7),
            success,
            np.array(states, dtype=np.float32).reshape(-1, 8),
            np.array(sims),
            np.array(joints),
            list(controller.phase_log),
        )

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:
            pass


def run_controller(
    gen: GenerationEnv, goal: PickPlace, index: int, max_steps: int, params: ControllerParams | None = None
) -> Episode:
    """One scripted episode from initial state ``index`` (stops at success or ``max_steps``)."""
    return gen.run(index, PickPlaceController(goal, params), max_steps)


# ---------------------------------------------------------------------------------- verification
@dataclass
class Replay:
    """Open-loop replay of an action sequence through `LiberoSim`."""

    success: bool
    success_step: int | None  # index of the action at which the task succeeded
    images: np.ndarray  # uint8 [T, V, S, S, 3], raw OpenGL frames before each action (T = success_step + 1)
    states: np.ndarray  # float32 [T, 8] before each action


def make_replay_sim(
    suite: str,
    task_id: int,
    image_size: int,
    num_noop_steps: int = 10,
    max_episode_steps: int | None = None,
    render_backend: str = "auto",
) -> LiberoSim:
    return LiberoSim(
        num_envs=1,
        suite=suite,
        task_id=task_id,
        split="all",
        image_flip="none",
        image_size=image_size,
        camera_names=tuple(c for c, _ in CAMERAS),
        num_noop_steps=num_noop_steps,
        max_episode_steps=max_episode_steps,
        render_backend=render_backend,
    )


def replay(sim: LiberoSim, index: int, actions: np.ndarray) -> Replay:
    """``sim.reset(index)`` then ``sim.step`` per action; the observation before each action is
    recorded; stops at the first success (LiberoSim resets the env then)."""
    import torch

    obs = sim.reset(int(index))
    images, states = [], []
    acts = torch.from_numpy(np.asarray(actions, dtype=np.float64))  # float64: the generated values exactly
    for t in range(len(acts)):
        images.append(obs.image[0].cpu().numpy())
        states.append(obs.state[0].cpu().numpy())
        res = sim.step(acts[t][None])
        if bool(res.success[0]):
            return Replay(True, t, np.stack(images), np.stack(states))
        if bool(res.done[0]):
            break
        obs = res.obs
    return Replay(
        False,
        None,
        np.stack(images) if images else np.zeros((0,), np.uint8),
        np.stack(states) if states else np.zeros((0, 8), np.float32),
    )


# ---------------------------------------------------------------------------------- writing
@dataclass
class Demo:
    """A verified demo, ready to write: ``T`` steps, observation t before action t."""

    index: int  # LIBERO initial state (the file key is demo_<index>)
    actions: np.ndarray  # float64 [T, 7]
    images: np.ndarray  # uint8 [T, 2, S, S, 3] (agentview, eye in hand), raw OpenGL
    states: np.ndarray  # float32 [T, 8]
    sim_states: np.ndarray  # float64 [T, D]
    joint_states: np.ndarray  # float64 [T, 7]
    init_state: np.ndarray  # float64 [D]


def task_path(root: str | Path, task: TaskInfo) -> Path:
    """``<root>/<suite>/<task name>_demo.hdf5``: where `builder.py` looks."""
    return Path(root) / task.suite / f"{task.name}_demo.hdf5"


def write_task_file(
    path: str | Path, task: TaskInfo, demos: Sequence[Demo], env_args: dict, meta: dict | None = None
) -> Path:
    """Write ``demos`` into ``path`` (official LIBERO layout), keeping demos already in the file
    under other keys; atomic: a temporary file in the same folder, then ``os.replace``."""
    import shutil

    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if path.exists():
            shutil.copyfile(path, tmp)
        with h5py.File(tmp, "a") as f:
            data = f.require_group("data")
            bddl = Path(task.bddl_file)
            data.attrs["env_name"] = "Libero_Tabletop_Manipulation"
            data.attrs["problem_info"] = json.dumps(
                {
                    "problem_name": "libero_tabletop_manipulation",
                    "domain_name": "robosuite",
                    "language_instruction": task.language,
                }
            )
            data.attrs["macros_image_convention"] = "opengl"
            data.attrs["bddl_file_name"] = str(bddl)
            data.attrs["bddl_file_content"] = bddl.read_text()
            data.attrs["env_args"] = json.dumps(env_args)
            data.attrs["mmrl_generator"] = json.dumps(
                {"source": "datasets/libero_demos/scripted.py", "obs_before_action": True, **(meta or {})}
            )
            for d in demos:
                key = f"demo_{d.index}"
                if key in data:
                    del data[key]
                n = len(d.actions)
                ep = data.create_group(key)
                obs = ep.create_group("obs")
                ee = np.asarray(d.states[:, :6], dtype=np.float64)
                obs.create_dataset("ee_states", data=ee)
                obs.create_dataset("ee_pos", data=ee[:, :3])
                obs.create_dataset("ee_ori", data=ee[:, 3:])
                obs.create_dataset("gripper_states", data=np.asarray(d.states[:, 6:8], dtype=np.float64))
                obs.create_dataset("joint_states", data=np.asarray(d.joint_states, dtype=np.float64))
                for v, (_, name) in enumerate(CAMERAS):
                    obs.create_dataset(
                        name,
                        data=np.ascontiguousarray(d.images[:, v]),
                        dtype=np.uint8,
                        compression="gzip",
                        compression_opts=4,
                        chunks=(1, *d.images.shape[2:]),
                    )
                ep.create_dataset("actions", data=np.asarray(d.actions, dtype=np.float64))
                ep.create_dataset("states", data=np.asarray(d.sim_states, dtype=np.float64))
                ep.create_dataset(
                    "robot_states",
                    data=np.concatenate(
                        [np.asarray(d.states[:, 6:8], np.float64), np.asarray(d.states[:, :3], np.float64)], axis=1
                    ),
                )
                rewards, dones = np.zeros(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8)
                rewards[-1] = dones[-1] = 1
                ep.create_dataset("rewards", data=rewards)
                ep.create_dataset("dones", data=dones)
                ep.attrs["num_samples"] = n
                ep.attrs["init_state"] = np.asarray(d.init_state, dtype=np.float64)
                ep.attrs["init_state_index"] = int(d.index)
            keys = [k for k in data.keys() if k.startswith("demo_")]
            data.attrs["num_demos"] = len(keys)
            data.attrs["total"] = int(sum(int(data[k]["actions"].shape[0]) for k in keys))
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


# ---------------------------------------------------------------------------------- the pipeline
def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=total, unit="demo", disable=not enabled, file=sys.stderr)


def generate(
    suite: str,
    task_ids: Sequence[int] | None,
    episodes: int,
    root: str | Path,
    image_size: int = 128,
    start: int = 0,
    num_noop_steps: int = 10,
    max_episode_steps: int | None = None,
    params: ControllerParams | None = None,
    render_backend: str = "auto",
    progress: bool = True,
    log=None,
) -> dict:
    """Scripted, verified demos of ``episodes`` initial states (``start`` .. ``start+episodes-1``)
    per task, written to ``<root>/<suite>/<task name>_demo.hdf5``.

    Returns ``{task_id: {"task", "attempted", "controller_success", "verified", "steps",
    "controller_steps", "replay_step_mismatch", "max_state_diff", "seconds", "seconds_per_demo",
    "file"}}``; ``steps`` lists the lengths of the written demos, ``controller_steps`` the
    controller's episode lengths (None where it failed).
    """
    if suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite {suite!r}; valid suites: {', '.join(SUITES)}")
    check_assets()
    tasks = list_tasks(suite)
    ids = list(range(len(tasks))) if task_ids is None else [int(i) for i in task_ids]
    bad = [i for i in ids if not 0 <= i < len(tasks)]
    if bad or not ids:
        raise ValueError(f"task ids must be in 0..{len(tasks) - 1} for {suite!r}, got {ids}")
    goals = {i: task_goal(tasks[i]) for i in ids}  # fail before running anything
    n_states = len(load_init_states(suite, ids[0]))
    if episodes < 1 or start < 0 or start + episodes > n_states:
        raise ValueError(
            f"need episodes >= 1 and start + episodes <= {n_states} initial states, "
            f"got start={start}, episodes={episodes}"
        )
    max_steps = int(max_episode_steps or MAX_EPISODE_STEPS[suite])
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    bar = _progress(len(ids) * episodes * 2, progress)
    stats: dict[int, dict] = {}
    for i in ids:
        task, t0 = tasks[i], time.perf_counter()
        gen = GenerationEnv(task, image_size, num_noop_steps=num_noop_steps, render_backend=render_backend)
        runs = []
        try:
            for k in range(start, start + episodes):
                runs.append(run_controller(gen, goals[i], k, max_steps, task_params(task, params)))
                if bar is not None:
                    bar.set_postfix_str(f"task {i} init {k}: {'ok' if runs[-1].success else 'fail'}")
                    bar.update(1)
        finally:
            gen.close()
        ok = [r for r in runs if r.success]
        if bar is not None:
            bar.update(len(runs) - len(ok))
        demos, mismatch, diffs = [], 0, []
        if ok:
            sim = make_replay_sim(suite, i, image_size, num_noop_steps, max_steps, render_backend)
            try:
                for r in ok:
                    rep = replay(sim, r.index, r.actions)
                    if rep.success:
                        t = rep.success_step + 1
                        mismatch += int(t != r.steps)
                        diffs.append(float(np.abs(rep.states - r.states[:t]).max()))
                        demos.append(
                            Demo(
                                r.index,
                                r.actions[:t],
                                rep.images,
                                rep.states,
                                r.sim_states[:t],
                                r.joint_states[:t],
                                gen.init_states[r.index],
                            )
                        )
                    if bar is not None:
                        bar.set_postfix_str(f"task {i} replay {r.index}: {'ok' if rep.success else 'FAILED'}")
                        bar.update(1)
            finally:
                sim.close()
        path = None
        if demos:
            args = {
                "type": 1,
                "env_name": "Libero_Tabletop_Manipulation",
                "problem_name": "libero_tabletop_manipulation",
                "bddl_file": str(task.bddl_file),
                "env_kwargs": {
                    **offscreen_env_kwargs(task, image_size, [c for c, _ in CAMERAS]),
                    "controller": "OSC_POSE",
                    "num_noop_steps": num_noop_steps,
                    "max_episode_steps": max_steps,
                },
            }
            path = write_task_file(
                task_path(root, task),
                task,
                demos,
                args,
                {
                    "controller_params": dataclasses.asdict(task_params(task, params)),
                    "goal": [goals[i].obj, goals[i].target],
                },
            )
        seconds = time.perf_counter() - t0
        stats[i] = {
            "task": task.name,
            "attempted": len(runs),
            "controller_success": len(ok),
            "verified": len(demos),
            "steps": [len(d.actions) for d in demos],
            "controller_steps": [r.steps if r.success else None for r in runs],
            "replay_step_mismatch": mismatch,
            "max_state_diff": max(diffs) if diffs else None,
            "seconds": round(seconds, 1),
            "seconds_per_demo": round(seconds / len(demos), 1) if demos else None,
            "file": None if path is None else str(path),
        }
        log(
            f"{suite} task {i}: attempted {len(runs)}, controller successes {len(ok)}, verified demos "
            f"{len(demos)} ({seconds:.0f} s){'' if path is None else ' -> ' + str(path)}"
        )
    if bar is not None:
        bar.close()
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Scripted, replay-verified LIBERO demos in the official HDF5 layout.")
    p.add_argument("--suite", default="libero_spatial", choices=SUITES)
    p.add_argument("--tasks", type=int, nargs="*", default=None, help="task ids (default: all of the suite)")
    p.add_argument("--episodes", type=int, default=3, help="initial states per task")
    p.add_argument("--start", type=int, default=0, help="first LIBERO initial-state index")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--num-noop-steps", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=None, help="step limit (default: the suite's max_episode_steps)")
    p.add_argument("--render-backend", default="auto")
    p.add_argument("--out", type=Path, required=True, help="root folder; files go to <out>/<suite>/<task>_demo.hdf5")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    try:
        stats = generate(
            args.suite,
            args.tasks,
            args.episodes,
            args.out,
            image_size=args.image_size,
            start=args.start,
            num_noop_steps=args.num_noop_steps,
            max_episode_steps=args.max_steps,
            render_backend=args.render_backend,
            progress=not args.no_progress,
        )
    except (FileNotFoundError, UnsupportedTaskError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps({"suite": args.suite, "image_size": args.image_size, "tasks": {str(k): v for k, v in stats.items()}})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
