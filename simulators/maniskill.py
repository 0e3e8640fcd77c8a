"""ManiSkillSim: ManiSkill3 tasks (PickCube-v1, PushCube-v1, ...) behind the simulator contract.

Two back ends, chosen by ``sim_backend`` (``"auto"``: ``physx_cuda`` when ``device`` is CUDA, else
``physx_cpu``):

- GPU (``physx_cuda``): one in-process env with ``num_envs`` parallel scenes, tensors stay on the GPU.
- CPU (``physx_cpu``): ManiSkill refuses ``num_envs > 1`` on the CPU back end, so each environment
  lives in its own worker process (``multiprocessing`` spawn, one pipe each) that runs one
  single-scene env; ``num_envs=1`` runs in-process. A worker executes a whole action chunk per
  round trip (stopping at the end of its episode), so IPC costs one message per call, not per step.
  Gymnasium's ``AsyncVectorEnv`` is not used: it cannot step a subset of envs, run a chunk natively
  or snapshot per-env simulator state. Workers are spawned, so a script that builds a CPU sim with
  ``num_envs > 1`` at top level needs the usual ``if __name__ == "__main__":`` guard.

Observations: ``image`` uint8 ``[N, H, W, 3]`` from the task's first sensor camera (``camera=``
names another, a list of names gives ``[N, V, H, W, 3]``), rendered at ``image_size`` (the camera
resolution is overridden; a camera that ignores it is resized with ``torch`` bilinear
interpolation). ``obs_mode="state"`` does not render unless ``render_images=True``: the image is
then all zeros (black) of ``image_shape``. ``state`` float ``[N, D]``: ManiSkill's flattened state
observation in state mode; in rgb mode the flattened ``agent`` (qpos, qvel) + ``extra`` (e.g.
tcp pose, goal position) dictionaries, i.e. what ManiSkill's own RGB baselines feed as "state".
``instruction``: one sentence per task (`INSTRUCTIONS`, a generic one for unlisted tasks),
overridable with ``instruction=`` (one string, or one per env).

Actions ``[N, A]`` in ``[-1, 1]`` are clipped and mapped affinely onto the action space bounds
(the identity for ManiSkill's normalised controllers such as ``pd_ee_delta_pos``); NaN/inf raise
``ValueError``. ``reward_mode`` defaults to ``"sparse"``: ManiSkill then pays +1 on the success step
(-1 on a failure step for tasks that define failure), which ends the episode. ``"dense"`` and
``"normalized_dense"`` give ManiSkill's shaped rewards. ``terminated`` = success or failure from the
task's evaluation; ``truncated`` at ``max_episode_steps`` (the task's registered limit unless given).
An episode that ends is reset in the same call (``final_obs`` holds its last observation); an
env that ends inside a chunk ignores the rest of the chunk.

Seeding: ``reset(seed)`` gives env i ``seed + i`` (or the i-th entry of a list), taken modulo
2**32 as ManiSkill requires; equal seeds give identical initial states. Auto resets draw their seed
from a per-env generator re-seeded by every seeded reset, so whole rollouts are reproducible.

``get_state`` / ``set_state`` wrap ManiSkill's ``get_state_dict`` / ``set_state_dict`` (plus the
episode counters and generators). PhysX does not restore its internal solver caches, so replays
after ``set_state`` agree to about 1e-6, not bit for bit.

Tasks whose assets are not downloaded raise `MissingAssetError` naming
``python -m mani_skill.utils.download_asset <TaskID>``; ManiSkill's stdin prompt is never reached.
ManiSkill needs a Vulkan driver even for state observations: on CPU machines run
``scripts/install_sim_deps.sh`` (Mesa >= 23 lavapipe).

Costs measured on a 2-core CPU machine (software Vulkan): starting the workers takes ~4 s per
process (importing ManiSkill, in parallel), and the first rgb render in each process ~15 s more
(lavapipe compiles its shaders per process). PickCube-v1 state: ~250-400 env-steps/s in-process or
with 2 workers; PushCube-v1 rgb 64 px: ~15-20 env-steps/s one step at a time, ~45-60 with 5-step
chunks (only the chunk's last step is rendered).
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing as mp
import traceback
from typing import Any

import numpy as np
import torch

from mmrl.errors import UserError
from mmrl.simulator import Observation, Simulator, StepResult

if importlib.util.find_spec("mani_skill") is None or importlib.util.find_spec("gymnasium") is None:
    raise ImportError("ManiSkillSim needs mani-skill and gymnasium", name="mani_skill")

INSTRUCTIONS: dict[str, str] = {
    "PickCube-v1": "pick up the red cube and move it to the green goal",
    "PickCubeSO100-v1": "pick up the red cube and move it to the green goal",
    "PickCubeWidowXAI-v1": "pick up the red cube and move it to the green goal",
    "SO100GraspCube-v1": "grasp the cube and lift it",
    "PushCube-v1": "push the blue cube to the red and white target",
    "PullCube-v1": "pull the red cube back to the target",
    "PokeCube-v1": "use the peg to push the cube to the goal",
    "PullCubeTool-v1": "use the L-shaped tool to pull the cube closer",
    "StackCube-v1": "stack the red cube on top of the green cube",
    "StackPyramid-v1": "stack the cubes into a pyramid",
    "PegInsertionSide-v1": "insert the peg into the hole in the box",
    "PlugCharger-v1": "plug the charger into the receptacle",
    "PushT-v1": "push the T-shaped block to the target pose",
    "LiftPegUpright-v1": "lift the peg lying on the table and stand it upright",
    "PlaceSphere-v1": "place the sphere into the bin",
    "RollBall-v1": "roll the ball to the goal region",
    "TurnFaucet-v1": "turn the faucet handle",
    "OpenCabinetDrawer-v1": "open the cabinet drawer",
    "OpenCabinetDoor-v1": "open the cabinet door",
    "PickSingleYCB-v1": "pick up the object and move it to the goal",
    "PickClutterYCB-v1": "pick up the target object from the clutter",
    "TwoRobotPickCube-v1": "pick up the cube and move it to the goal",
    "TwoRobotStackCube-v1": "stack the blue cube on the green cube",
    "DrawTriangle-v1": "draw the triangle on the canvas",
    "DrawSVG-v1": "draw the shape on the canvas",
    "UnitreeG1PlaceAppleInBowl-v1": "place the apple in the bowl",
    "UnitreeG1TransportBox-v1": "carry the box to the other table",
    "PutCarrotOnPlateInScene-v1": "put the carrot on the plate",
    "PutEggplantInBasketScene-v1": "put the eggplant in the basket",
    "PutSpoonOnTableClothInScene-v1": "put the spoon on the towel",
    "StackGreenCubeOnYellowCubeBakedTexInScene-v1": "stack the green block on the yellow block",
}


class MissingAssetError(RuntimeError):
    """A ManiSkill task needs assets that are not downloaded (the message names the command)."""


def _download_hint(task: str, what: str) -> str:
    return (
        f"ManiSkill task {task} needs assets that are not downloaded ({what}). Download them with "
        f"`python -m mani_skill.utils.download_asset {task}` and try again."
    )


def _check_assets(task: str) -> None:
    """Raise `MissingAssetError` if ``task``'s registered assets are missing (ManiSkill would
    otherwise ask on stdin); KeyError for an unknown task."""
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    from mani_skill.utils import assets
    from mani_skill.utils.registration import REGISTERED_ENVS

    if task not in REGISTERED_ENVS:
        raise KeyError(f"unknown ManiSkill task {task!r}; known: {', '.join(sorted(REGISTERED_ENVS))}")
    missing: list[str] = []
    for asset_id in REGISTERED_ENVS[task].asset_download_ids or []:
        if asset_id in assets.DATA_GROUPS:
            ids = assets.expand_data_group_into_individual_data_source_ids(asset_id)
        else:
            ids = [asset_id]
        missing += [i for i in ids if not assets.is_data_source_downloaded(i)]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise MissingAssetError(_download_hint(task, shown))


def _episode_limit(task: str, given: int | None) -> int:
    """``given``, else the task's registered time limit (100 if it has none)."""
    from mani_skill.utils.registration import REGISTERED_ENVS

    if given is not None:
        return int(given)
    return int(REGISTERED_ENVS[task].max_episode_steps or 100)


