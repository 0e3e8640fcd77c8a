"""Advantage estimators: pure torch functions, and their registered forms (`ADVANTAGES`).

Two families of pure functions:

- per-step critic-based: `gae` on time-major ``[T, N]`` rollouts (simulators, PPO);
- outcome / group-based: one scalar reward per sample ``[M]`` plus a ``group`` id ``[M]`` (long)
  naming the samples that share a prompt / initial state (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline,
  NGRPO). Group ids may be any integers (they need not be contiguous or sorted).

Conventions, stated once:

- "std" is the unbiased (Bessel-corrected) standard deviation, ``torch.std``'s default, as in
  verl's GRPO. A group of a single sample has no baseline: its advantage is 0 in every group-based
  estimator here (verl instead passes the raw reward through).
- Group normalisers divide by ``std + eps``; whitening (REINFORCE++) divides by ``sqrt(var + eps)``
  (verl's ``masked_whiten``).

Each estimator the config can name (``algorithm.advantage``) is registered beside its definition,
at the end of this file, with the registry's one signature and what it needs
(`mmrl.capabilities.Component`)::

    estimate(batch, algo, last_values) -> (advantages [T, N], returns [T, N])

``batch`` is the time-major rollout (`mmrl.batch.KEYS`: rewards, valid, dones, group, old_values,
bootstrap), ``algo`` the ``algorithm`` config section, ``last_values`` [N] the critic's value after
a fixed-length rollout (None otherwise). A plugin registers its own the same way
(``ADVANTAGES.register(name, Component(fn, needs))``, or the ``mmrl.advantages`` entry point).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from mmrl.capabilities import component
from mmrl.registry import ADVANTAGES

Tensor = torch.Tensor

__all__ = [
    "gae",
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "ngrpo_advantages",
    "psr_nsr_weights",
]


# --------------------------------------------------------------------------------------------------
# GAE (per-step, critic-based)
# --------------------------------------------------------------------------------------------------


def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    last_values: Tensor,
    gamma: float,
    lam: float,
    valid: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over a time-major rollout.

    Shapes: rewards, values, dones, valid ``[T, N]``; last_values ``[N]`` (value of the state after
    step T-1, used to bootstrap). Returns ``(advantages [T, N], returns [T, N])``.

    ``dones[t]`` means the episode ended at step t: nothing is bootstrapped past it::

        nonterminal_t = (1 - dones_t) * valid_{t+1}          (valid_T := 1)
        delta_t = r_t + gamma * nonterminal_t * V_{t+1} - V_t   (V_T := last_values)
        A_t     = delta_t + gamma * lam * nonterminal_t * A_{t+1}
        returns = A + V

    ``valid`` (bool, optional) marks steps that happened; invalid steps (after the episode ended in
    a fixed-horizon rollout) get ``A = 0`` (so ``returns = V`` there; mask them out of the value
    loss) and nothing propagates through them; a step followed by an invalid one is terminal.
    """
    T = rewards.shape[0]
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    rewards, values = rewards.to(dtype), values.to(dtype)
    last_values = last_values.to(dtype)
    notdone = 1.0 - dones.to(dtype)
    validf = torch.ones_like(rewards) if valid is None else valid.to(dtype)
    advantages = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(last_values)
    next_value = last_values
    next_valid = torch.ones_like(last_values)
    for t in reversed(range(T)):
        nonterminal = notdone[t] * next_valid
        delta = rewards[t] + gamma * nonterminal * next_value - values[t]
        adv_t = (delta + gamma * lam * nonterminal * next_adv) * validf[t]
        advantages[t] = adv_t
        next_adv, next_value, next_valid = adv_t, values[t], validf[t]
    return advantages, advantages + values


# --------------------------------------------------------------------------------------------------
# group statistics
# --------------------------------------------------------------------------------------------------


