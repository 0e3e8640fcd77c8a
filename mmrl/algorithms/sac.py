"""Soft actor-critic (SAC, Haarnoja et al. 2018, with the automatic entropy temperature) as pure
torch functions, plus n-step returns: the math the off-policy mode of the trainer (issue 36: SAC,
RLPD, DSRL) is built on. Everything is returned per sample (unreduced); callers take the mean.

Notation: ``q1, q2`` the twin critics' values of the replayed (state, action) pairs; ``next_q1,
next_q2`` the TARGET critics' values at the next state with an action drawn from the current policy,
``next_logp`` that action's log-probability; ``alpha`` the entropy temperature. Conventions follow
Stable-Baselines3 and CleanRL: the clipped double-Q target, the critic loss ``0.5 * sum_i (Q_i -
y)^2``, the temperature trained through ``log_alpha`` toward ``target_entropy`` (``-action_dim`` by
default), and target networks moved by Polyak averaging with ``tau``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

Tensor = torch.Tensor

__all__ = [
    "soft_q_target",
    "critic_loss",
    "actor_loss",
    "temperature_loss",
    "polyak_update",
    "n_step_returns",
]


def soft_q_target(
    reward: Tensor,
    done: Tensor,
    next_q1: Tensor,
    next_q2: Tensor,
    next_logp: Tensor,
    alpha: float | Tensor,
    gamma: float | Tensor,
) -> Tensor:
    """``y = r + gamma * (1 - done) * (min(Q1', Q2') - alpha * logp')``, with no gradient.

    ``done`` is termination only (a time limit is not an end: bootstrap through it); ``gamma`` may
    be a tensor of per-sample discounts (``gamma ** m`` of an m-step return, `n_step_returns`)."""
    with torch.no_grad():
        soft_v = torch.minimum(next_q1, next_q2) - alpha * next_logp
        return reward + gamma * (1.0 - done.float()) * soft_v


def critic_loss(q1: Tensor, q2: Tensor, target: Tensor) -> Tensor:
    """``0.5 * ((Q1 - y)^2 + (Q2 - y)^2)`` per sample (``target`` detached)."""
    target = target.detach()
    return 0.5 * ((q1 - target) ** 2 + (q2 - target) ** 2)


def actor_loss(q1_pi: Tensor, q2_pi: Tensor, logp_pi: Tensor, alpha: float | Tensor) -> Tensor:
    """``alpha * logp(a|s) - min(Q1(s, a), Q2(s, a))`` per sample, ``a`` drawn from the policy with
    its reparameterised sample (gradients flow into the actor through ``a`` and ``logp``; the
    temperature is held fixed here: pass ``alpha`` detached)."""
    return alpha * logp_pi - torch.minimum(q1_pi, q2_pi)


def temperature_loss(log_alpha: Tensor, logp: Tensor, target_entropy: float) -> Tensor:
    """``-log_alpha * (logp + target_entropy)`` per sample, ``logp`` detached: gradient descent
    raises alpha while the policy's entropy ``-logp`` is below ``target_entropy`` and lowers it
    above."""
    return -log_alpha * (logp.detach() + target_entropy)


@torch.no_grad()
def polyak_update(target: Iterable[Tensor], source: Iterable[Tensor], tau: float) -> None:
    """``target <- (1 - tau) * target + tau * source``, in place (``tau = 1``: a copy)."""
    if not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")
    for t, s in zip(target, source, strict=True):
        t.mul_(1.0 - tau).add_(s.detach(), alpha=tau)


def n_step_returns(
    rewards: Tensor, terminated: Tensor, truncated: Tensor, gamma: float, n: int
) -> tuple[Tensor, Tensor, Tensor]:
    """n-step returns of every start step of a rollout ``[T, N]`` (time first, N envs).

    For start ``t`` the return sums ``gamma^k r_{t+k}`` for ``k < m``, where ``m <= n`` stops after
    the first step that ends its episode (terminated or truncated) or at the rollout's end. Returns
    ``(returns [T, N], discount [T, N], last [T, N])``: ``discount = gamma^m``, 0 where the episode
    TERMINATED within the m steps (nothing to bootstrap), so the target is ``returns + discount *
    V(s')`` with ``s'`` the next observation of step ``last = t + m - 1`` (for a truncated episode
    its final observation: a time limit is bootstrapped through)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    T, N = rewards.shape
    ended = terminated | truncated
    returns = torch.zeros_like(rewards, dtype=torch.float32)
    discount = torch.ones(T, N)
    last = torch.zeros(T, N, dtype=torch.long)
    term = torch.zeros(T, N, dtype=torch.bool)
    for t in range(T):
        open_ = torch.ones(N, dtype=torch.bool)  # still accumulating: no episode end yet
        for k in range(min(n, T - t)):
            s = t + k
            returns[t] += open_.float() * discount[t] * rewards[s].float()
            discount[t] = torch.where(open_, discount[t] * gamma, discount[t])
            last[t] = torch.where(open_, torch.full((N,), s), last[t])
            term[t] |= open_ & terminated[s].bool()
            open_ &= ~ended[s].bool()
    return returns, torch.where(term, torch.zeros_like(discount), discount), last
