"""Policy / value losses, KL estimators and loss aggregation, as pure torch functions.

All losses are returned unreduced (elementwise); `aggregate_loss` turns a ``[B, T]`` loss and its
mask into the scalar to backpropagate. Log-ratios are clamped to ``[-20, 20]`` before ``exp`` so a
stale or masked token cannot overflow (``exp(20)`` ~ 5e8); within that range nothing changes.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

__all__ = [
    "ppo_clip_loss",
    "gspo_log_ratio",
    "gspo_token_ratio",
    "kl_penalty",
    "value_loss",
    "aggregate_loss",
    "AGG_MODES",
    "KL_KINDS",
]

LOG_RATIO_CLAMP = 20.0
KL_KINDS = ("k1", "k2", "k3")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, elementwise (any shape; advantages broadcast to logp).

    ::

        ratio = exp(logp - old_logp)
        loss  = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
        dual clip (c > 1), only where A < 0:  loss = min(loss, -c * A)   (i.e. at most c * |A|)

    ``clip_high`` defaults to ``clip_low``; a larger value is DAPO's clip-higher. The dual clip
    (Ye et al. 2020, verl ``clip_ratio_c``) bounds the loss of a negative-advantage sample whose
    ratio exploded. Returns ``(loss, stats)``; stats are detached elementwise tensors:

    - ``ratio``: the importance ratio;
    - ``clipped`` (bool): the clipped term was the active (larger) one;
    - ``dual_clipped`` (bool): the dual-clip bound was active;
    - ``approx_kl``: k3 estimate of KL(old || new) per element, ``ratio - 1 - log(ratio)``
      (unbiased under samples from the old policy, always >= 0).
    """
    if clip_high is None:
        clip_high = clip_low
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipped = loss_clipped > loss_unclipped
    dual_clipped = torch.zeros_like(clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (loss > bound)
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    stats = {
        "ratio": ratio.detach(),
        "clipped": clipped.detach(),
        "dual_clipped": dual_clipped.detach(),
        "approx_kl": (ratio - 1.0 - log_ratio).detach(),
    }
    return loss, stats


def gspo_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO sequence-level log importance ratio (Zheng et al. 2025). ``[B, T] -> [B]``::

        log s_i = (1 / |y_i|) * sum_{t valid} (logp_t - old_logp_t)

    i.e. the log of the length-normalised sequence ratio ``s_i = (pi / pi_old)(y_i)^(1/|y_i|)``.
    A sequence with no valid token gets 0.
    """
    m = mask.to(logp.dtype)
    diff = torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp))
    return diff.sum(-1) / m.sum(-1).clamp(min=1)


def gspo_token_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO-token ratio ``[B, T]``: ``s_{i,t} = sg[s_i] * exp(logp_t - sg[logp_t])``.

    Its value equals the sequence ratio ``s_i = exp(gspo_log_ratio)`` at every token, but the
    gradient flows per token: ``d s_{i,t} / d logp_t = s_i`` (so per-token advantages can be used).
    Use it in place of the ratio of `ppo_clip_loss` (e.g. via the log-ratio) and mask the result.
    """
    seq = gspo_log_ratio(logp, old_logp, mask).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.exp(seq.unsqueeze(-1) + logp - logp.detach())


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3") -> Tensor:
    """Per-element estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3).

    With ``x = logp - ref_logp``: ``k1 = x`` (unbiased, can be negative), ``k2 = 0.5 * x^2``,
    ``k3 = exp(-x) + x - 1`` (unbiased, >= 0, low variance; verl's ``low_var_kl``). For k3 the
    log-ratio is clamped to ``[-20, 20]`` so ``exp`` cannot overflow. Any shape -> same shape.
    """
    x = logp - ref_logp
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x.square()
    if kind == "k3":
        neg = (-x).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # log(pi_ref / pi)
        return torch.exp(neg) - neg - 1.0
    raise ValueError(f"unknown KL estimator '{kind}'; valid: {', '.join(KL_KINDS)}")


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float | None = None) -> Tensor:
    """Critic loss, elementwise (any shape)::

    no clip:  0.5 * (V - R)^2
    clip c:   0.5 * max((V - R)^2, (V_old + clamp(V - V_old, -c, c) - R)^2)   (PPO value clip)
    """
    err = (values - returns).square()
    if clip is None:
        return 0.5 * err
    v_clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum(err, (v_clipped - returns).square())


def aggregate_loss(loss: Tensor, mask: Tensor, mode: str = "token-mean", norm_len: float | None = None) -> Tensor:
    """Reduce an elementwise loss ``[B, T]`` (or ``[B]``, read as T=1) under ``mask`` to a scalar.

    - ``token-mean``: sum over all valid tokens / number of valid tokens in the batch (DAPO);
    - ``seq-mean-token-mean``: per sequence the mean over its valid tokens, then the mean over
      sequences (GRPO paper);
    - ``seq-mean-token-sum``: per sequence the sum over its valid tokens, then the mean over
      sequences;
    - ``seq-mean-token-sum-norm``: per sequence the sum over its valid tokens divided by the
      constant ``norm_len`` (default ``T = mask.shape[-1]``; Dr.GRPO: the max generation length),
      then the mean over sequences.

    "Mean over sequences" counts only sequences with at least one valid token, so padding rows
    change nothing; masked entries are ignored even if they hold NaN/inf. With no valid token at
    all the result is 0 (still connected to the graph).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode '{mode}'; valid: {', '.join(AGG_MODES)}")
    if loss.dim() == 1:
        loss, mask = loss.unsqueeze(-1), mask.unsqueeze(-1)
    valid = mask.bool()
    masked = torch.where(valid, loss, torch.zeros_like(loss))
    m = valid.to(loss.dtype)
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1)
    tokens = m.sum(-1)
    if mode == "seq-mean-token-mean":
        seq = masked.sum(-1) / tokens.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        seq = masked.sum(-1)
    else:
        seq = masked.sum(-1) / (float(mask.shape[-1]) if norm_len is None else float(norm_len))
    num_seqs = (tokens > 0).to(loss.dtype).sum()
    return seq.sum() / num_seqs.clamp(min=1)
