"""Meta-World (Farama ``metaworld`` 3.x, MuJoCo, the Sawyer arm): its 50 manipulation tasks, one at a
time (``metaworld:pick-place-v3``) or as the MT10 / MT50 multi-task benchmarks (``metaworld:MT10``).
Needs ``mmrl[metaworld]``.

Tasks and goal variations
    Each Meta-World task varies its object and goal positions: a *variation* is one frozen draw of them
    (Meta-World's ``Task``, 50 per task). The training variations are Meta-World's own
    (``MT1(task, seed=task_seed).train_tasks``, what MT1 / MT10 / MT50 train and are evaluated on in the
    multi-task literature); the held-out ones (``split="heldout"``) are 50 more per task drawn the same
    way under another seed (``task_seed + HELDOUT_SEED_OFFSET``), never seen in training: evaluation
    simulators use them (`MetaWorldSim.eval_kwargs`). ``split="train"`` evaluates on the training
    variations, as the MT literature reports.
    A reset with seed ``s`` picks the task ``tasks[s % T]`` and its variation ``(s // T) % 50``, as
    LIBERO's multi-task simulator picks task and init state, so GRPO groups (one seed per group) share
    both, and held-out episode e of evaluation is always the same task and variation.

Observations
    ``state`` float ``[N, 39]``: Meta-World's observation (hand position, gripper opening, two objects'
    positions and quaternions, the previous frame's 18 numbers, the goal position). ``instruction``:
    each env's task as a sentence (`INSTRUCTIONS`), ``meta[i]["task"]`` its task name (success per task
    in logs and `mmrl eval`). ``image``: all zeros unless ``render_images=True``, which renders the
    ``camera`` (default ``corner``) offscreen at ``image_size`` px through MuJoCo's OpenGL. Without
    ``MUJOCO_GL`` set, OSMesa (software; ``apt-get install libosmesa6``) renders where libOSMesa is
    installed, else EGL (`default_gl`): 13-15 env steps/s at
    64 px in one env on a CPU core (Mesa's EGL: 12), against about 1,200 without rendering, so pixels are for a
    GPU machine (``MUJOCO_GL=egl``) and state + instruction is the CPU path.

Actions, rewards, success
    ``[N, 4]`` in ``[-1, 1]``: the hand's displacement (x, y, z) and the gripper effort, as Meta-World
    takes them. The reward is Meta-World's v2 shaped reward (0 to 10 per step), or with
    ``reward="success"`` 1 at the step the task first succeeds (`REWARDS`). ``success`` is the
    env's own ``info["success"]`` reached at any step of the episode (`PROTOCOL`); with
    ``terminate_on_success`` (evaluation, as Meta-World's ``evaluation.evaluation`` does) the episode
    ends at the first success; in training it runs to the time limit by default, since ending it would
    cut the reward that success keeps earning. ``stagger_episodes`` (training only) cuts each env's
    first episode at a random length, as the gym adapter's does, so fixed-length rollouts of envs
    reset together cover every phase of an episode.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from mmrl.errors import UserError
from mmrl.simulator import Observation

from .gym_env import ContractEnv, GymSim

#: Meta-World's evaluation protocol, pinned (tests/simulators/test_metaworld.py fails when one drifts).
#: Sources: metaworld 3.1.1 (Farama), ``metaworld/sawyer_xyz_env.py`` and ``metaworld/evaluation.py``;
#: Yu et al., "Meta-World" (CoRL 2019), Sec. 4.
PROTOCOL = {
    "max_episode_steps": 500,  # SawyerXYZEnv.max_path_length: every task's time limit
    "success": "info['success'] at any step",  # evaluation(): an episode counts once it succeeded
    "terminate_on_success": True,  # evaluation() toggles AutoTerminateOnSuccessWrapper on
    "episodes_per_task": 50,  # evaluation(num_episodes=50): one per goal variation
    "variations_per_task": 50,  # _N_GOALS: Task objects per environment
    "goal_observable": True,  # MT benchmarks (_MT_OVERRIDE): the goal is in the observation
    "reward_function_version": "v2",  # _init_each_env's default
    "state_dim": 39,
    "action_dim": 4,
}
#: the held-out variations' task seed, relative to the training ones' (ML1 draws its test goals at +1;
#: a larger offset keeps them apart from every training seed a user is likely to pick)
HELDOUT_SEED_OFFSET = 1_000_003
BENCHMARKS = ("MT10", "MT50")
#: ``reward``: Meta-World's own shaped reward (``dense``, reward_function_version v2), or 1 at the step
#: the task first succeeds and 0 otherwise (``success``: the binary task reward VLA RL trains on, as
#: SimpleVLA-RL and RLinf do on LIBERO; the held-out figure is success either way)
REWARDS = ("dense", "success")

#: one sentence per task: what a person would tell the robot (mmrl's wording, from each task's goal)
INSTRUCTIONS = {
    "assembly-v3": "pick up the nut and place it onto the peg",
    "basketball-v3": "dunk the ball into the basket",
    "bin-picking-v3": "move the puck from one bin to the other",
    "box-close-v3": "grasp the lid and close the box with it",
    "button-press-topdown-v3": "press the button from the top",
    "button-press-topdown-wall-v3": "press the button behind the wall from the top",
    "button-press-v3": "press the button in front of you",
    "button-press-wall-v3": "press the button behind the wall",
    "coffee-button-v3": "push the button on the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "rotate the dial",
    "disassemble-v3": "pick the nut off the peg",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door by turning the lock",
    "door-open-v3": "open the door",
    "door-unlock-v3": "unlock the door by turning the lock",
    "hand-insert-v3": "insert the gripper into the hole",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "hammer-v3": "hammer the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg out of the hole",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the cabinet",
    "plate-slide-side-v3": "slide the plate into the cabinet from the side",
    "plate-slide-back-v3": "slide the plate out of the cabinet",
    "plate-slide-back-side-v3": "slide the plate out of the cabinet to the side",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "peg-unplug-side-v3": "unplug the peg sideways",
    "soccer-v3": "kick the ball into the goal",
    "stick-push-v3": "grasp the stick and push the box with it",
    "stick-pull-v3": "grasp the stick and pull the box with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck to the goal behind the wall",
    "push-back-v3": "push the puck back to the goal",
    "reach-v3": "reach the goal position",
    "reach-wall-v3": "reach the goal position behind the wall",
    "shelf-place-v3": "pick up the puck and place it on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}


def _metaworld():
    try:
        import metaworld
    except ImportError as exc:
        raise ImportError("Meta-World is not installed. Fix: pip install 'mmrl[metaworld]'", name="metaworld") from exc
    return metaworld


def resolve_tasks(task: str | list[str]) -> list[str]:
    """The Meta-World task names of ``task``: one name (``pick-place-v3``; ``pick-place`` also works),
    a list of names, or a benchmark (``MT10``, ``MT50``); an unknown name is one `UserError` line
    naming the closest ones."""
    import difflib

    names = list(INSTRUCTIONS)
    if isinstance(task, str) and task.upper() in BENCHMARKS:
        mw = _metaworld()
        return list(mw.env_dict.MT10_V3) if task.upper() == "MT10" else list(mw.ALL_V3_ENVIRONMENTS)
    wanted = [task] if isinstance(task, str) else list(task)
    out = []
    for name in wanted:
        full = name if name in INSTRUCTIONS else f"{name}-v3"
        if full not in INSTRUCTIONS:
            close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
            raise UserError(
                f"simulator 'metaworld': task {name!r} is not a Meta-World task"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
                + f"; use one of its {len(names)} tasks (e.g. pick-place-v3), a list of them, MT10 or MT50"
            )
        out.append(full)
    if len(set(out)) != len(out):
        raise UserError(f"simulator 'metaworld': task names repeat in {wanted}")
    return out


def variations(tasks: list[str], split: str, task_seed: int) -> dict[str, list]:
    """Per task, its 50 goal variations (Meta-World ``Task`` objects) of ``split``."""
    if split not in ("train", "heldout"):
        raise UserError(f"simulator 'metaworld': split must be 'train' or 'heldout', got {split!r}")
    seed = task_seed if split == "train" else task_seed + HELDOUT_SEED_OFFSET
    return {name: _task_variations(name, seed) for name in tasks}


@functools.lru_cache(maxsize=256)
def _task_variations(name: str, seed: int) -> list:
    """Meta-World draws a task's variations by resetting its env 50 times (about 2 s): once per process."""
    return list(_metaworld().MT1(name, seed=seed).train_tasks)


