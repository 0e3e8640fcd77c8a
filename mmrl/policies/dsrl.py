"""DSRL: SAC in the latent-noise space of a frozen flow policy (Wagenmaker et al. 2025, "Steering
Your Diffusion Policy with Latent Space RL"), its DSRL-SAC form: the critics score (features,
noise). The paper's noise-aliased DSRL-NA (an action-space critic distilled into a noise-space one)
is not implemented.

    observation -> frozen base's features f [D] -> actor MLP -> u ~ N(mean, std) [C, A]
    a = tanh(u) in [-1, 1]                                                (SAC's action)
    w = noise_bound * a                                                   (the initial noise)
    w -> base's deterministic ODE (`LatentNoiseBase.act_from_noise`) -> action chunk [C, A] (env units)

The frozen base, its warm start or checkpoint, the actor and the rollout are
`mmrl.policies.frozen_base`'s (shared with residual RL, `mmrl.policies.residual`). ``actor: prior``
replaces the actor by the base's own noise (w ~ N(0, I), unbounded): the DSRL policy then acts
exactly as its base's ODE sampler, a check and a baseline.

How far the noise can steer the base is logged once, at the first rollout (`steering_spread`):
``train/steer_spread``, the std of the base's actions (env units) over ``spread_draws`` noises
uniform in the bound's box, per observation, averaged; ``train/base_spread``, the same over the
base's own N(0, I) draws. A base distilled from one deterministic demonstrator maps most noise to
one action (docs/notes/2026-11-29-dsrl-on-reach.md: 0.024 over N(0, I), 0.33 at corners of 3): a steer spread small
against the actions' range says DSRL cannot move the base, and a larger ``noise_bound`` is the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmrl.config import ConfigError, check_range
from mmrl.policies.frozen_base import FrozenBaseConfig, FrozenBasePolicy
from mmrl.utils.rows import randn_rows


@dataclass
class DSRLConfig(FrozenBaseConfig):
    """Configuration of `DSRLPolicy` (the ``policy`` section of an experiment)."""

    type: str = "dsrl"
    noise_bound: float = 1.5  # the initial noise is noise_bound * tanh(u): |w| <= noise_bound
    # noises per observation (on up to 4 observations) for the steering-spread diagnostic logged at
    # the first rollout (train/steer_spread, train/base_spread); 0: not measured
    spread_draws: int = 8

    def validate(self) -> None:
        check_range(self, {"noise_bound": ">0", "spread_draws": ">=0"})
        if self.spread_draws == 1:
            raise ConfigError("'spread_draws' = 1: a spread needs >= 2 noises per observation (0 turns it off)")
        super().validate()


class DSRLPolicy(FrozenBasePolicy[DSRLConfig]):
    """A SAC actor over the initial noise of a frozen flow policy; see the module docstring."""

    config_class = DSRLConfig
    maps_demonstrations = False  # a chunk has no one noise that acts it
    demonstrations_fix = (
        "DSRL's actions are initial noises, and a chunk has no noise to replay: use policy.type=residual "
        "(a correction of the same frozen base's chunk), or algorithm.sac.demo_dataset=null"
    )

    def __init__(self, cfg: DSRLConfig, action_dim: int, state_dim: int | None = None):
        super().__init__(cfg, action_dim, state_dim)
        self._spread: dict[str, float] | None = None  # measured at the first rollout, logged once

    @property
    def actor_shape(self) -> tuple[int, ...]:
        """The base's noise shape (a LeRobot base's padded ``[chunk_size, max_action_dim]``, not the
        executed chunk)."""
        return tuple(self.base.noise_shape)

    def decode(self, obs, actions: torch.Tensor) -> torch.Tensor:
        """The base's ODE chunk from the noise ``noise_bound * actions``."""
        return self.base.act_from_noise(obs, self.cfg.noise_bound * actions)

    def prior_actions(self, obs, features: torch.Tensor, generator: torch.Generator | None):
        """The base's own draw ``w ~ N(0, I)`` (unbounded), replayed as ``w / noise_bound``."""
        w = randn_rows((features.shape[0], *self.actor_shape), generator=generator, device=features.device)
        logp = torch.distributions.Normal(0.0, 1.0).log_prob(w).sum((1, 2))
        return w / self.cfg.noise_bound, logp, self.base.act_from_noise(obs, w)

    def replay_actions(self, obs, chunk: torch.Tensor) -> torch.Tensor:
        raise ConfigError(self.demonstrations_fix)

    def before_rollout(self, obs) -> None:
        if self._spread is None and self.cfg.spread_draws:
            self._spread = self.steering_spread(obs, self.cfg.spread_draws)

    @torch.no_grad()
    def steering_spread(self, obs, draws: int, observations: int = 4) -> dict[str, float]:
        """How far the noise moves the base's actions on the first ``observations`` rows of ``obs``:
        ``steer_spread`` over ``draws`` noises uniform in ``[-noise_bound, noise_bound]`` (what the
        actor can reach), ``base_spread`` over ``draws`` N(0, I) noises (`action_spread` of each).
        The draws come from a generator of their own (seed 0): the run's random streams are untouched."""
        n = min(observations, len(obs.instruction))
        rows = obs.index(torch.arange(n).repeat_interleave(draws))
        g = torch.Generator().manual_seed(0)
        shape = (n * draws, *self.base.noise_shape)
        box = self.cfg.noise_bound * (2 * torch.rand(shape, generator=g) - 1)
        prior = torch.randn(shape, generator=g)
        dev = self.base_frozen.device
        chunks = {k: self.base.act_from_noise(rows, w.to(dev)) for k, w in (("steer", box), ("base", prior))}
        return {f"{k}_spread": action_spread(c.reshape(n, draws, *c.shape[1:])) for k, c in chunks.items()}

    def rollout_stats(self) -> dict[str, float]:
        """The steering spread, once (the rollout that measured it)."""
        out, self._spread = self._spread or {}, {}
        return out


def action_spread(chunks: torch.Tensor) -> float:
    """``chunks`` [N, K, ...]: K action chunks per observation -> the std over the K draws, averaged
    over observations and action entries."""
    if chunks.shape[1] < 2:
        raise ValueError(f"the spread needs >= 2 draws per observation, got chunks of shape {list(chunks.shape)}")
    return chunks.float().std(dim=1).mean().item()
