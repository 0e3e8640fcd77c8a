"""Residual RL on a frozen flow policy: a small SAC actor adds a bounded correction to its chunk.

    observation -> frozen base's features f [D] -> actor MLP -> u ~ N(mean, std) [C, A]
    a = tanh(u) in [-1, 1]                                                (SAC's action)
    chunk = base's deterministic ODE chunk from zero noise + scale * a    (env units)

The base's chunk is its ODE sample from the zero noise (`LatentNoiseBase.act_from_noise`), the mode of what
it draws, so the correction has one fixed chunk to correct per observation. The actor's last layer
starts at zero (``zero_init``): before training, its mean correction is 0 and evaluation acts as the
base. Because ``a`` lives in action space, a demonstration's chunk maps back to one
(`replay_actions`: ``(chunk - base chunk) / scale``, clipped to [-1, 1]), which is what RLPD's
demonstrations need (``algorithm.sac.demo_dataset``); DSRL's noise has no such inverse.

The frozen base, its warm start or checkpoint, the actor and the rollout are
`mmrl.policies.frozen_base`'s (shared with DSRL). ``actor: prior`` acts as the base alone (a = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mmrl.config import check_range
from mmrl.policies.frozen_base import FrozenBaseConfig, FrozenBasePolicy


@dataclass
class ResidualConfig(FrozenBaseConfig):
    """Configuration of `ResidualPolicy` (the ``policy`` section of an experiment)."""

    type: str = "residual"
    scale: float = 0.5  # the correction's bound in the environment's action units: |chunk - base| <= scale
    zero_init: bool = True  # the actor's last layer starts at zero: the mean correction starts at 0

    def validate(self) -> None:
        check_range(self, {"scale": ">0"})
        super().validate()


class ResidualPolicy(FrozenBasePolicy[ResidualConfig]):
    """A SAC actor over a bounded correction of a frozen flow policy's chunk; see the module docstring."""

    config_class = ResidualConfig

    def __init__(self, cfg: ResidualConfig, action_dim: int, state_dim: int | None = None):
        super().__init__(cfg, action_dim, state_dim)
        if self.actor is not None and cfg.zero_init:
            last = self.actor[-1]
            assert isinstance(last, nn.Linear)
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)

    @property
    def actor_shape(self) -> tuple[int, ...]:
        return (self.base.chunk_size, self.action_dim)

    def base_chunk(self, obs) -> torch.Tensor:
        """The base's chunk ``[B, C, A]`` (env units): its ODE from the zero noise."""
        n = len(obs.instruction)
        return self.base.act_from_noise(obs, torch.zeros(n, *self.base.noise_shape, device=self.base_frozen.device))

    def decode(self, obs, actions: torch.Tensor) -> torch.Tensor:
        """The base's chunk plus ``scale * actions``."""
        return self.base_chunk(obs) + self.cfg.scale * actions.to(self.base_frozen.device)

    def prior_actions(self, obs, features: torch.Tensor, generator: torch.Generator | None):
        """No correction: ``a = 0`` (log-prob 0), the base's chunk."""
        a = torch.zeros(features.shape[0], *self.actor_shape, device=features.device)
        return a, torch.zeros(features.shape[0], device=features.device), self.base_chunk(obs)

    @torch.no_grad()
    def replay_actions(self, obs, chunk: torch.Tensor) -> torch.Tensor:
        """``(chunk - base chunk) / scale``, clipped to [-1, 1]: the correction that acts ``chunk``
        (where it is within ``scale`` of the base's)."""
        base = self.base_chunk(obs)
        return ((chunk.to(base.device).float() - base) / self.cfg.scale).clamp(-1.0, 1.0)