class MetaWorldTasksEnv(gym.Env):
    """One env slot over several Meta-World tasks: each reset picks the task and its variation from
    the seed (module docstring) and runs that task's env (built on first use, one per task)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self,
        tasks: list[str],
        pools: dict[str, list],
        max_episode_steps: int,
        terminate_on_success: bool,
        render_images: bool,
        image_size: int,
        camera: str,
        reward: str = "dense",
    ):
        self.tasks, self.pools, self.reward = tasks, pools, reward
        self.max_episode_steps, self.terminate_on_success = max_episode_steps, terminate_on_success
        self.render_mode = "rgb_array" if render_images else None
        self.image_size, self.camera = image_size, camera
        self._envs: dict[str, Any] = {}
        self.task_index, self._seed_counter = 0, 0
        self._succeeded, self._steps = False, 0
        self.action_space = spaces.Box(-1.0, 1.0, (PROTOCOL["action_dim"],), np.float32)
        self.observation_space = spaces.Box(-np.inf, np.inf, (PROTOCOL["state_dim"],), np.float64)

    def _key(self, name: str) -> tuple:
        return (name, self.render_mode, self.camera, self.image_size)

    def _env(self, name: str):
        """This slot's env of task ``name``: the one it holds, else an idle one of this process
        (`_IDLE`), else a new one; the env of the task it leaves goes idle (at most `IDLE_PER_TASK`
        per task, the others closed). A slot holds one env, so memory follows the number of slots,
        not slots x tasks (MT10 with 140 slots built 1,400 envs of about 19 MB each before)."""
        if name in self._envs:
            return self._envs[name]
        for old, env in self._envs.items():  # the task this slot leaves
            idle = _IDLE.setdefault(self._key(old), [])
            idle.append(env) if len(idle) < IDLE_PER_TASK else _close(env)
        self._envs.clear()
        idle = _IDLE.get(self._key(name))
        if idle:
            env = idle.pop()
        else:
            cls = _metaworld().ALL_V3_ENVIRONMENTS[name]
            size = self.image_size
            kw = dict(render_mode=self.render_mode, camera_name=self.camera, width=size, height=size)
            env = cls(reward_function_version=PROTOCOL["reward_function_version"], **kw)
            LIVE_ENVS[0] += 1
        self._envs[name] = env
        return env

    @property
    def current(self):
        return self._env(self.tasks[self.task_index])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is None:  # an auto reset: the next seed of this slot's own sequence
            seed = self._seed_counter
        self._seed_counter = int(seed) + 1_000_000_007  # distinct from any reset seed a run passes
        t = int(seed) % len(self.tasks)
        name = self.tasks[t]
        pool = self.pools[name]
        env = self._env(name)
        env.set_task(pool[(int(seed) // len(self.tasks)) % len(pool)])
        env._partially_observable = not PROTOCOL["goal_observable"]  # the MT benchmarks' observation
        self.task_index, self._succeeded, self._steps = t, False, 0
        obs, info = env.reset()
        return np.asarray(obs, dtype=np.float64), {**info, "success": 0.0}

    def step(self, action):
        obs, reward, _, truncated, info = self.current.step(np.asarray(action, dtype=np.float32))
        self._steps += 1
        was_succeeded = self._succeeded
        self._succeeded |= bool(info.get("success", 0.0))
        if self.reward == "success":  # 1 at the step the task first succeeds, else 0
            reward = float(bool(info.get("success", 0.0)) and not was_succeeded)
        terminated = self.terminate_on_success and self._succeeded
        truncated = bool(truncated) or self._steps >= self.max_episode_steps
        return (
            np.asarray(obs, dtype=np.float64),
            float(reward),
            terminated,
            truncated and not terminated,
            {"success": float(self._succeeded)},
        )

    def render(self):
        return self.current.render()

    def close(self):
        for env in self._envs.values():
            _close(env)
        self._envs.clear()


#: idle Meta-World envs of this process by (task, render mode, camera, size), shared by every slot
#: and simulator in it (`MetaWorldTasksEnv._env`); `LIVE_ENVS` counts the envs built and not closed
_IDLE: dict[tuple, list] = {}
IDLE_PER_TASK = 2
LIVE_ENVS = [0]


def _close(env) -> None:
    env.close()
    LIVE_ENVS[0] -= 1


class MetaWorldContractEnv(ContractEnv):
    """`ContractEnv` whose observation also says which task the episode runs (``task``)."""

    def __init__(self, env: MetaWorldTasksEnv, render_images: bool):
        super().__init__(env, "metaworld", render_images)
        self.observation_space = spaces.Dict(
            {**self.observation_space.spaces, "task": spaces.Box(0, len(env.tasks), (), np.int64)}
        )

    def _observe(self, obs: Any) -> dict[str, np.ndarray]:
        out = super()._observe(obs)
        out["task"] = np.asarray(self.env.unwrapped.task_index, dtype=np.int64)
        return out

    def _frame(self) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(self.env.render())[..., :3], dtype=np.uint8)


def default_gl() -> str:
    """The MuJoCo GL backend to render with when ``MUJOCO_GL`` is unset: OSMesa (software, no display
    or GPU needed) where libOSMesa is installed, else EGL (a GPU's driver, or Mesa's)."""
    import ctypes.util

    return "osmesa" if ctypes.util.find_library("OSMesa") else "egl"


def _make(tasks, pools, max_steps, terminate, render_images, image_size, camera, reward) -> gym.Env:
    env = MetaWorldTasksEnv(tasks, pools, max_steps, terminate, render_images, image_size, camera, reward)
    if not render_images:
        return MetaWorldContractEnv(env, render_images)
    try:
        env.reset(seed=0)  # builds the first task's env and its OpenGL context
        env.render()
        return MetaWorldContractEnv(env, render_images)
    except Exception as exc:  # any failure here means: no OpenGL rendering on this machine
        raise UserError(
            f"simulator 'metaworld': MuJoCo could not render (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Fix: MUJOCO_GL=osmesa needs "
            "libOSMesa (apt-get install libosmesa6), MUJOCO_GL=egl needs an EGL driver (a GPU's); or "
            "render_images=False (state + instruction)"
        ) from None


class MetaWorldSim(GymSim):
    """Meta-World tasks (one, several, MT10, MT50) with an instruction per task (module docstring)."""

    name_arg = "task"  # `mmrl check simulator metaworld:pick-place-v3`, `metaworld:MT10`
    task_arg = "task"
    passthrough_arg = None
    #: held-out goal variations, episodes ending at the first success (Meta-World's evaluation)
    eval_kwargs = {"split": "heldout", "terminate_on_success": True, "stagger_episodes": False}

    def __init__(
        self,
        num_envs: int = 4,
        task: str | list[str] = "reach-v3",
        split: str = "train",
        task_seed: int = 0,
        render_images: bool = False,
        image_size: int = 64,
        camera: str = "corner",
        vectorization: str = "sync",
        device: str = "cpu",
        seed: int = 0,
        max_episode_steps: int = PROTOCOL["max_episode_steps"],
        terminate_on_success: bool = False,
        stagger_episodes: bool = False,
        reward: str = "dense",
    ):
        if reward not in REWARDS:
            raise UserError(f"simulator 'metaworld': reward must be one of {', '.join(REWARDS)}, got {reward!r}")
        if num_envs < 1 or image_size < 1:
            raise ValueError(f"MetaWorldSim: num_envs and image_size must be positive, got {num_envs}, {image_size}")
        if not 1 <= int(max_episode_steps) <= PROTOCOL["max_episode_steps"]:
            raise UserError(
                f"simulator 'metaworld': max_episode_steps must be 1..{PROTOCOL['max_episode_steps']} (Meta-World's "
                f"own limit), got {max_episode_steps}"
            )
        self.tasks = resolve_tasks(task)
        self.env_id = f"metaworld:{task if isinstance(task, str) else ','.join(self.tasks)}"
        self.instruction = INSTRUCTIONS[self.tasks[0]] if len(self.tasks) == 1 else None
        self.suite = task.upper() if isinstance(task, str) and task.upper() in BENCHMARKS else None
        if render_images and not os.environ.get("MUJOCO_GL"):
            os.environ["MUJOCO_GL"] = default_gl()
        pools = variations(self.tasks, split, int(task_seed))  # once per process (`_task_variations`)
        fn = functools.partial(
            _make, self.tasks, pools, int(max_episode_steps), bool(terminate_on_success), bool(render_images),
            int(image_size), camera, reward,
        )  # fmt: skip
        self._start(
            [fn] * int(num_envs), image_size, vectorization, render_images, device, seed, max_episode_steps,
            "success", stagger_episodes,
        )  # fmt: skip

    @classmethod
    def suite_tasks(cls, task: str | list[str] = "reach-v3", **_) -> list:
        return resolve_tasks(task)

    def _row(self, obs: Any, i: int) -> dict:
        t = obs["task"][i] if isinstance(obs, dict) else obs[i]["task"]
        return {"task": self.tasks[int(t)]}

    def _current_row(self, current: Observation, i: int) -> dict:
        return dict(current.meta[i]) if current.meta else {}

    def _labelled(self, image, state, rows: list[dict]) -> Observation:
        return Observation(image, [INSTRUCTIONS[r["task"]] for r in rows], state, meta=rows)

    def get_state(self) -> dict:
        """No snapshots: Meta-World's physics does not come back exactly from a copy of its MjData and
        attributes (measured: the next steps' rewards differ in the third digit), so none rather than
        wrong ones (collocated offloading and the exploration probe's restore then go without)."""
        raise NotImplementedError(
            "MetaWorldSim has no get_state / set_state: restoring a copy of its physics does not reproduce "
            "the next steps exactly"
        )

    def set_state(self, state: dict) -> None:
        self.get_state()


# GymSim declares its signature without its `**unknown`; this class's own arguments are its own
MetaWorldSim.__signature__ = inspect.signature(MetaWorldSim.__init__).replace(
    parameters=[p for name, p in inspect.signature(MetaWorldSim.__init__).parameters.items() if name != "self"]
)