@contextlib.contextmanager
def _no_prompt(task: str):
    """Turn ManiSkill's interactive download prompt (robot assets, ...) into `MissingAssetError`."""
    from mani_skill.utils import download_asset

    def refuse(message: str) -> bool:
        raise MissingAssetError(_download_hint(task, message.strip()))

    saved = download_asset.prompt_yes_no
    download_asset.prompt_yes_no = refuse
    try:
        yield
    finally:
        download_asset.prompt_yes_no = saved


def make_env(task: str, num_envs: int, cfg: dict):
    """``gym.make`` a ManiSkill task after the asset check; returns the gym env."""
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401

    _check_assets(task)
    cfg["max_episode_steps"] = _episode_limit(task, cfg["max_episode_steps"])
    kwargs = dict(cfg.get("make_kwargs") or {})
    kwargs.update(
        num_envs=num_envs,
        obs_mode=cfg["obs_mode"],
        reward_mode=cfg["reward_mode"],
        sim_backend=cfg["sim_backend"],
        max_episode_steps=cfg["max_episode_steps"],
    )
    if cfg["control_mode"] is not None:
        kwargs["control_mode"] = cfg["control_mode"]
    if cfg["render"]:
        size = cfg["image_size"]
        kwargs.setdefault("sensor_configs", dict(width=size, height=size))
    if cfg["sim_backend"] == "physx_cpu":
        kwargs.setdefault("render_backend", "cpu")
    with _no_prompt(task):
        return gym.make(task, **kwargs)


