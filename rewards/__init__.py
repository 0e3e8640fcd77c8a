"""Reward models (import package `rewards`), registered by name in `mmrl.registry.REWARDS` (``mmrl list``).

A reward model scores a batch of single-turn samples: ``reward(images, prompts, meta) -> float32 [B]``
(images uint8 ``[B, H, W, 3]``; ``kind = "video"``: videos uint8 ``[B, F, H, W, 3]``; ``kind = "text"``:
a list of B completion strings). The contract is in `mmrl.reward` and every reward passes
`mmrl.checks.reward.check_reward`. Simulators return their own task reward; these models score
generated images and videos (diffusion) and VLM answers.

Built-ins register lazily, so importing this package imports no model library; constructors take
keyword arguments only, default to the real checkpoints, and accept a built model for tests:

- ``clip_score``: open_clip image-prompt cosine (default ViT-L-14 / openai)            extra ``clip``
- ``pickscore``: PickScore v1 (transformers CLIPModel, yuvalkirstain/PickScore_v1)       extra ``vlm``
- ``aesthetic``: LAION aesthetic predictor v2 (CLIP ViT-L/14 + MLP)                   extra ``clip``
- ``jpeg_compressibility`` / ``jpeg_incompressibility``: -/+ JPEG size in kB (DDPO)   (Pillow)
- ``ocr``: 1 - normalised edit distance of OCR'd text to the target (rapidocr-onnxruntime or tesseract)
- ``shapes``: programmatic prompt following on the synthetic `shapes` grammar (embedded demo)
- ``weighted_sum``: ``sum_i w_i * r_i`` over rewards of one kind (`mmrl.reward.WeightedSum`)
- ``http``: a reward served by ``python -m rewards.http NAME`` (`rewards.http.RemoteReward`)
- ``math_answer``: 1/0 final answer (last ``\\boxed{}`` / ``<answer>`` / number) matches meta["answer"]
- ``multiple_choice``: 1/0 chosen letter (or option text) matches meta["answer"]
- ``counting``: 1/0 integer answer (digits or zero..twenty) matches meta["answer"]
- ``short_answer``: 1/0 normalised exact match of a short word or number answer with meta["answer"]
- ``grounding_iou``: IoU in [0, 1] of the predicted box with meta["box"] (or 1/0 at a threshold)
- ``format``: 1/0 completion is ``<think>...</think><answer>...</answer>``
- ``overlong_penalty``: DAPO soft overlong punishment in [-1, 0]
- ``math_with_format``: ``(1 - w) * math_answer + w * format`` (`rewards.verifiable`, all text rewards)
- ``clip_contrast_goal``: VLM-RL contrasting-language-goal reward in [0, 1] (`rewards.clip_goal`) extra ``clip``
- ``clip_goal_baseline``: VLM-RM goal-baseline projected CLIP reward (`rewards.clip_goal`)     extra ``clip``
- ``clip_cosine``: image-instruction CLIP cosine, default ViT-B-32 / laion2b (`rewards.clip_goal`) extra ``clip``
- ``vlm_judge``: a VLM answers a yes/no or 0-10 question, parsed to [0, 1] (`rewards.vlm_judge`)
- ``success_detector``: a small CNN trained on labelled frames, P(success | frame, instruction) or 1/0
  (`rewards.success_detector`; ``python -m rewards.success_detector`` trains one on reach_demos)

Video rewards (``kind = "video"``):

- ``frame_score``: an image reward (e.g. ``clip_score``, ``pickscore``) over n evenly spaced frames, mean or min
- ``temporal_consistency``: 1 - mean absolute difference of consecutive frames / 255 (`rewards.video`)
- ``motion_amount``: mean absolute difference of consecutive frames / 255 (`rewards.video`)
- ``frame_judge``: a VLM judge (``vlm_judge``) over n frames tiled into one strip (`rewards.video`)  extra ``vlm``
- ``moving_shapes``: programmatic prompt following on the synthetic `moving_shapes` videos (embedded demo)

Third-party packages register more under the ``mmrl.rewards`` entry-point group.
"""

from mmrl.checks.reward import check_reward
from mmrl.registry import REWARDS
from mmrl.reward import Reward, RewardError, WeightedSum

