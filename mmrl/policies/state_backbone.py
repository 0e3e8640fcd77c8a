"""A state-only encoder for simulators without images (gymnasium control tasks, state-mode robots).

The policy's prefix is built from the (normalised) state vector alone: an MLP turns it into
``tokens`` prefix tokens of width ``dim``, so the action expert attends to it exactly as it attends
to an image-text prefix. No image is read, resized or stored: on a state-only task the image
encoder (and the all-zero images it would see) cost nothing.
"""

from __future__ import annotations

import torch
from torch import nn


class StateBackbone(nn.Module):
    """state ``[B, D]`` -> prefix ``(tokens [B, tokens, dim], mask [B, tokens])``."""

    uses_images = False

    def __init__(self, state_dim: int, dim: int = 64, hidden: int = 64, tokens: int = 1):
        super().__init__()
        if not state_dim:
            raise ValueError(
                "the state backbone needs a simulator with a state vector (state_dim > 0); "
                "this one has none: use policy.backbone=tiny (images)"
            )
        self.out_dim, self.tokens = dim, tokens
        self.net = nn.Sequential(
            nn.Linear(state_dim, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, dim * tokens),
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.net(state.float()).view(state.shape[0], self.tokens, self.out_dim)
        return self.norm(h), torch.ones(state.shape[0], self.tokens, dtype=torch.bool, device=state.device)
