"""GymSim: any registered gymnasium environment id as an mmrl simulator (needs ``mmrl[gym]``).

``GymSim(num_envs, env_id="Pendulum-v1", ...)`` runs ``num_envs`` copies of ``gymnasium.make(env_id)``
in a gymnasium vector env (``vectorization="sync"``: `SyncVectorEnv` in this process;
``"async"``: `AsyncVectorEnv`, one worker process per env) with same-step auto reset
(``AutoresetMode.SAME_STEP``), and maps it onto the contract in `mmrl.simulator`:

Observations
    ``image`` uint8 ``[N, image_size, image_size, 3]``: each env's ``render()`` frame
    (``render_mode="rgb_array"``). MuJoCo envs render at ``image_size`` itself (``width`` and
    ``height`` passed to ``gymnasium.make`` unless ``env_kwargs`` sets them): rendering 480 px frames
    to shrink them costs most of an env step. Other envs' frames (classic control draws 500 or 600 px
    with pygame) are resized with antialiased bilinear interpolation (non-square frames are
    stretched to a square). With ``render_images=False`` nothing is rendered and ``image`` is all
    zeros (same shape; ``has_images = False``), which is much faster for state-only policies.
    Rendering classic-control envs needs ``pygame`` (``pip install "gymnasium[classic-control]"``).
    ``state`` float ``[N, D]``: the gym observation flattened with
    ``gymnasium.spaces.utils.flatten`` (a Box is reshaped to a vector, Discrete becomes one-hot,
    Dict / Tuple are concatenated); ``state_dim = flatdim(observation_space)``.
    ``instruction``: the ``instruction`` argument, default
    ``"control the <env_id> environment to maximise reward"``.

Actions
    float ``[N, A]`` in ``[-1, 1]`` (out-of-range values are clipped, NaN / inf raise ``ValueError``):
    Box: mapped linearly, ``-1 -> low`` and ``1 -> high`` (``A = prod(shape)``; infinite bounds
    raise ``ValueError``: wrap the env so its action space has finite bounds). Discrete(n): ``A = 1``
    and ``[-1, 1]`` is cut into ``n`` equal bins, ``floor((a + 1) / 2 * n)`` clamped to ``n - 1``
    (so -1 is the first action and 1 the last). MultiDiscrete: the same per dimension. MultiBinary:
    ``a >= 0`` is 1. Any other space raises ``NotImplementedError`` naming it.

Rewards and flags
    ``reward`` is the env reward (summed over the executed steps of a chunk); ``terminated`` /
    ``truncated`` are the env's (the time limit is ``max_episode_steps``, default the env spec's);
    ``success`` is ``info[success_key]`` of the step (e.g. ``success_key="is_success"`` for
    gymnasium-robotics tasks); with ``success_key=None`` (the default) the task defines no success
    (``has_success = False``) and training and evaluation report the episode return.

Auto reset and chunks
    An env whose episode ends is reset in the same call (SAME_STEP): the returned observation is the
    new episode's first one and ``final_obs`` holds the finished episode's last observation (image
    rendered before the reset). Auto resets draw from each env's own ``np_random``, which
    ``reset(seed)`` (and the constructor's ``seed``) seeds, so they are reproducible.
    ``step_chunk`` masks envs that ended inside the chunk: every env is wrapped in a small wrapper
    that, given an all-NaN action row, does not step its env and returns the previous observation with
    reward 0 and no flags. This works the same in the sync and async modes, so an env that ends
    mid-chunk really ignores the rest of its chunk (its new episode does not advance).

Staggered episodes
    ``stagger_episodes=True`` (training only: evaluation sims never stagger) cuts each env's first
    episode, as a time limit would (``truncated``, so the trainer bootstraps it), at a length drawn
    from the constructor's ``seed`` (`first_episode_limits`); later episodes run to the limit. Envs
    reset together otherwise stay in step wherever episodes never end early (Swimmer, HalfCheetah),
    and every fixed-length rollout of T steps then holds one T-step phase of the episode.

Snapshots
    ``get_state`` pickles the sub-envs into bytes and ``set_state`` unpickles them (sync mode only), so
    every wrapper's state (the time limit's step count, ...) and each env's ``np_random`` come back.
    pygame render surfaces are shared by reference, not copied, since rendering redraws them fully.
    MuJoCo envs: gymnasium's are ``EzPickle`` (a plain pickle rebuilds a fresh env from the
    constructor arguments), so they are pickled attribute by attribute instead; each ``MjData`` is
    copied whole (``mj_copyData``), while the ``MjModel`` and the renderer (an OpenGL context) are
    shared, the renderer pointed at the restored ``MjData``. An env that changes its ``MjModel``
    while it runs (domain randomisation of masses, ...) is therefore not restored exactly. In async
    mode, when an env cannot be pickled, or when it holds another ``EzPickle`` object (Box2D,
    Atari: state in C objects pickle cannot copy), ``get_state`` raises ``NotImplementedError``.

MuJoCo rendering
    Each MuJoCo env renders through its own OpenGL context (made current before each frame). With no
    ``MUJOCO_GL``, ``DISPLAY`` or ``WAYLAND_DISPLAY`` set, ``MUJOCO_GL`` is set to ``egl`` (gymnasium
    would try glfw, which fails late without a display); set ``MUJOCO_GL=osmesa`` where there is no
    EGL. gymnasium aims a MuJoCo camera at the pose of the env's first frame, so the first frame is
    rendered at the model's initial pose (``init_qpos``): every env, in every run, gets the same view.
"""

