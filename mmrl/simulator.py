"""The simulator contract every adapter implements (checked by `mmrl.checks.simulator.check_simulator`).

A simulator holds ``num_envs`` environments and is driven in batches of torch tensors on
``self.device`` (CPU or GPU):

- ``reset(seed)`` resets every environment. ``seed`` is an int (env i gets ``seed + i``) or a list of
  ``num_envs`` ints; environments given the same seed start from the same initial state, which is
  how GRPO groups share an initial state. Returns an `Observation`.
- ``step(actions)`` with ``actions`` float ``[N, A]`` in ``[-1, 1]`` advances every environment one
  step; ``step_chunk(actions)`` with ``[N, C, A]`` executes an action chunk (C steps). An environment
  whose episode ends inside a chunk ignores the rest of the chunk. Returns a `StepResult`.
- Actions come in the simulator's ``action_type`` (`ACTION_TYPES`), the natural type of what the
  policy produces: ``"chunk"`` float ``[N, C, A]`` (robots), ``"text"`` a list of N `Completions`
  (VLM answers), ``"image"`` uint8 ``[N, H, W, 3]`` (generated images). Image simulators are
  single-turn: every episode is one decision; a text simulator's episode is one answer, or several
  turns of a conversation with tools (``Observation.messages``, `simulators.tool_env`).
- Rewards: a simulator returns its own task reward. Reward models (``rewards/``) are not the
  simulator's business: the trainer's reward stage (`mmrl.trainer.reward_stage.RewardStage`) scores what the
  policy produced against ``Observation.instruction`` and ``Observation.meta``.
- Step traces: ``step_chunk(actions, trace=True)`` also returns what happened at each step of the
  chunk in ``StepResult.info["trace"]`` (`TRACE_KEYS`: the frame after each step, the last frame of
  an episode where it ended, per-step reward / success / terminated / truncated, and which steps
  ran). The reward stage scores a robot simulator's frames from it (`mmrl.trainer.reward_stage`);
  the default `step_chunk` records it for every adapter that implements `_run` or `_step_masked`.
- Auto reset: an environment whose episode ended is reset inside the same call. The returned
  observation is already the first observation of its next episode; the last observation of the
  finished episode is in ``StepResult.final_obs`` (rows of the other environments are unspecified).
  An auto reset draws a fresh initial state from the simulator's own generator.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Observation:
    image: torch.Tensor  # uint8 [N, H, W, 3] (several cameras: [N, V, H, W, 3])
    instruction: list[str]  # one natural-language instruction per env
    state: torch.Tensor | None = None  # float [N, D] proprio / low-dim state, if the sim has one
    #: per env, the full-resolution images of a question (uint8 [H, W, 3] each, any size and count);
    #: VLM question sims set it and ``image`` then holds fixed-size thumbnails for videos
    images: list[list[torch.Tensor]] | None = None
    #: per env, the ground truth a reward model reads (e.g. ``{"answer": "3"}``, ``{"color": "red"}``);
    #: two keys are the evaluation's: ``"task"`` (a multi-task simulator's task: success per task) and
    #: ``"breakdown"``, ``{dimension: label}`` of the episode (e.g. reach's ``{"goal": "red", ...}``):
    #: the evaluation report gives success per label of each dimension (`mmrl.rollout.episode_breakdown`)
    meta: list[dict] | None = None
    #: per env, the videos of a question (sources a VLM decodes: paths, frames, ... see `mmrl.video`)
    videos: list[list] | None = None
    #: per env, the conversation so far of a multi-turn episode (`mmrl.tools`): chat messages in the
    #: transformers chat-template format (``{"role", "content"}``; content a str or a list of items
    #: ``{"type": "text", "text"}`` / ``{"type": "image", "image": uint8 [H, W, 3]}``, tool results
    #: as ``role: "tool"``); a VLM policy then renders it instead of ``instruction`` + ``images``
    messages: list[list[dict]] | None = None
    #: per env, the JSON schemas of the tools the conversation may call (the chat template's ``tools=``)
    tools: list[list[dict]] | None = None

    def index(self, idx: torch.Tensor) -> Observation:
        rows = idx.tolist() if idx.dtype != torch.bool else idx.nonzero().flatten().tolist()
        return Observation(
            self.image[idx],
            [self.instruction[i] for i in rows],
            None if self.state is None else self.state[idx],
            None if self.images is None else [self.images[i] for i in rows],
            None if self.meta is None else [self.meta[i] for i in rows],
            None if self.videos is None else [self.videos[i] for i in rows],
            None if self.messages is None else [self.messages[i] for i in rows],
            None if self.tools is None else [self.tools[i] for i in rows],
        )


class Completions(list):
    """The text actions of a VLM: N answer strings, and how many tokens each took
    (``num_tokens``, for rewards that read the length)."""

    def __init__(self, texts, num_tokens=None):
        super().__init__(str(t) for t in texts)
        self.num_tokens = [int(n) for n in num_tokens] if num_tokens is not None else [0] * len(self)
        if len(self.num_tokens) != len(self):
            raise ValueError(f"{len(self)} completions but {len(self.num_tokens)} token counts")

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return Completions(list.__getitem__(self, idx), self.num_tokens[idx])
        return list.__getitem__(self, idx)

    def __reduce__(self):  # pickles (sim workers) with its token counts
        return (Completions, (list(self), self.num_tokens))


#: ``StepResult.info["trace"]`` of ``step_chunk(actions, trace=True)``: tensors ``[N, K, ...]`` over the
#: K steps the chunk ran (K <= C: it stops once every episode has ended)
TRACE_KEYS = {
    "image": "uint8 [N, K, *image_shape]: the frame after step k (where the episode ended at k, its last frame)",
    "reward": "float [N, K]: the task reward of step k (0 where it did not run)",
    "success": "bool [N, K]",
    "terminated": "bool [N, K]",
    "truncated": "bool [N, K]",
    "active": "bool [N, K]: step k ran in env n (its episode had not ended before it)",
}

#: what ``step_chunk`` takes, by ``Simulator.action_type``
ACTION_TYPES = {
    "chunk": "float [N, C, A]",
    "text": "Completions (N strings)",
    "image": "uint8 [N, H, W, 3]",
    "video": "uint8 [N, F, H, W, 3]",
}


@dataclass
class StepResult:
    obs: Observation  # after auto reset
    reward: torch.Tensor  # float [N], summed over the executed steps of the chunk
    terminated: torch.Tensor  # bool [N], episode ended by the task (success or failure)
    truncated: torch.Tensor  # bool [N], episode ended by the time limit
    success: torch.Tensor  # bool [N], task success reached during this call
    final_obs: Observation | None = None  # last obs of episodes that ended (rows where done)
    info: dict = field(default_factory=dict)

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated


class Simulator:
    """Base class: subclasses set the attributes below and implement reset / step."""

    num_envs: int
    action_dim: int
    max_episode_steps: int
    image_shape: tuple[int, ...]  # (H, W, 3) or (V, H, W, 3); a video simulator's (F, H, W, 3)
    state_dim: int | None = None
    #: whether ``Observation.image`` shows the scene (False: all-zero placeholder images; a policy
    #: then encodes the state alone, see `mmrl.policies.state_backbone`)
    has_images: bool = True
    #: whether the task defines success (``StepResult.success``); if not, the headline metric of
    #: training and evaluation is the episode return
    has_success: bool = True
    #: what ``step_chunk`` takes (`ACTION_TYPES`): robot action chunks, or a single-turn answer /
    #: image; a policy acts only in simulators of its own ``action_type``
    action_type: str = "chunk"
    #: names of numeric per-step ``StepResult.info`` entries ([N]) that count events of an episode
    #: (a tool env's ``tool_calls``, ``tool_errors``): the episodic collector sums each over every
    #: episode (``info["counters"]``) and the trainer logs their per-episode means (``train/<name>``)
    episode_counters: tuple[str, ...] = ()
    device: torch.device = torch.device("cpu")
    #: constructor argument set by a ``NAME:VALUE`` simulator name (``maniskill:PickCube-v1``)
    name_arg: str | None = None
    #: constructor argument that picks one task of a suite (``mmrl eval`` evaluates task by task)
    task_arg: str | None = None
    #: constructor argument (a dict) taking the arguments of what the simulator wraps (e.g. a gym
    #: env's ``env_kwargs``): named in the error for an unknown argument
    passthrough_arg: str | None = None
    #: constructor arguments that evaluation simulators get (e.g. LIBERO's held-out init states)
    eval_kwargs: dict = {}
    #: the one language instruction of a single-task simulator (reported per task by `mmrl eval`);
    #: None where each episode has its own
    instruction: str | None = None
    #: the suite its task belongs to (e.g. ``libero_spatial``; `mmrl eval` reports success per
    #: suite); None where the simulator names none (a list where its tasks span several suites)
    suite: str | list[str] | None = None

    @classmethod
    def suite_tasks(cls, **kwargs) -> list:
        """Every task (values of ``task_arg``) of the suite the constructor ``kwargs`` describe.
        Default: only the configured task."""
        if cls.task_arg is None:
            raise ValueError(f"simulator {cls.__name__} has no tasks to choose from")
        if cls.task_arg in kwargs:
            return [kwargs[cls.task_arg]]
        return [inspect.signature(cls).parameters[cls.task_arg].default]

    def reset(self, seed: int | list[int] | None = None) -> Observation:
        raise NotImplementedError

    def step(self, actions) -> StepResult:
        """One step of ``[N, A]`` actions: a chunk of length one (a single-turn simulator's
        answers or images are one step as they are)."""
        return self.step_chunk(actions[:, None] if self.action_type == "chunk" else actions)

    def step_chunk(self, actions: torch.Tensor, trace: bool = False) -> StepResult:
        """Execute ``[N, C, A]`` chunks; envs that finish mid-chunk skip the rest. With ``trace``,
        ``info["trace"]`` holds every step's frame and outcome (`TRACE_KEYS`).

        Adapters with a native chunk executor implement `_run`; the others implement
        `_step_masked` and this loops over the chunk (so does a traced chunk of a native one).
        """
        if actions.dim() != 3 or actions.shape[1] < 1:
            raise ValueError(f"step_chunk needs [N, C, A] actions with C >= 1, got {tuple(actions.shape)}")
        if self._native_chunks() and not trace:
            return self._run(actions, torch.ones(actions.shape[0], dtype=torch.bool, device=self.device))
        n, c, _ = actions.shape
        reward = torch.zeros(n, device=self.device)
        terminated = torch.zeros(n, dtype=torch.bool, device=self.device)
        truncated = torch.zeros_like(terminated)
        success = torch.zeros_like(terminated)
        final_obs: Observation | None = None
        executed = torch.zeros(n, dtype=torch.long, device=self.device)
        out = None
        steps: list[dict] = []
        for i in range(c):
            active = ~(terminated | truncated)
            if not active.any():
                break
            act = actions[:, i]
            out = self._step_masked(act, active)
            executed += active.long()
            reward += torch.where(active, out.reward, torch.zeros_like(out.reward))
            ended = active & out.done
            terminated |= active & out.terminated
            truncated |= active & out.truncated
            success |= active & out.success
            if ended.any():
                final_obs = _merge_final(final_obs, out.final_obs, ended)
            if trace:
                steps.append(_trace_step(out, active, ended))
        info: dict[str, Any] = {"num_steps": executed}  # sim steps each env executed in this call
        if trace:
            info["trace"] = {k: torch.stack([s[k] for s in steps], 1) for k in TRACE_KEYS}
        assert out is not None, "C >= 1, and every env is active at the first step"
        return StepResult(out.obs, reward, terminated, truncated, success, final_obs, info)

    def _step_masked(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        """Step only the ``active`` envs (the others keep their state, get reward 0 and are not
        done) and return a full-batch `StepResult`; used by the default `step_chunk`."""
        if self._native_chunks():
            return self._run(actions[:, None], active.bool())
        raise NotImplementedError("implement _run (native chunks) or _step_masked")

    def _run(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        """Native chunk executor: ``[N, C, A]`` actions; envs where ``active`` is False do not move;
        each env stops at the end of its episode (auto reset, ``final_obs``) and skips the rest."""
        raise NotImplementedError

    def _native_chunks(self) -> bool:
        return type(self)._run is not Simulator._run

    def close(self) -> None:
        pass

    # optional: state snapshot/restore for offloading in collocated placement
    def get_state(self) -> dict:
        raise NotImplementedError

    def set_state(self, state: dict) -> None:
        raise NotImplementedError


def check_observation(sim, obs: Observation, name: str | None = None) -> None:
    """The boundary check of every reset the trainer makes: ``obs.image`` is uint8 ``[N, *image_shape]``
    as ``sim`` declares. A simulator that returns other images fails here, naming both shapes (and
    ``name``, default its class), instead of training a policy built for the declared ones."""
    want = (sim.num_envs, *tuple(sim.image_shape))
    got = tuple(obs.image.shape)
    if got != want or obs.image.dtype != torch.uint8:
        from mmrl.errors import UserError

        raise UserError(
            f"simulator {name or type(sim).__name__} returned images {obs.image.dtype} {list(got)} but declares "
            f"uint8 {list(want)} (num_envs, *image_shape): fix its image_shape or its rendering "
            "(`mmrl check simulator NAME` runs the full contract)"
        )


#: what every `StepResult` holds beside its observations: field -> dtype kind, each ``[N]``
STEP_FIELDS = {"reward": "float", "terminated": "bool", "truncated": "bool", "success": "bool"}


def step_result_problem(res: Any, n: int) -> str | None:
    """The first way ``res`` breaks the contract of a step's outcome (a `StepResult` whose
    `STEP_FIELDS` are tensors of their dtype kind, shape ``[n]``), or None. Shared by the trainer's
    boundary check (`check_step_result`) and the contract checker (`mmrl check simulator`)."""
    if not isinstance(res, StepResult):
        return f"must return a StepResult, got {type(res).__name__}"
    for name, kind in STEP_FIELDS.items():
        t = getattr(res, name)
        if not isinstance(t, torch.Tensor):
            return f"{name} must be a tensor, got {type(t).__name__}"
        if not (t.is_floating_point() if kind == "float" else t.dtype == torch.bool):
            return f"{name} must be {kind}, got {t.dtype}"
        if tuple(t.shape) != (n,):
            return f"{name} shape {tuple(t.shape)} != [N] ({n},)"
    return None


def check_step_result(sim, res: Any, name: str | None = None) -> None:
    """The boundary check of every step the trainer takes: reward float ``[N]`` and terminated /
    truncated / success bool ``[N]`` (`step_result_problem`), and the observation (`check_observation`).
    A simulator that returns anything else fails here in one line naming it, instead of deep in the
    trainer with a broadcast error, or training on rewards that mean something else. ``name``: what
    to call the simulator (default: its class)."""
    problem = step_result_problem(res, sim.num_envs)
    if problem is not None:
        from mmrl.errors import UserError

        raise UserError(
            f"simulator {name or type(sim).__name__} returned a step against its contract: {problem} (a step "
            f"gives reward float [N] and terminated / truncated / success bool [N], N = num_envs = {sim.num_envs}): "
            "fix what its step_chunk returns (`mmrl check simulator NAME` runs the full contract)"
        )
    check_observation(sim, res.obs, name)


def reset_seeds(seed: int | list[int] | None, n: int, next_seed: int) -> tuple[list[int], int]:
    """Per-env seeds of a ``reset(seed)`` and the seed counter for later auto resets.

    ``None`` continues the counter; an int gives ``seed + i``; a list is taken as is (length n).
    After an explicit reset the counter is a hash of the seeds, so auto resets are reproducible.
    """
    if seed is None:
        return [next_seed + i for i in range(n)], next_seed + n
    seeds = [int(seed) + i for i in range(n)] if isinstance(seed, int) else [int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"reset got {len(seeds)} seeds for {n} envs")
    return seeds, (sum(seeds) * 2654435761 + n) % (1 << 40)


def _trace_step(out: StepResult, active: torch.Tensor, ended: torch.Tensor) -> dict:
    """One step of a `TRACE_KEYS` trace from the `StepResult` of `Simulator._step_masked`."""
    image = out.obs.image
    if ended.any():  # the last frame of an episode that ended, not its auto-reset successor
        assert out.final_obs is not None, "the contract: a step where an episode ends has its final_obs"
        image = image.clone()
        image[ended] = out.final_obs.image[ended]
    zero = torch.zeros_like(active)
    return {
        "image": image,
        "reward": torch.where(active, out.reward, torch.zeros_like(out.reward)),
        "success": torch.where(active, out.success, zero),
        "terminated": torch.where(active, out.terminated, zero),
        "truncated": torch.where(active, out.truncated, zero),
        "active": active.clone(),
    }


def _merge_final(acc: Observation | None, new: Observation | None, rows: torch.Tensor):
    if new is None:
        return acc
    if acc is None:
        return Observation(
            new.image.clone(),
            list(new.instruction),
            None if new.state is None else new.state.clone(),
            None if new.images is None else list(new.images),
            None if new.meta is None else list(new.meta),
            None if new.videos is None else list(new.videos),
            None if new.messages is None else list(new.messages),
            None if new.tools is None else list(new.tools),
        )
    # one simulator's observations: each field is there in all of them, or in none
    acc.image[rows] = new.image[rows]
    if acc.state is not None:
        assert new.state is not None
        acc.state[rows] = new.state[rows]
    for i in rows.nonzero().flatten().tolist():
        acc.instruction[i] = new.instruction[i]
        if acc.images is not None:
            assert new.images is not None
            acc.images[i] = new.images[i]
        if acc.meta is not None:
            assert new.meta is not None
            acc.meta[i] = new.meta[i]
        if acc.videos is not None:
            assert new.videos is not None
            acc.videos[i] = new.videos[i]
        if acc.messages is not None:
            assert new.messages is not None
            acc.messages[i] = new.messages[i]
        if acc.tools is not None:
            assert new.tools is not None
            acc.tools[i] = new.tools[i]
    return acc
