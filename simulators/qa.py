"""QASim: visual question answering with a checkable answer (VLM RL) as one-step episodes.

This is how the one trainer drives VLMs: ``reset`` deals each environment a question (its images
and text) from a VLM dataset (``datasets/``: ``shapes_vqa``, ``vlm_records``, ``geometry3k``, ...),
the policy answers, and ``step`` scores the answer with a text reward (``rewards/``: ``short_answer``,
``counting``, ``math_answer``, ``multiple_choice``, ``grounding_iou``, a ``weighted_sum``, ...). A GRPO group
(environments reset with the same seed) answers the same question.

Observations: ``images`` holds each question's images at dataset resolution (uint8 ``[H, W, 3]``,
any size and count; pixel budgets are applied by the dataset at load time); ``image`` holds a
``thumb_size`` thumbnail of the first image (videos and grids); ``instruction`` is the question.

Actions (text as a tensor, so answers batch and checkpoint like any action): ``[N, 1, 1 + W]``
with ``W = answer_bytes``; element 0 is the completion's length in tokens (the policy knows it, the
overlong penalty needs it: rewards get it as ``meta["completion_tokens"]``), elements 1.. are the
answer's UTF-8 bytes, zero padded (`encode_answers` / `decode_answers`).

Data order: the question of reset seed ``s`` is ``perm_e[s mod P]`` with ``e = s // P`` and
``perm_e`` a permutation of the P questions drawn from ``(shuffle_seed, e)``. The trainer gives
iteration ``it`` the consecutive seeds ``base + it * N / G + g``, so a run walks the dataset in a
fixed shuffled order, epoch by epoch, and a resumed run continues it exactly (no question
repeated or skipped). ``success`` is ``reward >= success_threshold`` (accuracy for 0/1 rewards).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmrl.policies.base import decode_answers, encode_answers  # noqa: F401  (re-exported: the answer wire format)
from mmrl.simulator import Observation, Simulator, StepResult, reset_seeds


def thumbnail(image: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [H, W, 3] -> uint8 [size, size, 3] (bilinear, aspect not kept)."""
    x = image.permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8)