def _resize(img: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 ``[..., h, w, 3]`` -> ``[..., size, size, 3]`` (bilinear, antialiased)."""
    if img.shape[-3] == size and img.shape[-2] == size:
        return img
    lead = img.shape[:-3]
    x = img.reshape(-1, *img.shape[-3:]).permute(0, 3, 1, 2).float()
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    return x.reshape(*lead, size, size, 3)


class _Obs:
    """Extract (images ``[B, V, H, W, 3]`` or None, state ``[B, D]``) from a ManiSkill env."""

    def __init__(self, env, cfg: dict):
        from mani_skill.sensors.camera import Camera

        self.u = env.unwrapped
        self.cfg = cfg
        self.mode = cfg["obs_mode"]
        cams = [k for k, s in self.u.scene.sensors.items() if isinstance(s, Camera)]
        want = cfg["camera"]
        if want is None:
            if cfg["render"] and not cams:
                raise ValueError(f"ManiSkill task {cfg['task']} has no sensor camera")
            self.cameras = cams[:1]
        else:
            self.cameras = [want] if isinstance(want, str) else list(want)
            bad = [c for c in self.cameras if c not in cams]
            if bad:
                raise ValueError(f"camera(s) {bad} not in {cfg['task']}'s sensor cameras {cams}")

    @contextlib.contextmanager
    def no_render(self):
        """Step / reset without rendering the sensors (the observation is then a state dict)."""
        if self.mode == "state":
            yield
            return
        saved = self.u._obs_mode
        self.u._obs_mode = "state_dict"
        try:
            yield
        finally:
            self.u._obs_mode = saved

    def read(self, raw: Any = None) -> tuple[torch.Tensor | None, torch.Tensor]:
        from mani_skill.utils import common

        if raw is None:
            raw = self.u.get_obs()
        if self.mode == "state":
            state = raw
            sensors = self.u._get_obs_sensor_data() if self.cfg["render"] else None
        else:
            state = common.flatten_state_dict(dict(agent=raw["agent"], extra=raw["extra"]), use_torch=True)
            sensors = raw["sensor_data"]
        state = state.reshape(state.shape[0], -1).float()
        if sensors is None:
            return None, state
        img = torch.stack([sensors[c]["rgb"][..., :3] for c in self.cameras], 1)  # [B, V, h, w, 3]
        return _resize(img.to(torch.uint8), self.cfg["image_size"]), state


def _open_env(cfg: dict, num_envs: int):
    """(env, unwrapped, observation reader, max episode steps) for ``num_envs`` scenes of the task;
    only Box action spaces are supported."""
    env = make_env(cfg["task"], num_envs, cfg)
    space = env.unwrapped.single_action_space
    if not hasattr(space, "low"):
        raise ValueError(f"ManiSkill task {cfg['task']} has a non-Box action space {space}; not supported")
    return env, env.unwrapped, _Obs(env, cfg), int(cfg["max_episode_steps"])


# ---------------------------------------------------------------------------------- one CPU env
class _SingleEnv:
    """One single-scene CPU env with the contract's episode logic (runs in a worker or in-process)."""

    def __init__(self, cfg: dict, index: int):
        self.cfg = cfg
        self.index = index
        self.env, self.u, self.obs, self.max_steps = _open_env(cfg, 1)
        self.elapsed = 0
        self.rng = np.random.default_rng([index])
        self.last = self._reset(int(self.rng.integers(2**31)))

    def spec(self) -> dict:
        space = self.u.single_action_space
        img, state = self.last
        return {
            "action_low": np.asarray(space.low, dtype=np.float32).reshape(-1),
            "action_high": np.asarray(space.high, dtype=np.float32).reshape(-1),
            "state_dim": int(state.shape[-1]),
            "cameras": list(self.obs.cameras),
            "max_episode_steps": self.max_steps,
        }

    def _reset(self, seed: int) -> tuple:
        raw, _ = self.u.reset(seed=int(seed))
        self.elapsed = 0
        img, state = self.obs.read(raw)
        return (None if img is None else img[0].numpy(), state[0].numpy())

    def reset(self, seed: int) -> tuple:
        seed = int(seed) % 2**32
        self.rng = np.random.default_rng([seed, self.index])
        self.last = self._reset(seed)
        return self.last

    def run(self, actions: np.ndarray | None) -> dict:
        """Execute ``[C, A]`` (env units) until the episode ends; ``None``: an inactive env."""
        out = {"reward": 0.0, "terminated": False, "truncated": False, "success": False, "num_steps": 0}
        if actions is None:
            out.update(obs=self.last, final=None)
            return out
        raw = None
        for a in actions:
            with self.obs.no_render():
                raw, r, te, _, info = self.u.step(a[None])
            self.elapsed += 1
            out["num_steps"] += 1
            out["reward"] += float(r.reshape(-1)[0])
            out["success"] |= bool(info["success"].reshape(-1)[0]) if "success" in info else False
            if bool(te.reshape(-1)[0]):
                out["terminated"] = True
                break
            if self.elapsed >= self.max_steps:
                out["truncated"] = True
                break
        img, state = self.obs.read(raw if self.obs.mode == "state" else None)
        cur = (None if img is None else img[0].numpy(), state[0].numpy())
        out["final"] = None
        if out["terminated"] or out["truncated"]:
            out["final"] = cur
            cur = self._reset(int(self.rng.integers(2**31)))
        self.last = cur
        out["obs"] = cur
        return out

    def get_state(self) -> dict:
        return {
            "sim": _tree_clone(self.u.get_state_dict()),
            "ms_elapsed": self.u._elapsed_steps.clone(),
            "elapsed": self.elapsed,
            "rng": self.rng.bit_generator.state,
            "last": _tree_clone(self.last),
        }

    def set_state(self, st: dict) -> None:
        self.u.set_state_dict(_tree_clone(st["sim"]))
        self.u._elapsed_steps[:] = st["ms_elapsed"]
        self.elapsed = int(st["elapsed"])
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = st["rng"]
        self.last = _tree_clone(st["last"])

    def close(self) -> None:
        self.env.close()


def _tree_clone(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: _tree_clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_clone(v) for v in x)
    return x


def _tree_map(fn, x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def _worker(conn, cfg: dict, index: int) -> None:
    """Worker process: one `_SingleEnv`; answers (command, arg) messages with ("ok", value) or
    ("error", type name, message, traceback)."""
    import os

    # Mesa's software Vulkan (lavapipe) starts one render thread per core in every process; with
    # one process per env that oversubscribes the CPU and slows start-up (no effect on GPU drivers).
    os.environ.setdefault("LP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg["num_envs"])))
    torch.set_num_threads(1)  # tiny tensors: extra intra-op threads only contend with the other workers
    try:
        env = _SingleEnv(cfg, index)
        conn.send(("ok", env.spec()))
    except BaseException as exc:  # report everything, incl. SystemExit from ManiSkill
        conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc()))
        conn.close()
        return
    while True:
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            break
        if cmd == "close":
            env.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(env, cmd)(*arg)))
        except BaseException as exc:
            conn.send(("error", type(exc).__name__, str(exc), traceback.format_exc()))
    conn.close()


