"""The reward-model contract (checked by `mmrl.checks.reward.check_reward`).

A reward model scores a batch of single-turn samples and returns float32 ``[B]`` on the CPU:

- ``kind = "image"``: ``reward(images, prompts, meta)`` with ``images`` uint8 ``[B, H, W, 3]``,
  ``prompts`` a list of B strings and ``meta`` an optional list of B dicts (ground truth carried
  by the prompt dataset, e.g. ``{"color": "red", "count": 2}``).
- ``kind = "text"``: ``reward(completions, prompts, meta)`` with ``completions`` a list of B strings
  (VLM answers; ``meta`` holds e.g. ``{"answer": "42"}``).

Scores must not depend on which other samples share the batch (a sample scores the same alone or
in any batch, up to float tolerance), must be finite, and equal inputs give equal scores. Bad
input (wrong dtype, shape, or a prompt list of the wrong length) raises ``ValueError`` naming what
was expected. A reward model that fails while scoring raises; `RewardStage` (the trainer's reward
stage) and `simulators.semantic` wrap that in `RewardError` with the reward's name, and the run
stops before touching the last checkpoint.

`RewardStage` is where reward models meet the trainer: after each decision of a single-turn policy
(a VLM's answers, a generator's images) it scores the policy's actions, batched over the envs that
acted, against the observation's prompts and ``meta``, adds the score to the simulator's task
reward and sets ``success`` where the score reaches ``success_threshold``.

``WeightedSum`` combines several rewards of one kind: ``sum_i w_i * r_i`` and reports each part.
"""

from __future__ import annotations

from typing import Sequence

import torch

from mmrl.simulator import Completions, Observation, StepResult


class RewardError(RuntimeError):
    """A reward model failed while scoring a batch (the message names the reward)."""


class Reward:
    """Base class: subclasses set ``name`` and ``kind`` and implement `score`."""

    name: str = "reward"
    kind: str = "image"  # "image" or "text"

    def __call__(self, samples, prompts: Sequence[str], meta: Sequence[dict] | None = None) -> torch.Tensor:
        prompts = list(prompts)
        if self.kind == "image":
            check_images(samples, len(prompts))
        else:
            if not isinstance(samples, (list, tuple)) or not all(isinstance(s, str) for s in samples):
                raise ValueError(f"reward '{self.name}' scores text: pass a list of strings")
            if len(samples) != len(prompts):
                raise ValueError(f"reward '{self.name}': {len(samples)} completions but {len(prompts)} prompts")
        if meta is not None and len(meta) != len(prompts):
            raise ValueError(f"reward '{self.name}': {len(meta)} meta entries but {len(prompts)} prompts")
        out = self.score(samples, prompts, list(meta) if meta is not None else [{} for _ in prompts])
        return torch.as_tensor(out, dtype=torch.float32).detach().cpu().reshape(len(prompts))

    def score(self, samples, prompts: list[str], meta: list[dict]) -> torch.Tensor:
        raise NotImplementedError

    def preflight(self) -> None:
        """Called once before a run starts any work: raise `RewardError` naming the problem when
        the reward cannot score (e.g. its server does not answer). Default: nothing to check."""

    def parts(self, samples, prompts, meta=None) -> dict[str, torch.Tensor]:
        """Named components for logging (a single reward: itself)."""
        return {self.name: self(samples, prompts, meta)}


def check_images(images, n: int | None = None) -> None:
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8 or images.dim() != 4 \
            or images.shape[-1] != 3:
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        dtype = getattr(images, "dtype", "")
        raise ValueError(f"image rewards take uint8 images [B, H, W, 3], got {got} {dtype}")
    if n is not None and images.shape[0] != n:
        raise ValueError(f"{images.shape[0]} images but {n} prompts")


