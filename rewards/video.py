"""Video rewards (``kind = "video"``): each scores uint8 videos ``[B, F, H, W, 3]`` against their prompts.

- ``frame_score`` (`FrameScore`): any image reward over n evenly spaced frames of each video, reduced
  to one score per video by the mean or the min over the frames. With ``reward="clip_score"`` or
  ``"pickscore"`` it is the text-video CLIP / PickScore score over sampled frames.
- ``temporal_consistency`` (`TemporalConsistency`): 1 - the mean absolute difference of consecutive
  frames / 255, in [0, 1] (VBench's temporal flickering score); higher for steadier videos.
- ``motion_amount`` (`MotionAmount`): the mean absolute difference of consecutive frames / 255, in
  [0, 1]: the opposite pressure (a generator rewarded only for consistency learns still videos).
- ``frame_judge`` (`FrameJudge`): n sampled frames tiled left to right into one image strip, asked
  of a VLM judge (`rewards.vlm_judge.VLMJudge`, or any image reward given as ``judge``).

With ``d_t = mean over pixels and channels of |x_{t+1} - x_t| / 255`` (t = 0..F-2; `frame_differences`):
``motion = mean_t d_t`` and ``consistency = 1 - mean_t d_t`` (``reduce="max"``: ``1 - max_t d_t``,
which a single flicker or cut pulls down). A single-frame video has no motion (0) and full
consistency (1). Frames are chosen by `frame_indices`.
"""

from __future__ import annotations

import torch

from mmrl.reward import Reward

from .vlm_judge import VLMJudge

REDUCTIONS = ("mean", "min")

STRIP_YES_NO_TEMPLATE = (
    "The image shows frames of a video in time order, from left to right. Task: {instruction}. "
    "Does the video show this? Answer yes or no."
)
STRIP_SCORE_TEMPLATE = (
    "The image shows frames of a video in time order, from left to right. Task: {instruction}. "
    "Rate from 0 to 10 how well the video shows this. Answer with a single number."
)


# ----------------------------------------------------------------------------- pure functions
def frame_indices(num_frames: int, frames: int | None) -> torch.Tensor:
    """Indices (long [n]) of n evenly spaced frames of a video of ``num_frames``: all of them when
    ``frames`` is None or >= num_frames; else ``round(k * (num_frames - 1) / (n - 1))`` for
    k = 0..n-1 (first and last included, all distinct), and the middle frame
    ``(num_frames - 1) // 2`` for n = 1."""
    if frames is None or frames >= num_frames:
        return torch.arange(num_frames)
    if frames == 1:
        return torch.tensor([(num_frames - 1) // 2])
    return torch.round(torch.arange(frames, dtype=torch.float64) * (num_frames - 1) / (frames - 1)).long()


def frame_differences(videos: torch.Tensor) -> torch.Tensor:
    """uint8 [B, F, H, W, 3] -> float [B, F - 1]: ``d_t = mean |x_{t+1} - x_t| / 255`` over the
    pixels and channels of consecutive frames (in [0, 1])."""
    x = videos.float()
    return (x[:, 1:] - x[:, :-1]).abs().mean((2, 3, 4)) / 255.0


def motion_amount(videos: torch.Tensor) -> torch.Tensor:
    """``mean_t d_t`` (`frame_differences`) per video, float [B] in [0, 1]; 0 for a single frame."""
    d = frame_differences(videos)
    return d.mean(1) if d.shape[1] else torch.zeros(videos.shape[0])


def temporal_consistency(videos: torch.Tensor, reduce: str = "mean") -> torch.Tensor:
    """``1 - mean_t d_t`` (``reduce="mean"``) or ``1 - max_t d_t`` (``"max"``) per video, float [B]
    in [0, 1]; 1 for a single frame."""
    d = frame_differences(videos)
    if not d.shape[1]:
        return torch.ones(videos.shape[0])
    return 1.0 - (d.mean(1) if reduce == "mean" else d.amax(1))


def frame_strip(videos: torch.Tensor, gap: int = 1, gap_value: int = 255) -> torch.Tensor:
    """uint8 [B, n, H, W, 3] -> uint8 [B, H, n * W + (n - 1) * gap, 3]: the frames side by side,
    left to right, ``gap`` px columns of ``gap_value`` between them."""
    b, n, h, w, c = videos.shape
    out = torch.full((b, h, n * w + (n - 1) * gap, c), gap_value, dtype=torch.uint8)
    for k in range(n):
        out[:, :, k * (w + gap) : k * (w + gap) + w] = videos[:, k]
    return out


def _check_frames(frames: int | None) -> int | None:
    if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames < 1):
        raise ValueError(f"frames must be a number of frames >= 1, or None for all of them; got {frames!r}")
    return frames


def _image_reward(reward, reward_kwargs: dict | None, what: str) -> Reward:
    """A built image reward: ``reward`` itself, or the reward it names (a registered name or a
    ``module:function`` / ``file.py:function`` reference) built with ``reward_kwargs``."""
    if isinstance(reward, str):
        from mmrl.trainer.reward_stage import reward_model

        reward = reward_model(reward, reward_kwargs, "image")
    elif reward_kwargs:
        raise ValueError(f"{what}: reward_kwargs apply to a reward given by name, not to a built reward")
    if getattr(reward, "kind", None) != "image" or not callable(reward):
        raise ValueError(
            f"{what} scores frames with an image reward (kind 'image'), got {getattr(reward, 'kind', reward)!r}"
        )
    return reward


# ----------------------------------------------------------------------------- rewards
class FrameScore(Reward):
    """An image reward over ``frames`` evenly spaced frames of each video (`frame_indices`; None:
    all), reduced over the frames by ``reduce`` ("mean" or "min"): ``score = reduce_k r(x_{i_k},
    prompt)``. ``reward``: a built image reward, or a registered name (``"clip_score"``,
    ``"pickscore"``, ...) or function reference built with ``reward_kwargs``. Each frame is scored
    with its video's prompt and meta, all frames of a batch in one call of the image reward."""

    name = "frame_score"
    kind = "video"
    passthrough_arg = "reward_kwargs"  # `mmrl check reward`: where the wrapped reward's arguments go

    def __init__(
        self,
        *,
        reward: Reward | str,
        reward_kwargs: dict | None = None,
        frames: int | None = 4,
        reduce: str = "mean",
        name: str | None = None,
    ):
        if reduce not in REDUCTIONS:
            raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
        self.reward = _image_reward(reward, reward_kwargs, "frame_score")
        self.frames, self.reduce = _check_frames(frames), reduce
        self.name = name or self.name
        self.example_prompts = getattr(self.reward, "example_prompts", None)  # what `check_reward` scores
        self.example_meta = getattr(self.reward, "example_meta", None)

    def frame_scores(self, videos: torch.Tensor, prompts: list[str], meta: list[dict]) -> torch.Tensor:
        """float [B, n]: the image reward of each sampled frame."""
        b, f = videos.shape[:2]
        idx = frame_indices(f, self.frames)
        n = len(idx)
        images = videos[:, idx.to(videos.device)].reshape(b * n, *videos.shape[2:])
        repeat = [i for i in range(b) for _ in range(n)]
        scores = self.reward(images, [prompts[i] for i in repeat], [meta[i] for i in repeat])
        return scores.reshape(b, n)

    def score(self, videos, prompts, meta) -> torch.Tensor:
        s = self.frame_scores(videos, prompts, meta)
        return s.mean(1) if self.reduce == "mean" else s.amin(1)

    def preflight(self) -> None:
        self.reward.preflight()


class TemporalConsistency(Reward):
    """``1 - mean_t d_t`` in [0, 1] (``reduce="max"``: ``1 - max_t d_t``), d_t the mean absolute
    difference of consecutive frames / 255 (see the module doc); the prompt is not used."""

    name = "temporal_consistency"
    kind = "video"

    def __init__(self, *, reduce: str = "mean"):
        if reduce not in ("mean", "max"):
            raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}")
        self.reduce = reduce

    def score(self, videos, prompts, meta) -> torch.Tensor:
        return temporal_consistency(videos.cpu(), self.reduce)