def _group_index(group: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group ids ``[M]`` to dense indices 0..G-1; returns (index [M], G)."""
    uniq, inverse = torch.unique(group, return_inverse=True)
    return inverse, uniq.numel()


def _group_sum(x: Tensor, index: Tensor, num: int) -> Tensor:
    """Per-group sum of ``x [M]`` -> ``[G]``."""
    return torch.zeros(num, dtype=x.dtype, device=x.device).index_add_(0, index, x)


def _per_group(rewards: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(each sample's group index ``[M]``, and per group ``[G]``: mean, unbiased std, size).

    The std of a single-sample group is reported as 0 (instead of NaN).
    """
    index, num = _group_index(group)
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    count = _group_sum(torch.ones_like(r), index, num)
    mean = _group_sum(r, index, num) / count
    sq = _group_sum((r - mean[index]) ** 2, index, num)
    var = sq / (count - 1).clamp(min=1)
    return index, mean, var.sqrt(), count


def _group_stats(rewards: Tensor, group: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group mean, unbiased group std, group size), all ``[M]`` (`_per_group`)."""
    index, mean, std, count = _per_group(rewards, group)
    return mean[index], std[index], count[index]


def group_reward_stats(returns: Tensor, group: Tensor) -> dict[str, float]:
    """TRL's GRPO reward statistics of a batch of episodes in groups (returns ``[M]``, group ids
    ``[M]``): ``reward_std``, the mean over the groups of their unbiased std, and
    ``frac_reward_zero_std``, the fraction of groups whose returns are all equal (no GRPO signal)."""
    _, _, std, _ = _per_group(returns, group)
    zero = torch.isclose(std, torch.zeros_like(std))
    return {"reward_std": float(std.mean()), "frac_reward_zero_std": float(zero.float().mean())}


# --------------------------------------------------------------------------------------------------
# group-based (outcome) estimators
# --------------------------------------------------------------------------------------------------


def grpo_advantages(rewards: Tensor, group: Tensor, scale: str = "std", eps: float = 1e-6) -> Tensor:
    """GRPO group-relative advantage. rewards ``[M]``, group ``[M]`` long -> ``[M]``.

    ``A_i = (r_i - mean_g) / (s + eps)`` with

    - ``scale="std"``: s = unbiased std of the group (GRPO, verl);
    - ``scale="none"``: no division, ``A_i = r_i - mean_g`` (Dr.GRPO);
    - ``scale="batch_std"``: s = unbiased std of all M rewards of the batch (Flow-GRPO global std).

    Single-sample groups get 0.
    """
    mean, std, count = _group_stats(rewards, group)
    centred = rewards.to(mean.dtype) - mean
    if scale == "std":
        adv = centred / (std + eps)
    elif scale == "none":
        adv = centred
    elif scale == "batch_std":
        r = rewards.to(mean.dtype)
        batch_std = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype, device=r.device)
        adv = centred / (batch_std + eps)
    else:
        raise ValueError(f"unknown GRPO scale '{scale}'; valid: 'std', 'none', 'batch_std'")
    return torch.where(count > 1, adv, torch.zeros_like(adv))


def dr_grpo_advantages(rewards: Tensor, group: Tensor) -> Tensor:
    """Dr.GRPO advantage ``A_i = r_i - mean_g`` (no std division). ``[M] -> [M]``."""
    return grpo_advantages(rewards, group, scale="none")


def rloo_advantages(rewards: Tensor, group: Tensor) -> Tensor:
    """RLOO leave-one-out advantage ``A_i = r_i - mean_{j != i, j in g} r_j``. ``[M] -> [M]``.

    Equivalently ``n / (n - 1) * (r_i - mean_g)``; single-sample groups get 0.
    """
    mean, _, count = _group_stats(rewards, group)
    r = rewards.to(mean.dtype)
    loo_mean = (mean * count - r) / (count - 1).clamp(min=1)
    return torch.where(count > 1, r - loo_mean, torch.zeros_like(r))


def ngrpo_advantages(rewards: Tensor, group: Tensor, r_max: float = 1.0, eps: float = 1e-6) -> Tensor:
    """NGRPO advantage calibration (Nan et al. 2025, arXiv:2509.18851). ``[M] -> [M]``.

    A virtual sample with the maximum reward ``r_max`` joins every group when computing its
    statistics (it gets no advantage itself). With n real samples::

        mean'_g = (sum_{j in g} r_j + r_max) / (n + 1)
        std'_g  = sqrt((sum_{j in g} (r_j - mean'_g)^2 + (r_max - mean'_g)^2) / n)   (unbiased)
        A_i     = (r_i - mean'_g) / (std'_g + eps)

    so an all-failure group gets negative, non-zero advantages (paper's example, G=8, one correct:
    +1.76 / -0.50). An all-``r_max`` group gets 0.
    """
    index, num = _group_index(group)
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    n = _group_sum(torch.ones_like(r), index, num)
    mean = (_group_sum(r, index, num) + r_max) / (n + 1)
    sq = _group_sum((r - mean[index]) ** 2, index, num) + (r_max - mean) ** 2
    std = (sq / n).sqrt()
    return (r - mean[index]) / (std[index] + eps)


def reinforce_pp_baseline_advantages(rewards: Tensor, group: Tensor, eps: float = 1e-8) -> Tensor:
    """REINFORCE++-baseline: group-mean baseline, then batch normalisation. ``[M] -> [M]``.

    ``a_i = r_i - mean_g``;  ``A_i = a_i / sqrt(var(a) + eps)`` with the unbiased variance over the
    whole batch (the batch mean of ``a`` is already 0, so this equals whitening). Per-sample
    weighting; verl whitens over response tokens, which weighs long responses more.
    """
    mean, _, count = _group_stats(rewards, group)
    a = torch.where(count > 1, rewards.to(mean.dtype) - mean, torch.zeros_like(mean))
    var = a.var() if a.numel() > 1 else torch.zeros((), dtype=a.dtype, device=a.device)
    return a / torch.sqrt(var + eps)


# --------------------------------------------------------------------------------------------------
# token-level REINFORCE++ and PSR/NSR weighting
# --------------------------------------------------------------------------------------------------


def reinforce_pp_advantages(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0, eps: float = 1e-8) -> Tensor:
    """REINFORCE++ advantage: discounted return-to-go, whitened over the batch's valid tokens.

    Shapes: token_rewards ``[B, T]`` (usually the outcome reward on the last token, minus any
    per-token KL penalty), mask ``[B, T]`` (1 = valid response token) -> ``[B, T]``::

        G_t = r_t + gamma * G_{t+1}   over valid tokens (G after the last valid token := 0)
        A   = (G - mean(G)) / sqrt(var(G) + eps) * mask

    Masked tokens inside a response (e.g. tool output in a multi-turn rollout) are skipped: the
    return passes through them unchanged (no reward, no discount); for right padding this is
    verl's REINFORCE++. mean/var over valid tokens only, var unbiased (verl ``masked_whiten``).
    """
    m = mask.to(torch.promote_types(token_rewards.dtype, torch.float32))
    r = token_rewards.to(m.dtype) * m
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in reversed(range(r.shape[1])):
        running = torch.where(m[:, t] > 0, r[:, t] + gamma * running, running)
        returns[:, t] = running
    n = m.sum()
    mean = (returns * m).sum() / n.clamp(min=1)
    var = (((returns - mean) * m) ** 2).sum() / (n - 1).clamp(min=1)
    return (returns - mean) / torch.sqrt(var + eps) * m


def psr_nsr_weights(advantages: Tensor, pos_weight: float = 1.0, neg_weight: float = 1.0) -> Tensor:
    """PSR/NSR weighting (Zhu et al. 2025, "The Surprising Effectiveness of Negative
    Reinforcement"). Any shape -> same shape::

        A'_i = pos_weight * A_i  if A_i > 0;  neg_weight * A_i  if A_i < 0;  0 if A_i = 0

    W-REINFORCE is ``pos_weight=0.1, neg_weight=1``; pure NSR is ``pos_weight=0``.
    """
    return torch.where(advantages > 0, pos_weight * advantages, neg_weight * advantages)


# --------------------------------------------------------------------------------------------------
# the registered estimators: estimate(batch, algo, last_values) -> (advantages [T, N], returns [T, N])
# --------------------------------------------------------------------------------------------------


@component(ADVANTAGES, "gae", needs=("critic",))
def gae_estimate(batch, algo, last_values: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lambda) over time-major [T, N] rollouts with a critic

    Uses the critic's ``old_values``. Where the time limit cut an episode (``bootstrap`` [T, N]: the
    value of its last observation, see `mmrl.rollout.truncation_values`) the reward gets
    ``gamma * bootstrap`` added and the step stays terminal for GAE (SB3's scheme); ``last_values``
    [N] bootstraps envs still running at the end of a fixed-length rollout.
    """
    valid = batch["valid"]
    rewards = batch["rewards"] * valid
    if "bootstrap" in batch:
        rewards = rewards + algo.gamma * batch["bootstrap"].to(rewards) * valid
    values = batch["old_values"] * valid
    last = torch.zeros_like(values[0]) if last_values is None else last_values.to(values)
    return gae(rewards, values, batch["dones"], last, algo.gamma, algo.lam, valid=valid)


@component(ADVANTAGES, "reinforce_pp")
def reinforce_pp_estimate(batch, algo, last_values: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted return-to-go of each decision, whitened over the batch (no critic, no groups)"""
    valid = batch["valid"]
    rewards = batch["rewards"] * valid
    return reinforce_pp_advantages(rewards.T, valid.T, algo.gamma).T, rewards.sum(0)[None].expand_as(rewards)


def outcome_estimate(outcome: Callable[[Tensor, Tensor], Tensor]) -> Callable:
    """The registered form of a group (outcome) estimator ``outcome(returns [N], group [N]) -> [N]``:
    each episode's return is scored within its group, and that advantage is given to every valid
    decision of the episode; the return is the episode's."""

    def estimate(batch, algo, last_values: Tensor | None = None) -> tuple[Tensor, Tensor]:
        valid = batch["valid"]
        rewards = batch["rewards"] * valid
        episode_return = rewards.sum(0)  # [N]
        adv = outcome(episode_return, batch["group"][0])[None].expand_as(rewards) * valid
        return adv, episode_return[None].expand_as(rewards)

    return estimate


for _name, _fn, _doc in (
    ("grpo", grpo_advantages, "GRPO: (r - group mean) / group std (unbiased)"),
    (
        "grpo_global_std",
        functools.partial(grpo_advantages, scale="batch_std"),
        "Flow-GRPO: (r - group mean) / std of the whole batch",
    ),
    ("dr_grpo", dr_grpo_advantages, "Dr.GRPO: r - group mean (no std division)"),
    ("rloo", rloo_advantages, "RLOO: r - mean of the other samples of the group"),
    (
        "reinforce_pp_baseline",
        reinforce_pp_baseline_advantages,
        "REINFORCE++-baseline: r - group mean, divided by the batch std",
    ),
    ("ngrpo", ngrpo_advantages, "NGRPO: GRPO with a virtual max-reward sample in each group's mean and std"),
):
    component(ADVANTAGES, _name, needs=("groups",), description=_doc)(outcome_estimate(_fn))