class WeightedSum(Reward):
    """``sum_i weight_i * reward_i`` over rewards of the same kind."""

    def __init__(self, rewards: dict[str, Reward] | Sequence[Reward], weights: Sequence[float] | None = None,
                 name: str = "weighted_sum"):
        items = list(rewards.items()) if isinstance(rewards, dict) else [(r.name, r) for r in rewards]
        if not items:
            raise ValueError("WeightedSum needs at least one reward")
        kinds = {r.kind for _, r in items}
        if len(kinds) != 1:
            raise ValueError(f"WeightedSum mixes reward kinds {sorted(kinds)}; combine one kind at a time")
        weights = [1.0] * len(items) if weights is None else [float(w) for w in weights]
        if len(weights) != len(items):
            raise ValueError(f"{len(weights)} weights for {len(items)} rewards")
        self.items, self.weights, self.name, self.kind = items, weights, name, kinds.pop()

    def parts(self, samples, prompts, meta=None) -> dict[str, torch.Tensor]:
        out = {}
        for key, reward in self.items:
            try:
                out[key] = reward(samples, prompts, meta)
            except Exception as exc:  # name the failing part
                raise RewardError(f"reward '{key}' failed: {exc}") from exc
        return out

    def score(self, samples, prompts, meta) -> torch.Tensor:
        parts = self.parts(samples, prompts, meta)
        return sum(w * parts[k] for (k, _), w in zip(self.items, self.weights))


class RewardStage:
    """The trainer's reward stage (the experiment's ``reward:`` section): ``model`` scores a
    single-turn policy's actions; ``success_threshold`` (None: the task's own success only) makes
    ``success = score >= threshold``."""

    KINDS = {"text": "text", "image": "image"}  # the simulator action type each reward kind scores

    def __init__(self, model: Reward, success_threshold: float | None = None, name: str | None = None):
        if model.kind not in self.KINDS:
            raise ValueError(f"reward '{name or model.name}' has kind {model.kind!r}; a reward stage scores "
                             f"{sorted(self.KINDS)}")
        self.model, self.threshold = model, success_threshold
        self.name = name or model.name

    @property
    def defines_success(self) -> bool:
        return self.threshold is not None

    def check_simulator(self, sim) -> None:
        """Raise ValueError naming the fix unless the simulator's actions are what the reward scores."""
        want = self.KINDS[self.model.kind]
        if sim.action_type != want:
            raise ValueError(f"reward '{self.name}' scores {self.model.kind}, but simulator actions are "
                             f"{sim.action_type!r}: use a {sim.action_type} reward, or for a robot simulator's frames "
                             "sim.type: semantic (an image reward on the rendered frames)")

    def __call__(self, res: StepResult, obs: Observation, actions, alive: torch.Tensor) -> StepResult:
        """``res`` of the decision ``actions`` taken on ``obs``, with the score of the envs in
        ``alive`` added to its reward (and ``success`` set by the threshold)."""
        rows = alive.cpu().nonzero().flatten().tolist()
        if not rows:
            return res
        prompts = [obs.instruction[r] for r in rows]
        meta = [dict(obs.meta[r]) if obs.meta is not None else {} for r in rows]
        if isinstance(actions, Completions):
            samples = Completions([actions[r] for r in rows], [actions.num_tokens[r] for r in rows])
            for m, n in zip(meta, samples.num_tokens):
                m["completion_tokens"] = n  # the overlong penalty reads it
        elif isinstance(actions, list):
            samples = [actions[r] for r in rows]
        else:
            samples = actions[torch.tensor(rows, device=actions.device)].cpu()
        try:
            score = self.model(samples, prompts, meta)
        except Exception as exc:
            raise RewardError(f"reward '{self.name}' failed on {len(rows)} samples (first prompt {prompts[0]!r}): "
                              f"{type(exc).__name__}: {exc}") from exc
        reward = res.reward.clone()
        idx = torch.tensor(rows, device=reward.device)
        reward[idx] = reward[idx] + score.to(reward.device, reward.dtype)
        res.reward = reward
        if self.threshold is not None:
            success = res.success.clone()
            success[idx] |= score.to(success.device) >= self.threshold
            res.success = success
        return res
