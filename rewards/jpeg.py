"""JPEG (in)compressibility rewards, as in DDPO (Black et al. 2023).

The size of an image saved as JPEG (PIL, ``quality=95`` by default) in kilobytes (1 kB = 1000
bytes). ``jpeg_compressibility`` rewards small files (``-size_kb``: flat, simple images score
higher); ``jpeg_incompressibility`` rewards large ones (``+size_kb``: detailed, noisy images). The
prompt is ignored. Needs only Pillow.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from mmrl.reward import Reward


def jpeg_size_kb(image: np.ndarray, quality: int = 95) -> float:
    """Size in kB (1000 bytes) of one uint8 ``[H, W, 3]`` image saved as JPEG at ``quality``."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="JPEG", quality=quality)
    return buf.tell() / 1000.0


class JpegCompressibility(Reward):
    """Negative JPEG file size in kB (DDPO's compressibility reward); the prompt is ignored."""

    name = "jpeg_compressibility"
    kind = "image"
    sign = -1.0

    def __init__(self, *, quality: int = 95):
        if not 1 <= quality <= 100:
            raise ValueError(f"JPEG quality must be in [1, 100], got {quality}")
        self.quality = quality

    def score(self, images, prompts, meta) -> torch.Tensor:
        arrays = images.cpu().numpy()
        return torch.tensor([self.sign * jpeg_size_kb(a, self.quality) for a in arrays], dtype=torch.float32)


class JpegIncompressibility(JpegCompressibility):
    """JPEG file size in kB (DDPO's incompressibility reward); the prompt is ignored."""

    name = "jpeg_incompressibility"
    sign = 1.0


__all__ = ["JpegCompressibility", "JpegIncompressibility", "jpeg_size_kb"]
