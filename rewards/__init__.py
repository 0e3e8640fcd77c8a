"""Reward models (import package `rewards`), registered by name in `mmrl.registry.REWARDS` (``mmrl list``).

A reward model scores a batch of single-turn samples: ``reward(images, prompts, meta) -> float32 [B]``
(images uint8 ``[B, H, W, 3]``; or ``kind = "text"``: a list of B completion strings). The contract
is in `rewards.base` and every reward passes `rewards.check.check_reward`. Simulators return their
own task reward; these models score generated images (diffusion) and VLM answers.

Built-ins register lazily, so importing this package imports no model library; constructors take
keyword arguments only, default to the real checkpoints, and accept a built model for tests:

- ``clip_score``: open_clip image-prompt cosine (default ViT-L-14 / openai)            extra ``clip``
- ``pickscore``: PickScore v1 (transformers CLIPModel, yuvalkirstain/PickScore_v1)       extra ``vlm``
- ``aesthetic``: LAION aesthetic predictor v2 (CLIP ViT-L/14 + MLP)                   extra ``clip``
- ``jpeg_compressibility`` / ``jpeg_incompressibility``: -/+ JPEG size in kB (DDPO)   (Pillow)
- ``ocr``: 1 - normalised edit distance of OCR'd text to the target (rapidocr-onnxruntime or tesseract)
- ``shapes``: programmatic prompt following on the synthetic `shapes` grammar (embedded demo)
- ``weighted_sum``: ``sum_i w_i * r_i`` over rewards of one kind (`rewards.base.WeightedSum`)
- ``http``: a reward served by ``python -m rewards.http NAME`` (`rewards.http.RemoteReward`)

Third-party packages register more under the ``mmrl.rewards`` entry-point group.
"""

from mmrl.registry import REWARDS

from .base import Reward, RewardError, WeightedSum
from .check import check_reward

REWARDS.register(
    "clip_score", "rewards.clip_score:CLIPScore", extra="clip",
    description="CLIP cosine similarity between image and prompt (open_clip; default ViT-L-14 / openai)",
)
REWARDS.register(
    "pickscore", "rewards.pickscore:PickScore", extra="vlm",
    description="PickScore v1 human-preference score (transformers CLIPModel yuvalkirstain/PickScore_v1)",
)
REWARDS.register(
    "aesthetic", "rewards.aesthetic:AestheticScore", extra="clip",
    description="LAION aesthetic predictor v2 (sac+logos+ava1 MLP on CLIP ViT-L/14 image embeddings)",
)
REWARDS.register(
    "jpeg_compressibility", "rewards.jpeg:JpegCompressibility", extra="vlm",
    description="negative JPEG size in kB at quality 95 (DDPO compressibility)",
)
REWARDS.register(
    "jpeg_incompressibility", "rewards.jpeg:JpegIncompressibility", extra="vlm",
    description="JPEG size in kB at quality 95 (DDPO incompressibility)",
)
REWARDS.register(
    "ocr", "rewards.ocr:OCRScore", extra="ocr",
    description="1 - normalised edit distance between OCR'd text and the quoted target text (rapidocr / tesseract)",
)
REWARDS.register(
    "shapes", "rewards.shapes:ShapesReward",
    description="programmatic prompt following for the synthetic shapes dataset (colour, count, shape, position, purity)",
)
REWARDS.register(
    "weighted_sum", "rewards.base:WeightedSum",
    description="weighted sum of rewards of one kind, each part reported",
)
REWARDS.register(
    "http", "rewards.http:RemoteReward",
    description="a reward served over HTTP by `python -m rewards.http NAME` (stdlib client)",
)

__all__ = ["Reward", "RewardError", "WeightedSum", "check_reward"]
