"""The interface of a text-to-image generator that `mmrl.policies.diffusion.DiffusionPolicy` drives,
shared by the built-in tiny generator (`mmrl.policies.tiny_generator`) and the diffusers ones
(`mmrl.policies.diffusers_base`: SD3, FLUX). Its own module, so that those can subclass it without
importing the policy that imports them."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn


class TextToImageGenerator(nn.Module):
    """What `DiffusionPolicy` drives, implemented by the built-in tiny generator
    (`mmrl.policies.tiny_generator`) and the diffusers ones (`mmrl.policies.diffusers_base`):
    ``forward(x, t, cond) -> v``, the velocity of samples ``x`` at flow times ``t``."""

    #: whether `disable_adapter` switches a LoRA adapter off (the reference model); without one the
    #: policy keeps a frozen copy as its reference
    has_adapter: bool = False

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One sample: ``[C, H, W]``, the image itself (pixel space) or its VAE latent, or a video
        latent ``[C, F, H, W]`` (`mmrl.policies.wan`)."""
        raise NotImplementedError

    def encode(self, prompts: list[str]) -> Any:
        """Prompts -> the ``cond`` that ``forward`` takes (a tuple of tensors with B rows)."""
        raise NotImplementedError

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Samples -> images ``[B, 3, H, W]`` in [-1, 1]."""
        raise NotImplementedError

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images ``[B, H, W, 3]`` -> samples ``x0`` (the warm start's targets)."""
        raise NotImplementedError

    def disable_adapter(self) -> AbstractContextManager[None]:
        """A context in which the model runs without its adapter (only with ``has_adapter``)."""
        raise NotImplementedError
