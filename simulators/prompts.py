"""PromptSim: single-turn generation tasks (prompt -> image, scored by a reward model) as a simulator.

This is how the one trainer drives image generators: every episode is one step. ``reset`` deals
each environment a prompt from a prompt dataset (``datasets/``, e.g. ``shapes_prompts`` or
``prompt_list``); the policy's action is the generated image, flattened: ``actions`` ``[N, 1,
H*W*3]`` in ``[-1, 1]`` (pixel ``(h, w, c)`` at index ``(h * W + w) * 3 + c``, ``-1`` black, ``1``
white); ``step`` turns it into uint8 images and scores them with a reward model (``rewards/``, e.g.
``shapes``, ``clip_score``, ``pickscore``; a ``weighted_sum`` combines several). The episode then
terminates, so a GRPO group (environments given the same reset seed) is a group of images of one
prompt, as in Flow-GRPO.

Observations: ``image`` is black before generation; the finished episode's ``final_obs.image`` is
the generated image (so evaluation videos and grids show it). ``instruction`` is the prompt. There is
no ``state``. ``success`` is ``reward >= success_threshold`` (all False without a threshold).

Prompt datasets: ``build(split="train"|"eval", **dataset_kwargs)`` returning ``{"prompt": [P str],
"meta": [P dict]}``; evaluation simulators get ``split="eval"`` (held-out prompts).

Prompt choice (``deal``): env i reset with seed s gets prompt ``floor(u(s) * P)`` for a
counter-based hash ``u`` (`simulators.reach.hash_uniform`) with ``deal="random"`` (training: fresh
prompts drawn with replacement), or prompt ``s mod P`` with ``deal="cycle"`` (evaluation, the
``eval_kwargs``): the trainer evaluates episodes with consecutive seeds, so ``k * P`` episodes
evaluate every held-out prompt exactly k times (`PromptSim.evaluation_rounds` checks the count).
Either way equal seeds give equal prompts in any batch. Reward model failures raise
`mmrl.reward.RewardError` naming the reward, the prompts, and the cause.
"""

from __future__ import annotations

import torch

from mmrl.simulator import Observation, Simulator, StepResult, reset_seeds
from .reach import hash_uniform