from __future__ import annotations

import copy
import copyreg
import difflib
import functools
import inspect
import io
import os
import pickle
from typing import Any

import gymnasium as gym  # a missing gymnasium is reported by the registry with `pip install 'mmrl[gym]'`
import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from gymnasium.utils import EzPickle

from mmrl.errors import UserError
from mmrl.simulator import Observation, Simulator, StepResult


# ---------------------------------------------------------------------------- action mapping
def action_dim_of(space: spaces.Space, env_id: str = "the env") -> int:
    """Width ``A`` of the contract action ``[N, A]`` for a gym action space (raises if unsupported)."""
    if isinstance(space, spaces.Box):
        if not (np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high))):
            raise ValueError(
                f"GymSim: {env_id} has a Box action space with infinite bounds ({space!r}); contract "
                "actions in [-1, 1] are mapped linearly to [low, high], which needs finite bounds. Wrap "
                "the env in a gymnasium.ActionWrapper whose action_space is a bounded Box (and register "
                "it under its own id, or pass that id as env_id)."
            )
        return int(np.prod(space.shape, dtype=np.int64))
    if isinstance(space, spaces.Discrete):
        return 1
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.size)
    if isinstance(space, spaces.MultiBinary):
        return int(np.prod(space.shape, dtype=np.int64))
    raise NotImplementedError(
        f"GymSim: {env_id} has action space {space!r} ({type(space).__name__}), which is not "
        "supported; supported action spaces: Box (finite bounds), Discrete, MultiDiscrete, MultiBinary. "
        "Wrap the env in a gymnasium.ActionWrapper that exposes one of these."
    )


