"""WorldModelSim: a trained world model played as a simulator, its episodes judged by a reward model.

``sim.type: world_model`` wraps a checkpoint of ``policy.type: world_model``
(`mmrl.policies.world_model`) or ``wan_world_model`` (`mmrl.policies.wan_world_model`, a subclass
with the same `predict`): a run folder, a checkpoint or an `mmrl export` folder, behind the
simulator contract, so any policy and objective trains inside it unchanged:

- ``reset(seed)``: each environment starts from a *real* start frame (and state and instruction):
  the first observation of a recorded episode, picked by a hash of its seed from the start pool
  (``start_dataset`` / ``starts``: decision records, `mmrl.episodes`), so equal seeds start equal.
- ``step``: the world model imagines the frame and the state after each action (one model call per
  step: the model is trained on one-step chunks, so a policy of any chunk size acts in it; the
  default `step_chunk` runs a chunk step by step and stops an environment where its episode ends).
- Success, the reward and the episode's end come from a reward model of the reward stage (an image
  reward of `rewards`, built by name from ``reward`` / ``reward_kwargs``: the trained
  ``success_detector``, a CLIP or VLM-judge score): a frame scoring at least ``success_threshold``
  is a success, which gives reward 1 and ends the episode; ``max_episode_steps`` truncates.
- ``imagined_steps`` counts every step it imagined; none of them is a real environment step.

Imagination is only as good as the model: a policy trained inside it can exploit its errors (and the
detector's). Measure the gap in the real simulator (`mmrl.dyna`: the imagined-vs-real reward gap at
every evaluation).
"""

from __future__ import annotations

import torch

from mmrl.episodes import check_records
from mmrl.simulator import Observation, Simulator, StepResult, reset_seeds

from .reach import hash_uniform


def start_pool(records: dict) -> dict:
    """The first observation of every episode of decision ``records``: ``image``, ``instruction`` and
    (where recorded) ``state``."""
    check_records(records, "the world model's start frames")
    rows = (records["step"].long() == 0).nonzero().flatten()
    if not len(rows):
        raise ValueError("the start records hold no episode's first decision (step 0)")
    pool = {"image": records["image"][rows], "instruction": [records["instruction"][i] for i in rows.tolist()]}
    if "state" in records:
        pool["state"] = records["state"][rows].float()
    return pool


