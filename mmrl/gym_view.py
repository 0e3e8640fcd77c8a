"""Gymnasium views of an mmrl simulator: hand any `Simulator` to gymnasium, SB3 or LeRobot users.

``SimulatorVectorEnv(sim)`` is a `gymnasium.vector.VectorEnv` of all ``sim.num_envs`` environments;
``SimulatorEnv(sim)`` is a `gymnasium.Env` of a simulator built with ``num_envs=1`` (it passes
`gymnasium.utils.env_checker.check_env`). Both take the simulator object, so this module imports
no adapter; build one by name through the registry::

    from mmrl.registry import SIMULATORS
    from mmrl.gym_view import SimulatorEnv, SimulatorVectorEnv

    env = SimulatorEnv(SIMULATORS.build("reach", num_envs=1, seed=0))
    envs = SimulatorVectorEnv(SIMULATORS.build("reach", num_envs=64, seed=0))

or by gymnasium id (importing this module registers ``mmrl/<simulator>-v0`` for every simulator;
view arguments go to the view, the others build the simulator)::

    env = gymnasium.make("mmrl.gym_view:mmrl/reach-v0", keys=("image", "state"), image_size=36)
    envs = gymnasium.make_vec("mmrl/reach-v0", num_envs=64, vectorization_mode="vector_entry_point")

Only simulators whose ``action_type`` is ``"chunk"`` (float actions) have a view; the views own the
simulator (``close()`` closes it).

Observations: a `spaces.Dict` with, by default,

- ``"image"``: ``Box(0, 255, sim.image_shape, uint8)`` (``[H, W, 3]``, or ``[V, H, W, 3]`` for V
  cameras); left out by default when ``sim.has_images`` is False (all-zero placeholder images);
- ``"state"``: ``Box(-inf, inf, (sim.state_dim,), float32)`` when ``sim.state_dim`` is set (a
  simulator declares no state bounds, so `check_env` warns about infinite bounds);
- ``"instruction"``: ``Text(instruction_max_length, min_length=0, charset=instruction_charset)``
  (default: printable ASCII); an instruction outside that space raises `ValueError` naming it.

``keys`` picks (a sequence) or picks and renames (a mapping ``{mmrl key: gym key}``, e.g.
``{"image": "pixels", "state": "agent_pos"}``) entries. Stable-Baselines3 has no `Text` space: use
``keys=("image", "state")``. ``Observation.images`` and ``Observation.meta`` have no view.

Actions: ``Box(-1, 1, (A,), float32)`` per environment with the default ``chunk_size=1`` (one
simulator step per gym step), or ``(chunk_size, A)``: one gym step executes a whole chunk, the reward
is summed over the executed steps, and an environment whose episode ends inside the chunk ignores the
rest (``info["num_steps"]`` says how many steps it executed). ``[-1, 1]`` is the simulator contract's
action range (`mmrl.simulator`); a simulator clips or rejects actions outside it.

Info: ``"success"`` (bool, task success reached during the step; only when ``sim.has_success``) and
``"num_steps"`` (int), plus any other per-environment tensor of `StepResult.info`.

Auto reset (the vector view): an mmrl simulator resets an environment whose episode ended inside
the same call, so the vector view declares ``metadata["autoreset_mode"] = AutoresetMode.SAME_STEP``
and follows gymnasium's contract for it exactly: the returned observation of a finished environment
is the first one of its next episode; ``infos["final_obs"]`` (object array, one observation dict per
finished environment, None elsewhere; mask ``infos["_final_obs"]``) holds the last observation of the
episode, and ``infos["final_info"]`` (mask ``infos["_final_info"]``) the step's info ("success",
"num_steps") of the finished environments, whose top-level info entries are then masked out (the
reset has no info), as `gymnasium.vector.SyncVectorEnv` does with ``AutoresetMode.SAME_STEP``.

The single view steps to the end of an episode and returns that last observation; the simulator has
already started the next episode, which ``reset()`` (without a seed) then returns, so the episodes of
a ``SimulatorEnv`` are the simulator's own. ``step()`` before ``reset()`` or after the end of an
episode raises `gymnasium.error.ResetNeeded`.

Seeds: ``reset(seed=s)`` is the simulator's ``reset(s)`` (vector: env i gets ``s + i``; a list gives
one seed per env); ``reset()`` continues the simulator's own generator, as its auto resets do, so a
seeded view is reproducible through any number of episodes.

Rendering: ``render_mode="rgb_array"`` renders the image of the last returned observation (the
cameras of a multi-camera simulator side by side); the vector view returns one frame per environment.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch

from mmrl.simulator import Observation, Simulator, StepResult, check_observation, check_step_result

try:
    import gymnasium as gym
    from gymnasium import spaces
    from gymnasium.vector import AutoresetMode
    from gymnasium.vector.utils import batch_space
except ImportError as exc:  # gymnasium is an optional dependency
    raise ImportError(f"mmrl.gym_view needs gymnasium ({exc}): pip install 'mmrl[gym]'") from exc

__all__ = ["SimulatorEnv", "SimulatorVectorEnv", "observation_space_of", "action_space_of", "DEFAULT_CHARSET"]

#: characters an instruction may hold by default: printable ASCII (letters, digits, punctuation, whitespace)
DEFAULT_CHARSET = string.printable
OBS_KEYS = ("image", "state", "instruction")


def _select_keys(sim: Simulator, keys: Sequence[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``{mmrl key: gym key}`` of the observation entries the view returns."""
    available = [k for k in OBS_KEYS if k != "state" or sim.state_dim]
    if keys is None:
        return {k: k for k in available if k != "image" or sim.has_images}
    mapping = dict(keys) if isinstance(keys, Mapping) else {k: k for k in keys}
    bad = [k for k in mapping if k not in available]
    if bad or not mapping:
        raise ValueError(
            f"keys {list(mapping)}: {type(sim).__name__} observations have {', '.join(available)}"
            + (f" (no 'state': its state_dim is {sim.state_dim})" if "state" in bad else "")
        )
    if len(set(mapping.values())) != len(mapping):
        raise ValueError(f"keys {mapping} give two entries the same name")
    return mapping