def _bins(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Index of the bin holding ``a`` in ``[-1, 1]`` cut into ``n`` equal bins (``1`` -> ``n - 1``)."""
    idx = np.floor((a.astype(np.float64) + 1.0) / 2.0 * n).astype(np.int64)
    return np.clip(idx, 0, n - 1)


def to_env_action(space: spaces.Space, action: np.ndarray) -> Any:
    """Map one contract action ``[A]`` in ``[-1, 1]`` (clipped) to an element of ``space``."""
    a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
    if isinstance(space, spaces.Box):
        low = space.low.astype(np.float64).reshape(-1)
        high = space.high.astype(np.float64).reshape(-1)
        x = low + (a + 1.0) / 2.0 * (high - low)
        if np.issubdtype(space.dtype, np.integer):
            x = np.rint(x)
        return np.clip(x, low, high).reshape(space.shape).astype(space.dtype)
    if isinstance(space, spaces.Discrete):
        return np.int64(space.start + _bins(a[:1], np.int64(space.n))[0])
    if isinstance(space, spaces.MultiDiscrete):
        idx = _bins(a, space.nvec.reshape(-1).astype(np.int64)) + space.start.reshape(-1)
        return idx.reshape(space.nvec.shape).astype(space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return (a >= 0).reshape(space.shape).astype(space.dtype)
    action_dim_of(space)  # raises NotImplementedError naming the space
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------- per-env wrapper
class ContractEnv(gym.Wrapper):
    """Per-env adapter run inside the vector env (numpy only, so it is safe in worker processes).

    Action space: Box ``[-1, 1]^A`` float32, mapped by `to_env_action`; an all-NaN row means "skip":
    the env is not stepped and the previous observation is returned with reward 0 and no flags.
    Observation space: Dict with ``state`` (the flattened gym observation, float32) and, when
    rendering, ``frame`` (the ``render()`` image, uint8 ``[H, W, 3]`` at the env's resolution).
    """

    def __init__(self, env: gym.Env, env_id: str, render_images: bool):
        super().__init__(env)
        # the first episode ends (truncated, as by the time limit) after this many steps: GymSim's
        # stagger_episodes sets it; later episodes run to the env's own limit
        self._first_limit: int | None = None
        self._steps = 0
        self._inner_obs_space = env.observation_space
        self._inner_act_space = env.action_space
        self._render_images = render_images
        dim = action_dim_of(env.action_space, env_id)
        try:
            state_dim = spaces.utils.flatdim(env.observation_space)
        except (NotImplementedError, ValueError) as exc:
            raise NotImplementedError(
                f"GymSim: {env_id} has observation space {env.observation_space!r}, which cannot be "
                f"flattened into a state vector ({exc})"
            ) from exc
        self.action_space = spaces.Box(-1.0, 1.0, (dim,), np.float32)
        obs_spaces: dict[str, spaces.Space] = {"state": spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)}
        self._last: dict[str, np.ndarray] | None = None
        if render_images:
            if "rgb_array" not in (env.metadata.get("render_modes") or []):
                raise ValueError(
                    f"GymSim: {env_id} does not support render_mode='rgb_array' (render modes: "
                    f"{env.metadata.get('render_modes')}); pass render_images=False for zero images"
                )
            mujoco_env = "mujoco_renderer" in vars(env.unwrapped)
            if mujoco_env and not any(os.environ.get(v) for v in ("MUJOCO_GL", "DISPLAY", "WAYLAND_DISPLAY")):
                os.environ["MUJOCO_GL"] = "egl"  # gymnasium would try glfw, which fails late without a display
            try:
                env.reset()  # a first frame, to learn the render resolution
                base = env.unwrapped
                if mujoco_env and hasattr(base, "init_qpos") and hasattr(base, "init_qvel"):
                    # gymnasium aims the camera at the pose of the first frame: the same pose in every env
                    base.set_state(base.init_qpos, base.init_qvel)
                frame = self._frame()
            except Exception as exc:  # any failure here means: this env cannot render here
                gl = (
                    f" MuJoCo renders through OpenGL (MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}): set "
                    "MUJOCO_GL=egl (needs libEGL) or MUJOCO_GL=osmesa (needs libOSMesa), or"
                    if mujoco_env
                    else ""
                )
                raise RuntimeError(
                    f"GymSim: {env_id} could not render a frame ({type(exc).__name__}: {exc}).{gl} pass "
                    "render_images=False for zero images"
                ) from exc
            obs_spaces["frame"] = spaces.Box(0, 255, frame.shape, np.uint8)
        self.observation_space = spaces.Dict(obs_spaces)

    def _frame(self) -> np.ndarray:
        viewer = getattr(vars(self.env.unwrapped).get("mujoco_renderer"), "viewer", None)
        if viewer is not None:  # each MuJoCo env has its own OpenGL context: render in this one's
            viewer.make_context_current()
        frame = np.asarray(self.env.render())
        if frame.ndim != 3 or frame.shape[-1] not in (3, 4):
            raise ValueError(f"GymSim: render() returned an array of shape {frame.shape}, expected [H, W, 3]")
        return np.ascontiguousarray(frame[..., :3], dtype=np.uint8)

    def _observe(self, obs: Any) -> dict[str, np.ndarray]:
        out = {"state": np.asarray(spaces.utils.flatten(self._inner_obs_space, obs), dtype=np.float32)}
        if self._render_images:
            out["frame"] = self._frame()
        self._last = out
        return out

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._steps:  # a reset after the first episode: the first-episode cut is spent
            self._first_limit = None
        self._steps = 0
        obs, info = self.env.reset(seed=seed, options=options)
        return self._observe(obs), info

    def close(self):
        """Frees each MuJoCo renderer's GL objects in its own context, then the context. gymnasium
        leaves both to garbage collection, whose order frees the ``MjrContext`` in whichever context
        is current: another env's, whose framebuffers carry the same ids, which then draws black."""
        renderer = vars(self.env.unwrapped).get("mujoco_renderer")
        for viewer in list(getattr(renderer, "_viewers", {}).values()):
            context, con = getattr(viewer, "opengl_context", None), getattr(viewer, "con", None)
            if context is not None and con is not None:
                viewer.make_context_current()
                con.free()
                context.free()
        super().close()

    def step(self, action: np.ndarray):
        action = np.asarray(action)
        if self._last is not None and np.isnan(action).all():  # masked: this env sits out
            return self._last, 0.0, False, False, {}
        obs, reward, terminated, truncated, info = self.env.step(to_env_action(self._inner_act_space, action))
        self._steps += 1
        if self._first_limit is not None and self._steps >= self._first_limit:
            truncated = True
        return self._observe(obs), float(reward), bool(terminated), bool(truncated), info


def renders_at_any_size(env_id: str) -> bool:
    """Whether ``gymnasium.make(env_id, width=, height=)`` sets the render size: gymnasium's MuJoCo
    envs (subclasses of ``MujocoEnv``, which takes both)."""
    try:
        from gymnasium.envs.mujoco import MujocoEnv
    except ImportError:  # gymnasium without its MuJoCo extra
        return False
    find = getattr(gym.envs.registration, "_find_spec", gym.spec)  # gym.make's lookup: 'module:Ns/Id' too
    entry = find(env_id).entry_point
    cls = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    return isinstance(cls, type) and issubclass(cls, MujocoEnv)


def _make_env(
    env_id: str, render_images: bool, max_episode_steps: int | None, env_kwargs: dict, image_size: int = 0
) -> gym.Env:
    kwargs = dict(env_kwargs)
    if render_images:
        kwargs["render_mode"] = "rgb_array"
        if image_size and not {"width", "height"} & set(kwargs) and renders_at_any_size(env_id):
            kwargs.update(width=image_size, height=image_size)  # render at the size the policy reads
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    return ContractEnv(gym.make(env_id, **kwargs), env_id, render_images)


def _is_pygame(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "pygame"


def _is_mujoco(obj: Any) -> bool:
    """A MuJoCo binding object (``MjModel``, ``MjData``, ``MjvScene``, ...); not a class."""
    return not isinstance(obj, type) and type(obj).__module__.split(".")[0] == "mujoco"


def _is_mujoco_renderer(obj: Any) -> bool:
    """gymnasium's MuJoCo renderer or one of its viewers (they hold an OpenGL context)."""
    return not isinstance(obj, type) and type(obj).__module__ == "gymnasium.envs.mujoco.mujoco_rendering"


class _ByReference:
    """What a snapshot holds by reference (``copy.deepcopy`` keeps it): the live objects pickle
    cannot copy (``items``), and private copies of each ``MjData`` (``datas``, never stepped)."""

    def __init__(self) -> None:
        self.items: list = []
        self.datas: list = []

    def __deepcopy__(self, memo: dict) -> _ByReference:
        return self


def _set_dict(obj: Any, state: dict) -> None:
    obj.__dict__.update(state)


class _EnvPickler(pickle.Pickler):
    """Pickles envs by value, except what cannot be copied that way.

    Kept by reference (``refs.items``): pygame objects (render surfaces, clocks; not picklable),
    MuJoCo objects other than ``MjData`` (the ``MjModel``, which stepping does not change, and render
    structures) and gymnasium's MuJoCo renderers (an OpenGL context each). Each ``MjData`` (the
    physics state) is copied into ``refs.datas``. gymnasium's MuJoCo envs are ``EzPickle``, which
    pickles as the constructor arguments (a fresh env); they are pickled by ``__dict__`` instead. Any
    other ``EzPickle`` object (Box2D, Atari, ...) raises ``NotImplementedError``: its state lives in
    C objects that pickle cannot copy.
    """

    def __init__(self, file: io.BytesIO, env_id: str):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.env_id = env_id
        self.refs = _ByReference()
        self._ids: dict[int, tuple[str, int]] = {}  # persistent ids are not memoised by pickle

    def persistent_id(self, obj: Any) -> tuple[str, int] | None:
        if not (_is_pygame(obj) or _is_mujoco(obj) or _is_mujoco_renderer(obj)):
            return None
        if id(obj) not in self._ids:
            if type(obj).__name__ == "MjData":  # mj_copyData: the whole physics state, contacts included
                self.refs.datas.append(copy.copy(obj))
                self._ids[id(obj)] = ("data", len(self.refs.datas) - 1)
            else:
                self.refs.items.append(obj)
                self._ids[id(obj)] = ("shared", len(self.refs.items) - 1)
        return self._ids[id(obj)]

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, EzPickle) and not isinstance(obj, type):
            if not any(type(v).__name__ == "MjData" and _is_mujoco(v) for v in vars(obj).values()):
                raise NotImplementedError(
                    f"GymSim.get_state: {self.env_id} contains {type(obj).__name__}, which pickles by "
                    "rebuilding itself from its constructor arguments (gymnasium EzPickle), so a snapshot "
                    "would silently hold a fresh env instead of the current state; snapshots work for "
                    "envs whose state lives in Python / numpy attributes or a MuJoCo MjData"
                )
            return copyreg.__newobj__, (type(obj),), dict(vars(obj)), None, None, _set_dict
        return NotImplemented


class _EnvUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, refs: _ByReference):
        super().__init__(io.BytesIO(data))
        self.refs = refs
        self.loaded: dict[int, Any] = {}

    def persistent_load(self, pid: tuple[str, int]) -> Any:
        kind, i = pid
        if kind == "shared":
            return self.refs.items[i]
        if i not in self.loaded:  # a fresh copy, so the snapshot can be restored again
            self.loaded[i] = copy.copy(self.refs.datas[i])
        return self.loaded[i]


def _rebind_mujoco_renderers(envs: list) -> None:
    """Point each restored MuJoCo env's (shared) renderer and its viewers at the env's new MjData."""
    for env in envs:
        base = env.unwrapped
        renderer = vars(base).get("mujoco_renderer")
        if renderer is None:
            continue
        renderer.data = base.data
        for viewer in getattr(renderer, "_viewers", {}).values():
            viewer.data = base.data


def first_episode_limits(num_envs: int, max_episode_steps: int, seed: int) -> list[int | None]:
    """Where each env's first episode is cut (``stagger_episodes``): env 0 runs to the time limit,
    the others at lengths drawn uniformly from [1, max_episode_steps] with ``seed``. Envs reset
    together stay in step (every env at step k of its episode at once) wherever episodes never end
    early, as in Swimmer: every fixed-length rollout then holds one phase of the episode only. Cutting
    the first episodes at random lengths spreads the envs over the whole episode, as IsaacGym's legged
    robots randomise their first episode lengths."""
    rng = np.random.default_rng([int(seed), 0x57A6])
    cuts = rng.integers(1, max_episode_steps + 1, size=num_envs)
    return [None if i == 0 else int(cuts[i]) for i in range(num_envs)]


# ---------------------------------------------------------------------------- simulator
class GymSim(Simulator):
    """Any registered gymnasium env id through a gymnasium vector env (images from render())."""

    name_arg = "env_id"  # `mmrl check simulator gym:CartPole-v1` sets env_id
    task_arg = "env_id"
    passthrough_arg = "env_kwargs"  # the gymnasium env's own constructor arguments
    eval_kwargs = {"stagger_episodes": False}  # held-out episodes run to the env's own limit

    def __init__(
        self,
        num_envs: int = 4,
        env_id: str = "Pendulum-v1",
        image_size: int = 64,
        instruction: str | None = None,
        vectorization: str = "sync",
        render_images: bool = True,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int | None = None,
        env_kwargs: dict | None = None,
        success_key: str | None = None,
        stagger_episodes: bool = False,
        **unknown: Any,  # only to say where env arguments go; not in the declared signature (below)
    ):
        if unknown:
            raise TypeError(unknown_arguments_message(unknown, env_kwargs))
        if vectorization not in ("sync", "async"):
            raise ValueError(f"GymSim: vectorization must be 'sync' or 'async', got {vectorization!r}")
        if num_envs < 1 or image_size < 1:
            raise ValueError(f"GymSim: num_envs and image_size must be positive, got {num_envs}, {image_size}")
        check_env_id(env_id)
        self.env_id = env_id
        self.instruction = instruction or f"control the {env_id} environment to maximise reward"
        fn = functools.partial(
            _make_env, env_id, bool(render_images), max_episode_steps, dict(env_kwargs or {}), int(image_size)
        )
        self._start(
            [fn] * int(num_envs),
            image_size,
            vectorization,
            render_images,
            device,
            seed,
            max_episode_steps,
            success_key,
            stagger_episodes,
        )

    def _start(
        self,
        fns: list,
        image_size: int,
        vectorization: str,
        render_images: bool,
        device: str | torch.device,
        seed: int,
        max_episode_steps: int | None,
        success_key: str | None,
        stagger_episodes: bool,
    ) -> None:
        """Build the vector env of ``fns`` (one env factory each, returning a `ContractEnv`) and read
        its spaces: what every simulator on gymnasium envs shares (`simulators.metaworld` too)."""
        self.num_envs = len(fns)
        self.image_size = int(image_size)
        self.vectorization = vectorization
        self.render_images = bool(render_images)
        self.device = torch.device(device)
        vec_cls = gym.vector.SyncVectorEnv if vectorization == "sync" else gym.vector.AsyncVectorEnv
        self._vec = vec_cls(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        self._closed = False
        spec = self._vec.get_attr("spec")[0]
        steps = max_episode_steps if max_episode_steps is not None else getattr(spec, "max_episode_steps", None)
        if not steps:
            self.close()
            raise ValueError(f"GymSim: {self.env_id} has no time limit in its spec; pass max_episode_steps=<int>")
        self.max_episode_steps = int(steps)
        if stagger_episodes:
            self._vec.set_attr("_first_limit", first_episode_limits(self.num_envs, self.max_episode_steps, seed))
        self.action_dim = int(self._vec.single_action_space.shape[0])
        self.state_dim = int(self._vec.single_observation_space["state"].shape[0])
        self.image_shape = (self.image_size, self.image_size, 3)
        self.has_images = self.render_images
        self.has_success = success_key is not None
        self.success_key = success_key
        self.reset(seed)  # later reset(None) and auto resets are reproducible from `seed`

    # ------------------------------------------------------------------ observations
    def _images(self, frames: np.ndarray | None) -> torch.Tensor:
        n, s = len(frames) if frames is not None else self.num_envs, self.image_size
        if frames is None:
            return torch.zeros(n, s, s, 3, dtype=torch.uint8, device=self.device)
        x = torch.from_numpy(np.ascontiguousarray(frames))
        if tuple(x.shape[1:3]) != (s, s):
            x = x.permute(0, 3, 1, 2)  # NCHW view in channels-last memory: torch's fast uint8 path
            try:
                x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
            except (RuntimeError, NotImplementedError):  # no uint8 kernel: resize in float
                x = F.interpolate(x.float(), size=(s, s), mode="bilinear", antialias=True, align_corners=False)
                x = x.round().clamp(0, 255).to(torch.uint8)
            x = x.permute(0, 2, 3, 1).contiguous()
        return x.to(self.device)

    def _observation(self, obs: dict[str, np.ndarray]) -> Observation:
        image = self._images(obs["frame"] if self.render_images else None)
        state = torch.from_numpy(np.array(obs["state"], dtype=np.float32)).to(self.device)
        return self._labelled(image, state, [self._row(obs, i) for i in range(self.num_envs)])

    def _row(self, obs: Any, i: int) -> dict:
        """What env ``i``'s observation says beyond its state and frame (a multi-task simulator's
        task); ``obs`` is the batched dict, or a list of per-env dicts for final observations."""
        return {}

    def _labelled(self, image: torch.Tensor, state: torch.Tensor, rows: list[dict]) -> Observation:
        """The `Observation` of ``image`` and ``state``; one instruction for every env here (a
        multi-task simulator gives each env its own task's and ``meta``)."""
        return Observation(image, [self.instruction] * len(rows), state)

    def _final_observation(self, final: np.ndarray, done: np.ndarray, current: Observation) -> Observation:
        """`Observation` whose done rows are the finished episodes' last observations."""
        rows = np.flatnonzero(done)
        state = current.state.clone()
        state[torch.as_tensor(rows)] = torch.from_numpy(
            np.stack([np.asarray(final[i]["state"], dtype=np.float32) for i in rows])
        ).to(self.device)
        image = current.image.clone()
        if self.render_images:
            image[torch.as_tensor(rows)] = self._images(np.stack([final[i]["frame"] for i in rows]))
        labels = [self._row(final, i) if done[i] else self._current_row(current, i) for i in range(self.num_envs)]
        return self._labelled(image, state, labels)

    def _current_row(self, current: Observation, i: int) -> dict:
        """`_row` of an env whose episode goes on, read back from the current observation."""
        return {}

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | list[int] | None = None) -> Observation:
        n = self.num_envs
        if seed is None:
            seeds = None  # each env continues its own generator
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + i for i in range(n)]
        else:
            seeds = [int(s) for s in seed]
            if len(seeds) != n:
                raise ValueError(f"GymSim.reset got {len(seeds)} seeds for {n} envs")
        obs, _ = self._vec.reset(seed=seeds)
        return self._observation(obs)

    def step(self, actions: torch.Tensor) -> StepResult:
        """One step of ``[N, A]`` actions in ``[-1, 1]`` (clipped) for every env."""
        return self._step_masked(actions, torch.ones(self.num_envs, dtype=torch.bool))

    def _step_masked(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        n, a_dim = self.num_envs, self.action_dim
        if actions.dim() != 2 or tuple(actions.shape) != (n, a_dim):
            raise ValueError(f"GymSim: actions must be [{n}, {a_dim}], got {tuple(actions.shape)}")
        act = actions.detach().to("cpu", torch.float32)
        if not torch.isfinite(act).all():
            raise ValueError("GymSim: actions contain NaN or inf")
        act = act.clamp(-1.0, 1.0).numpy().copy()
        mask = active.detach().cpu().numpy().astype(bool)
        act[~mask] = np.nan  # ContractEnv skips all-NaN rows
        obs, reward, terminated, truncated, info = self._vec.step(act)
        terminated = np.asarray(terminated, dtype=bool) & mask
        truncated = np.asarray(truncated, dtype=bool) & mask
        done = terminated | truncated
        success = np.zeros(n, dtype=bool)
        final_info = info.get("final_info", {})
        if self.success_key is not None:
            for i in np.flatnonzero(mask):
                success[i] = _success(final_info if done[i] else info, i, self.success_key)
        current = self._observation(obs)
        final_obs = self._final_observation(info["final_obs"], done, current) if done.any() else None
        dev = self.device
        return StepResult(
            current,
            torch.as_tensor(np.where(mask, reward, 0.0), dtype=torch.float32, device=dev),
            torch.as_tensor(terminated, device=dev),
            torch.as_tensor(truncated, device=dev),
            torch.as_tensor(success, device=dev),
            final_obs,
            {"num_steps": torch.as_tensor(mask, dtype=torch.long, device=dev)},
        )

    # step_chunk: the base class's, which calls _step_masked with the envs still running

    def close(self) -> None:
        if not getattr(self, "_closed", True):
            self._closed = True
            self._vec.close()

    # ------------------------------------------------------------------ snapshot / restore
    def get_state(self) -> dict:
        if self.vectorization != "sync":
            raise NotImplementedError(
                "GymSim.get_state: the async vector env keeps its envs in worker processes; "
                "use vectorization='sync' for snapshots"
            )
        buf = io.BytesIO()
        pickler = _EnvPickler(buf, self.env_id)
        try:
            pickler.dump(self._vec.envs)
        except NotImplementedError:
            raise
        except Exception as exc:  # any failure means: no snapshot for this env
            raise NotImplementedError(f"GymSim.get_state: {self.env_id} envs cannot be pickled ({exc})") from exc
        # the sub-envs as immutable bytes, plus what they reference but pickle cannot copy
        return {"envs": buf.getvalue(), "refs": pickler.refs}

    def set_state(self, state: dict) -> None:
        if self.vectorization != "sync":
            raise NotImplementedError("GymSim.set_state needs vectorization='sync'")
        envs = _EnvUnpickler(state["envs"], state["refs"]).load()
        _rebind_mujoco_renderers(envs)
        self._vec.envs = envs


# `**unknown` exists only for `unknown_arguments_message`: the declared signature, which `mmrl check`
# and the config validation read to list the valid arguments, leaves it out
GymSim.__signature__ = inspect.signature(GymSim.__init__).replace(
    parameters=[
        p for name, p in inspect.signature(GymSim.__init__).parameters.items() if name not in ("self", "unknown")
    ]
)


def unknown_arguments_message(unknown: dict, env_kwargs: dict | None = None) -> str:
    """The error for ``GymSim(..., X=...)`` where X is not a GymSim argument: most likely an argument
    of the gymnasium env, which goes under ``env_kwargs``."""
    names = ", ".join(map(repr, unknown))
    verb = "is not an argument" if len(unknown) == 1 else "are not arguments"
    valid = ", ".join(sorted(inspect.signature(GymSim).parameters))
    return (
        f"{names} {verb} of simulator 'gym'; arguments of the gymnasium env go under env_kwargs: "
        f"env_kwargs={ {**(env_kwargs or {}), **unknown}!r} (in a config: sim.kwargs.env_kwargs). "
        f"Valid: {valid}"
    )


def check_env_id(env_id: str) -> None:
    """`UserError` (one line) for an ``env_id`` gymnasium has not registered, found as ``gym.make``
    finds it (a ``module:EnvId`` id imports ``module`` first), naming the closest registered ids."""
    find = getattr(gym.envs.registration, "_find_spec", gym.spec)  # gym.make's own lookup
    try:
        find(env_id)
        return
    except ModuleNotFoundError as exc:
        raise UserError(
            f"simulator 'gym': env_id {env_id!r} names a module to import first, which is not installed "
            f"({str(exc).split('. ')[0]}): install the package that registers the environment"
        ) from None
    except gym.error.Error:
        pass
    ids = sorted(gym.envs.registry)
    name = env_id.split(":")[-1]
    lower = {i.lower(): i for i in ids}
    close = difflib.get_close_matches(name, ids, n=5, cutoff=0.5) or [
        lower[c] for c in difflib.get_close_matches(name.lower(), list(lower), n=5, cutoff=0.5)
    ]
    hint = (
        f"close registered ids: {', '.join(close)}"
        if close
        else f"no registered id is close ({len(ids)} are registered)"
    )
    raise UserError(
        f"simulator 'gym': env_id {env_id!r} is not a registered gymnasium environment; {hint}. Use one "
        f"(sim.kwargs.env_id in a config, gym:<id> on the command line; `python -c 'import gymnasium; "
        f"gymnasium.pprint_registry()'` lists them all; another package's environment is 'package:EnvId')"
    )


def _success(info: dict, i: int, key: str) -> bool:
    if key in info and bool(np.asarray(info.get(f"_{key}", np.ones(i + 1, bool)))[i]):
        return bool(np.asarray(info[key])[i])
    return False