REWARDS.register(
    "clip_score",
    f"{__name__}.clip_score:CLIPScore",
    extra="clip",
    description="CLIP cosine similarity between image and prompt (open_clip; default ViT-L-14 / openai)",
)
REWARDS.register(
    "pickscore",
    f"{__name__}.pickscore:PickScore",
    extra="vlm",
    description="PickScore v1 human-preference score (transformers CLIPModel yuvalkirstain/PickScore_v1)",
)
REWARDS.register(
    "aesthetic",
    f"{__name__}.aesthetic:AestheticScore",
    extra="clip",
    description="LAION aesthetic predictor v2 (sac+logos+ava1 MLP on CLIP ViT-L/14 image embeddings)",
)
REWARDS.register(
    "jpeg_compressibility",
    f"{__name__}.jpeg:JpegCompressibility",
    extra="vlm",
    description="negative JPEG size in kB at quality 95 (DDPO compressibility)",
)
REWARDS.register(
    "jpeg_incompressibility",
    f"{__name__}.jpeg:JpegIncompressibility",
    extra="vlm",
    description="JPEG size in kB at quality 95 (DDPO incompressibility)",
)
REWARDS.register(
    "ocr",
    f"{__name__}.ocr:OCRScore",
    extra="ocr",
    description="1 - normalised edit distance between OCR'd text and the quoted target text (rapidocr / tesseract)",
)
REWARDS.register(
    "shapes",
    f"{__name__}.shapes:ShapesReward",
    description="programmatic prompt following for the synthetic shapes dataset "
    "(colour, count, shape, position, purity)",
)
REWARDS.register(
    "moving_shapes",
    f"{__name__}.moving_shapes:MovingShapesReward",
    description="programmatic prompt following for the synthetic moving_shapes videos (colour, shape, direction)",
)
REWARDS.register(
    "weighted_sum",
    "mmrl.reward:WeightedSum",
    description="weighted sum of rewards of one kind, each part reported",
)
REWARDS.register(
    "http",
    f"{__name__}.http:RemoteReward",
    description="a reward served over HTTP by `python -m rewards.http NAME` (stdlib client)",
)
REWARDS.register(
    "math_answer",
    f"{__name__}.verifiable:MathAnswer",
    description="1/0: the last \\boxed{} / <answer> / number matches meta['answer'] (fractions; rel_tol decimals)",
)
REWARDS.register(
    "multiple_choice",
    f"{__name__}.verifiable:MultipleChoice",
    description="1/0: the chosen letter (\\boxed{B}, Answer: (B), a lone B, or an option text) matches meta['answer']",
)
REWARDS.register(
    "counting",
    f"{__name__}.verifiable:Counting",
    description="1/0: the integer answer (digits or zero..twenty in words) matches meta['answer']",
)
REWARDS.register(
    "short_answer",
    f"{__name__}.verifiable:ShortAnswer",
    description="1/0: normalised exact match of a short word / number answer (case, punctuation, articles, "
    "<answer>/\\boxed{}, number words) with meta['answer']",
)
REWARDS.register(
    "grounding_iou",
    f"{__name__}.verifiable:GroundingIoU",
    description="IoU of the predicted [x1, y1, x2, y2] box with meta['box'] (1/0 with threshold)",
)
REWARDS.register(
    "format",
    f"{__name__}.verifiable:FormatReward",
    description="1/0: the completion is <think>...</think> <answer>...</answer> (or just <answer>...</answer>)",
)
REWARDS.register(
    "overlong_penalty",
    f"{__name__}.verifiable:OverlongPenalty",
    description="DAPO soft overlong punishment in [-1, 0] over the last cache_length tokens before max_length",
)
REWARDS.register(
    "math_with_format",
    f"{__name__}.verifiable:MathWithFormat",
    description="(1 - format_weight) * math_answer + format_weight * format, each part reported",
)
REWARDS.register(
    "clip_contrast_goal",
    f"{__name__}.clip_goal:CLIPContrastGoal",
    extra="clip",
    description="VLM-RL contrasting language goal (positive vs negative goal text) CLIP reward in [0, 1]",
)
REWARDS.register(
    "clip_goal_baseline",
    f"{__name__}.clip_goal:CLIPGoalBaseline",
    extra="clip",
    description="VLM-RM goal-baseline regularised CLIP reward 1 - 0.5||(aP + (1-a)I)(s - g)||^2",
)
REWARDS.register(
    "clip_cosine",
    f"{__name__}.clip_goal:CLIPCosine",
    extra="clip",
    description="CLIP cosine between image and instruction (open_clip; default ViT-B-32 / laion2b_s34b_b79k)",
)
REWARDS.register(
    "vlm_judge",
    f"{__name__}.vlm_judge:VLMJudge",
    extra="vlm",
    description="VLM judge: a templated yes/no or 0-10 question per image, parsed to [0, 1] (callable or HTTP)",
)
REWARDS.register(
    "success_detector",
    f"{__name__}.success_detector:SuccessDetector",
    description="success detector trained on labelled frames: P(success | frame, instruction) in [0, 1] "
    "or 1/0 at a threshold (python -m rewards.success_detector)",
)
REWARDS.register(
    "frame_score",
    f"{__name__}.video:FrameScore",
    description="an image reward (clip_score, pickscore, ...) over n evenly spaced frames of a video, mean or min",
)
REWARDS.register(
    "temporal_consistency",
    f"{__name__}.video:TemporalConsistency",
    description="1 - mean absolute difference of consecutive frames / 255 (steady videos score high)",
)
REWARDS.register(
    "motion_amount",
    f"{__name__}.video:MotionAmount",
    description="mean absolute difference of consecutive frames / 255 (moving videos score high)",
)
REWARDS.register(
    "frame_judge",
    f"{__name__}.video:FrameJudge",
    extra="vlm",
    description="VLM judge (vlm_judge) over n frames of a video tiled left to right into one image strip",
)

__all__ = ["Reward", "RewardError", "WeightedSum", "check_reward"]
