"""A small built-in text-to-video flow-matching generator for the embedded video demo (CPU-fast).

Pixel space (no VAE): the sample is the clip itself, ``[B, 3, F, H, W]`` in ``[-1, 1]``, laid out as
a video latent of `mmrl.policies.wan` (channels, frames, rows, columns), so the diffusion policy
drives both the same way. The network is the image generator (`TinyTextToImage`: its prompt
encoder, FiLM-modulated conv U-Net and cross-attention) run on every frame, factorised (2+1)-D:

- frames are folded into the batch for the 2-D layers (``[B F, C, h, w]``), each frame seeing the
  same prompt tokens and flow time;
- a learned per-frame embedding is added after the input conv, so a frame knows where it is in the
  clip (where a shape that moves right must be at the start and at the end);
- after the input conv and after every residual block (`TinyTextToImage.MIX_POINTS`), a temporal
  convolution over frames (kernel 3, per pixel and channel group) is added as a residual, started
  at zero, so the untrained model is the image model on each frame and motion is learned; seven
  of them see every frame of an 8-frame clip from every other.

Interface: `mmrl.policies.generator.TextToImageGenerator` with ``sample_shape = (3, F, H, W)``;
``decode(x0) -> frames [B, F, 3, H, W]`` in ``[-1, 1]`` (the Wan generator's layout) and
``encode_images(videos uint8 [B, F, H, W, 3]) -> x0``.
"""

from __future__ import annotations

import torch
from torch import nn

from mmrl.policies.tiny_generator import TinyTextToImage


class TinyTextToVideo(TinyTextToImage):
    """Pixel-space conditional velocity model ``v(x_t, t, prompt)`` of ``num_frames``-frame clips."""

    def __init__(self, image_size: int = 16, num_frames: int = 8, ch: int = 64, dim: int = 128, **kwargs):
        super().__init__(image_size=image_size, ch=ch, dim=dim, **kwargs)
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        self.num_frames = num_frames
        self.frame_pos = nn.Parameter(torch.randn(num_frames, ch) * 0.02)
        widths = {"in": ch, "down0": ch, "down1": ch, "mid1": 2 * ch, "mid2": 2 * ch, "up0": ch, "up1": ch}
        convs = {}
        for point, w in widths.items():  # residual mixing that starts as the identity
            conv = convs[point] = nn.Conv3d(w, w, (3, 1, 1), padding=(1, 0, 0), groups=8)
            assert conv.bias is not None  # Conv3d's default bias=True
            nn.init.zeros_(conv.weight)
            nn.init.zeros_(conv.bias)
        self.temporal = nn.ModuleDict(convs)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (3, self.num_frames, self.image_size, self.image_size)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        """The velocity of clips ``x [B', 3, F, H, W]`` (rows a multiple of the prompts, sample-major)."""
        b, c, f, h, w = x.shape
        if f != self.num_frames:
            raise ValueError(f"the generator makes {self.num_frames}-frame clips, got {f} frames")
        frames = x.transpose(1, 2).reshape(b * f, c, h, w)  # row b*F + k: frame k of clip b
        tok, mask = cond
        v = super().forward(frames, t.repeat_interleave(f), (tok, mask))
        return v.reshape(b, f, c, h, w).transpose(1, 2)

    def mix(self, h: torch.Tensor, point: str) -> torch.Tensor:
        bf, ch, hh, ww = h.shape
        f = self.num_frames
        clip = h.reshape(bf // f, f, ch, hh, ww).transpose(1, 2)  # [B, C, F, h, w]
        if point == "in":
            clip = clip + self.frame_pos.t()[None, :, :, None, None]
        clip = clip + self.temporal[point](clip)
        return clip.transpose(1, 2).reshape(bf, ch, hh, ww)

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Clips ``[B, 3, F, H, W]`` -> frames ``[B, F, 3, H, W]`` in ``[-1, 1]``."""
        return x0.clamp(-1, 1).transpose(1, 2)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 videos ``[B, F, H, W, 3]`` -> x0 ``[B, 3, F, H, W]`` in [-1, 1]."""
        return images.to(self.device).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)