def vulkan_problem(text: str) -> str | None:
    """The one line for an error text of SAPIEN's that says no Vulkan driver works here (ManiSkill
    renders with Vulkan even for state observations), else None."""
    if "vk::" not in text and "Vulkan" not in text and "ErrorIncompatibleDriver" not in text:
        return None
    return (
        f"ManiSkill cannot start: no working Vulkan driver here ({text.strip().splitlines()[-1][:120]}); ManiSkill "
        "renders with Vulkan even for state observations: bash scripts/install_sim_deps.sh installs Mesa's software "
        "driver (lavapipe, Mesa >= 23), or install your GPU's driver (and check VK_ICD_FILENAMES)"
    )


class _Pool:
    """``num_envs`` single-env worker processes (or one in-process env when ``num_envs == 1``)."""

    def __init__(self, cfg: dict, num_envs: int, start_timeout: float = 600.0):
        self.local: _SingleEnv | None = None
        self.conns: list = []
        self.procs: list = []
        if num_envs == 1:
            try:
                self.local = _SingleEnv(cfg, 0)
            except RuntimeError as exc:
                no_vulkan = vulkan_problem(str(exc))
                if no_vulkan:
                    raise UserError(no_vulkan) from None
                raise
            self.spec = self.local.spec()
            return
        ctx = mp.get_context("spawn")
        try:
            for i in range(num_envs):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child, cfg, i), daemon=True, name=f"maniskill-{i}")
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
            specs = [self._recv(i, timeout=start_timeout) for i in range(num_envs)]
        except BaseException:
            self.close()
            raise
        self.spec = specs[0]

    def _recv(self, i: int, timeout: float | None = None) -> Any:
        conn, proc = self.conns[i], self.procs[i]
        if timeout is not None and not conn.poll(timeout):
            raise TimeoutError(f"ManiSkill worker {i} did not answer within {timeout:.0f} s")
        try:
            msg = conn.recv()
        except EOFError:
            proc.join(1)
            raise RuntimeError(f"ManiSkill worker {i} died (exit code {proc.exitcode})") from None
        if msg[0] == "ok":
            return msg[1]
        _, name, text, tb = msg
        no_vulkan = vulkan_problem(text)
        if no_vulkan:
            raise UserError(no_vulkan)
        plain = {"MissingAssetError": MissingAssetError, "KeyError": KeyError, "ValueError": ValueError}
        if name in plain:  # the adapter's own, self-explanatory errors
            raise plain[name](text.strip("'\""))
        raise RuntimeError(f"ManiSkill worker {i}: {name}: {text}\n{tb}")

    def call(self, cmd: str, args: list[tuple]) -> list:
        """``cmd(*args[i])`` on every env; returns the answers in order."""
        if self.local is not None:
            return [getattr(self.local, cmd)(*args[0])]
        for conn, a in zip(self.conns, args):
            conn.send((cmd, a))
        return [self._recv(i) for i in range(len(self.conns))]

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
            self.local = None
        for conn in self.conns:
            with contextlib.suppress(Exception):
                conn.send(("close", ()))
        for conn, p in zip(self.conns, self.procs):
            with contextlib.suppress(Exception):
                if conn.poll(10):
                    conn.recv()
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            with contextlib.suppress(Exception):
                conn.close()
        self.conns, self.procs = [], []


