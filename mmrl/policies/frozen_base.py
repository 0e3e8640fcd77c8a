"""What DSRL and residual RL share: a small SAC actor over the features of a frozen flow policy.

    observation -> frozen base's features f [D] (pooled prefix of image + instruction, normalised
                   state: `LatentNoiseBase.observation_features`, computed at rollout, replayed as the state)
    f -> actor MLP -> u ~ N(mean, std) [*actor_shape] -> a = tanh(u) in [-1, 1]   (SAC's action)
    a -> `decode(obs, a)` -> the environment's action chunk [C, A]

A subclass says what ``a`` means: DSRL's initial noise of the base's ODE (`mmrl.policies.dsrl`), a
bounded correction added to the base's chunk (`mmrl.policies.residual`). The base (``policy.base``:
any policy with ``Capabilities.latent_noise``, e.g. ``flow_vla`` or ``lerobot``) is never
back-propagated through: its features are computed without a graph, the replayed transitions hold
``(f, a)``, and SAC's twin critics score ``(f, a)`` (`mmrl.trainer.off_policy.SoftCritics`, built on
``replay_dim``). Train rollouts draw ``u`` from the actor, eval rollouts take its mean.

The base is either loaded from an mmrl run (``policy.base_checkpoint``: a run folder or one of its
checkpoints; its own recorded ``policy`` section replaces ``policy.base``; the experiment layer,
`mmrl.experiment.build_policy`, reads it, since a policy may not import the trainer's checkpoint
reader) and frozen at once, or warm-started in this run by the base's own supervised loss
(``warm_start``: `warm_start_batch`, `supervised_loss` and `update_statistics` go to the base) and
frozen when the warm start ends (`after_warm_start`). The freeze is part of the weights
(``base_frozen``), so a resumed run's base stays frozen. ``actor: prior`` has no actor: the
subclass's `prior_actions` act (a check and a baseline).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

import torch
from torch import nn

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities, missing_role
from mmrl.config import ConfigError, check_range
from mmrl.policies.base import Decision, Evaluation, PolicyConfig
from mmrl.policies.flow_vla import FlowVLAConfig
from mmrl.policies.gaussian import LOG_STD_MAX, LOG_STD_MIN, GaussianPolicy, mlp
from mmrl.policies.off_policy import LatentNoiseBase, OffPolicyActor
from mmrl.utils.rows import randn_rows


@dataclass
class FrozenBaseConfig(PolicyConfig):
    """The fields every actor over a frozen base has (`DSRLConfig`, `ResidualConfig`)."""

    # the frozen base policy's section (a type with Capabilities.latent_noise: flow_vla, lerobot); with
    # base_checkpoint, the checkpoint's own recorded section replaces it
    base: PolicyConfig = field(default_factory=FlowVLAConfig)
    # an mmrl run folder or checkpoint folder holding the trained base (then no warm start); null:
    # the base is built from policy.base and warm-started in this run (warm_start), then frozen
    base_checkpoint: str | None = None
    # "learned": the SAC actor acts; "prior": no actor (the subclass's prior actions, no RL)
    actor: Literal["learned", "prior"] = "learned"
    hidden: int = 256  # width of the actor MLP (ReLU)
    layers: int = 2  # its hidden layers

    def validate(self) -> None:
        check_range(self, {"hidden": ">=1", "layers": ">=1"})
        from mmrl.registry import POLICIES

        base = POLICIES.get(self.base.type) if self.base.type in POLICIES else None
        if base is None or not base.capabilities(self.base).latent_noise or missing_role(base, ["latent_noise"]):
            steerable = [n for n in ("flow_vla", "lerobot") if n in POLICIES]
            raise ConfigError(
                f"'base.type' = {self.base.type!r} has no deterministic noise -> action map "
                f"(Capabilities.latent_noise, the LatentNoiseBase role) for '{self.type}' to act through: use a "
                f"flow policy ({', '.join(steerable)})"
            )


C = TypeVar("C", bound=FrozenBaseConfig)


class FrozenBasePolicy(OffPolicyActor[C], Generic[C]):
    """A SAC actor over the features of a frozen flow policy; see the module docstring. Subclasses
    set `actor_shape` and implement `decode` and `prior_actions`."""

    base_frozen: torch.Tensor  # buffer: bool [], whether the base is frozen (kept in the weights)

    #: whether a recorded action chunk maps back to ``a`` (`OffPolicyActor.replay_actions`; RLPD's demonstrations)
    maps_demonstrations = True
    demonstrations_fix = ""

    @classmethod
    def capabilities(cls, cfg: C) -> Capabilities:
        """Action chunks, reparameterised squashed actions (SAC) with ``actor: learned``; no
        replayable log-prob, no critic of its own (SAC's critics belong to the off-policy mode)."""
        name = cfg.type
        return Capabilities(
            critic=False,
            likelihood=False,
            reparameterized=cfg.actor == "learned",
            demonstrations=cls.maps_demonstrations,
            fixes={
                **({} if cls.maps_demonstrations else {"demonstrations": cls.demonstrations_fix}),
                "likelihood": f"'{name}' trains its actor with SAC: set algorithm.objective=sac",
                "reparameterized": "set policy.actor=learned (policy.actor=prior has no actor to train)",
                "critic": f"'{name}''s critics belong to the off-policy mode: set algorithm.objective=sac",
                "likelihood_free": f"'{name}' trains with SAC: set algorithm.objective=sac",
                "kl_reference": f"'{name}' keeps no reference model: set algorithm.kl_coef=0",
            },
        )

    @classmethod
    def configure(cls, cfg: C, sim) -> C:
        """The base's section completed from the simulator (a section read from ``base_checkpoint``
        is complete already)."""
        from mmrl.registry import POLICIES

        if cfg.base_checkpoint is not None:
            return cfg
        return dataclasses.replace(cfg, base=POLICIES.get(cfg.base.type).configure(cfg.base, sim))

    def __init__(self, cfg: C, action_dim: int, state_dim: int | None = None):
        super().__init__()
        from mmrl.registry import POLICIES

        self.cfg, self.action_dim, self.state_dim = cfg, action_dim, state_dim
        self.base: LatentNoiseBase = POLICIES.get(cfg.base.type)(cfg.base, action_dim=action_dim, state_dim=state_dim)
        self.text_bytes = self.base.text_bytes
        self.register_buffer("base_frozen", torch.tensor(False))
        self.actor_width = int(torch.tensor(self.actor_shape).prod())
        self.actor = (
            mlp(self.base.feature_dim, cfg.hidden, cfg.layers, 2 * self.actor_width, nn.ReLU)
            if cfg.actor == "learned"
            else None
        )
        self.register_load_state_dict_post_hook(lambda module, incompatible: module.apply_freeze())

    # ---- what a subclass defines --------------------------------------------------------------
    @property
    def actor_shape(self) -> tuple[int, ...]:
        """The shape of one decision's ``a`` (the replayed action)."""
        raise NotImplementedError

    def decode(self, obs, actions: torch.Tensor) -> torch.Tensor:
        """The environment's chunk ``[B, C, A]`` for actions ``a`` ``[B, *actor_shape]`` in [-1, 1]."""
        raise NotImplementedError

    def prior_actions(self, obs, features: torch.Tensor, generator: torch.Generator | None):
        """``actor: prior``: ``(a [B, *actor_shape], its log-prob [B], the environment's chunk)``."""
        raise NotImplementedError

    def before_rollout(self, obs) -> None:
        """A hook at each rollout, before the actions are chosen (DSRL's steering diagnostic)."""

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
                f"policy.base_checkpoint loads a trained base, which '{self.cfg.type}' keeps frozen: set "
                "warm_start.dataset=null (or leave base_checkpoint unset to warm-start the base in this run)"
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

    # ---- the actor ----------------------------------------------------------------------------
    @property
    def replay_dim(self) -> int:
        return self.base.feature_dim

    def replay_action_width(self, action_dim: int) -> int:
        """The replayed action is ``a``: ``prod(actor_shape)`` wide."""
        return self.actor_width

    def replay_state(self, obs) -> torch.Tensor:
        """The frozen base's features ``[B, feature_dim]`` (no graph)."""
        with torch.no_grad():
            return self.base.observation_features(obs).detach()

    def _dist(self, features: torch.Tensor) -> torch.distributions.Normal:
        """The Gaussian of ``u`` ``[B, *actor_shape]`` for replayed features ``[B, D]``."""
        assert self.actor is not None, "actor: prior has no actor (the config check refuses SAC with it)"
        out = self.actor(features.to(self.base_frozen.device).float())
        mean, log_std = out.view(-1, *self.actor_shape[:-1], 2 * self.actor_shape[-1]).chunk(2, dim=-1)
        return torch.distributions.Normal(mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp())

    def sample_reparameterized(
        self, state: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(a = tanh(u) [B, *actor_shape], its log-prob [B])`` for replayed features ``state``
        [B, D], differentiable w.r.t. the actor (the base is not involved)."""
        dist = self._dist(state)
        u = dist.mean + dist.stddev * randn_rows(dist.mean.shape, generator=generator, device=dist.mean.device)
        return torch.tanh(u), GaussianPolicy._squashed_logp(dist, u)

    def env_actions(self, obs, actions: torch.Tensor) -> torch.Tensor:
        """The environment's chunk for actions ``a`` (`decode`)."""
        return self.decode(obs, actions)

    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        """Batch: ``state`` [B, D] (the base's features), ``actions`` [B, *actor_shape] (``a`` in
        [-1, 1]), ``old_logp`` [B]; the environment gets `decode` of ``a`` (``actor: prior``: the
        subclass's `prior_actions`)."""
        self.before_rollout(obs)
        features = self.replay_state(obs)
        if self.actor is None:
            a, logp, chunk = self.prior_actions(obs, features, generator)
        else:
            dist = self._dist(features)
            u = dist.mean
            if mode == "train":
                u = u + dist.stddev * randn_rows(u.shape, generator=generator, device=u.device)
            a, logp = torch.tanh(u), GaussianPolicy._squashed_logp(dist, u)
            chunk = self.decode(obs, a)
        return Decision(Batch(state=features, actions=a, old_logp=logp), chunk)

    def evaluate(self, batch: Batch) -> Evaluation:
        raise NotImplementedError(
            f"'{self.cfg.type}' has no replayable log-probs: it trains with algorithm.objective=sac"
        )