class MotionAmount(Reward):
    """``mean_t d_t`` in [0, 1], d_t the mean absolute difference of consecutive frames / 255 (see
    the module doc): rewards motion; the prompt is not used."""

    name = "motion_amount"
    kind = "video"

    def score(self, videos, prompts, meta) -> torch.Tensor:
        return motion_amount(videos.cpu())


class FrameJudge(Reward):
    """A VLM judge over a frame strip: ``frames`` evenly spaced frames (`frame_indices`) tiled left
    to right with ``gap`` px white columns between them (`frame_strip`), the strip scored by
    ``judge`` (any image reward) or by `rewards.vlm_judge.VLMJudge` built with ``judge_kwargs``
    (its backend: ``generate_fn`` or ``base_url`` + ``model``; its ``mode``; the ``template``
    defaults to `STRIP_YES_NO_TEMPLATE` / `STRIP_SCORE_TEMPLATE`, which say the image is frames of a
    video in time order)."""

    name = "frame_judge"
    kind = "video"
    passthrough_arg = "judge_kwargs"

    def __init__(
        self,
        *,
        judge: Reward | None = None,
        judge_kwargs: dict | None = None,
        frames: int | None = 4,
        gap: int = 1,
        name: str | None = None,
    ):
        if (judge is None) == (judge_kwargs is None):
            raise ValueError(
                "frame_judge needs exactly one of judge (an image reward) or judge_kwargs (the arguments of "
                "vlm_judge, e.g. {'base_url': 'http://127.0.0.1:8000/v1', 'model': ...})"
            )
        if judge_kwargs is not None:
            kwargs = dict(judge_kwargs)
            mode = kwargs.get("mode", "yes_no")
            kwargs.setdefault("template", STRIP_SCORE_TEMPLATE if mode == "score" else STRIP_YES_NO_TEMPLATE)
            judge = VLMJudge(**kwargs)
        self.judge = _image_reward(judge, None, "frame_judge")
        self.frames = _check_frames(frames)
        if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
            raise ValueError(f"gap must be a number of pixels >= 0, got {gap!r}")
        self.gap = gap
        self.name = name or self.name

    def strips(self, videos: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, n * W + (n - 1) * gap, 3]: what the judge sees."""
        idx = frame_indices(videos.shape[1], self.frames).to(videos.device)
        return frame_strip(videos[:, idx].cpu(), self.gap)

    def score(self, videos, prompts, meta) -> torch.Tensor:
        return self.judge(self.strips(videos), prompts, meta)

    def preflight(self) -> None:
        self.judge.preflight()


__all__ = [
    "FrameScore",
    "TemporalConsistency",
    "MotionAmount",
    "FrameJudge",
    "frame_indices",
    "frame_differences",
    "motion_amount",
    "temporal_consistency",
    "frame_strip",
    "STRIP_YES_NO_TEMPLATE",
    "STRIP_SCORE_TEMPLATE",
]