class QASim(Simulator):
    """Question (images + text) -> answer -> text reward, one step per episode."""

    max_episode_steps = 1
    name_arg = "dataset"  # `mmrl check simulator qa:shapes_vqa`
    eval_kwargs = {"split": "eval"}

    def __init__(self, num_envs: int = 8, dataset: str = "shapes_vqa", dataset_kwargs: dict | None = None,
                 reward: str = "math_answer", reward_kwargs: dict | None = None, split: str = "train",
                 answer_bytes: int = 256, thumb_size: int = 64, success_threshold: float = 1.0,
                 shuffle_seed: int = 0, device: str | torch.device = "cpu", seed: int = 0):
        from mmrl.data import load_dataset
        from mmrl.registry import REWARDS

        if num_envs < 1 or answer_bytes < 1 or thumb_size < 1:
            raise ValueError("num_envs, answer_bytes and thumb_size must be >= 1")
        data = load_dataset(dataset, **{**(dataset_kwargs or {}), "split": split})
        missing = [k for k in ("prompt", "images", "meta") if k not in data]
        if missing or not data["prompt"]:
            raise ValueError(f"VLM dataset '{dataset}' must return {{'prompt', 'images', 'meta'}} lists with at "
                             f"least one question (missing: {missing or 'none; it is empty'})")
        self.dataset_name, self.split = dataset, split
        self.prompts: list[str] = list(data["prompt"])
        self.images: list[list[torch.Tensor]] = [list(x) for x in data["images"]]
        self.meta: list[dict] = list(data["meta"])
        self.solutions: list[str] = list(data.get("solution") or [str(m.get("answer", "")) for m in self.meta])
        self.reward_name = reward
        self.reward_model = REWARDS.build(reward, **(reward_kwargs or {}))
        if getattr(self.reward_model, "kind", "image") != "text":
            raise ValueError(f"reward '{reward}' scores {self.reward_model.kind}; QASim needs a text reward "
                             "(e.g. short_answer, counting, math_answer, multiple_choice, grounding_iou)")
        self.num_envs, self.threshold, self.shuffle_seed = int(num_envs), float(success_threshold), int(shuffle_seed)
        self.answer_bytes, self.thumb_size = int(answer_bytes), int(thumb_size)
        self.action_dim = 1 + self.answer_bytes
        self.image_shape = (self.thumb_size, self.thumb_size, 3)
        self.device = torch.device(device)
        self._next_seed = int(seed) * 1_000_003
        self._perms: dict[int, torch.Tensor] = {}
        self._idx = torch.zeros(self.num_envs, dtype=torch.long)
        self._thumbs: dict[int, torch.Tensor] = {}  # question -> thumbnail, made on first use

    # ------------------------------------------------------------------ data order
    def question_index(self, seeds: list[int]) -> torch.Tensor:
        """Question of each reset seed: ``perm_{s // P}[s mod P]`` (see the module docstring)."""
        p, out = len(self.prompts), []
        for s in seeds:
            epoch = int(s) // p
            if epoch not in self._perms:
                if len(self._perms) > 8:
                    self._perms.clear()
                g = torch.Generator().manual_seed(self.shuffle_seed * 1_000_003 + epoch)
                self._perms[epoch] = torch.randperm(p, generator=g)
            out.append(int(self._perms[epoch][int(s) % p]))
        return torch.tensor(out, dtype=torch.long)

    def _obs(self) -> Observation:
        rows = self._idx.tolist()
        for i in rows:
            if i not in self._thumbs:
                self._thumbs[i] = thumbnail(self.images[i][0], self.thumb_size) if self.images[i] else \
                    torch.zeros(self.image_shape, dtype=torch.uint8)
        thumbs = torch.stack([self._thumbs[i] for i in rows])
        return Observation(thumbs.to(self.device), [self.prompts[i] for i in rows],
                           images=[self.images[i] for i in rows])

    def record(self, i: int) -> dict:
        """Question ``i`` as a dict (prompt, images, meta, solution)."""
        return {"prompt": self.prompts[i], "images": self.images[i], "meta": self.meta[i],
                "solution": self.solutions[i]}

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | list[int] | None = None) -> Observation:
        seeds, self._next_seed = reset_seeds(seed, self.num_envs, self._next_seed)
        self._idx = self.question_index(seeds)
        return self._obs()

    def _run(self, actions: torch.Tensor, active: torch.Tensor) -> StepResult:
        from mmrl.reward import RewardError

        if actions.shape[0] != self.num_envs or actions.shape[2] != self.action_dim:
            raise ValueError(f"QASim expects actions [{self.num_envs}, C, {self.action_dim}] (token count + "
                             f"{self.answer_bytes} answer bytes), got {tuple(actions.shape)}")
        n, dev = self.num_envs, self.device
        texts, lengths = decode_answers(actions[:, 0])
        rows = active.cpu().nonzero().flatten().tolist()
        reward = torch.zeros(n)
        if rows:
            qs = [int(self._idx[r]) for r in rows]
            meta = [{**self.meta[q], "completion_tokens": lengths[r]} for q, r in zip(qs, rows)]
            try:
                reward[rows] = self.reward_model([texts[r] for r in rows], [self.prompts[q] for q in qs], meta)
            except Exception as exc:
                raise RewardError(f"reward '{self.reward_name}' failed on {len(rows)} answers (first question "
                                  f"{self.prompts[qs[0]]!r}): {type(exc).__name__}: {exc}") from exc
        done = active.to(dev).clone()
        success = done & (reward.to(dev) >= self.threshold)
        final = self._obs()
        ended = done.cpu().nonzero().flatten().tolist()
        if ended:  # auto reset: the next questions for the envs that finished
            self._idx[ended] = self.question_index([self._next_seed + i for i in range(len(ended))])
            self._next_seed += len(ended)
        info = {"num_steps": done.long(), "answers": texts}
        return StepResult(self._obs(), reward.to(dev), done, torch.zeros_like(done), success, final, info)

    def get_state(self) -> dict:
        return {"idx": self._idx.clone(), "next_seed": self._next_seed}

    def set_state(self, state: dict) -> None:
        self._idx, self._next_seed = state["idx"].clone(), int(state["next_seed"])
