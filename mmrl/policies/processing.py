"""Pre/post-processing kept apart from the models: image resizing and action normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resize_images(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 [B, H, W, 3] or [B, V, H, W, 3] -> same layout at size x size (bilinear, antialiased)."""
    if images.shape[-3] == size and images.shape[-2] == size:
        return images
    lead = images.shape[:-3]
    x = images.reshape(-1, *images.shape[-3:]).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
    return x.reshape(*lead, size, size, 3)


class ActionNormalizer:
    """Maps environment actions in [low, high] to the policy's [-1, 1] space and back.

    ``low``/``high`` are per-dimension bounds (dataset statistics, e.g. 1st/99th percentiles as
    OpenVLA does, or the simulator's action space). The policy samples in normalised space; what
    the environment executes is ``unnormalize(clamp(x, -1, 1))``.
    """

    def __init__(self, low: torch.Tensor | float = -1.0, high: torch.Tensor | float = 1.0):
        self.low = torch.as_tensor(low, dtype=torch.float32)
        self.high = torch.as_tensor(high, dtype=torch.float32)
        if torch.any(self.high <= self.low):
            raise ValueError("ActionNormalizer needs high > low in every dimension")

    @classmethod
    def from_config(cls, low: list[float] | None, high: list[float] | None) -> ActionNormalizer:
        """From a policy config's ``action_low`` / ``action_high`` (both null: the identity on [-1, 1])."""
        if (low is None) != (high is None):
            raise ValueError("set both policy.action_low and policy.action_high, or neither")
        return cls() if low is None else cls(torch.tensor(low), torch.tensor(high))

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        low, high = self.low.to(actions.device), self.high.to(actions.device)
        return (2 * (actions - low) / (high - low) - 1).clamp(-1, 1)

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        low, high = self.low.to(x.device), self.high.to(x.device)
        return low + (x.clamp(-1, 1) + 1) * (high - low) / 2

    def state_dict(self) -> dict:
        return {"low": self.low, "high": self.high}
