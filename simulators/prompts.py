"""PromptSim: single-turn generation tasks (prompt -> image, scored by a reward model) as a simulator.

This is how the one trainer drives image generators: every episode is one step. ``reset`` deals
each environment a prompt from a prompt dataset (``datasets/``, e.g. ``shapes_prompts`` or
``prompt_list``); the policy's action is the generated image (``action_type = "image"``: uint8
``[N, H, W, 3]``) and the episode ends, so a GRPO group (environments given the same reset seed) is
a group of images of one prompt, as in Flow-GRPO. The task reward is 0: the trainer's reward stage
(the experiment's ``reward:`` section, `mmrl.trainer.reward_stage.RewardStage`) scores the images with a reward
model (``rewards/``, e.g. ``shapes``, ``clip_score``, ``pickscore``; a ``weighted_sum`` combines
several) against the prompt and its ``meta``, and decides ``success`` from its threshold.

Observations: ``image`` is black before generation; the finished episode's ``final_obs.image`` is
the generated image (so evaluation videos and grids show it). ``instruction`` is the prompt,
``meta`` its ground truth from the dataset. There is no ``state``.

Prompt datasets: ``build(split="train"|"eval", **dataset_kwargs)`` returning ``{"prompt": [P str],
"meta": [P dict]}``; evaluation simulators get ``split="eval"`` (held-out prompts).

Prompt choice (``deal``): env i reset with seed s gets prompt ``floor(u(s) * P)`` for a
counter-based hash ``u`` (`simulators.reach.hash_uniform`) with ``deal="random"`` (training: fresh
prompts drawn with replacement), or prompt ``s mod P`` with ``deal="cycle"`` (evaluation, the
``eval_kwargs``): the trainer evaluates episodes with consecutive seeds, so ``k * P`` episodes
evaluate every held-out prompt exactly k times (`PromptSim.evaluation_rounds` checks the count).
Either way equal seeds give equal prompts in any batch.

`VideoPromptSim` (``video_prompts``) is the same task for video generators: the action is a clip,
uint8 ``[N, F, H, W, 3]`` with ``num_frames`` frames (``action_type = "video"``, scored by a
``kind: video`` reward), and ``image`` holds black clips before generation, the generated clip
after.
"""

from __future__ import annotations

import torch

from mmrl.simulator import Observation, Simulator, StepResult, reset_seeds

from .reach import hash_uniform


class PromptSim(Simulator):
    """Prompt -> image -> reward, one step per episode."""

    max_episode_steps = 1
    action_type = "image"
    action_dim = 0  # the action is an image, not a vector
    has_success = False  # success is the reward stage's threshold
    name_arg = "dataset"  # `mmrl check simulator prompts:shapes_prompts`
    eval_kwargs = {"split": "eval", "deal": "cycle"}  # every held-out prompt equally often
    DEALS = ("random", "cycle")

    def __init__(
        self,
        num_envs: int = 8,
        dataset: str = "shapes_prompts",
        dataset_kwargs: dict | None = None,
        image_size: int = 16,
        split: str = "train",
        deal: str = "random",
        device: str | torch.device = "cpu",
        seed: int = 0,
    ):
        from mmrl.data import load_dataset

        if num_envs < 1 or image_size < 1:
            raise ValueError("num_envs >= 1 and image_size >= 1 required")
        if deal not in self.DEALS:
            raise ValueError(f"PromptSim deal must be one of {self.DEALS}, got {deal!r}")
        kwargs = {**(dataset_kwargs or {}), "split": split}  # prompt datasets take split=train|eval
        data = load_dataset(dataset, **kwargs)
        if not isinstance(data, dict) or not data.get("prompt"):
            raise ValueError(
                f"prompt dataset '{dataset}' must return {{'prompt': [...], 'meta': [...]}} with at least one prompt"
            )
        self.prompts: list[str] = list(data["prompt"])
        self.meta: list[dict] = list(data.get("meta") or [{} for _ in self.prompts])
        self.num_envs, self.split, self.deal = int(num_envs), split, deal
        self.image_size = int(image_size)
        self.image_shape = (self.image_size, self.image_size, 3)
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
            raise ValueError(
                f"PromptSim deals prompts at random (deal={self.deal!r}): only deal='cycle' "
                "evaluates every prompt equally often"
            )
        if num_episodes < p or num_episodes % p:
            k = max(1, round(num_episodes / p))
            raise ValueError(
                f"{num_episodes} evaluation episodes deal the {p} held-out prompts unequally: "
                f"set trainer.eval_episodes to a multiple of {p} (e.g. {k * p}, {k} per prompt)"
            )
        return num_episodes // p

    def _obs(self) -> Observation:
        image = torch.zeros(self.num_envs, *self.image_shape, dtype=torch.uint8, device=self.device)
        rows = self._idx.tolist()
        return Observation(image, [self.prompts[i] for i in rows], meta=[self.meta[i] for i in rows])

    def reset(self, seed: int | list[int] | None = None) -> Observation:
        seeds, self._next_seed = reset_seeds(seed, self.num_envs, self._next_seed)
        self._idx = self.prompt_index(seeds)
        return self._obs()

    def step_chunk(self, actions: torch.Tensor) -> StepResult:
        """Each env's generated image (uint8 ``[N, H, W, 3]``) ends its episode; reward 0 (the
        reward stage scores the image)."""
        want = (self.num_envs, *self.image_shape)
        if not isinstance(actions, torch.Tensor) or actions.dtype != torch.uint8 or tuple(actions.shape) != want:
            got = (
                f"{actions.dtype} {tuple(actions.shape)}"
                if isinstance(actions, torch.Tensor)
                else type(actions).__name__
            )
            raise ValueError(
                f"{type(self).__name__} takes uint8 {self.action_type}s {list(want)} ({self._size_args()}, "
                f"the policy's), got {got}"
            )
        n, dev = self.num_envs, self.device
        done = torch.ones(n, dtype=torch.bool, device=dev)
        final = self._obs()
        final.image = actions.to(dev).clone()
        self._idx = self.prompt_index([self._next_seed + i for i in range(n)])  # auto reset: next prompts
        self._next_seed += n
        info = {"num_steps": done.long()}
        return StepResult(
            self._obs(), torch.zeros(n, device=dev), done, torch.zeros_like(done), torch.zeros_like(done), final, info
        )

    def _size_args(self) -> str:
        return f"sim.kwargs.image_size = {self.image_size}"

    def get_state(self) -> dict:
        return {"idx": self._idx.clone(), "next_seed": self._next_seed}

    def set_state(self, state: dict) -> None:
        self._idx, self._next_seed = state["idx"].clone(), int(state["next_seed"])


class VideoPromptSim(PromptSim):
    """Prompt -> video -> reward, one step per episode (see the module docstring)."""

    action_type = "video"
    name_arg = "dataset"

    def __init__(self, num_envs: int = 8, dataset: str = "moving_shapes_prompts", num_frames: int = 8, **kwargs):
        if num_frames < 1:
            raise ValueError(f"VideoPromptSim needs num_frames >= 1, got {num_frames}")
        super().__init__(num_envs=num_envs, dataset=dataset, **kwargs)
        self.num_frames = int(num_frames)
        self.image_shape = (self.num_frames, self.image_size, self.image_size, 3)

    def _size_args(self) -> str:
        return f"sim.kwargs.num_frames = {self.num_frames}, image_size = {self.image_size}"
