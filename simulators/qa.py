"""QASim: visual question answering with a checkable answer (VLM RL) as one-step episodes.

This is how the one trainer drives VLMs: ``reset`` deals each environment a question (its images
and text) from a VLM dataset (``datasets/``: ``shapes_vqa``, ``vlm_records``, ``geometry3k``, ...),
the policy answers (``action_type = "text"``: `mmrl.simulator.Completions`, N strings with their
token counts) and the episode ends. The task reward is 0: the trainer's reward stage (the
experiment's ``reward:`` section, `mmrl.trainer.reward_stage.RewardStage`) scores the answers with a text reward
(``rewards/``: ``short_answer``, ``counting``, ``math_answer``, ``multiple_choice``,
``grounding_iou``, a ``weighted_sum``, ...) against the question's ``meta`` (its ground truth) and
decides ``success`` from its threshold (accuracy for 0/1 rewards with threshold 1). A GRPO group
(environments reset with the same seed) answers the same question.

Observations: ``images`` holds each question's images at dataset resolution (uint8 ``[H, W, 3]``,
any size and count; pixel budgets are applied by the dataset at load time); ``videos`` (when the
dataset has a ``videos`` column: per question a list of video sources, `mmrl.video`) holds them
undecoded, the policy decodes and samples them; ``image`` holds a ``thumb_size`` thumbnail of the
first image, else of the first video's first frame (for logged grids); ``instruction`` is the question.

Data order: the question of reset seed ``s`` is ``perm_e[s mod P]`` with ``e = s // P`` and
``perm_e`` a permutation of the P questions drawn from ``(shuffle_seed, e)``. The trainer gives
iteration ``it`` the consecutive seeds ``base + it * N / G + g``, so a run walks the dataset in a
fixed shuffled order, epoch by epoch, and a resumed run continues it exactly (no question
repeated or skipped).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmrl.simulator import Completions, Observation, Simulator, StepResult, reset_seeds


def thumbnail(image: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [H, W, 3] -> uint8 [size, size, 3] (bilinear, aspect not kept)."""
    x = image.permute(2, 0, 1)[None].float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return x[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8)


def luma(rgb: torch.Tensor) -> torch.Tensor:
    """ITU-R BT.601 luma (float, 0-255) of rgb [..., 3]."""
    return rgb.float() @ torch.tensor([0.299, 0.587, 0.114])


