"""Advantages and losses for a collected rollout, composed from the pure functions in
`mmrl.algorithms`. Read top to bottom: episode rewards -> advantages -> per-sample loss.

The objectives the config can name (``algorithm.objective``) are registered in
`mmrl.registry.OBJECTIVES` beside their definitions, with the registry's one signature
``objective(policy, minibatch, algo) -> (loss, metrics)`` and what they need from the policy
(`mmrl.capabilities.Component`): a plugin adds one the same way (or by the ``mmrl.objectives``
entry point). An objective that needs ``replay`` (``sac``) runs in the trainer's off-policy mode
(`mmrl.trainer.off_policy`) on replayed transitions, its first argument the mode's `SACAgent`.

The config section that picks them, `AlgorithmConfig` (``algorithm``: the estimator, the objective
and their options; the off-policy mode's under ``algorithm.sac``), is defined here beside them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from mmrl.algorithms import aggregate_loss, kl_penalty, ppo_clip_loss, psr_nsr_weights, value_loss
from mmrl.algorithms.losses import gspo_token_ratio
from mmrl.algorithms.sac import actor_loss, critic_loss, soft_q_target, temperature_loss
from mmrl.batch import Batch
from mmrl.capabilities import component
from mmrl.config import ConfigError, check_range
from mmrl.registry import ADVANTAGES, OBJECTIVES
from mmrl.trainer.off_policy import SACConfig


@dataclass
class AlgorithmConfig:
    objective: str = "ppo"  # a registered objective (`mmrl list`): ppo (clipped ratio), awm, nft (likelihood-free)
    advantage: str = "gae"  # a registered estimator: gae (critic) or a group estimator: grpo, dr_grpo, rloo, ...
    group_size: int = 1  # episodes sharing an initial state (GRPO family)
    gamma: float = 0.99  # discount factor
    lam: float = 0.95  # GAE's lambda
    normalize_advantages: bool = True  # whiten advantages (mean 0, std 1) before the update
    # over which samples advantages are whitened (and then PSR-weighted and clipped): the whole
    # rollout once (default), or each minibatch as it is drawn (SB3's and CleanRL's PPO)
    advantage_norm_scope: Literal["rollout", "minibatch"] = "rollout"
    adv_clip: float | None = None  # clamp advantages to [-adv_clip, adv_clip] (Flow-GRPO: 5)
    # PSR/NSR: scale positive / negative advantages after normalisation (W-REINFORCE: 0.1 / 1.0)
    pos_weight: float = 1.0
    neg_weight: float = 1.0  # see pos_weight
    ratio: Literal["token", "sequence"] = "token"  # sequence: GSPO's length-normalised sequence ratio
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, collect more
    max_sampling_rounds: int = 4  # dynamic sampling: rollout rounds per iteration at most
    clip_low: float = 0.2  # PPO's clip range below 1 (and above, unless clip_high)
    clip_high: float | None = None  # None = clip_low (symmetric); larger = DAPO clip-higher
    dual_clip: float | None = None  # c > 1 bounds the loss of negative-advantage samples
    # how per-token losses become one: token-mean, or per sequence first (Dr.GRPO: seq-mean-token-sum-norm)
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    vf_coef: float = 0.5  # weight of the value loss
    # clip the value prediction's change to this range around the old value (null: no clip)
    value_clip: float | None = None
    ent_coef: float = 0.0  # weight of the entropy bonus
    kl_coef: float = 0.0  # weight of the KL penalty to the reference policy (0: no reference needed)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"  # k1, k2 or k3 (Schulman's estimators of the KL)
    epochs: int = 2  # passes over the collected batch per update
    minibatch_size: int = 256  # samples per gradient step
    max_grad_norm: float = 1.0  # clip the gradient's global norm to this
    # scale rewards by the running std of the discounted return (SB3 VecNormalize / CleanRL
    # NormalizeReward); the critic then learns returns in those units. State saved in checkpoints.
    reward_norm: bool = False
    # what shares one running std: every reward ("all"), or the rewards of one task ("task": a std per
    # task the simulator names in Observation.meta, for multi-task suites whose rewards differ in
    # scale, such as Meta-World's MT10; PopArt's motivation, Hessel et al. 2019)
    reward_norm_by: Literal["all", "task"] = "all"
    # stop an iteration's update early once the mean approx KL of an epoch exceeds this (None = never)
    target_kl: float | None = None
    # the off-policy mode's options (objective: sac): replay buffer, update-to-data ratio, SAC, RLPD
    sac: SACConfig = field(default_factory=SACConfig)

    def validate(self) -> None:
        check_range(
            self,
            {
                "group_size": ">=1",
                "gamma": "0..1",
                "lam": "0..1",
                "clip_low": ">0",
                "clip_high": ">0",
                "dual_clip": ">1",
                "epochs": ">=1",
                "minibatch_size": ">=1",
                "max_grad_norm": ">0",
                "vf_coef": ">=0",
                "ent_coef": ">=0",
                "kl_coef": ">=0",
                "adv_clip": ">0",
                "value_clip": ">0",
            },
        )
        if self.target_kl is not None and not self.target_kl > 0:
            raise ConfigError(f"'target_kl' must be > 0 or null, got {self.target_kl}")
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"'advantage' = {self.advantage!r} is not one of: {', '.join(ADVANTAGES.names())}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"'objective' = {self.objective!r} is not one of: {', '.join(OBJECTIVES.names())}")
        if self.reward_norm_by == "task" and not self.reward_norm:
            raise ConfigError("'reward_norm_by' = 'task' scales rewards per task: set reward_norm: true as well")
        if self.max_sampling_rounds < 1:
            raise ConfigError(f"'max_sampling_rounds' must be >= 1, got {self.max_sampling_rounds}")
        if self.dynamic_sampling and not self.grouped:
            raise ConfigError("'dynamic_sampling' filters groups: use a group estimator (grpo, dr_grpo, rloo, ...)")
        if self.pos_weight < 0 or self.neg_weight < 0:
            raise ConfigError(f"'pos_weight' / 'neg_weight' must be >= 0, got {self.pos_weight} / {self.neg_weight}")
        if self.grouped and self.group_size < 2:
            raise ConfigError(f"'advantage' = {self.advantage!r} compares episodes within a group: set group_size >= 2")

    @property
    def off_policy(self) -> bool:
        """Whether the objective learns from replayed transitions (SAC): the trainer's off-policy
        mode (`mmrl.trainer.off_policy`); its objective declares that it needs ``replay``."""
        return "replay" in OBJECTIVES.get(self.objective).needs

    @property
    def grouped(self) -> bool:
        """Whether the advantage estimator compares episodes within groups (GRPO family): it
        declares that it needs ``groups`` (`mmrl.capabilities`)."""
        return "groups" in ADVANTAGES.get(self.advantage).needs


def compute_advantages(batch: Batch, algo, last_values: torch.Tensor | None = None) -> Batch:
    """Adds ``advantages`` [T, N] and ``returns`` [T, N] to a time-major batch, by the registered
    estimator ``algo.advantage`` (`mmrl.algorithms.advantages`; what it needs, e.g. a critic or
    groups, was checked when the config loaded)."""
    adv, ret = ADVANTAGES.get(algo.advantage)(batch, algo, last_values)
    batch["advantages"], batch["returns"] = adv.float(), ret.float()
    return batch


def valid_samples(batch: Batch) -> Batch:
    """[T, N, ...] -> the valid decisions as rows [M, ...]."""
    flat = batch.flatten()
    return flat.index(flat["valid"])


def normalize_advantages(samples: Batch) -> Batch:
    """Rows with their ``advantages`` whitened (mean 0, std 1); one row is left as it is."""
    if samples.size > 1:
        a = samples["advantages"]
        samples["advantages"] = (a - a.mean()) / (a.std() + 1e-8)
    return samples


def prepare_advantages(samples: Batch, algo, normalize: bool) -> Batch:
    """Whitening (when ``normalize``), PSR/NSR weights and the clip, in that order, over the rows
    given: the whole rollout or one minibatch (``algorithm.advantage_norm_scope``)."""
    if normalize:
        samples = normalize_advantages(samples)
    return clip_advantages(weight_advantages(samples, algo.pos_weight, algo.neg_weight), algo.adv_clip)


def weight_advantages(samples: Batch, pos_weight: float, neg_weight: float) -> Batch:
    """PSR/NSR: scale positive advantages by ``pos_weight`` and negative ones by ``neg_weight``
    (W-REINFORCE: 0.1 / 1; both 1 leaves them)."""
    if pos_weight != 1.0 or neg_weight != 1.0:
        samples["advantages"] = psr_nsr_weights(samples["advantages"], pos_weight, neg_weight)
    return samples


def clip_advantages(samples: Batch, limit: float | None) -> Batch:
    """Clamp advantages to ``[-limit, limit]`` (Flow-GRPO clips at 5); None leaves them."""
    if limit is not None:
        samples["advantages"] = samples["advantages"].clamp(-limit, limit)
    return samples


@component(OBJECTIVES, "ppo", needs=("likelihood",))
def ppo_loss(policy, mb: Batch, algo) -> tuple[torch.Tensor, dict]:
    """PPO-clip (clip-higher, dual clip) + value loss + optional entropy bonus, on a minibatch."""
    out = policy.evaluate(mb)
    logp, old = out.logp, mb["old_logp"]
    mask = out.logp_mask  # e.g. the real tokens of a completion, the stochastic denoising steps
    flat_mask = (
        torch.ones(logp.shape[0], logp[0].numel(), dtype=torch.bool, device=logp.device)
        if mask is None
        else mask.reshape(logp.shape[0], -1).bool()
    )
    surrogate = logp
    if algo.ratio == "sequence":  # GSPO-token: every token carries its sequence's ratio, gradient per token
        ratio = gspo_token_ratio(logp.reshape(flat_mask.shape), old.reshape(flat_mask.shape), flat_mask)
        surrogate = old + ratio.log().reshape(logp.shape)
    adv = mb["advantages"].reshape(-1, *([1] * (logp.dim() - 1)))
    pg, stats = ppo_clip_loss(surrogate, old, adv, algo.clip_low, algo.clip_high, algo.dual_clip)
    if "is_weight" in mb:  # truncated importance sampling: trainer vs rollout-engine probabilities
        pg = pg * mb["is_weight"].to(pg.device)
    loss = aggregate_loss(pg.reshape(flat_mask.shape), flat_mask, algo.loss_agg)

    def masked(x: torch.Tensor) -> torch.Tensor:  # the elements that count (real tokens, noisy steps)
        return x.reshape(flat_mask.shape)[flat_mask]

    metrics = {
        "policy_loss": loss.detach(),
        "clip_frac": masked(stats["clipped"]).float().mean(),
        "approx_kl": masked(stats["approx_kl"]).mean(),
        "ratio_max": masked(stats["ratio"]).max(),
        "entropy": out.entropy.detach(),
    }
    if algo.ent_coef:
        loss = loss - algo.ent_coef * out.entropy
    if out.values is not None and algo.vf_coef:
        vl = value_loss(out.values, mb["old_values"], mb["returns"], algo.value_clip).mean()
        loss = loss + algo.vf_coef * vl
        metrics["value_loss"] = vl.detach()
    if algo.kl_coef:  # the policy's own KL (e.g. Flow-GRPO's mean drift), else an estimator on log-probs
        if out.kl is not None:
            kl = out.kl.mean()
        else:
            kl = masked(kl_penalty(logp, mb["ref_logp"].to(logp.device), algo.kl_estimator)).mean()
        loss = loss + algo.kl_coef * kl
        metrics["kl"] = kl.detach()
    return loss, metrics


@component(OBJECTIVES, "awm", needs=("likelihood_free",))
def awm_objective(policy, mb: Batch, algo) -> tuple[torch.Tensor, dict]:
    """Advantage-weighted matching: flow-matching loss on rollout actions weighted by advantage."""
    per_sample = policy.likelihood_free_loss(mb, mb["advantages"])
    loss = per_sample.mean()
    return loss, {"awm_loss": loss.detach()}


@component(OBJECTIVES, "nft", needs=("forward_process",))
def nft_objective(policy, mb: Batch, algo) -> tuple[torch.Tensor, dict]:
    """DiffusionNFT: the forward-process loss on the rollout's clean samples, weighted by their
    optimality (their advantages mapped to [0, 1]); no log-likelihood, any sampler."""
    loss = policy.forward_process_loss(mb, mb["advantages"]).mean()
    return loss, {"nft_loss": loss.detach()}


@component(OBJECTIVES, "sac", needs=("reparameterized", "replay"))
def sac_objective(agent, mb: Batch, algo) -> tuple[torch.Tensor, dict]:
    """SAC on a replayed batch (the off-policy mode, `mmrl.trainer.off_policy`): critic + actor +
    temperature losses. ``agent`` is the mode's `SACAgent` (the policy, its `SoftCritics`, the entropy
    target, the noise generator); ``mb`` holds the transitions' ``state`` [B, D], ``actions`` [B, W],
    ``rewards`` [B] (n-step returns), ``discount`` [B] (0 where the episode terminated) and
    ``next_state`` [B, D]. Each loss's gradient reaches only its own parameters (the critics; the
    policy, through reparameterised actions scored by the critics held fixed; log(alpha)), so one
    backward and one step of an optimizer with a group per part are SAC's three updates."""
    policy, critics = agent.policy, agent.critics
    alpha = critics.log_alpha.exp().detach()
    state, next_state = mb["state"], mb["next_state"]
    # critics: the clipped double-Q soft target from the target critics, at an action of the policy
    with torch.no_grad():
        next_action, next_logp = policy.sample_reparameterized(next_state, agent.generator)
        next_q1, next_q2 = critics.target(next_state, next_action.flatten(1))
        done = torch.zeros_like(mb["discount"])  # termination is in the discount (0 where it ended)
        backup_alpha = alpha if algo.sac.backup_entropy else torch.zeros_like(alpha)
        target = soft_q_target(mb["rewards"], done, next_q1, next_q2, next_logp, backup_alpha, mb["discount"])
    q1, q2 = critics(state, mb["actions"])
    q_loss = critic_loss(q1, q2, target).mean()
    # actor: reparameterised actions of the replayed states, scored by the critics held fixed
    action, logp = policy.sample_reparameterized(state, agent.generator)
    pi_q1, pi_q2 = critics.frozen(state, action.flatten(1))
    pi_loss = actor_loss(pi_q1, pi_q2, logp, alpha).mean()
    # temperature: toward the target entropy
    alpha_loss = temperature_loss(critics.log_alpha, logp, agent.target_entropy).mean()
    metrics = {
        "critic_loss": q_loss.detach(),
        "actor_loss": pi_loss.detach(),
        "temperature_loss": alpha_loss.detach(),
        "alpha": alpha,
        "entropy": -logp.detach().mean(),
        "q": q1.detach().mean(),
        "demo_rows": mb["is_demo"].float().mean() if "is_demo" in mb else torch.zeros(()),
    }
    return q_loss + pi_loss + alpha_loss, metrics