def observation_space_of(
    sim: Simulator,
    keys: Sequence[str] | Mapping[str, str] | None = None,
    instruction_charset: str = DEFAULT_CHARSET,
    instruction_max_length: int = 1024,
) -> spaces.Dict:
    """The observation space of one environment of ``sim`` (see the module docstring)."""
    out: dict[str, spaces.Space] = {}
    for key, name in _select_keys(sim, keys).items():
        if key == "image":
            out[name] = spaces.Box(0, 255, tuple(int(d) for d in sim.image_shape), np.uint8)
        elif key == "state":
            assert sim.state_dim is not None  # _select_keys offers "state" only with one
            out[name] = spaces.Box(-np.inf, np.inf, (int(sim.state_dim),), np.float32)
        else:
            out[name] = spaces.Text(instruction_max_length, min_length=0, charset=instruction_charset)
    return spaces.Dict(out)


def action_space_of(sim: Simulator, chunk_size: int = 1) -> spaces.Box:
    """``Box(-1, 1, (A,))`` (``chunk_size=1``) or ``(chunk_size, A)`` float32: one env's actions."""
    if sim.action_type != "chunk":
        raise ValueError(
            f"{type(sim).__name__} takes {sim.action_type!r} actions; a gymnasium view needs a "
            "simulator of float action chunks (action_type 'chunk')"
        )
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    shape = (int(sim.action_dim),) if chunk_size == 1 else (int(chunk_size), int(sim.action_dim))
    return spaces.Box(-1.0, 1.0, shape, np.float32)


