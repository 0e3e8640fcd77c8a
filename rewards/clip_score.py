"""CLIP score: cosine similarity between an image and its prompt in an open_clip model's space.

``score = scale * cos(E_img(image), E_txt(prompt))``. With the default ``scale=1.0`` the score is
the raw cosine (about 0.15-0.40 for matching pairs with real CLIP models); ``scale=100`` gives the
"CLIP score" numbers papers report (torchmetrics' ``CLIPScore`` also clips at 0, this does not).

Default checkpoint: open_clip ``ViT-L-14`` with ``pretrained="openai"`` (OpenAI's CLIP ViT-L/14,
the backbone of torchmetrics' CLIPScore and of the LAION aesthetic predictor). Any open_clip name /
tag works, e.g. ``model_name="ViT-H-14", pretrained="laion2b_s32b_b79k"``; ``pretrained`` may also be
a local checkpoint file, ``model_name`` a ``"local-dir:/path"`` folder, or pass a built ``model=``.

Images are preprocessed in torch from the uint8 batch (`clip_pixels`: resize the shortest side,
center crop, normalise with the model's mean / std), not with torchvision transforms, and open_clip
is imported only when a model is built (`rewards.pickscore` reuses `clip_pixels` without it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from mmrl.registry import MissingDependencyError
from mmrl.reward import Reward

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_pixels(
    images: torch.Tensor, resize: int, crop: tuple[int, int], mean: Sequence[float], std: Sequence[float]
) -> torch.Tensor:
    """uint8 ``[B, H, W, 3]`` -> float32 ``[B, 3, crop_h, crop_w]``, CLIP-style.

    Resize so the shortest side is ``resize`` (bicubic, antialiased, clamped to [0, 1] as a uint8
    round trip would be), center crop to ``crop``, then ``(x - mean) / std`` per channel.
    """
    x = images.permute(0, 3, 1, 2).float() / 255.0
    h, w = x.shape[-2:]
    ch, cw = crop
    s = resize / min(h, w)
    nh, nw = max(ch, round(h * s)), max(cw, round(w * s))
    if (nh, nw) != (h, w):
        x = F.interpolate(x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True).clamp(0.0, 1.0)
    top, left = int(round((nh - ch) / 2.0)), int(round((nw - cw) / 2.0))
    x = x[..., top : top + ch, left : left + cw]
    mean_t = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    std_t = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x - mean_t) / std_t


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity of ``[B, D]`` and ``[B, D]`` -> ``[B]``."""
    return (F.normalize(a.float(), dim=-1) * F.normalize(b.float(), dim=-1)).sum(-1)


def default_device(device: str | torch.device | None) -> torch.device:
    return torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))


def import_open_clip():
    """Import open_clip (after the torchvision work-around), or say which extra installs it."""
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()
    try:
        import open_clip
    except ImportError as exc:
        raise MissingDependencyError(f"this reward needs open_clip ({exc}). Fix: pip install 'mmrl[clip]'") from exc
    return open_clip


def load_open_clip(model_name: str, pretrained: str | None, model: Any = None, device=None):
    """Build (or take) an open_clip model; return ``(model, image_preprocess_spec)``.

    The spec is ``(resize, (crop_h, crop_w), mean, std)`` read from ``model.visual`` (its
    ``preprocess_cfg`` and ``image_size``), falling back to OpenAI's mean / std.
    """
    dev = default_device(device)
    if model is None:
        open_clip = import_open_clip()
        model, _, _ = open_clip.create_model_and_transforms(model_name, pretrained=pretrained, device=dev)
    model = model.to(dev).eval()
    visual = model.visual
    cfg = getattr(visual, "preprocess_cfg", None) or {}
    size = getattr(visual, "image_size", None) or cfg.get("size") or 224
    crop = (size, size) if isinstance(size, int) else tuple(size)
    spec = (min(crop), crop, tuple(cfg.get("mean", OPENAI_MEAN)), tuple(cfg.get("std", OPENAI_STD)))
    return model, spec


class CLIPScore(Reward):
    """CLIP image-prompt cosine similarity (open_clip; default ViT-L-14 / openai), times ``scale``."""

    name = "clip_score"
    kind = "image"

    def __init__(
        self,
        *,
        model_name: str = "ViT-L-14",
        pretrained: str | None = "openai",
        model: Any = None,
        tokenizer: Any = None,
        scale: float = 1.0,
        device: str | torch.device | None = None,
    ):
        self.model, self.spec = load_open_clip(model_name, pretrained, model, device)
        if tokenizer is None:
            tokenizer = import_open_clip().get_tokenizer(model_name)
        self.tokenizer, self.scale = tokenizer, float(scale)
        self.device = next(self.model.parameters()).device

    @torch.no_grad()
    def embed(self, images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unnormalised image and text embeddings ``[B, D]`` (float32, model device)."""
        dtype = next(self.model.parameters()).dtype
        pixels = clip_pixels(images.to(self.device), *self.spec).to(dtype)
        tokens = self.tokenizer(prompts).to(self.device)
        return self.model.encode_image(pixels).float(), self.model.encode_text(tokens).float()

    def score(self, images, prompts, meta) -> torch.Tensor:
        img, txt = self.embed(images, prompts)
        return self.scale * cosine(img, txt)


__all__ = ["CLIPScore", "clip_pixels", "cosine", "load_open_clip"]
