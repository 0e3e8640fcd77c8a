"""CLIP language-goal rewards for embodied RL: contrasting goals (VLM-RL), goal-baseline projection
(VLM-RM), plain cosine, and episode-level scoring over video frames.

The prompt is the task instruction. All three rewards share the open_clip loading, preprocessing and
embedding code of `rewards.clip_score` (they subclass `CLIPScore`); the math lives in pure functions
(`contrast_goal_reward`, `goal_baseline_reward`) that take similarities / embeddings directly.

``clip_contrast_goal`` (VLM-RL's "contrasting language goal" (CLG) reward; Huang, Sheng, Qu, You,
Chen 2024, "VLM-RL: A Unified Vision Language Models and Reinforcement Learning Framework for Safe
Autonomous Driving", arXiv:2412.15544, Sec. "CLG-as-reward"). With ``c_pos = cos(I, L_pos)`` and
``c_neg = cos(I, L_neg)``, the authors' released code (github.com/zihaosheng/VLM-RL,
``clip/clip_reward_model.py::forward_vlm_rl`` then ``clip/clip_rewarded_sac.py``) computes::

    d = c_neg - c_pos                       # how much closer the image is to the negative goal
    r = 1 - (clip(d, t_min, t_max) - t_min) / (t_max - t_min)      with t_min = 0, t_max = 0.03

so ``r = 1`` whenever the image is at least as close to the positive goal as to the negative one,
``r = 0`` once it is ``t_max`` closer to the negative goal, linear in between. Range [0, 1].
``raw=True`` returns the un-normalised contrast ``c_pos - c_neg`` instead (range [-2, 2]).

``clip_goal_baseline`` (VLM-RM, Rocamonde et al. 2024, "Vision-Language Models are Zero-Shot Reward
Models for Reinforcement Learning", ICLR, Sec. 3 "Goal-Baseline Regularization"; code
github.com/AlignmentResearch/vlmrm ``src/vlmrm/reward_model.py::CLIPReward``)::

    R = 1 - 0.5 * || (alpha * P + (1 - alpha) * I) (s - g) ||^2,   P = d d^T / ||d||^2,  d = g - b

with ``s, g, b`` the unit image, goal and baseline embeddings. ``alpha = 0`` gives ``cos(s, g)``;
``alpha = 1`` keeps only the component along the baseline->goal direction. Range [-1, 1].

``clip_cosine``: ``cos(image, prompt)``, i.e. `rewards.clip_score.CLIPScore` (same code) with the
checkpoint default of this module and `score_episode`. Range [-1, 1].

Episode level (video-language reward): every reward here has ``score_episode(frames [B, T, H, W, 3],
prompts, meta, mode)``, ``mode="final"`` (score of the last frame, a success-style reward) or
``"mean"`` (mean over frames of the per-frame reward); `score_episode` also works on any image reward.

Default checkpoint: open_clip ``ViT-B-32`` / ``laion2b_s34b_b79k``; any open_clip name / tag, a
local checkpoint, or a built ``model=`` (tests pass a tiny one) works as in `rewards.clip_score`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from mmrl.reward import check_images

from .clip_score import CLIPScore, clip_pixels

DEFAULT_MODEL = "ViT-B-32"
DEFAULT_PRETRAINED = "laion2b_s34b_b79k"
EPISODE_MODES = ("final", "mean")


# ----------------------------------------------------------------------------- pure math
def contrast_goal_reward(
    sim_pos: torch.Tensor, sim_neg: torch.Tensor, t_min: float = 0.0, t_max: float = 0.03, raw: bool = False
) -> torch.Tensor:
    """VLM-RL CLG reward from cosine similarities to the positive / negative goal (see module doc).

    ``1 - (clip(sim_neg - sim_pos, t_min, t_max) - t_min) / (t_max - t_min)`` in [0, 1];
    ``raw=True``: ``sim_pos - sim_neg``.
    """
    sim_pos, sim_neg = torch.as_tensor(sim_pos).float(), torch.as_tensor(sim_neg).float()
    if raw:
        return sim_pos - sim_neg
    if not t_max > t_min:
        raise ValueError(f"contrast_goal_reward needs t_max > t_min, got t_min={t_min}, t_max={t_max}")
    d = (sim_neg - sim_pos).clamp(t_min, t_max)
    return 1.0 - (d - t_min) / (t_max - t_min)


def goal_baseline_reward(s: torch.Tensor, g: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    """VLM-RM goal-baseline reward ``1 - 0.5 * ||(alpha P + (1 - alpha) I)(s - g)||^2`` (module doc).

    ``s``: image embeddings ``[B, D]``; ``g``, ``b``: goal / baseline embeddings ``[D]`` or ``[B, D]``.
    All three are L2-normalised here. Where ``g == b`` the direction is undefined and ``P = 0``
    (the reward is then ``1 - 0.5 * (1 - alpha)^2 * ||s - g||^2``). Range [-1, 1] for alpha in [0, 1].
    """
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    s = F.normalize(torch.as_tensor(s).float(), dim=-1)
    g = F.normalize(torch.as_tensor(g).float(), dim=-1).expand_as(s)
    b = F.normalize(torch.as_tensor(b).float(), dim=-1).expand_as(s)
    d = g - b
    norm = d.norm(dim=-1, keepdim=True)
    unit = torch.where(norm > 1e-8, d / norm.clamp_min(1e-12), torch.zeros_like(d))
    v = s - g
    proj = (v * unit).sum(-1, keepdim=True) * unit  # P v without forming the D x D matrix
    mv = alpha * proj + (1.0 - alpha) * v
    return 1.0 - 0.5 * (mv * mv).sum(-1)


# ----------------------------------------------------------------------------- episodes
def score_episode(
    reward: Any, frames: torch.Tensor, prompts: Sequence[str], meta: Sequence[dict] | None = None, mode: str = "final"
) -> torch.Tensor:
    """Episode-level score of an image reward over video frames uint8 ``[B, T, H, W, 3]`` -> float32 ``[B]``.

    ``mode="final"``: the reward of the last frame; ``"mean"``: the mean over the T frames of the
    per-frame reward (frames are scored one time step at a time, a batch of B images each).
    """
    if mode not in EPISODE_MODES:
        raise ValueError(f"mode must be one of {list(EPISODE_MODES)}, got {mode!r}")
    if (
        not isinstance(frames, torch.Tensor)
        or frames.dtype != torch.uint8
        or frames.dim() != 5
        or frames.shape[-1] != 3
        or frames.shape[1] == 0
    ):
        got = tuple(frames.shape) if isinstance(frames, torch.Tensor) else type(frames).__name__
        raise ValueError(
            f"score_episode takes uint8 frames [B, T, H, W, 3] with T >= 1, got {got} {getattr(frames, 'dtype', '')}"
        )
    prompts = list(prompts)
    if frames.shape[0] != len(prompts):
        raise ValueError(f"{frames.shape[0]} episodes but {len(prompts)} prompts")
    steps = [frames.shape[1] - 1] if mode == "final" else range(frames.shape[1])
    per_step = torch.stack([reward(frames[:, t], prompts, meta) for t in steps], dim=1)
    return per_step.mean(dim=1).float()


class _GoalReward(CLIPScore):
    """Shared parts: checkpoint defaults, per-sample texts, image / text embeddings, `score_episode`."""

    def __init__(
        self,
        *,
        model_name: str = DEFAULT_MODEL,
        pretrained: str | None = DEFAULT_PRETRAINED,
        model: Any = None,
        tokenizer: Any = None,
        device: str | torch.device | None = None,
        scale: float = 1.0,
    ):
        super().__init__(
            model_name=model_name, pretrained=pretrained, model=model, tokenizer=tokenizer, scale=scale, device=device
        )

    @torch.no_grad()
    def image_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        """Unit image embeddings ``[B, D]`` (the preprocessing of `CLIPScore.embed`)."""
        check_images(images)
        dtype = next(self.model.parameters()).dtype
        pixels = clip_pixels(images.to(self.device), *self.spec).to(dtype)
        return F.normalize(self.model.encode_image(pixels).float(), dim=-1)

    @torch.no_grad()
    def text_embeddings(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit text embeddings ``[N, D]``; each distinct text is encoded once."""
        unique = sorted(set(texts))
        tokens = self.tokenizer(unique).to(self.device)
        emb = F.normalize(self.model.encode_text(tokens).float(), dim=-1)
        index = {t: i for i, t in enumerate(unique)}
        return emb[torch.tensor([index[t] for t in texts], device=emb.device)]

    @staticmethod
    def goal_texts(prompts: list[str], meta: list[dict], key: str, template: str | None, arg: str) -> list[str]:
        """Per sample: ``meta[key]`` if given, else ``template.format(prompt=prompt)``."""
        out = []
        for prompt, m in zip(prompts, meta):
            if m.get(key) is not None:
                out.append(str(m[key]))
            elif template is None:
                raise ValueError(
                    f"no {key.replace('_', ' ')} for prompt {prompt!r}: pass {arg}='...' "
                    f"(a text, may use {{prompt}}) or meta[{key!r}]"
                )
            else:
                out.append(template.format(prompt=prompt))
        return out

    def score_episode(
        self, frames: torch.Tensor, prompts: Sequence[str], meta: Sequence[dict] | None = None, mode: str = "final"
    ) -> torch.Tensor:
        """Episode-level reward over frames ``[B, T, H, W, 3]`` (see the module-level `score_episode`)."""
        return score_episode(self, frames, prompts, meta, mode)