class SimulatorVectorEnv(gym.vector.VectorEnv):
    """All ``sim.num_envs`` environments of an mmrl simulator as a gymnasium `VectorEnv`
    (``AutoresetMode.SAME_STEP``; see the module docstring)."""

    def __init__(
        self,
        sim: Simulator,
        *,
        chunk_size: int = 1,
        keys: Sequence[str] | Mapping[str, str] | None = None,
        instruction_charset: str = DEFAULT_CHARSET,
        instruction_max_length: int = 1024,
        render_mode: str | None = None,
        render_fps: float = 10.0,
    ):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.sim = sim
        self.num_envs = int(sim.num_envs)
        self.chunk_size = int(chunk_size)
        self.single_action_space = action_space_of(sim, chunk_size)
        self.keys = _select_keys(sim, keys)  # {mmrl key: gym key}
        self.single_observation_space = observation_space_of(
            sim, self.keys, instruction_charset, instruction_max_length
        )
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {
            "autoreset_mode": AutoresetMode.SAME_STEP,
            "render_modes": ["rgb_array"],
            "render_fps": render_fps,
        }
        self.render_mode = render_mode
        # the Text space `observation_space` made for the instructions (None without that key)
        self._text = cast(
            "spaces.Text | None",
            next((self.single_observation_space[n] for k, n in self.keys.items() if k == "instruction"), None),
        )
        self._known_instructions: set[str] = set()  # instructions already checked against the Text space
        self._image: torch.Tensor | None = None  # what render() shows: the last step's (final) images
        self._obs_image: torch.Tensor | None = None  # the images of the last returned observations
        self._reset_done = False

    # ------------------------------------------------------------------ conversion
    def _observations(self, obs: Observation) -> dict[str, Any]:
        """Batched numpy observations (fresh arrays) of an `Observation`, checked against the spaces."""
        n = self.num_envs
        out: dict[str, Any] = {}
        for key, name in self.keys.items():
            if key == "image":
                out[name] = obs.image.detach().cpu().numpy().copy()
            elif key == "state":
                state = obs.state
                if state is None or tuple(state.shape) != (n, self.sim.state_dim):
                    got = None if state is None else list(state.shape)
                    raise ValueError(
                        f"{type(self.sim).__name__} returned state {got}, but declares "
                        f"[{n}, {self.sim.state_dim}] (num_envs, state_dim)"
                    )
                out[name] = state.detach().to("cpu", torch.float32).numpy().copy()
            else:
                if len(obs.instruction) != n:
                    raise ValueError(
                        f"{type(self.sim).__name__} returned {len(obs.instruction)} instructions for {n} envs"
                    )
                text_space = self._text
                assert text_space is not None  # made with the "instruction" key
                for text in obs.instruction:
                    if text not in self._known_instructions:
                        if not text_space.contains(text):
                            odd = sorted({c for c in str(text) if c not in text_space.character_set})
                            raise ValueError(
                                f"instruction {text!r} is outside the observation space {text_space} "
                                f"({'characters ' + repr(''.join(odd)) if odd else 'length ' + str(len(text))}): "
                                "pass instruction_charset / instruction_max_length to the view, or keys without "
                                "'instruction'"
                            )
                        if len(self._known_instructions) >= 100_000:  # endless variants: keep it bounded
                            self._known_instructions.clear()
                        self._known_instructions.add(text)
                out[name] = tuple(obs.instruction)
        return out

    def _step_info(self, res: StepResult) -> dict[str, np.ndarray]:
        """Per-env step information: success (when the task defines it), num_steps, and any other
        per-env tensor of ``res.info``."""
        info = {"success": res.success} if self.sim.has_success else {}
        for key, value in res.info.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == self.num_envs:
                info[key] = value
        return {k: v.detach().cpu().numpy().copy() for k, v in info.items()}

    @staticmethod
    def _row(batched: dict[str, Any], i: int) -> dict[str, Any]:
        return {k: v[i] if isinstance(v, tuple) else v[i].copy() for k, v in batched.items()}

    def _actions(self, actions: Any) -> torch.Tensor:
        a = np.asarray(actions, dtype=np.float32)
        if a.shape != self.action_space.shape:
            raise ValueError(
                f"actions must have shape {self.action_space.shape} (num_envs, "
                f"{'chunk_size, ' if self.chunk_size > 1 else ''}action_dim), got {a.shape}"
            )
        t = torch.from_numpy(a.copy()).to(self.sim.device)
        return t[:, None] if self.chunk_size == 1 else t

    # ------------------------------------------------------------------ gymnasium API
    def reset(
        self,
        *,
        seed: int | list[int] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset every env: ``seed`` None (the simulator's generator), an int (env i gets
        ``seed + i``) or a list of ``num_envs`` ints. ``options`` are not supported (None or {})."""
        if options:
            raise ValueError(
                f"reset options {sorted(options)} are not supported (the view auto resets in "
                "the same step, so it has no reset_mask)"
            )
        if isinstance(seed, (list, tuple)):
            if len(seed) != self.num_envs or any(s is None for s in seed):
                raise ValueError(f"reset(seed=list) needs {self.num_envs} int seeds, got {list(seed)}")
            seed = [int(s) for s in seed]
        elif seed is not None:
            seed = int(seed)
            super().reset(seed=seed)  # seeds self.np_random, as gymnasium's vector envs do
        obs = self.sim.reset(seed)
        check_observation(self.sim, obs)
        self._image = self._obs_image = obs.image
        self._reset_done = True
        return self._observations(obs), {}

    def step(self, actions: Any) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._reset_done:
            raise gym.error.ResetNeeded("call reset() before step()")
        res = self.sim.step_chunk(self._actions(actions))
        check_step_result(self.sim, res)
        obs = self._observations(res.obs)
        terminated = res.terminated.detach().cpu().numpy().astype(bool)
        truncated = res.truncated.detach().cpu().numpy().astype(bool)
        done = terminated | truncated
        step_info = self._step_info(res)
        infos: dict[str, Any] = {}
        if not done.all():  # finished envs: their top-level info is the reset's (none)
            for key, value in step_info.items():
                infos[key] = np.where(_rows(~done, value), value, np.zeros_like(value))
                infos[f"_{key}"] = ~done
        image = res.obs.image
        if done.any():
            if res.final_obs is None:
                raise ValueError(f"{type(self.sim).__name__} ended episodes without a final_obs")
            final = self._observations(res.final_obs)
            final_obs = np.full(self.num_envs, None, dtype=object)
            for i in np.flatnonzero(done):
                final_obs[i] = self._row(final, int(i))
            final_info: dict[str, Any] = {}
            for key, value in step_info.items():
                final_info[key] = np.where(_rows(done, value), value, np.zeros_like(value))
                final_info[f"_{key}"] = done.copy()
            infos.update(final_obs=final_obs, _final_obs=done.copy(), final_info=final_info, _final_info=done.copy())
            rows = torch.as_tensor(done, device=image.device)
            image = torch.where(rows.view(-1, *[1] * (image.dim() - 1)), res.final_obs.image, image)
        self._image, self._obs_image = image, res.obs.image  # render() shows the end of finished episodes
        reward = res.reward.detach().cpu().numpy().astype(np.float64)
        return obs, reward, terminated, truncated, infos

    def render(self) -> tuple[np.ndarray, ...]:
        if self.render_mode != "rgb_array":
            raise gym.error.Error("render() needs render_mode='rgb_array' (the view's constructor argument)")
        if self._image is None:
            raise gym.error.ResetNeeded("call reset() before render()")
        return tuple(_frame(img) for img in self._image.detach().cpu().numpy())

    def close_extras(self, **kwargs: Any) -> None:
        self.sim.close()

    def __repr__(self) -> str:
        return f"SimulatorVectorEnv({type(self.sim).__name__}, num_envs={self.num_envs})"


class SimulatorEnv(gym.Env):
    """A simulator built with ``num_envs=1`` as a gymnasium `Env` (see the module docstring)."""

    def __init__(
        self,
        sim: Simulator,
        *,
        chunk_size: int = 1,
        keys: Sequence[str] | Mapping[str, str] | None = None,
        instruction_charset: str = DEFAULT_CHARSET,
        instruction_max_length: int = 1024,
        render_mode: str | None = None,
        render_fps: float = 10.0,
    ):
        if sim.num_envs != 1:
            raise ValueError(
                f"SimulatorEnv views one environment: build the simulator with num_envs=1 (got "
                f"{sim.num_envs}), or use SimulatorVectorEnv for all {sim.num_envs}"
            )
        self._vec = SimulatorVectorEnv(
            sim,
            chunk_size=chunk_size,
            keys=keys,
            instruction_charset=instruction_charset,
            instruction_max_length=instruction_max_length,
            render_mode=render_mode,
            render_fps=render_fps,
        )
        self.sim = sim
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self.metadata = {"render_modes": ["rgb_array"], "render_fps": render_fps}
        self.render_mode = render_mode
        self._next_obs: dict[str, Any] | None = None  # the simulator's auto-reset episode, for reset()
        self._running = False

    def reset(
        self,
        *,
        seed: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``seed``: the simulator's ``reset([seed])``; None continues the simulator's generator (after
        an episode's end: the next episode the simulator already started)."""
        super().reset(seed=seed)  # seeds self.np_random
        if seed is None and self._next_obs is not None and not options:
            obs = self._next_obs
            self._vec._image = self._vec._obs_image  # render() shows the new episode
        else:
            batched, _ = self._vec.reset(seed=None if seed is None else [int(seed)], options=options)
            obs = SimulatorVectorEnv._row(batched, 0)
        self._next_obs = None
        self._running = True
        return obs, {}

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if not self._running:
            raise gym.error.ResetNeeded("call reset() before step(), and after the end of an episode")
        a = np.asarray(action, dtype=np.float32)
        if a.shape != self.action_space.shape:
            raise ValueError(f"action must have shape {self.action_space.shape}, got {a.shape}")
        obs, reward, terminated, truncated, infos = self._vec.step(a[None])
        term, trunc = bool(terminated[0]), bool(truncated[0])
        if term or trunc:
            self._running = False
            self._next_obs = SimulatorVectorEnv._row(obs, 0)  # the simulator's next episode, for reset()
            out_obs, source = infos["final_obs"][0], infos["final_info"]
        else:
            out_obs, source = SimulatorVectorEnv._row(obs, 0), infos
        info = {k: v[0].item() if v.ndim == 1 else v[0].copy() for k, v in source.items() if not k.startswith("_")}
        return out_obs, float(reward[0]), term, trunc, info

    def render(self) -> np.ndarray:
        if self.render_mode != "rgb_array":
            raise gym.error.Error("render() needs render_mode='rgb_array' (the view's constructor argument)")
        return self._vec.render()[0]

    def close(self) -> None:
        self._vec.close()

    def __repr__(self) -> str:
        return f"SimulatorEnv({type(self.sim).__name__})"


def _rows(mask: np.ndarray, value: np.ndarray) -> np.ndarray:
    """``mask [N]`` broadcastable against ``value [N, ...]``."""
    return mask.reshape(-1, *[1] * (value.ndim - 1))


def _frame(image: np.ndarray) -> np.ndarray:
    """``[H, W, 3]`` frame of one env's image (cameras ``[V, H, W, 3]`` side by side)."""
    return np.concatenate(list(image), axis=1) if image.ndim == 4 else image.copy()


# ---- gymnasium ids: gymnasium.make("mmrl/<simulator>-v0") ---------------------------------------
#: the arguments of `gymnasium.make` / `make_vec` that configure the view; every other one builds the simulator
VIEW_ARGUMENTS = ("chunk_size", "keys", "instruction_charset", "instruction_max_length", "render_mode", "render_fps")


def _split(kwargs: dict) -> tuple[dict, dict]:
    """``(view arguments, simulator arguments)``; takes the view's out of ``kwargs``."""
    view = {k: kwargs.pop(k) for k in VIEW_ARGUMENTS if k in kwargs}
    return view, kwargs


def make_env(simulator: str, seed: int = 0, **kwargs: Any) -> SimulatorEnv:
    """``gymnasium.make("mmrl/<simulator>-v0", **kwargs)``: registered simulator ``simulator``
    built with ``num_envs=1``, ``seed`` and the remaining ``kwargs``, in a `SimulatorEnv` that takes
    the `VIEW_ARGUMENTS` among ``kwargs``."""
    from mmrl.registry import SIMULATORS

    view, sim_kwargs = _split(kwargs)  # kwargs: this call's own dict
    return SimulatorEnv(SIMULATORS.build(simulator, num_envs=1, seed=seed, **sim_kwargs), **view)


def make_vector_env(simulator: str, num_envs: int = 1, seed: int = 0, **kwargs: Any) -> SimulatorVectorEnv:
    """``gymnasium.make_vec("mmrl/<simulator>-v0", num_envs, **kwargs)``: the simulator's own
    batched environments (one process, no copies) as a `SimulatorVectorEnv`."""
    from mmrl.registry import SIMULATORS

    view, sim_kwargs = _split(kwargs)  # kwargs: this call's own dict
    return SimulatorVectorEnv(SIMULATORS.build(simulator, num_envs=num_envs, seed=seed, **sim_kwargs), **view)


def register_simulators(namespace: str = "mmrl") -> list[str]:
    """Register every simulator of mmrl's registry (plugins included) with gymnasium as
    ``<namespace>/<name>-v0`` (single: `make_env`; vector: `make_vector_env`); ids already there are
    kept, and ``gym`` (a gymnasium env already) is left out. Runs when this module is imported, so
    ``gymnasium.make("mmrl.gym_view:mmrl/reach-v0")`` works in a fresh process. A simulator whose
    actions are not float chunks (``prompts``, ``qa``) is registered too; making it raises the
    views' `ValueError` naming its action type. Returns the ids registered."""
    from mmrl.registry import SIMULATORS

    ids = []
    for name in SIMULATORS.names():
        if name == "gym":  # a gymnasium env already
            continue
        env_id = f"{namespace}/{name}-v0"
        if env_id not in gym.registry:
            gym.register(
                env_id,
                entry_point=f"{__name__}:make_env",
                vector_entry_point=f"{__name__}:make_vector_env",
                kwargs={"simulator": name},
                disable_env_checker=False,
            )
            ids.append(env_id)
    return ids


register_simulators()