class PromptSim(Simulator):
    """Prompt -> image -> reward, one step per episode."""

    max_episode_steps = 1
    name_arg = "dataset"  # `mmrl check simulator prompts:shapes_prompts`
    eval_kwargs = {"split": "eval", "deal": "cycle"}  # every held-out prompt equally often
    DEALS = ("random", "cycle")

    def __init__(self, num_envs: int = 8, dataset: str = "shapes_prompts", dataset_kwargs: dict | None = None,
                 reward: str = "shapes", reward_kwargs: dict | None = None, image_size: int = 16,
                 split: str = "train", success_threshold: float | None = None, deal: str = "random",
                 device: str | torch.device = "cpu", seed: int = 0):
        from mmrl.data import load_dataset
        from mmrl.registry import REWARDS

        if num_envs < 1 or image_size < 1:
            raise ValueError("num_envs >= 1 and image_size >= 1 required")
        if deal not in self.DEALS:
            raise ValueError(f"PromptSim deal must be one of {self.DEALS}, got {deal!r}")
        kwargs = {**(dataset_kwargs or {}), "split": split}  # prompt datasets take split=train|eval
        data = load_dataset(dataset, **kwargs)
        if not isinstance(data, dict) or not data.get("prompt"):
            raise ValueError(f"prompt dataset '{dataset}' must return {{'prompt': [...], 'meta': [...]}} "
                             "with at least one prompt")
        self.prompts: list[str] = list(data["prompt"])
        self.meta: list[dict] = list(data.get("meta") or [{} for _ in self.prompts])
        self.reward_name = reward
        self.reward_model = REWARDS.build(reward, **(reward_kwargs or {}))
        if getattr(self.reward_model, "kind", "image") != "image":
            raise ValueError(f"reward '{reward}' scores {self.reward_model.kind}, PromptSim needs an image reward")
        self.num_envs, self.split, self.deal, self.threshold = int(num_envs), split, deal, success_threshold
        self.has_success = success_threshold is not None  # else the metric is the mean reward
        self.image_size = int(image_size)
        self.image_shape = (self.image_size, self.image_size, 3)
        self.action_dim = self.image_size * self.image_size * 3
        self.device = torch.device(device)
        self._next_seed = int(seed) * 1_000_003  # auto resets draw fresh prompts from here
        self._idx = torch.zeros(self.num_envs, dtype=torch.long)

    # ------------------------------------------------------------------ contract
    def prompt_index(self, seeds: list[int]) -> torch.Tensor:
        """Prompt index of each reset seed (see ``deal`` in the module docstring)."""
        s = torch.tensor(seeds, dtype=torch.int64)
        if self.deal == "cycle":
            return s % len(self.prompts)
        u = hash_uniform(s, 1)[:, 0]
        return (u * len(self.prompts)).long().clamp(max=len(self.prompts) - 1)

    def evaluation_rounds(self, num_episodes: int) -> int:
        """How many times ``num_episodes`` consecutive seeds deal each prompt (``deal="cycle"``);
        raises ValueError unless that is the same whole number k >= 1 for every prompt."""
        p = len(self.prompts)
        if self.deal != "cycle":
            raise ValueError(f"PromptSim deals prompts at random (deal={self.deal!r}): only deal='cycle' "
                             "evaluates every prompt equally often")
        if num_episodes < p or num_episodes % p:
            k = max(1, round(num_episodes / p))
            raise ValueError(f"{num_episodes} evaluation episodes deal the {p} held-out prompts unequally: "
                             f"set trainer.eval_episodes to a multiple of {p} (e.g. {k * p}, {k} per prompt)")
        return num_episodes // p

    def _obs(self) -> Observation:
        image = torch.zeros(self.num_envs, *self.image_shape, dtype=torch.uint8, device=self.device)
        return Observation(image, [self.prompts[i] for i in self._idx.tolist()])

    def reset(self, seed: int | list[int] | None = None) -> Observation:
        seeds, self._next_seed = reset_seeds(seed, self.num_envs, self._next_seed)
        self._idx = self.prompt_index(seeds)
        return self._obs()

    def to_images(self, actions: torch.Tensor) -> torch.Tensor:
        """Flat ``[N, H*W*3]`` actions in [-1, 1] -> uint8 ``[N, H, W, 3]``."""
        x = (actions.float().clamp(-1, 1) + 1) * 127.5
        return x.round().to(torch.uint8).reshape(-1, *self.image_shape)

    def _run(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        from mmrl.reward import RewardError

        if actions.shape[0] != self.num_envs or actions.shape[2] != self.action_dim:
            raise ValueError(f"PromptSim expects actions [{self.num_envs}, C, {self.action_dim}] "
                             f"(images of {self.image_size} px), got {tuple(actions.shape)}")
        if not torch.isfinite(actions).all():
            raise ValueError("PromptSim got non-finite actions (NaN/inf pixels)")
        n, dev = self.num_envs, self.device
        images = self.to_images(actions[:, 0].cpu())
        rows = active.cpu().nonzero().flatten().tolist()
        reward = torch.zeros(n)
        if rows:
            prompts = [self.prompts[self._idx[r]] for r in rows]
            try:
                reward[rows] = self.reward_model(images[rows], prompts, [self.meta[self._idx[r]] for r in rows])
            except Exception as exc:
                raise RewardError(f"reward '{self.reward_name}' failed on {len(rows)} images "
                                  f"(first prompt {prompts[0]!r}): {type(exc).__name__}: {exc}") from exc
        done = active.to(dev).clone()
        success = done & (reward.to(dev) >= self.threshold) if self.threshold is not None else torch.zeros_like(done)
        final = self._obs()
        final.image[done] = images.to(dev)[done]
        ended = done.cpu().nonzero().flatten().tolist()
        if ended:  # auto reset: the next prompt for every env that finished
            self._idx[ended] = self.prompt_index([self._next_seed + i for i in range(len(ended))])
            self._next_seed += len(ended)
        info = {"num_steps": done.long()}
        return StepResult(self._obs(), reward.to(dev), done, torch.zeros_like(done), success, final, info)

    def get_state(self) -> dict:
        return {"idx": self._idx.clone(), "next_seed": self._next_seed}

    def set_state(self, state: dict) -> None:
        self._idx, self._next_seed = state["idx"].clone(), int(state["next_seed"])