# ---------------------------------------------------------------------------------- the adapter
class ManiSkillSim(Simulator):
    """ManiSkill3 task under the simulator contract (GPU-batched, or one CPU process per env)."""

    name_arg = "task"  # `mmrl check simulator maniskill:PushCube-v1` sets task=
    task_arg = "task"

    def __init__(
        self,
        num_envs: int = 4,
        task: str = "PickCube-v1",
        obs_mode: str = "state",
        control_mode: str | None = None,
        image_size: int = 64,
        sim_backend: str = "auto",
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int | None = None,
        instruction: str | list[str] | None = None,
        camera: str | list[str] | None = None,
        reward_mode: str = "sparse",
        render_images: bool = False,
        **make_kwargs: Any,
    ):
        if obs_mode not in ("state", "rgb"):
            raise ValueError(f"obs_mode must be 'state' or 'rgb', got {obs_mode!r}")
        if reward_mode not in ("sparse", "dense", "normalized_dense", "none"):
            raise ValueError(f"reward_mode must be sparse, dense, normalized_dense or none, got {reward_mode!r}")
        if num_envs < 1 or image_size < 1:
            raise ValueError("num_envs >= 1 and image_size >= 1 required")
        self.num_envs = int(num_envs)
        self.task = task
        self.obs_mode = obs_mode
        self.device = torch.device(device)
        backends = {"auto": None, "cpu": "physx_cpu", "gpu": "physx_cuda", "cuda": "physx_cuda"}
        backend = backends.get(sim_backend, sim_backend)
        if backend is None:
            backend = "physx_cuda" if self.device.type == "cuda" else "physx_cpu"
        if backend not in ("physx_cpu", "physx_cuda"):
            raise ValueError(f"sim_backend must be auto, physx_cpu or physx_cuda, got {sim_backend!r}")
        self.sim_backend = backend
        self.image_size = int(image_size)
        render = obs_mode == "rgb" or bool(render_images)
        self.cfg = dict(
            task=task,
            obs_mode=obs_mode,
            control_mode=control_mode,
            reward_mode=reward_mode,
            sim_backend=backend,
            max_episode_steps=max_episode_steps,
            image_size=self.image_size,
            camera=camera,
            render=render,
            make_kwargs=make_kwargs,
            num_envs=self.num_envs,
        )
        if instruction is None:
            instruction = INSTRUCTIONS.get(task, f"solve the ManiSkill task {task.rsplit('-v', 1)[0]}")
        if isinstance(instruction, str):
            self._instructions = [instruction] * self.num_envs
        else:
            if len(instruction) != self.num_envs:
                raise ValueError(f"got {len(instruction)} instructions for {self.num_envs} envs")
            self._instructions = [str(s) for s in instruction]
        self._rng = np.random.default_rng(int(seed))
        self._impl = _GpuEnvs(self.cfg, self.num_envs, self.device) if backend == "physx_cuda" else None
        self._pool = None if self._impl is not None else _Pool(self.cfg, self.num_envs)
        spec = self._impl.spec if self._impl is not None else self._pool.spec
        self._low = torch.as_tensor(spec["action_low"], dtype=torch.float32, device=self.device)
        self._high = torch.as_tensor(spec["action_high"], dtype=torch.float32, device=self.device)
        self.action_dim = int(self._low.numel())
        self.max_episode_steps = int(spec["max_episode_steps"])
        self.state_dim = spec["state_dim"]
        self.cameras = spec["cameras"]
        views = max(len(self.cameras), 1)
        hw = (self.image_size, self.image_size, 3)
        self.image_shape = hw if views == 1 else (views, *hw)
        self.reset(None)

    # ------------------------------------------------------------------ helpers
    def _to_env_actions(self, actions: torch.Tensor) -> torch.Tensor:
        a = torch.as_tensor(actions, dtype=torch.float32, device=self.device)
        if not torch.isfinite(a).all():
            raise ValueError("actions contain NaN or inf")
        a = a.clamp(-1.0, 1.0)
        finite = torch.isfinite(self._low) & torch.isfinite(self._high)
        mapped = self._low + (a + 1.0) * 0.5 * (self._high - self._low)
        return torch.where(finite, mapped, a)

    def _image(self, imgs: list) -> torch.Tensor:
        if imgs[0] is None:
            return torch.zeros((self.num_envs, *self.image_shape), dtype=torch.uint8, device=self.device)
        x = torch.from_numpy(np.stack(imgs)).to(self.device)
        return x if len(self.image_shape) == 4 else x[:, 0]

    def _observation(self, pairs: list) -> Observation:
        state = torch.from_numpy(np.stack([p[1] for p in pairs])).to(self.device)
        return Observation(self._image([p[0] for p in pairs]), list(self._instructions), state)

    def _seeds(self, seed: int | list[int] | None) -> list[int]:
        n = self.num_envs
        if seed is None:
            return [int(s) for s in self._rng.integers(0, 2**31, size=n)]
        if isinstance(seed, (int, np.integer)):
            return [(int(seed) + i) % 2**32 for i in range(n)]
        seeds = [int(s) % 2**32 for s in seed]
        if len(seeds) != n:
            raise ValueError(f"reset got {len(seeds)} seeds for {n} envs")
        return seeds

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | list[int] | None = None) -> Observation:
        seeds = self._seeds(seed)
        if self._impl is not None:
            return self._impl.reset(seeds, self._instructions)
        return self._observation(self._pool.call("reset", [(s,) for s in seeds]))

    def _run(self, actions: torch.Tensor, active: torch.Tensor | None = None) -> StepResult:
        n = self.num_envs
        if actions.dim() != 3 or actions.shape[0] != n or actions.shape[2] != self.action_dim:
            raise ValueError(f"actions must be [{n}, C, {self.action_dim}], got {tuple(actions.shape)}")
        a = self._to_env_actions(actions)
        if self._impl is not None:
            return self._impl.run(a, active, self._instructions)
        act = [True] * n if active is None else active.cpu().tolist()
        a_np = a.cpu().numpy()
        outs = self._pool.call("run", [(a_np[i] if act[i] else None,) for i in range(n)])
        dev = self.device

        def flag(key: str) -> torch.Tensor:
            return torch.tensor([o[key] for o in outs], dtype=torch.bool, device=dev)

        reward = torch.tensor([o["reward"] for o in outs], dtype=torch.float32, device=dev)
        terminated, truncated, success = flag("terminated"), flag("truncated"), flag("success")
        obs = self._observation([o["obs"] for o in outs])
        final_obs = None
        if any(o["final"] is not None for o in outs):
            final_obs = self._observation([o["final"] if o["final"] is not None else o["obs"] for o in outs])
        info = {"num_steps": torch.tensor([o["num_steps"] for o in outs], dtype=torch.long, device=dev)}
        return StepResult(obs, reward, terminated, truncated, success, final_obs, info)

    def get_state(self) -> dict:
        if self._impl is not None:
            st = self._impl.get_state()
        else:
            st = {"envs": self._pool.call("get_state", [()] * self.num_envs)}
        st["rng"] = self._rng.bit_generator.state
        return st

    def set_state(self, state: dict) -> None:
        if self._impl is not None:
            self._impl.set_state(state)
        else:
            self._pool.call("set_state", [(s,) for s in state["envs"]])
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state["rng"]

    def close(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.close()
            self._pool = None
        if getattr(self, "_impl", None) is not None:
            self._impl.close()
            self._impl = None

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


# ---------------------------------------------------------------------------------- GPU batch
class _GpuEnvs:
    """All ``num_envs`` scenes in one ``physx_cuda`` env, driven in place on the GPU.

    Seeded resets reset each scene on its own under ``torch.manual_seed(seed_i)`` (ManiSkill's
    batched seeding draws every scene from the first seed, so equal seeds would not give equal
    states); auto resets reset the finished scenes together under one seed drawn from the
    simulator's generator.
    """

    def __init__(self, cfg: dict, num_envs: int, device: torch.device):
        if device.type != "cuda":
            raise ValueError("sim_backend='physx_cuda' needs a CUDA device (device='cuda')")
        self.cfg = cfg
        self.n = num_envs
        self.device = device
        self.env, self.u, self.obs, self.max_steps = _open_env(cfg, num_envs)
        space = self.u.single_action_space
        self.elapsed = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.rng = np.random.default_rng(0)
        self.u.reset(seed=list(range(num_envs)))
        _, state = self.obs.read()
        self.spec = {
            "action_low": np.asarray(space.low, dtype=np.float32).reshape(-1),
            "action_high": np.asarray(space.high, dtype=np.float32).reshape(-1),
            "state_dim": int(state.shape[-1]),
            "cameras": list(self.obs.cameras),
            "max_episode_steps": self.max_steps,
        }

    def _seeded_reset(self, idx: torch.Tensor, seed: int) -> None:
        with torch.random.fork_rng(devices=[self.device]):
            torch.manual_seed(int(seed))
            with self.obs.no_render():
                self.u.reset(options={"env_idx": idx})
        self.elapsed[idx] = 0

    def _observe(self, instructions: list[str]) -> Observation:
        img, state = self.obs.read()
        if img is None:
            size, views = self.cfg["image_size"], max(len(self.obs.cameras), 1)
            img = torch.zeros((self.n, views, size, size, 3), dtype=torch.uint8)
        img = img.to(self.device)
        if img.shape[1] == 1:
            img = img[:, 0]
        return Observation(img, list(instructions), state.to(self.device))

    def reset(self, seeds: list[int], instructions: list[str]) -> Observation:
        with self.obs.no_render():
            self.u.reset(seed=list(seeds))  # per-scene numpy episode generators
        for i, s in enumerate(seeds):
            self._seeded_reset(torch.tensor([i], device=self.device), s)
        self.rng = np.random.default_rng(list(seeds))
        return self._observe(instructions)

    def run(self, actions: torch.Tensor, active: torch.Tensor | None, instructions: list[str]) -> StepResult:
        n, dev = self.n, self.device
        alive = torch.ones(n, dtype=torch.bool, device=dev) if active is None else active.to(dev).clone()
        reward = torch.zeros(n, device=dev)
        terminated = torch.zeros(n, dtype=torch.bool, device=dev)
        truncated = torch.zeros_like(terminated)
        success = torch.zeros_like(terminated)
        executed = torch.zeros(n, dtype=torch.long, device=dev)
        final_obs: Observation | None = None
        for i in range(actions.shape[1]):
            if not bool(alive.any()):
                break
            if active is not None and not bool(alive.all()):
                snap = _tree_clone(self.u.get_state_dict())  # inactive scenes must not move
            else:
                snap = None
            with self.obs.no_render():
                _, r, te, _, info = self.u.step(actions[:, i])
            if snap is not None:  # ManiSkill's partial set_state_dict takes the rows of env_idx only
                idx = torch.nonzero(~alive).flatten()
                self.u.set_state_dict(_tree_map(lambda x, idx=idx: x[idx], snap), idx)
            r, te = r.to(dev).float(), te.to(dev).bool()
            self.elapsed += alive.long()
            executed += alive.long()
            reward += torch.where(alive, r, torch.zeros_like(r))
            if "success" in info:
                success |= alive & info["success"].to(dev).bool()
            term = alive & te
            trunc = alive & ~te & (self.elapsed >= self.max_steps)
            terminated |= term
            truncated |= trunc
            ended = term | trunc
            if bool(ended.any()):
                cur = self._observe(instructions)
                if final_obs is None:
                    final_obs = cur
                else:
                    final_obs.image[ended] = cur.image[ended]
                    final_obs.state[ended] = cur.state[ended]
            alive &= ~ended
        done = terminated | truncated
        if bool(done.any()):
            self._seeded_reset(torch.nonzero(done).flatten(), int(self.rng.integers(2**31)))
        obs = self._observe(instructions)
        return StepResult(obs, reward, terminated, truncated, success, final_obs, {"num_steps": executed})

    def get_state(self) -> dict:
        return {
            "sim": _tree_clone(self.u.get_state_dict()),
            "ms_elapsed": self.u._elapsed_steps.clone(),
            "elapsed": self.elapsed.clone(),
            "env_rng": self.rng.bit_generator.state,
        }

    def set_state(self, st: dict) -> None:
        self.u.set_state_dict(_tree_clone(st["sim"]))
        self.u._elapsed_steps[:] = st["ms_elapsed"]
        self.elapsed = st["elapsed"].clone()
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = st["env_rng"]

    def close(self) -> None:
        self.env.close()
