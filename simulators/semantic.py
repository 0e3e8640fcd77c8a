"""SemanticRewardSim: any registered simulator with its reward replaced by (or synthesised with) an
image reward model scored on the frames the simulator renders, the instruction as the prompt.

This is the reward-in-the-loop setting of VLM-RM / VLM-RL: the policy is trained on what a
vision-language reward model (``rewards/``: ``clip_contrast_goal``, ``clip_goal_baseline``,
``clip_cosine``, or any image reward) says about the camera frames, not on the simulator's own
reward. ``success`` is always the wrapped simulator's (it is the evaluation metric) and it never
enters the semantic reward; it is available to `synthesis` only when a config names it.

Config (``sim.kwargs`` of an experiment with ``sim.type: semantic``)::

    base: reach                      # the wrapped simulator (registry name) ...
    base_kwargs: {max_episode_steps: 40}   # ... and its constructor arguments
    reward: clip_contrast_goal       # an image reward (registry name) ...
    reward_kwargs: {model_name: "local-dir:runs/reach_clip", pretrained: null, t_min: -0.05, t_max: 0.05}
    timing: episode_end              # or "step"
    episode_mode: final              # episode_end only: "final" (last frame) or "mean" (mean over frames)
    goal_meta:                       # per-sample reward meta built from the instruction (optional)
      positive_goal: "the gripper is on the {color} disc"
      negative_goal: "the gripper is far from the {color} disc"
    instruction_pattern: "(?P<color>red|green|blue|yellow|purple|cyan|orange|pink)"
    synthesis: {mode: weighted, weights: {semantic: 1.0}}   # `rewards.synthesis.RewardSynthesis`

Timing:

- ``step``: every simulator step's frame is scored (the frame after the step; for an episode that
  ended, its last frame), in one batch over the active envs, and the score is that step's semantic
  reward: a dense signal. Caveat for tasks that terminate on success (``reach``): a per-step reward
  in [0, 1] pays for every step spent near the goal, so ending the episode early forfeits reward;
  use it synthesised with a step cost (``weights: {semantic: 1.0, step_cost: 1.0}`` turns it into a
  non-positive "distance cost", see the ``step_cost`` term) or with ``episode_end``.
- ``episode_end`` (default; VLM-RL style, deferred to the end of the episode): the frames of an
  episode are buffered and scored in one batch when it ends (all envs ending in the same step
  share the batch); the score is written to the episode's final step, every other step gets 0.
  ``episode_mode: final`` scores the last frame only (the reward the benchmark
  `benchmarks/semantic_reward.py` uses on ``reach``, VLM-RL's goal-state reward: whether the last
  frame looks like the goal text says; reaching it earlier is discounted less); ``mean`` averages
  the per-frame scores of the episode.

Chunks: the wrapper runs action chunks one step at a time through the wrapped simulator's
``_step_masked`` (the default `Simulator.step_chunk` loop), so every step's frame is available and
envs that end inside a chunk skip the rest of it exactly as in the wrapped simulator.

Synthesis (`rewards.synthesis`): the semantic reward is combined per step with the terms
``base`` (the wrapped simulator's reward), ``success``, ``terminated``, ``truncated`` (0/1) and
``step_cost`` (-1 on every executed step); the default ``{mode: weighted, weights: {semantic: 1}}``
is the semantic reward alone. ``failure_term`` names a term used as the failure mask of
`rewards.synthesis.terminal_override` (the reward is ``synthesis.failure_penalty`` there).

``info`` of a step adds ``semantic_reward`` and ``base_reward`` ([N], summed over the executed steps).
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from mmrl.simulator import Observation, Simulator, StepResult

TIMINGS = ("step", "episode_end")
EPISODE_MODES = ("final", "mean")
TERMS = ("base", "success", "terminated", "truncated", "step_cost")

_REWARD_CACHE: dict[str, Any] = {}


def build_reward(name: str, kwargs: dict | None, cache: bool = True):
    """An image reward model from the registry; equal (name, kwargs) share one instance per process
    (the training and evaluation simulators of a run load the model once). The global torch RNG is
    left untouched, so a run builds the same policy with or without this simulator."""
    from mmrl.registry import REWARDS

    key = json.dumps([name, kwargs or {}], sort_keys=True, default=str)
    if cache and key in _REWARD_CACHE:
        return _REWARD_CACHE[key]
    with torch.random.fork_rng(devices=[]):  # building a model (random init, then load) must not move
        model = REWARDS.build(name, **(kwargs or {}))  # the global RNG: the policy built next is seeded by it
    if getattr(model, "kind", "image") != "image":
        raise ValueError(f"reward '{name}' scores {model.kind}; SemanticRewardSim needs an image reward")
    if cache:
        _REWARD_CACHE[key] = model
    return model


class SemanticRewardSim(Simulator):
    """A wrapped simulator whose reward is an image reward model's score of its frames."""

    eval_kwargs = {"evaluation": True}

    def __init__(
        self,
        num_envs: int = 8,
        base: str = "reach",
        base_kwargs: dict | None = None,
        reward: Any = "clip_contrast_goal",
        reward_kwargs: dict | None = None,
        timing: str = "episode_end",
        episode_mode: str = "final",
        goal_meta: dict | None = None,
        instruction_pattern: str | None = None,
        synthesis: dict | None = None,
        failure_term: str | None = None,
        view: int = 0,
        evaluation: bool = False,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ):
        from mmrl.registry import SIMULATORS
        from rewards.synthesis import RewardSynthesis

        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {list(TIMINGS)}, got {timing!r}")
        if episode_mode not in EPISODE_MODES:
            raise ValueError(f"episode_mode must be one of {list(EPISODE_MODES)}, got {episode_mode!r}")
        if base == "semantic":
            raise ValueError("base must be another simulator, not 'semantic'")
        self.synthesis = RewardSynthesis.from_dict(synthesis or {"mode": "weighted", "weights": {"semantic": 1.0}})
        named = [k for k in self.synthesis.weights if k != "semantic"] if self.synthesis.mode == "weighted" else []
        named += list(self.synthesis.factors) + ([self.synthesis.gate] if self.synthesis.gate else [])
        if self.synthesis.mode == "hierarchical":
            named.append(self.synthesis.speed)
        if failure_term is not None:
            named.append(failure_term)
        unknown = sorted({k for k in named if k not in TERMS})
        if unknown:
            raise ValueError(f"synthesis names unknown term(s) {unknown}; terms: {list(TERMS)} (and 'semantic')")
        self.failure_term = failure_term
        self.timing, self.episode_mode = timing, episode_mode
        self.goal_meta = dict(goal_meta or {})
        self.pattern = re.compile(instruction_pattern) if instruction_pattern else None
        self.view = int(view)

        cls = SIMULATORS.get(base)
        kwargs = {**(base_kwargs or {}), **(cls.eval_kwargs if evaluation else {})}
        self.base_name = base
        self.base: Simulator = SIMULATORS.build(base, num_envs=num_envs, seed=seed, device=device, **kwargs)
        self.reward_name = reward if isinstance(reward, str) else getattr(reward, "name", type(reward).__name__)
        self.reward_model = build_reward(reward, reward_kwargs) if isinstance(reward, str) else reward

        b = self.base
        self.num_envs, self.action_dim = b.num_envs, b.action_dim
        self.max_episode_steps, self.image_shape = b.max_episode_steps, tuple(b.image_shape)
        self.state_dim, self.device = b.state_dim, torch.device(b.device)
        self.has_images, self.has_success = b.has_images, b.has_success
        n = self.num_envs
        self._frames: torch.Tensor | None = None  # episode_end + mean: [N, T, H, W, 3] buffered frames
        self._length = torch.zeros(n, dtype=torch.long)
        self._sem_acc = torch.zeros(n)
        self._base_acc = torch.zeros(n)

    # ------------------------------------------------------------------ prompts and scores
    def meta_for(self, instructions: list[str]) -> list[dict] | None:
        """Reward meta per instruction: `goal_meta` templates formatted with ``{instruction}`` and the
        named groups of `instruction_pattern` (None without templates)."""
        if not self.goal_meta:
            return None
        out = []
        for text in instructions:
            fields = {"instruction": text}
            if self.pattern is not None:
                m = self.pattern.search(text)
                if m is None:
                    raise ValueError(f"instruction_pattern {self.pattern.pattern!r} does not match instruction {text!r}")
                fields.update({k: v for k, v in m.groupdict().items() if v is not None})
            try:
                out.append({k: t.format(**fields) for k, t in self.goal_meta.items()})
            except KeyError as exc:
                raise ValueError(f"goal_meta template needs field {exc} (fields: {sorted(fields)}); "
                                 "name it as a group of instruction_pattern") from exc
        return out

    def score(self, frames: torch.Tensor, instructions: list[str]) -> torch.Tensor:
        """Image reward of uint8 frames ``[B, H, W, 3]`` with their instructions -> float ``[B]`` (CPU)."""
        if frames.shape[0] == 0:
            return torch.zeros(0)
        from mmrl.reward import RewardError

        meta = self.meta_for(instructions)  # a template / pattern error is raised as is
        try:
            out = self.reward_model(frames, instructions, meta)
        except Exception as exc:
            raise RewardError(f"reward '{self.reward_name}' failed on {len(instructions)} frames "
                              f"(e.g. {instructions[:2]}): {exc}") from exc
        return out.float().cpu()

    def _view(self, image: torch.Tensor) -> torch.Tensor:
        return image[:, self.view] if image.dim() == 5 else image

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | list[int] | None = None) -> Observation:
        self._length.zero_()
        return self.base.reset(seed)

    def step_chunk(self, actions: torch.Tensor) -> StepResult:
        self._sem_acc = torch.zeros(self.num_envs)
        self._base_acc = torch.zeros(self.num_envs)
        res = super().step_chunk(actions)
        res.info.update(semantic_reward=self._sem_acc.to(self.device), base_reward=self._base_acc.to(self.device))
        return res

    def _step_masked(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        res = self.base._step_masked(actions, active)
        n = self.num_envs
        act = active.to(self.device).bool()
        done = (res.terminated | res.truncated) & act
        frames = self._view(res.obs.image)
        instructions = list(res.obs.instruction)
        if done.any():  # the last frame (and instruction) of the episodes that ended
            frames = frames.clone()
            frames[done] = self._view(res.final_obs.image)[done]
            for i in done.nonzero().flatten().tolist():
                instructions[i] = res.final_obs.instruction[i]
        semantic = torch.zeros(n)
        if self.timing == "step":
            rows = act.nonzero().flatten()
            semantic[rows.cpu()] = self.score(frames[rows], [instructions[i] for i in rows.tolist()])
        elif self.episode_mode == "final":
            rows = done.nonzero().flatten()
            semantic[rows.cpu()] = self.score(frames[rows], [instructions[i] for i in rows.tolist()])
        else:
            self._buffer(frames, act)
            rows = done.nonzero().flatten()
            if rows.numel():
                semantic[rows.cpu()] = self._episode_means(rows, instructions)
                self._length[rows.cpu()] = 0
        a = act.cpu()
        base_reward = res.reward.float().cpu()
        terms = {
            "base": base_reward,
            "success": res.success.float().cpu(),
            "terminated": res.terminated.float().cpu(),
            "truncated": res.truncated.float().cpu(),
            "step_cost": -a.float(),
        }
        failure = terms[self.failure_term].bool() & a if self.failure_term else None
        reward = self.synthesis(semantic, terms, failure)
        reward = torch.where(a, reward, torch.zeros_like(reward))
        self._sem_acc += torch.where(a, semantic, torch.zeros_like(semantic))
        self._base_acc += torch.where(a, base_reward, torch.zeros_like(base_reward))
        return StepResult(res.obs, reward.to(self.device), res.terminated, res.truncated, res.success,
                          res.final_obs, dict(res.info))

    def _buffer(self, frames: torch.Tensor, active: torch.Tensor) -> None:
        if self._frames is None or self._frames.shape[2:] != frames.shape[1:]:
            self._frames = torch.zeros(self.num_envs, self.max_episode_steps, *frames.shape[1:], dtype=torch.uint8)
        rows = active.nonzero().flatten().cpu()
        slot = self._length[rows].clamp(max=self.max_episode_steps - 1)
        self._frames[rows, slot] = frames[rows.to(frames.device)].cpu()
        self._length[rows] += 1

    def _episode_means(self, rows: torch.Tensor, instructions: list[str]) -> torch.Tensor:
        """Mean per-frame score of the buffered episodes of ``rows``, all frames in one batch."""
        r = rows.cpu()
        lengths = self._length[r].clamp(max=self.max_episode_steps)
        owner = torch.repeat_interleave(torch.arange(r.numel()), lengths)
        step = torch.cat([torch.arange(int(k)) for k in lengths.tolist()])
        flat = self._frames[r[owner], step]
        texts = [instructions[int(r[o])] for o in owner.tolist()]
        scores = self.score(flat.to(self.device), texts)
        sums = torch.zeros(r.numel()).index_add_(0, owner, scores)
        return sums / lengths.clamp(min=1).float()

    def get_state(self) -> dict:
        return {
            "base": self.base.get_state(),
            "length": self._length.clone(),
            "frames": None if self._frames is None else self._frames.clone(),
        }

    def set_state(self, state: dict) -> None:
        self.base.set_state(state["base"])
        self._length = state["length"].clone()
        self._frames = None if state["frames"] is None else state["frames"].clone()

    def close(self) -> None:
        self.base.close()


__all__ = ["SemanticRewardSim", "build_reward", "TIMINGS", "EPISODE_MODES", "TERMS"]