class CLIPContrastGoal(_GoalReward):
    """VLM-RL contrasting-language-goal (CLG) reward in [0, 1] (open_clip; default ViT-B-32 / laion2b).

    ``positive`` / ``negative``: goal texts, templates with ``{prompt}`` (the instruction) or fixed
    sentences; ``meta["positive_goal"]`` / ``meta["negative_goal"]`` override them per sample. There
    is no default negative goal (CLIP reads negations poorly; describe the failure state, e.g. VLM-RL's
    "Two cars have collided with each other on the road"). ``t_min`` / ``t_max``: the normalisation
    window of ``c_neg - c_pos`` (VLM-RL: 0 and 0.03). ``raw=True``: ``c_pos - c_neg`` instead.
    """

    name = "clip_contrast_goal"
    kind = "image"
    example_prompts = ["pick up the red cube", "open the drawer", "push the blue block to the left"]

    def __init__(
        self,
        *,
        positive: str | None = "{prompt}",
        negative: str | None = None,
        t_min: float = 0.0,
        t_max: float = 0.03,
        raw: bool = False,
        **model_kwargs,
    ):
        if not t_max > t_min:
            raise ValueError(f"t_max must exceed t_min, got t_min={t_min}, t_max={t_max}")
        super().__init__(**model_kwargs)
        self.positive, self.negative = positive, negative
        self.t_min, self.t_max, self.raw = float(t_min), float(t_max), bool(raw)

    def similarities(self, images, prompts: list[str], meta: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos(I, L_pos), cos(I, L_neg))``, each ``[B]``."""
        pos = self.goal_texts(prompts, meta, "positive_goal", self.positive, "positive")
        neg = self.goal_texts(prompts, meta, "negative_goal", self.negative, "negative")
        img = self.image_embeddings(images)
        return (img * self.text_embeddings(pos)).sum(-1), (img * self.text_embeddings(neg)).sum(-1)

    def score(self, images, prompts, meta) -> torch.Tensor:
        sim_pos, sim_neg = self.similarities(images, prompts, meta)
        return contrast_goal_reward(sim_pos, sim_neg, self.t_min, self.t_max, raw=self.raw)


class CLIPGoalBaseline(_GoalReward):
    """VLM-RM goal-baseline regularised CLIP reward in [-1, 1] (open_clip; default ViT-B-32 / laion2b).

    ``goal``: goal text or ``{prompt}`` template (``meta["goal"]`` overrides); ``baseline``: the
    baseline text, a generic description of the scene (``meta["baseline"]`` overrides); ``alpha`` in
    [0, 1]: how much of the embedding space is projected onto the baseline->goal line.
    """

    name = "clip_goal_baseline"
    kind = "image"
    example_prompts = ["pick up the red cube", "open the drawer", "push the blue block to the left"]

    def __init__(self, *, goal: str = "{prompt}", baseline: str = "a robot arm", alpha: float = 0.5, **model_kwargs):
        if not 0.0 <= float(alpha) <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        super().__init__(**model_kwargs)
        self.goal, self.baseline, self.alpha = goal, baseline, float(alpha)

    def score(self, images, prompts, meta) -> torch.Tensor:
        goals = self.goal_texts(prompts, meta, "goal", self.goal, "goal")
        baselines = self.goal_texts(prompts, meta, "baseline", self.baseline, "baseline")
        img = self.image_embeddings(images)
        return goal_baseline_reward(img, self.text_embeddings(goals), self.text_embeddings(baselines), self.alpha)


class CLIPCosine(_GoalReward):
    """Cosine similarity between image and instruction (`CLIPScore` with scale 1, default ViT-B-32 / laion2b)."""

    name = "clip_cosine"
    kind = "image"


__all__ = [
    "CLIPContrastGoal",
    "CLIPGoalBaseline",
    "CLIPCosine",
    "contrast_goal_reward",
    "goal_baseline_reward",
    "score_episode",
    "EPISODE_MODES",
]
