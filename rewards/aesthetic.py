"""LAION aesthetic predictor v2: an MLP on L2-normalised CLIP ViT-L/14 image embeddings.

The predictor of https://github.com/christophschuhmann/improved-aesthetic-predictor (used by DDPO
and many diffusion RL papers): ``Linear(768, 1024) - Dropout(0.2) - Linear(1024, 128) -
Dropout(0.2) - Linear(128, 64) - Dropout(0.1) - Linear(64, 16) - Linear(16, 1)`` (no activations),
applied to ``e / ||e||`` where ``e`` is OpenAI CLIP ViT-L/14's image embedding. Scores are roughly
on a 1-10 scale. The prompt is ignored.

Weights: ``sac+logos+ava1-l14-linearMSE.pth`` (a ``state_dict`` with keys ``layers.0.weight`` ...)
from that repository, :data:`WEIGHTS_URL`. ``weights=`` takes that URL (downloaded once into the
torch hub cache), a local file path, or pass a built ``mlp=``; ``model=`` takes a built open_clip
model instead of loading ``clip_model`` / ``pretrained``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mmrl.reward import Reward

from .clip_score import clip_pixels, load_open_clip

WEIGHTS_URL = (
    "https://github.com/christophschuhmann/improved-aesthetic-predictor/raw/main/sac+logos+ava1-l14-linearMSE.pth"
)


class AestheticMLP(nn.Module):
    """The predictor's head; parameter names match the released ``.pth`` (``layers.{0,2,4,6,7}``)."""

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.layers(embeddings)


def load_mlp(weights: str, input_size: int = 768) -> AestheticMLP:
    """An `AestheticMLP` with weights from a local ``.pth`` file or an http(s) URL."""
    if weights.startswith(("http://", "https://")):
        state = torch.hub.load_state_dict_from_url(weights, map_location="cpu", weights_only=True)
    else:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    mlp = AestheticMLP(input_size)
    mlp.load_state_dict(state)
    return mlp


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """``x / ||x||`` per row; a zero row stays zero (as the reference ``normalized`` does)."""
    norm = x.norm(dim=-1, keepdim=True)
    return x / torch.where(norm == 0, torch.ones_like(norm), norm)


class AestheticScore(Reward):
    """LAION aesthetic predictor v2 (sac+logos+ava1, CLIP ViT-L/14 + MLP); roughly 1-10, prompt ignored."""

    name = "aesthetic"
    kind = "image"

    def __init__(
        self,
        *,
        weights: str = WEIGHTS_URL,
        clip_model: str = "ViT-L-14",
        pretrained: str | None = "openai",
        model: Any = None,
        mlp: nn.Module | None = None,
        device: str | torch.device | None = None,
    ):
        self.model, self.spec = load_open_clip(clip_model, pretrained, model, device)
        self.device = next(self.model.parameters()).device
        if mlp is None:
            mlp = load_mlp(weights, input_size=self.model.visual.output_dim)
        self.mlp = mlp.to(self.device).eval()

    @torch.no_grad()
    def score(self, images, prompts, meta) -> torch.Tensor:
        dtype = next(self.model.parameters()).dtype
        pixels = clip_pixels(images.to(self.device), *self.spec).to(dtype)
        emb = l2_normalize(self.model.encode_image(pixels).float())
        return self.mlp(emb.to(next(self.mlp.parameters()).dtype)).squeeze(-1).float()


__all__ = ["AestheticScore", "AestheticMLP", "load_mlp", "l2_normalize", "WEIGHTS_URL"]