class WorldModelSim(Simulator):
    """A world model checkpoint played as a simulator (see the module docstring)."""

    def __init__(
        self,
        checkpoint: str | None = None,
        reward: str = "success_detector",
        reward_kwargs: dict | None = None,
        success_threshold: float = 0.5,
        start_dataset: str | None = None,
        start_kwargs: dict | None = None,
        starts: str | None = None,
        num_envs: int = 64,
        max_episode_steps: int = 20,
        seed: int = 0,
        device: str | torch.device = "cpu",
        model=None,
        reward_model=None,
        start_records: dict | None = None,
    ):
        if (checkpoint is None) == (model is None):
            raise ValueError(
                "give the world model as checkpoint (a run, checkpoint or export folder) or model, one of them"
            )
        sources = [s is not None for s in (start_dataset, starts, start_records)]
        if sum(sources) != 1:
            raise ValueError(
                "give the start frames once: start_dataset (a dataset of recorded episodes, e.g. reach_demos), "
                "starts (a .pt file of decision records) or start_records"
            )
        if num_envs < 1 or max_episode_steps < 1:
            raise ValueError("num_envs >= 1 and max_episode_steps >= 1 required")
        self.device = torch.device(device)
        if model is None:
            from mmrl.api import load_policy

            model = load_policy(checkpoint, device=str(self.device))
        from mmrl.policies.world_model import WorldModelPolicy

        if not isinstance(model, WorldModelPolicy):
            raise ValueError(
                f"{checkpoint or model!r} is a {type(model).__name__}, not a world model "
                "(policy.type: world_model or wan_world_model)"
            )
        if model.chunk_size != 1:
            raise ValueError(
                f"the world model predicts {model.chunk_size}-step chunks; the simulator steps one action at a "
                "time: train it with policy.chunk_size=1 (records of single steps)"
            )
        self.model = model.to(self.device).eval()
        if reward_model is None:
            from mmrl.registry import REWARDS

            reward_model = REWARDS.get(reward)(**dict(reward_kwargs or {}))
        if getattr(reward_model, "kind", "image") != "image":
            raise ValueError(
                f"reward '{reward}' scores {reward_model.kind}; a world model's frames need an image reward"
            )
        self.reward_model, self.success_threshold = reward_model, float(success_threshold)
        if start_records is None:
            if starts is not None:
                start_records = torch.load(starts, map_location="cpu", weights_only=True)
            else:
                from mmrl.data import load_dataset

                assert start_dataset is not None
                start_records = load_dataset(start_dataset, **dict(start_kwargs or {}))
        self.pool = start_pool(start_records)
        cfg = model.cfg
        self.num_envs, self.max_episode_steps = int(num_envs), int(max_episode_steps)
        self.action_dim = model.action_dim
        self.image_shape = (cfg.image_size, cfg.image_size, 3)
        self.state_dim = model.state_dim or None
        if self.state_dim and "state" not in self.pool:
            raise ValueError("the world model reads a state, but the start records have none")
        if tuple(self.pool["image"].shape[1:]) != self.image_shape:
            raise ValueError(
                f"start frames are {tuple(self.pool['image'].shape[1:])} but the world model predicts "
                f"{self.image_shape}"
            )
        self.context = cfg.context
        self.imagined_steps = 0
        self._gen = torch.Generator(device=self.device).manual_seed(int(seed))
        self._next_seed = int(seed)
        n = self.num_envs
        self.history = torch.zeros(n, self.context, *self.image_shape, dtype=torch.uint8, device=self.device)
        self.state = torch.zeros(n, self.state_dim or 0, device=self.device)
        self.instructions = [""] * n
        self.elapsed = torch.zeros(n, dtype=torch.long, device=self.device)
        self.reset(int(seed))

    # ------------------------------------------------------------------ episodes
    def _start(self, rows: torch.Tensor, seeds: list[int]) -> None:
        pick = (hash_uniform(torch.tensor(seeds, dtype=torch.int64), 1)[:, 0] * len(self.pool["instruction"])).long()
        pick = pick.clamp(max=len(self.pool["instruction"]) - 1)
        frames = self.pool["image"][pick].to(self.device)
        self.history[rows] = frames[:, None].expand(-1, self.context, -1, -1, -1)
        if self.state_dim:
            self.state[rows] = self.pool["state"][pick].to(self.device)
        for r, p in zip(rows.tolist(), pick.tolist(), strict=True):
            self.instructions[r] = self.pool["instruction"][p]
        self.elapsed[rows] = 0

    def _obs(self, rows: torch.Tensor | None = None) -> Observation:
        if rows is None:
            rows = torch.arange(self.num_envs, device=self.device)
        return Observation(
            image=self.history[rows, -1].clone(),
            instruction=[self.instructions[i] for i in rows.tolist()],
            state=self.state[rows].clone() if self.state_dim else None,
        )

    def reset(self, seed: int | list[int] | None = None) -> Observation:
        seeds, self._next_seed = reset_seeds(seed, self.num_envs, self._next_seed)
        if seed is not None:  # the imagined steps' noise follows the reset seeds
            self._gen.manual_seed(int(seeds[0]) * 1_000_003 + len(seeds))
        self._start(torch.arange(self.num_envs, device=self.device), seeds)
        return self._obs()

    def reset_to(self, obs: Observation) -> Observation:
        """Start every environment from given observations (``num_envs`` rows of real frames, their
        instructions and states): imagining the episodes a real evaluation starts from."""
        if obs.image.shape[0] != self.num_envs or tuple(obs.image.shape[1:]) != self.image_shape:
            raise ValueError(
                f"reset_to needs {self.num_envs} frames of {self.image_shape}, got {tuple(obs.image.shape)}"
            )
        if self.state_dim and obs.state is None:
            raise ValueError("this world model reads a state: the observations have none")
        self.history[:] = obs.image.to(self.device)[:, None]
        if self.state_dim:
            assert obs.state is not None
            self.state[:] = obs.state.to(self.device).float()
        self.instructions = list(obs.instruction)
        self.elapsed.zero_()
        return self._obs()

    def _draw_seeds(self, n: int) -> list[int]:
        return torch.randint(0, 2**62, (n,), generator=self._gen, device=self.device).tolist()

    # ------------------------------------------------------------------ imagining
    def success(self, frames: torch.Tensor, instructions: list[str]) -> torch.Tensor:
        """bool [B]: the reward model's score of each frame against its instruction reaches the threshold."""
        scores = self.reward_model(frames.cpu(), instructions)
        return (scores >= self.success_threshold).to(self.device)

    def _step_masked(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        if actions.dim() != 2 or actions.shape[1] != self.action_dim:
            raise ValueError(f"actions must be [N, {self.action_dim}], got {tuple(actions.shape)}")
        if not torch.isfinite(actions).all():
            raise ValueError("actions must be finite")
        n = self.num_envs
        reward = torch.zeros(n, device=self.device)
        terminated = torch.zeros(n, dtype=torch.bool, device=self.device)
        truncated = torch.zeros_like(terminated)
        rows = active.to(self.device).nonzero().flatten()
        final_obs = None
        if len(rows):
            instr = [self.instructions[i] for i in rows.tolist()]
            act = actions.to(self.device).float().clamp(-1, 1)[rows, None]  # one-step chunks
            state = self.state[rows] if self.state_dim else None
            frame, nxt = self.model.predict(self.history[rows], instr, act, state, self._gen)
            self.imagined_steps += len(rows)
            self.history[rows] = torch.cat([self.history[rows, 1:], frame[:, None].to(self.device)], 1)
            if nxt is not None:
                self.state[rows] = nxt
            self.elapsed[rows] += 1
            won = self.success(frame, instr)
            reward[rows] = won.float()
            terminated[rows] = won
            truncated[rows] = ~won & (self.elapsed[rows] >= self.max_episode_steps)
            done = (terminated | truncated).nonzero().flatten()
            if len(done):
                final_obs = self._obs()  # rows where done hold each finished episode's last observation
                self._start(done, self._draw_seeds(len(done)))
        return StepResult(self._obs(), reward, terminated, truncated, terminated.clone(), final_obs)

    def close(self) -> None:
        pass
