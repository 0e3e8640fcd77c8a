"""A small built-in text-to-image flow-matching generator for the embedded diffusion demo (CPU-fast).

Pixel space (no VAE): the sample is the image itself, ``[B, 3, H, W]`` in ``[-1, 1]``. A two-level
conv U-Net whose residual blocks are modulated (FiLM) by the flow time and by the prompt: words
become hashed embeddings (`mmrl.policies.tiny_backbone.hash_tokenize`, any vocabulary, no
tokenizer files) mixed by one transformer layer and mean-pooled, and, at the 8x8 level, attended
to by the image features (one cross-attention layer), so "red" can bind to "left". An empty prompt
is the unconditional model (classifier-free guidance drops prompts while pretraining).

Interface shared with the diffusers generators (`mmrl.policies.sd3`, `mmrl.policies.flux`), declared
by `mmrl.policies.generator.TextToImageGenerator`: ``encode(prompts) -> cond``,
``forward(x, t, cond) -> v``, ``sample_shape``, ``decode(x0) -> images [-1, 1] [B, 3, H, W]``,
``encode_images(images) -> x0``.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from mmrl.policies.flow_vla import timestep_embedding
from mmrl.policies.generator import TextToImageGenerator
from mmrl.policies.tiny_backbone import hash_tokenize


class ResBlock(nn.Module):
    def __init__(self, ch: int, cond_dim: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, ch), nn.Conv2d(ch, ch, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(8, ch), nn.Conv2d(ch, ch, 3, padding=1)
        self.film = nn.Linear(cond_dim, 2 * ch)

    def forward(self, x, c):
        h = self.conv1(torch.nn.functional.silu(self.norm1(x)))
        scale, shift = self.film(c).chunk(2, -1)
        h = self.norm2(h) * (1 + scale[..., None, None]) + shift[..., None, None]
        return x + self.conv2(torch.nn.functional.silu(h))


def add_prompt_encoder(module: nn.Module, dim: int, buckets: int, max_words: int) -> None:
    """Give ``module`` the hashed-word prompt encoder's weights (``words``, ``word_pos``, ``null``,
    ``text``, made in this order) that `encode_prompts` reads."""
    module.words = nn.Embedding(buckets, dim, padding_idx=0)
    module.word_pos = nn.Parameter(torch.randn(1, max_words, dim) * 0.02)
    module.null = nn.Parameter(torch.zeros(1, 1, dim))  # the token of an empty prompt
    module.text = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)


def encode_prompts(module, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts -> (word tokens [B, L+1, D], mask [B, L+1]) by ``module``'s prompt encoder
    (`add_prompt_encoder`; its ``buckets``, ``max_words`` and ``device``); token 0 is the null token."""
    ids = hash_tokenize(prompts, module.buckets, module.max_words).to(module.device)
    mask = torch.cat([torch.ones_like(ids[:, :1], dtype=torch.bool), ids > 0], 1)
    tok = torch.cat([module.null.expand(len(prompts), -1, -1), module.words(ids) + module.word_pos], 1)
    return module.text(tok, src_key_padding_mask=~mask), mask


def zero_output(head: nn.Sequential) -> None:
    """Start the last convolution of ``head`` at zero: the untrained model outputs zeros."""
    last = cast(nn.Conv2d, head[-1])
    assert last.bias is not None  # Conv2d's default bias=True
    nn.init.zeros_(last.weight)
    nn.init.zeros_(last.bias)


class TinyTextToImage(TextToImageGenerator):
    """Pixel-space conditional velocity model ``v(x_t, t, prompt)``."""

    def __init__(self, image_size: int = 16, ch: int = 64, dim: int = 128, buckets: int = 4096, max_words: int = 16):
        super().__init__()
        if image_size % 2:
            raise ValueError(f"image_size must be even, got {image_size}")
        self.image_size, self.dim, self.buckets, self.max_words = image_size, dim, buckets, max_words
        add_prompt_encoder(self, dim, buckets, max_words)
        self.time = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down1 = nn.ModuleList([ResBlock(ch, dim), ResBlock(ch, dim)])
        self.down = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1)
        self.mid1, self.mid2 = ResBlock(2 * ch, dim), ResBlock(2 * ch, dim)
        self.q, self.kv = nn.Linear(2 * ch, dim), nn.Linear(dim, 2 * dim)
        self.attn_out = nn.Linear(dim, 2 * ch)
        self.up = nn.Conv2d(2 * ch, ch, 3, padding=1)
        self.up1 = nn.ModuleList([ResBlock(ch, dim), ResBlock(ch, dim)])
        self.merge = nn.Conv2d(2 * ch, ch, 1)
        self.out = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))
        zero_output(self.out)

    @property
    def device(self) -> torch.device:
        return self.inp.weight.device

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts -> (word tokens [B, L+1, D], mask [B, L+1]); token 0 is the null token."""
        return encode_prompts(self, prompts)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        """The velocity ``v(x_t, t, cond)``; ``x`` rows may be a multiple of the prompts (sample-major)."""
        tok, mask = cond
        reps = x.shape[0] // tok.shape[0]
        if reps > 1:  # several noisy samples per prompt (chain steps, AWM timesteps): sample-major
            tok, mask = tok.repeat_interleave(reps, 0), mask.repeat_interleave(reps, 0)
        m = mask.unsqueeze(-1).to(tok.dtype)
        c = (tok * m).sum(1) / m.sum(1) + self.time(timestep_embedding(t, self.dim))
        h = self.mix(self.inp(x), "in")
        for i, block in enumerate(self.down1):
            h = self.mix(block(h, c), f"down{i}")
        skip = h
        h = self.mix(self.mid1(self.down(h), c), "mid1")
        b, ch, hh, ww = h.shape
        q = self.q(h.flatten(2).transpose(1, 2))  # [B, hw, D]
        k, v = self.kv(tok).chunk(2, -1)
        att = torch.nn.functional.scaled_dot_product_attention(
            q[:, None], k[:, None], v[:, None], attn_mask=mask[:, None, None]
        )[:, 0]
        h = h + self.attn_out(att).transpose(1, 2).reshape(b, ch, hh, ww)
        h = self.mix(self.mid2(h, c), "mid2")
        h = self.up(torch.nn.functional.interpolate(h, scale_factor=2, mode="nearest"))
        h = self.merge(torch.cat([h, skip], 1))
        for i, block in enumerate(self.up1):
            h = self.mix(block(h, c), f"up{i}")
        return self.out(h)

    #: the feature maps `mix` is called on, in order: after the input conv and after each block
    MIX_POINTS = ("in", "down0", "down1", "mid1", "mid2", "up0", "up1")

    def mix(self, h: torch.Tensor, point: str) -> torch.Tensor:
        """A hook on the features ``[B', C, h, w]`` at ``point`` (`MIX_POINTS`): identity for images;
        the video generator (`mmrl.policies.tiny_video_generator`) mixes frames there."""
        return h

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        return x0.clamp(-1, 1)

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> x0 [B, 3, H, W] in [-1, 1]."""
        return images.to(self.device).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
