"""Running statistics for PPO's normalisations, and the critic's explained variance, as small
pure functions plus one module that keeps its state in buffers (so it is saved with the weights).

- `RunningMeanStd`: mean / variance of a stream of batches (Chan et al.'s parallel update, the one
  Stable-Baselines3's ``VecNormalize`` and CleanRL use), for observation normalisation.
- `discounted_returns_std`: the reward scaling of SB3 / CleanRL's ``NormalizeReward``: rewards are
  divided by the running std of the discounted return ``G_t = gamma * G_{t-1} * (1 - done_{t-1}) + r_t``
  (not mean-centred, so the sign of a reward is kept).
- `explained_variance`: ``1 - Var(target - pred) / Var(target)`` over the valid samples (1 = the
  critic predicts the returns exactly, 0 = no better than a constant, < 0 = worse).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def merge_moments(
    mean: Tensor, var: Tensor, count: Tensor, batch_mean: Tensor, batch_var: Tensor, batch_count: int | Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, (population) variance and count of two samples merged (Chan et al. 1979).

    ``mean``/``var`` ``[*D]`` over ``count`` elements, ``batch_*`` over ``batch_count`` elements::

        delta = batch_mean - mean,   n = count + batch_count
        mean' = mean + delta * batch_count / n
        var'  = (var * count + batch_var * batch_count + delta^2 * count * batch_count / n) / n
    """
    batch_count = torch.as_tensor(batch_count, dtype=count.dtype, device=count.device)
    total = count + batch_count
    delta = batch_mean - mean
    new_mean = mean + delta * batch_count / total
    m2 = var * count + batch_var * batch_count + delta.pow(2) * count * batch_count / total
    return new_mean, m2 / total, total


class RunningMeanStd(nn.Module):
    """Running mean and variance of ``[B, *shape]`` batches, kept in buffers (saved in checkpoints).

    ``normalize(x) = clamp((x - mean) / sqrt(var + eps), -clip, clip)``. The count starts at
    ``eps`` (as in SB3) so the first update takes the batch's statistics almost exactly.
    """

    mean: Tensor  # buffers, float64: ``[*shape]``, ``[*shape]`` and a 0-dim count
    var: Tensor
    count: Tensor

    def __init__(self, shape: tuple[int, ...] | int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        """Merge a batch ``[B, *shape]`` (rows with a non-finite value are skipped)."""
        x = x.detach().to(self.mean.device, torch.float64).reshape(-1, *self.mean.shape)
        x = x[torch.isfinite(x).reshape(x.shape[0], -1).all(1)]
        if x.shape[0] == 0:
            return
        var = x.var(0, unbiased=False) if x.shape[0] > 1 else torch.zeros_like(self.mean)
        mean, var, count = merge_moments(self.mean, self.var, self.count, x.mean(0), var, x.shape[0])
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)

    def normalize(self, x: Tensor) -> Tensor:
        mean, std = self.mean.to(x.dtype), (self.var + self.eps).sqrt().to(x.dtype)
        return ((x - mean) / std).clamp(-self.clip, self.clip)


def discounted_returns(
    rewards: Tensor, dones: Tensor, gamma: float, start: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Running discounted returns ``G [T, N]`` of a time-major rollout and the carry ``[N]``.

    ``G_t = gamma * G_{t-1} * (1 - done_{t-1}) + r_t`` with ``G_{-1} = start`` (0 by default); the
    carry returned is ``G_{T-1} * (1 - done_{T-1})``, the start of the next rollout of the same envs.
    """
    g = torch.zeros_like(rewards[0]) if start is None else start.to(rewards)
    out = torch.empty_like(rewards)
    for t in range(rewards.shape[0]):
        g = gamma * g + rewards[t]
        out[t] = g
        g = g * (~dones[t].bool()).to(rewards)
    return out, g


def explained_variance(pred: Tensor, target: Tensor, mask: Tensor | None = None) -> float:
    """``1 - Var(target - pred) / Var(target)`` over the entries where ``mask`` is True (all if
    None); NaN when the target is constant (nothing to explain)."""
    if mask is not None:
        pred, target = pred[mask.bool()], target[mask.bool()]
    pred, target = pred.double().flatten(), target.double().flatten()
    if target.numel() < 2:
        return float("nan")
    var = target.var()
    if var <= 0:
        return float("nan")
    return float(1.0 - (target - pred).var() / var)


class RewardScaler:
    """Reward scaling by the running std of the discounted return (``NormalizeReward``).

    ``scale(rewards [T, N], dones [T, N], valid [T, N])`` updates the running variance with the
    discounted returns of the valid steps, then returns ``clamp(r / sqrt(var + eps), -clip, clip)``.
    With ``continuing=True`` (fixed-length rollouts) the discounted return carries over from one
    call to the next, as the episodes do; else every call starts from 0 (one episode per env).

    ``keys [T, N]`` (long; with ``per_key=True``) gives each step a key, the id of its episode's task:
    each key keeps its own running variance, so a task whose rewards are a hundred times another's
    does not set the other's scale. The discounted return itself runs as without keys (an episode
    has one task, and a done resets it).
    """

    def __init__(self, gamma: float, clip: float = 10.0, eps: float = 1e-8, per_key: bool = False):
        self.gamma, self.clip, self.eps, self.per_key = float(gamma), float(clip), float(eps), per_key
        self.rms = RunningMeanStd(())
        self.key_rms: dict[int, RunningMeanStd] = {}
        self.carry: Tensor | None = None

    def scale(
        self, rewards: Tensor, dones: Tensor, valid: Tensor, continuing: bool = False, keys: Tensor | None = None
    ) -> Tensor:
        if self.per_key and keys is None:
            raise ValueError("a per-key RewardScaler needs each step's key (keys [T, N])")
        start = self.carry if continuing else None
        g, carry = discounted_returns(rewards * valid, dones.bool() | ~valid.bool(), self.gamma, start)
        self.carry = carry if continuing else None
        ok = valid.bool()
        if not self.per_key:
            self.rms.update(g[ok])
            std = (self.rms.var + self.eps).sqrt().to(rewards.dtype)
            return (rewards / std).clamp(-self.clip, self.clip)
        assert keys is not None
        std = torch.ones_like(rewards)  # steps that did not happen keep theirs
        for key in keys[ok].unique().tolist():
            rows = keys == key
            rms = self.key_rms.setdefault(int(key), RunningMeanStd(()))
            rms.update(g[rows & ok])
            std[rows] = (rms.var + self.eps).sqrt().to(rewards.dtype)
        return (rewards / std).clamp(-self.clip, self.clip)

    def stds(self) -> dict[int, float]:
        """Per key, the std rewards are divided by (empty without ``per_key``)."""
        return {k: float((r.var + self.eps).sqrt()) for k, r in self.key_rms.items()}

    def state_dict(self) -> dict:
        out: dict = {"rms": self.rms.state_dict(), "carry": self.carry}
        if self.per_key:
            out["key_rms"] = {k: r.state_dict() for k, r in self.key_rms.items()}
        return out

    def load_state_dict(self, state: dict) -> None:
        self.rms.load_state_dict(state["rms"])
        self.carry = state["carry"]
        # a checkpoint saved with one std for every reward (a recorded config change) starts the
        # per-task stds afresh
        self.key_rms = {}
        for k, sd in state.get("key_rms", {}).items() if self.per_key else ():
            self.key_rms[int(k)] = RunningMeanStd(())
            self.key_rms[int(k)].load_state_dict(sd)
