"""DSRL: SAC in the latent-noise space of a frozen flow policy (Wagenmaker et al. 2025, "Steering
Your Diffusion Policy with Latent Space RL"), its DSRL-SAC form: the critics score (features,
noise). The paper's noise-aliased DSRL-NA (an action-space critic distilled into a noise-space one)
is not implemented.

    observation -> frozen base's features f [D] (pooled prefix of image + instruction, normalised
                   state: `Policy.observation_features`, computed at rollout, replayed as the state)
    f -> actor MLP -> u ~ N(mean, std) [C, A] -> a = tanh(u) in [-1, 1]   (SAC's action)
    w = noise_bound * a                                                   (the initial noise)
    w -> base's deterministic ODE (`Policy.act_from_noise`) -> action chunk [C, A] (env units)

The base (``policy.base``: any policy with ``Capabilities.latent_noise``, e.g. ``flow_vla``) is never
back-propagated through: its features are computed without a graph, the replayed transitions hold
``(f, a)``, and SAC's twin critics score ``(f, a)`` (`mmrl.trainer.off_policy.SoftCritics`, built on
``replay_dim``). Train rollouts draw ``u`` from the actor, eval rollouts take its mean.

The base is either loaded from an mmrl run (``policy.base_checkpoint``: a run folder or one of its
checkpoints; its own recorded ``policy`` section replaces ``policy.base``; the experiment layer,
`mmrl.experiment.build_policy`, reads it, since a policy may not import the trainer's checkpoint
reader) and frozen at once, or warm-started in this run by the base's own supervised loss
(``warm_start``: `warm_start_batch`, `supervised_loss` and `update_statistics` go to the base) and
frozen when the warm start ends (`after_warm_start`). The freeze is part of the weights
(``base_frozen``), so a resumed run's base
stays frozen. ``actor: prior`` replaces the actor by the base's own noise (w ~ N(0, I), unbounded):
the DSRL policy then acts exactly as its base's ODE sampler, a check and a baseline.

How far the noise can steer the base is logged once, at the first rollout (`steering_spread`):
``train/steer_spread``, the std of the base's actions (env units) over ``spread_draws`` noises
uniform in the bound's box, per observation, averaged; ``train/base_spread``, the same over the
base's own N(0, I) draws. A base distilled from one deterministic demonstrator maps most noise to
one action (README, "DSRL on reach": 0.024 over N(0, I), 0.33 at corners of 3): a steer spread small
against the actions' range says DSRL cannot move the base, and a larger ``noise_bound`` is the fix.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import ConfigError, check_range
from mmrl.policies.base import Decision, Evaluation, Policy, PolicyConfig
from mmrl.policies.flow_vla import FlowVLAConfig
from mmrl.policies.gaussian import LOG_STD_MAX, LOG_STD_MIN, GaussianPolicy, mlp
from mmrl.utils.rows import randn_rows


@dataclass
class DSRLConfig(PolicyConfig):
    """Configuration of `DSRLPolicy` (the ``policy`` section of an experiment)."""

    type: str = "dsrl"
    # the frozen base policy's section (a type with Capabilities.latent_noise: flow_vla, lerobot); with
    # base_checkpoint, the checkpoint's own recorded section replaces it
    base: PolicyConfig = field(default_factory=FlowVLAConfig)
    # an mmrl run folder or checkpoint folder holding the trained base (then no warm start); null:
    # the base is built from policy.base and warm-started in this run (warm_start), then frozen
    base_checkpoint: str | None = None
    noise_bound: float = 1.5  # the initial noise is noise_bound * tanh(u): |w| <= noise_bound
    # "learned": the SAC actor picks the noise; "prior": w ~ N(0, I) as the base draws it (no RL)
    actor: Literal["learned", "prior"] = "learned"
    hidden: int = 256  # width of the actor MLP (ReLU)
    layers: int = 2  # its hidden layers
    # noises per observation (on up to 4 observations) for the steering-spread diagnostic logged at
    # the first rollout (train/steer_spread, train/base_spread); 0: not measured
    spread_draws: int = 8

    def validate(self) -> None:
        check_range(self, {"noise_bound": ">0", "hidden": ">=1", "layers": ">=1", "spread_draws": ">=0"})
        if self.spread_draws == 1:
            raise ConfigError("'spread_draws' = 1: a spread needs >= 2 noises per observation (0 turns it off)")
        from mmrl.registry import POLICIES

        if self.base.type not in POLICIES or not POLICIES.get(self.base.type).capabilities(self.base).latent_noise:
            steerable = [n for n in ("flow_vla", "lerobot") if n in POLICIES]
            raise ConfigError(
                f"'base.type' = {self.base.type!r} has no deterministic noise -> action map "
                f"(Capabilities.latent_noise) for DSRL to steer: use a flow policy ({', '.join(steerable)})"
            )


class DSRLPolicy(Policy[DSRLConfig]):
    """A SAC actor over the initial noise of a frozen flow policy; see the module docstring."""

    config_class = DSRLConfig
    base_frozen: torch.Tensor  # buffer: bool [], whether the base is frozen (kept in the weights)

    @classmethod
    def capabilities(cls, cfg: DSRLConfig) -> Capabilities:
        """Action chunks, reparameterised squashed latent actions (SAC) with ``actor: learned``; no
        replayable log-prob, no critic of its own (SAC's critics belong to the off-policy mode)."""
        return Capabilities(
            critic=False,
            likelihood=False,
            reparameterized=cfg.actor == "learned",
            fixes={
                "likelihood": "DSRL trains its latent-noise actor with SAC: set algorithm.objective=sac",
                "reparameterized": "set policy.actor=learned (policy.actor=prior has no actor to train)",
                "critic": "DSRL's critics belong to the off-policy mode: set algorithm.objective=sac",
                "likelihood_free": "DSRL trains with SAC: set algorithm.objective=sac",
                "kl_reference": "DSRL keeps no reference model: set algorithm.kl_coef=0",
            },
        )

    @classmethod
    def configure(cls, cfg: DSRLConfig, sim) -> DSRLConfig:
        """The base's section completed from the simulator (a section read from ``base_checkpoint``
        is complete already)."""
        from mmrl.registry import POLICIES

        if cfg.base_checkpoint is not None:
            return cfg
        return dataclasses.replace(cfg, base=POLICIES.get(cfg.base.type).configure(cfg.base, sim))

    def __init__(self, cfg: DSRLConfig, action_dim: int, state_dim: int | None = None):
        super().__init__()
        from mmrl.registry import POLICIES

        self.cfg, self.action_dim, self.state_dim = cfg, action_dim, state_dim
        self.base: Policy = POLICIES.get(cfg.base.type)(cfg.base, action_dim=action_dim, state_dim=state_dim)
        self.text_bytes = self.base.text_bytes
        self.register_buffer("base_frozen", torch.tensor(False))
        self.noise_width = int(torch.tensor(self.base.noise_shape).prod())
        self.actor = (
            mlp(self.base.feature_dim, cfg.hidden, cfg.layers, 2 * self.noise_width, nn.ReLU)
            if cfg.actor == "learned"
            else None
        )
        self.register_load_state_dict_post_hook(lambda module, incompatible: module.apply_freeze())
        self._spread: dict[str, float] | None = None  # measured at the first rollout, logged once

    # ---- the frozen base ----------------------------------------------------------------------
    def freeze_base(self) -> None:
        """Freeze the base for good (no gradient, eval mode; recorded in ``base_frozen``)."""
        self.base_frozen.fill_(True)
        self.apply_freeze()

    def apply_freeze(self) -> None:
        if bool(self.base_frozen):
            self.base.requires_grad_(False)
            self.base.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        self.apply_freeze()  # a frozen base stays in eval mode
        return self

    @property
    def chunk_size(self) -> int:
        return self.base.chunk_size

    def check_simulator(self, sim) -> None:
        self.base.check_simulator(sim)

    def warm_start_batch(self, data: dict) -> Batch:
        if bool(self.base_frozen):
            raise ConfigError(
                "policy.base_checkpoint loads a trained base, which DSRL keeps frozen: set warm_start.dataset=null "
                "(or leave base_checkpoint unset to warm-start the base in this run)"
            )
        return self.base.warm_start_batch(data)

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """The base's warm-start loss (before it is frozen)."""
        return self.base.supervised_loss(batch)

    def update_statistics(self, batch: Batch) -> None:
        """The base's statistics while it warm-starts; none once frozen (its features stay fixed)."""
        if not bool(self.base_frozen):
            self.base.update_statistics(batch)

    def after_warm_start(self) -> None:
        self.base.after_warm_start()
        self.freeze_base()

    # ---- the latent-noise actor ---------------------------------------------------------------
    @property
    def replay_dim(self) -> int:
        return self.base.feature_dim

    def replay_action_width(self, action_dim: int) -> int:
        """The replayed action is the noise: ``prod(base.noise_shape)`` wide (a LeRobot base's padded
        ``[chunk_size, max_action_dim]``, not the executed chunk)."""
        return self.noise_width

    def replay_state(self, obs) -> torch.Tensor:
        """The frozen base's features ``[B, feature_dim]`` (no graph)."""
        with torch.no_grad():
            return self.base.observation_features(obs).detach()

    def _dist(self, features: torch.Tensor) -> torch.distributions.Normal:
        """The Gaussian of ``u`` ``[B, *noise_shape]`` for replayed features ``[B, D]``."""
        assert self.actor is not None, "actor: prior has no actor (the config check refuses SAC with it)"
        out = self.actor(features.to(self.base_frozen.device).float())
        mean, log_std = out.view(-1, *self.base.noise_shape[:-1], 2 * self.base.noise_shape[-1]).chunk(2, dim=-1)
        return torch.distributions.Normal(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp())

    def sample_reparameterized(
        self, state: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a = tanh(u) [B, C, A], its log-prob [B])`` for replayed features ``state`` [B, D],
        differentiable w.r.t. the actor (the base is not involved)."""
        dist = self._dist(state)
        u = dist.mean + dist.stddev * randn_rows(dist.mean.shape, generator=generator, device=dist.mean.device)
        return torch.tanh(u), GaussianPolicy._squashed_logp(dist, u)

    def env_actions(self, obs, actions: torch.Tensor) -> torch.Tensor:
        """The base's ODE chunk from the noise ``noise_bound * actions``."""
        return self.base.act_from_noise(obs, self.cfg.noise_bound * actions)

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

    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        """Batch: ``state`` [B, D] (the base's features), ``actions`` [B, C, A] (``a`` in [-1, 1], the
        noise over ``noise_bound``), ``old_logp`` [B]; the environment gets the base's ODE chunk from
        ``w = noise_bound * a`` (``actor: prior``: from ``w ~ N(0, I)``, as the base draws it)."""
        if self._spread is None and self.cfg.spread_draws:
            self._spread = self.steering_spread(obs, self.cfg.spread_draws)
        features = self.replay_state(obs)
        shape = (features.shape[0], *self.base.noise_shape)
        if self.actor is None:
            w = randn_rows(shape, generator=generator, device=features.device)
            a, logp = w / self.cfg.noise_bound, torch.distributions.Normal(0.0, 1.0).log_prob(w).sum((1, 2))
        else:
            dist = self._dist(features)
            u = dist.mean
            if mode == "train":
                u = u + dist.stddev * randn_rows(shape, generator=generator, device=u.device)
            a, logp = torch.tanh(u), GaussianPolicy._squashed_logp(dist, u)
            w = self.cfg.noise_bound * a
        batch = Batch(state=features, actions=a, old_logp=logp)
        return Decision(batch, self.base.act_from_noise(obs, w))

    def evaluate(self, batch: Batch) -> Evaluation:
        raise NotImplementedError("DSRL has no replayable log-probs: it trains with algorithm.objective=sac")


def action_spread(chunks: torch.Tensor) -> float:
    """``chunks`` [N, K, ...]: K action chunks per observation -> the std over the K draws, averaged
    over observations and action entries."""
    if chunks.shape[1] < 2:
        raise ValueError(f"the spread needs >= 2 draws per observation, got chunks of shape {list(chunks.shape)}")
    return chunks.float().std(dim=1).mean().item()
