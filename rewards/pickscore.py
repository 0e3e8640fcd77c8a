"""PickScore (Kirstain et al. 2023): a CLIP-H/14 fine-tuned on Pick-a-Pic human preferences.

``score = exp(logit_scale) * cos(E_img(image), E_txt(prompt))`` with transformers' ``CLIPModel``
(about 18-23 for real images), as in the reference inference code. Defaults are the real hub ids:
model ``yuvalkirstain/PickScore_v1``, processor ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``. Either
may be a local folder, or pass built objects (``model=CLIPModel(...)``, ``processor=CLIPProcessor``).

Only the processor's tokenizer and its image settings (shortest-edge size, crop size, mean, std)
are used: images are resized / cropped / normalised in torch from the uint8 batch
(`rewards.clip_score.clip_pixels`). Prompts are padded to the fixed 77-token context, so a
prompt's score does not depend on the other prompts in the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from mmrl.utils.compat import patch_torchvision

patch_torchvision()
from transformers import AutoProcessor, CLIPModel  # noqa: E402

from mmrl.reward import Reward  # noqa: E402

from .clip_score import clip_pixels, cosine, default_device  # noqa: E402

MODEL_ID = "yuvalkirstain/PickScore_v1"
PROCESSOR_ID = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def _field(d: Any, key: str):
    if d is None:
        return None
    return d.get(key) if isinstance(d, dict) else getattr(d, key, None)


def image_spec(image_processor: Any) -> tuple[int, tuple[int, int], tuple, tuple]:
    """``(resize, (crop_h, crop_w), mean, std)`` from a CLIP image processor's settings."""
    size, crop = image_processor.size, getattr(image_processor, "crop_size", None)
    resize = _field(size, "shortest_edge") or min(_field(size, "height"), _field(size, "width"))
    if getattr(image_processor, "do_center_crop", True) and crop is not None:
        crop_hw = (_field(crop, "height"), _field(crop, "width"))
    else:
        crop_hw = (resize, resize)
    return resize, crop_hw, tuple(image_processor.image_mean), tuple(image_processor.image_std)


def _features(out: Any) -> torch.Tensor:
    """transformers 5 returns a model output (projected ``pooler_output``); older versions a tensor."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


class PickScore(Reward):
    """PickScore v1 human-preference score: exp(logit_scale) * CLIP cosine (transformers CLIPModel)."""

    name = "pickscore"
    kind = "image"

    def __init__(
        self,
        *,
        model: str | Any = MODEL_ID,
        processor: str | Any = PROCESSOR_ID,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ):
        dev = default_device(device)
        if isinstance(model, str):
            model = CLIPModel.from_pretrained(model, dtype=dtype)
        if isinstance(processor, str):
            processor = AutoProcessor.from_pretrained(processor)
        self.model = model.to(dev).eval()
        self.tokenizer = processor.tokenizer
        self.spec = image_spec(processor.image_processor)
        self.device = dev

    @torch.no_grad()
    def embed(self, images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Projected (unnormalised) image and text embeddings ``[B, D]``, float32."""
        dtype = next(self.model.parameters()).dtype
        pixels = clip_pixels(images.to(self.device), *self.spec).to(dtype)
        text = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=77, return_tensors="pt")
        text = {k: v.to(self.device) for k, v in text.items()}
        img = _features(self.model.get_image_features(pixel_values=pixels))
        txt = _features(self.model.get_text_features(**text))
        return img.float(), txt.float()

    def score(self, images, prompts, meta) -> torch.Tensor:
        img, txt = self.embed(images, prompts)
        return self.model.logit_scale.exp().float() * cosine(img, txt)


__all__ = ["PickScore", "image_spec", "MODEL_ID", "PROCESSOR_ID"]
