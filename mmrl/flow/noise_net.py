"""Flow-Noise (pi_RL): a small learnable, bounded noise-std head for the action expert.

The head reads the action expert's hidden state (optionally concatenated with the time embedding)
and gives a per-element std for :func:`mmrl.flow.steps.noise_step`::

    std = min_std + (max_std - min_std) * sigmoid(mlp(h))

so ``min_std < std < max_std`` always (the log-prob stays finite and exploration bounded). The last
layer starts at zero, so an untrained head gives the midpoint ``(min_std + max_std) / 2``.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn


class FlowNoiseHead(nn.Module):
    """Bounded per-element std from a hidden state.

    Args:
        hidden_dim: size of the action expert's hidden state ``h``.
        out_dim: number of std values per position (e.g. the action dim ``A``).
        min_std, max_std: bounds, ``0 < min_std < max_std``.
        time_dim: size of an optional time embedding concatenated to ``h`` (0 = none).
        mlp_dim: width of the hidden layer (default ``hidden_dim``).

    forward(h ``[.., hidden_dim]``, t_emb ``[.., time_dim]`` or None) -> std ``[.., out_dim]``.
    """

    def __init__(
        self,
        hidden_dim: int,
        out_dim: int,
        min_std: float = 0.05,
        max_std: float = 0.5,
        time_dim: int = 0,
        mlp_dim: int | None = None,
    ):
        super().__init__()
        if not 0.0 < min_std < max_std:
            raise ValueError(f"need 0 < min_std < max_std, got {min_std}, {max_std}")
        self.min_std, self.max_std, self.time_dim = float(min_std), float(max_std), int(time_dim)
        width = mlp_dim or hidden_dim
        self.mlp = nn.Sequential(
            nn.Linear(hidden_dim + self.time_dim, width),
            nn.SiLU(),
            nn.Linear(width, out_dim),
        )
        out = cast(nn.Linear, self.mlp[-1])
        nn.init.zeros_(out.weight)
        nn.init.zeros_(out.bias)

    def forward(self, h: torch.Tensor, t_emb: torch.Tensor | None = None) -> torch.Tensor:
        if self.time_dim:
            if t_emb is None:
                raise ValueError(f"FlowNoiseHead built with time_dim={self.time_dim} needs t_emb")
            h = torch.cat([h, t_emb.expand(*h.shape[:-1], t_emb.shape[-1])], dim=-1)
        elif t_emb is not None:
            raise ValueError("FlowNoiseHead built with time_dim=0 got a t_emb")
        return self.min_std + (self.max_std - self.min_std) * torch.sigmoid(self.mlp(h))