def grayscale(image: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 3] -> uint8 [..., 3]: its luma in all three channels."""
    y = luma(image).round().clamp(0, 255).to(torch.uint8)
    return y[..., None].expand(*y.shape, 3).contiguous()


def check_video_paths(videos: list[list], where: str) -> None:
    """Fail at load, naming the question, if a video given as a file path does not exist."""
    from pathlib import Path

    for i, sources in enumerate(videos):
        for v in sources:
            path = v if isinstance(v, (str, Path)) else v.get("path") if isinstance(v, dict) else None
            if path is not None and not (isinstance(v, dict) and v.get("bytes")) and not Path(path).is_file():
                raise FileNotFoundError(
                    f"question {i} of {where}: video file {path} does not exist. Fix: correct the dataset's "
                    f"'videos' column (relative paths are read from {Path.cwd()})"
                )


class QASim(Simulator):
    """Question (images + text) -> answer -> text reward, one step per episode."""

    max_episode_steps = 1
    action_type = "text"
    action_dim = 0  # the action is text, not a vector
    has_success = False  # success is the reward stage's threshold
    name_arg = "dataset"  # `mmrl check simulator qa:shapes_vqa`
    eval_kwargs = {"split": "eval"}

    def __init__(
        self,
        num_envs: int = 8,
        dataset: str = "shapes_vqa",
        dataset_kwargs: dict | None = None,
        split: str = "train",
        thumb_size: int = 64,
        shuffle_seed: int = 0,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ):
        from mmrl.data import load_dataset

        if num_envs < 1 or thumb_size < 1:
            raise ValueError("num_envs and thumb_size must be >= 1")
        if "split" in (dataset_kwargs or {}):  # the simulator picks the split (training vs evaluation)
            raise ValueError(
                f"dataset_kwargs.split = {dataset_kwargs['split']!r}: the split is the simulator's own "
                "argument (sim.kwargs.split for training, sim.eval_kwargs.split for evaluation)"
            )
        data = load_dataset(dataset, **{**(dataset_kwargs or {}), "split": split})
        missing = [k for k in ("prompt", "images", "meta") if k not in data]
        if missing or not data["prompt"]:
            raise ValueError(
                f"VLM dataset '{dataset}' must return {{'prompt', 'images', 'meta'}} lists with at "
                f"least one question (missing: {missing or 'none; it is empty'})"
            )
        self.dataset_name, self.split = dataset, split
        self.prompts: list[str] = list(data["prompt"])
        self.images: list[list[torch.Tensor]] = [list(x) for x in data["images"]]
        self.meta: list[dict] = list(data["meta"])
        self.videos: list[list] | None = [list(v) for v in data["videos"]] if "videos" in data else None
        if self.videos is not None:
            check_video_paths(self.videos, f"'{dataset}' ({split})")
        self.solutions: list[str] = list(data.get("solution") or [str(m.get("answer", "")) for m in self.meta])
        self.num_envs, self.shuffle_seed, self.thumb_size = int(num_envs), int(shuffle_seed), int(thumb_size)
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
                self._thumbs[i] = self._thumbnail(i)
        thumbs = torch.stack([self._thumbs[i] for i in rows])
        return Observation(
            thumbs.to(self.device),
            [self.prompts[i] for i in rows],
            images=[self.images[i] for i in rows],
            meta=[self.meta[i] for i in rows],
            videos=None if self.videos is None else [self.videos[i] for i in rows],
        )

    def _thumbnail(self, i: int) -> torch.Tensor:
        if self.images[i]:
            return thumbnail(self.images[i][0], self.thumb_size)
        if self.videos is not None and self.videos[i]:
            from mmrl.video import first_frame

            return thumbnail(first_frame(self.videos[i][0]), self.thumb_size)
        return torch.zeros(self.image_shape, dtype=torch.uint8)

    def record(self, i: int) -> dict:
        """Question ``i`` as a dict (prompt, images, videos, meta, solution)."""
        return {
            "prompt": self.prompts[i],
            "images": self.images[i],
            "videos": [] if self.videos is None else self.videos[i],
            "meta": self.meta[i],
            "solution": self.solutions[i],
        }

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | list[int] | None = None) -> Observation:
        seeds, self._next_seed = reset_seeds(seed, self.num_envs, self._next_seed)
        self._idx = self.question_index(seeds)
        return self._obs()

    def check_answers(self, actions) -> None:
        """ValueError unless ``actions`` are ``num_envs`` answers (`Completions`, a list of str)."""
        if (
            not isinstance(actions, list)
            or len(actions) != self.num_envs
            or not all(isinstance(a, str) for a in actions)
        ):
            raise ValueError(
                f"{type(self).__name__} takes {self.num_envs} answers (Completions, a list of str), got "
                f"{type(actions).__name__} of length "
                f"{len(actions) if hasattr(actions, '__len__') else '?'}"
            )

    def step_chunk(self, actions: Completions) -> StepResult:
        """Each env's answer ends its episode; reward 0 (the reward stage scores the answer)."""
        self.check_answers(actions)
        n, dev = self.num_envs, self.device
        done = torch.ones(n, dtype=torch.bool, device=dev)
        final = self._obs()
        self._idx = self.question_index([self._next_seed + i for i in range(n)])  # auto reset: next questions
        self._next_seed += n
        info = {"num_steps": done.long(), "answers": list(actions)}
        return StepResult(
            self._obs(), torch.zeros(n, device=dev), done, torch.zeros_like(done), torch.zeros_like(done), final, info
        )

    def get_state(self) -> dict:
        return {"idx": self._idx.clone(), "next_seed": self._next_seed}

    def set_state(self, state: dict) -> None:
        self._idx, self._next_seed = state["idx"].clone(), int(state["next_seed"])
