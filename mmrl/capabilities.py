"""What components can do and what they need, declared as data and checked when a config loads.

- A policy declares its `Capabilities` for a configuration (``Policy.capabilities(cfg)``): the
  actions it produces, the granularity of its log-probs, whether it has a critic, a likelihood-free
  loss, a KL reference, background rollout, and the modules that sharded training wraps.
- An advantage estimator or an objective registers as a `Component`: one callable with its
  registry's one signature, plus the `NEEDS` it declares (a critic, groups, a likelihood ...).

`missing_needs` compares the two, so that ``algorithm.objective: awm`` with a policy that has no
likelihood-free loss fails when the config loads, naming the capability and the fix, instead of at
the first update after the warm start. The trainer never probes a policy for optional methods.

- Some capabilities come with hooks beyond the base policy contract, which a policy class opts into
  by subclassing a role (`ROLES`: `mmrl.policies.off_policy.OffPolicyActor` for SAC's actor,
  `LatentNoiseBase` for the flow base DSRL steers). `missing_role` finds the capability whose role a
  class lacks: the config check names it in one line, as it names a missing capability.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: what an estimator or an objective may need, and what provides it
NEEDS = {
    "critic": "a critic (the policy's value head; its rollouts carry old_values)",
    "groups": "groups of whole episodes sharing an initial state (algorithm.group_size >= 2, trainer.rollout_steps: 0)",
    "likelihood": "exact log-probs of the policy's actions (Policy.evaluate)",
    "likelihood_free": "a likelihood-free loss (Policy.likelihood_free_loss: advantage-weighted matching)",
    "forward_process": "DiffusionNFT's forward-process loss (Policy.forward_process_loss) on its own clean samples",
    "reparameterized": "reparameterised, tanh-squashed actions of a replayed state with their log-prob "
    "(OffPolicyActor.sample_reparameterized: SAC's actor)",
    "replay": "transitions replayed from a buffer (the off-policy mode of the trainer, trainer.rollout_steps > 0)",
}
#: the capabilities whose hooks are a role (a class of `mmrl.policies.off_policy` that a policy class
#: subclasses to opt in), by the role's name: a policy needs the role to offer the capability
ROLES = {
    "reparameterized": "OffPolicyActor",  # SAC's actor: replay_state, sample_reparameterized, env_actions, ...
    "latent_noise": "LatentNoiseBase",  # the flow base DSRL / residual RL steer: act_from_noise, noise_shape, ...
}
#: granularity of a policy's ``old_logp`` (its log-prob shape after the batch dim)
LOGP_LEVELS = {
    "decision": "one log-prob per decision: shape ()",
    "element": "one per action element of the chunk: (chunk, action_dim)",
    "token": "one per generated token: (max_tokens,)",
    "step": "one per denoising step: (num_steps,)",
}
#: where a policy's KL to its reference comes from
KL_SOURCES = {
    "logp": "rollouts carry ref_logp; algorithm.kl_estimator (k1 / k2 / k3) turns them into the KL",
    "own": "Policy.evaluate returns the policy's own KL (e.g. Flow-GRPO's mean drift to the reference)",
}


@dataclass(frozen=True)
class Capabilities:
    """What a policy can do as configured. ``fixes`` says, per capability it lacks (a key of
    `as_needs` or ``kl_reference`` / ``asynchronous`` / ``demonstrations``), how to get it (shown by
    the config check)."""

    action_type: str = "chunk"  # what it produces (mmrl.simulator.ACTION_TYPES): it acts in simulators of this type
    #: it acts in its simulator; False: a model only the warm start trains (a world model, played as a
    #: simulator by others): its run is the warm start alone (``trainer.iterations: 0``), with no evaluation
    acts: bool = True
    logp: str = "decision"  # `LOGP_LEVELS`
    critic: bool = False
    likelihood: bool = True  # exact log-probs of its actions (PPO / GRPO ratios)
    likelihood_free: bool = False  # a likelihood-free loss (AWM)
    forward_process: bool = False  # DiffusionNFT's loss (a flow-matching generator's own clean samples)
    reparameterized: bool = False  # reparameterised squashed actions of a state with their log-prob (SAC)
    kl_reference: str | None = None  # `KL_SOURCES`, or None: no reference to take a KL to
    #: a deterministic map from initial noise to an action chunk (``LatentNoiseBase.act_from_noise``, with
    #: ``noise_shape`` and ``observation_features``): what DSRL's latent-noise actor steers
    latent_noise: bool = False
    asynchronous: bool = True  # a deep copy can roll out in a background thread (trainer.async_staleness)
    #: chooses its initial action std on a fresh run's first rollouts (``Policy.exploration_stds``,
    #: `mmrl.trainer.exploration`), which the trainer then collects in order, not in the background
    exploration_probe: bool = False
    #: its replayed actions map back from environment action chunks (``OffPolicyActor.replay_actions``): what
    #: recorded demonstrations need to be replayed (``algorithm.sac.demo_dataset``, RLPD)
    demonstrations: bool = True
    #: class names of the blocks that sharded data-parallel training wraps one by one (FSDP2
    #: ``fully_shard`` units, DeepSpeed ZeRO-3 leaf modules); () = the whole policy as one unit
    sharding_units: tuple[str, ...] = ()
    fixes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.logp not in LOGP_LEVELS:
            raise ValueError(f"Capabilities.logp must be one of {list(LOGP_LEVELS)}, got {self.logp!r}")
        if self.kl_reference is not None and self.kl_reference not in KL_SOURCES:
            raise ValueError(
                f"Capabilities.kl_reference must be None or one of {list(KL_SOURCES)}, got {self.kl_reference!r}"
            )
        unknown = sorted(set(self.fixes) - {*NEEDS, "acts", "kl_reference", "asynchronous", "demonstrations"})
        if unknown:
            raise ValueError(f"Capabilities.fixes names unknown capabilities {unknown}")

    def as_needs(self) -> frozenset[str]:
        """The `NEEDS` this policy satisfies (``groups`` comes from the collection and ``replay`` from
        the trainer's off-policy mode, not the policy)."""
        have = {
            "critic": self.critic,
            "likelihood": self.likelihood,
            "likelihood_free": self.likelihood_free,
            "forward_process": self.forward_process,
            "reparameterized": self.reparameterized,
        }
        return frozenset(k for k, v in have.items() if v)

    def fix(self, capability: str, default: str) -> str:
        return self.fixes.get(capability, default)


@dataclass(frozen=True)
class Component:
    """A registered algorithm component: ``fn`` with its registry's signature, and what it needs."""

    fn: Callable[..., Any]
    needs: frozenset[str] = frozenset()
    description: str = ""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.needs) - set(NEEDS))
        if unknown:
            raise ValueError(f"{self.fn!r} needs unknown {unknown}; known needs: {list(NEEDS)}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def component(registry, name: str, needs: Iterable[str] = (), description: str = "") -> Callable:
    """Decorator registering ``fn`` in ``registry`` under ``name`` as a `Component` that needs
    ``needs``; returns ``fn`` unchanged (its pure form stays callable and testable)."""

    def add(fn: Callable) -> Callable:
        doc = description or ((fn.__doc__ or "").strip().splitlines() or [""])[0]
        registry.register(name, Component(fn, frozenset(needs), doc), description=doc)
        return fn

    return add


def missing_needs(needs: Iterable[str], have: Iterable[str]) -> list[str]:
    """The needs not in ``have``, in `NEEDS` order."""
    have = set(have)
    return [n for n in NEEDS if n in set(needs) and n not in have]


def roles_of(cls: type) -> frozenset[str]:
    """The roles (`ROLES`' values) a policy class opts into: the ``role`` that a class of its MRO
    names in its own body (`mmrl.policies.off_policy.OffPolicyActor` names ``"OffPolicyActor"``)."""
    return frozenset(vars(k)["role"] for k in cls.__mro__ if isinstance(vars(k).get("role"), str))


def missing_role(cls: type, capabilities: Iterable[str]) -> str | None:
    """The first of ``capabilities`` (an objective's needs, or what a policy declares) whose role
    (`ROLES`) the policy class ``cls`` does not opt into; None when it has every one."""
    have = roles_of(cls)
    wanted = set(capabilities)
    return next((c for c, role in ROLES.items() if c in wanted and role not in have), None)


__all__ = [
    "Capabilities",
    "Component",
    "component",
    "missing_needs",
    "missing_role",
    "roles_of",
    "NEEDS",
    "ROLES",
    "LOGP_LEVELS",
    "KL_SOURCES",
]
