"""Likelihood-free flow-matching objectives: supervised flow matching, advantage-weighted
matching (AWM) and DiffusionNFT's forward-process loss.

Conventions as in ``mmrl/flow/__init__.py``: ``x_t = t * noise + (1 - t) * x0`` and the target
velocity is ``noise - x0``. ``model_fn(x [N, *E], t [N]) -> (v [N, *E], std or None)``; ``std`` is
ignored here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl.utils.rows import rand_rows, randn_rows

ModelFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]

AWM_WEIGHTINGS = ("uniform", "t", "huber")


def _per_row(w: torch.Tensor, ndim: int) -> torch.Tensor:
    """``[N]`` -> ``[N, 1, ..]`` (``ndim`` dims); other shapes are returned unchanged."""
    return w.reshape(-1, *([1] * (ndim - 1))) if w.ndim == 1 and ndim > 1 else w


def sample_times(
    shape,
    generator: torch.Generator | None = None,
    device=None,
    dtype: torch.dtype = torch.float32,
    time_sampling: str = "uniform",
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
) -> torch.Tensor:
    """Training times in (0, 1): ``"uniform"`` U(0, 1) or ``"logit_normal"`` sigmoid(N(m, s^2))
    (SD3's default density, more weight on mid-range t)."""
    if time_sampling == "uniform":
        return rand_rows(shape, generator=generator, device=device, dtype=dtype)
    if time_sampling == "logit_normal":
        u = randn_rows(shape, generator=generator, device=device, dtype=dtype)
        return torch.sigmoid(logit_mean + logit_std * u)
    raise ValueError(f"unknown time_sampling {time_sampling!r}; allowed: ('uniform', 'logit_normal')")


def flow_matching_error(
    model_fn: ModelFn, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-row conditional flow-matching error ``[N]``, one model call.

    ``x_t = t noise + (1 - t) x0``; ``err = mean_E( w * (v(x_t, t) - (noise - x0))^2 )``.
    x0, noise ``[N, *E]``; t ``[N]``; weights ``[N]`` or broadcastable to ``[N, *E]``.
    """
    tb = _per_row(t, x0.ndim).to(x0.dtype)
    x_t = tb * noise + (1.0 - tb) * x0
    v, _ = model_fn(x_t, t)
    err = (v - (noise - x0)) ** 2
    if weights is not None:
        err = err * _per_row(torch.as_tensor(weights, device=err.device), err.ndim)
    return err.reshape(err.shape[0], -1).mean(1)


def flow_matching_loss(
    model_fn: ModelFn,
    x0: torch.Tensor,
    t: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    weights: torch.Tensor | None = None,
    time_sampling: str = "uniform",
) -> torch.Tensor:
    """Supervised conditional flow-matching loss per sample ``[B]`` (SFT warm start).

    ``t ~ U(0, 1)`` (or ``time_sampling="logit_normal"``) and ``noise ~ N(0, I)`` are drawn with
    ``generator`` unless given; ``x_t = t noise + (1 - t) x0``, target ``noise - x0``, loss
    ``mean over elements of weights * (v(x_t, t) - target)^2``. x0 ``[B, *E]``; t ``[B]``; noise
    ``[B, *E]``; weights ``[B]`` (per sample) or broadcastable to ``[B, *E]`` (e.g. a padding mask).
    Take ``.mean()`` for a scalar.
    """
    B = x0.shape[0]
    if t is None:
        t = sample_times((B,), generator, x0.device, x0.dtype, time_sampling)
    if noise is None:
        noise = randn_rows(x0.shape, generator=generator, device=x0.device, dtype=x0.dtype)
    return flow_matching_error(model_fn, x0, t, noise, weights)


def _times_and_noise(x0, num_timesteps, generator, t, noise, t_range) -> tuple[torch.Tensor, torch.Tensor]:
    """``K`` stratified training times per sample ``t [B, K]``, ``t_j = lo + (hi - lo) (j + u_j) / K``
    with ``u_j ~ U(0, 1)``, and fresh noise ``[B, K, *E]`` (each drawn unless given)."""
    B, E = x0.shape[0], x0.shape[1:]
    K = int(num_timesteps) if t is None else t.shape[1]
    if K < 1:
        raise ValueError(f"num_timesteps must be >= 1, got {num_timesteps}")
    if t is None:
        lo, hi = t_range
        u = rand_rows((B, K), generator=generator, device=x0.device, dtype=x0.dtype)
        j = torch.arange(K, device=x0.device, dtype=x0.dtype)
        t = lo + (hi - lo) * (j + u) / K
    if noise is None:
        noise = randn_rows((B, K, *E), generator=generator, device=x0.device, dtype=x0.dtype)
    return t, noise


def awm_loss(
    model_fn: ModelFn,
    x0: torch.Tensor,
    advantages: torch.Tensor,
    num_timesteps: int = 1,
    weighting: str = "uniform",
    generator: torch.Generator | None = None,
    huber_c: float | None = None,
    t: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    t_range: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """Advantage-Weighted Matching loss per sample ``[B]`` (Xue et al. 2025, arXiv 2509.25050).

    AWM keeps the pretraining objective and reweights it by the advantage: for each generated
    sample ``x0`` (detached, from any sampler) draw fresh noise and ``K = num_timesteps``
    stratified times ``t_j = lo + (hi - lo) (j + u_j) / K``, ``u_j ~ U(0, 1)`` per sample, and::

        err_j  = mean_E (v(x_t_j, t_j) - (noise_j - x0))^2
        loss_b = A_b * mean_j w(err_j, t_j)

        w = err                              "uniform"
            t * err                          "t"
            t * (sqrt(err + c^2) - c)         "huber" (pseudo-Huber, c = huber_c, default 1e-5)

    This is the on-policy (ratio = 1) form of the AWM reference implementation, whose per-sample
    "log-prob" is ``-w`` and whose policy loss is ``-A * exp(logp - logp_old)``: the gradients are
    equal. Minimising lowers the matching error of high-advantage samples and raises it for
    negative ones; no likelihood is needed, so any sampler (ODE included) can produce ``x0``.

    Model calls: ONE call on ``[B*K, *E]`` rows ordered sample-major (row ``r`` is sample
    ``r // K``): repeat per-sample conditioning with ``repeat_interleave(K, 0)``.

    Args: x0 ``[B, *E]``; advantages ``[B]`` (detached here); t ``[B, K]`` and noise
    ``[B, K, *E]`` override the random draws (for tests / variance-reduced reuse).
    """
    if weighting not in AWM_WEIGHTINGS:
        raise ValueError(f"unknown AWM weighting {weighting!r}; allowed: {AWM_WEIGHTINGS}")
    B, E = x0.shape[0], x0.shape[1:]
    t, noise = _times_and_noise(x0, num_timesteps, generator, t, noise, t_range)
    K = t.shape[1]
    x0_rep = x0.detach().repeat_interleave(K, 0)  # [B*K, *E]
    err = flow_matching_error(model_fn, x0_rep, t.reshape(-1), noise.reshape(B * K, *E))
    err = err.reshape(B, K)
    tt = t.to(err.dtype)
    if weighting == "t":
        err = tt * err
    elif weighting == "huber":
        c = 1e-5 if huber_c is None else float(huber_c)
        err = tt * (torch.sqrt(err + c * c) - c)
    adv = torch.as_tensor(advantages, device=err.device, dtype=err.dtype).detach().reshape(B)
    return adv * err.mean(1)


def nft_optimality(advantages: torch.Tensor, adv_max: float) -> torch.Tensor:
    """DiffusionNFT's optimality probability ``r = clamp(A, -m, m) / (2 m) + 1/2`` in [0, 1]: 1 for
    the best samples (A >= m), 0 for the worst, 1/2 for an average one."""
    if adv_max <= 0:
        raise ValueError(f"the advantage bound of DiffusionNFT must be > 0, got {adv_max}")
    return advantages.clamp(-adv_max, adv_max) / (2.0 * adv_max) + 0.5


def nft_loss(
    model_fn: ModelFn,
    old_fn: ModelFn | None,
    x0: torch.Tensor,
    advantages: torch.Tensor,
    beta: float = 1.0,
    adv_max: float = 5.0,
    num_timesteps: int = 1,
    adaptive_weight: bool = True,
    generator: torch.Generator | None = None,
    t: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    t_range: tuple[float, float] = (0.0, 1.0),
) -> torch.Tensor:
    """DiffusionNFT's forward-process loss per sample ``[B]`` (Zheng et al. 2025, arXiv 2509.16117).

    Trained on the policy's own clean samples ``x0`` (detached, from any sampler: no
    log-likelihood, no SDE, no CFG needed). At fresh noise and times (as `awm_loss` draws them,
    ``x_t = t noise + (1 - t) x0``) the current velocity ``v`` and the old one ``v_old`` (``old_fn``,
    no gradient; None: ``v`` detached, the on-policy case) make two implicit policies::

        v_pos = beta v + (1 - beta) v_old          v_neg = (1 + beta) v_old - beta v
        x0_pos = x_t - t v_pos                     x0_neg = x_t - t v_neg
        r = nft_optimality(A, adv_max)
        loss_b = adv_max / beta * mean_j [ r  |x0_pos - x0|^2 / w_pos + (1 - r) |x0_neg - x0|^2 / w_neg ]

    with ``|.|^2`` the mean over elements and, under ``adaptive_weight``, ``w = mean |x0_hat - x0|``
    (no gradient, at least 1e-5) per row, else ``w = 1``: the positive policy is pulled onto the good
    samples and the negative one onto the bad, which moves ``v`` towards the good and away from the
    bad (the negative policy steps the other way). The factors are those of the authors'
    reference implementation (NVlabs/DiffusionNFT).

    One model call on ``[B*K, *E]`` rows, sample-major (as `awm_loss`). x0 ``[B, *E]``;
    advantages ``[B]``; t ``[B, K]`` and noise ``[B, K, *E]`` override the draws.
    """
    if beta <= 0:
        raise ValueError(f"DiffusionNFT's beta must be > 0, got {beta}")
    B, E = x0.shape[0], x0.shape[1:]
    t, noise = _times_and_noise(x0, num_timesteps, generator, t, noise, t_range)
    K = t.shape[1]
    x0_rep = x0.detach().repeat_interleave(K, 0)  # [B*K, *E]
    tb = _per_row(t.reshape(-1), x0.ndim).to(x0.dtype)
    x_t = tb * noise.reshape(B * K, *E) + (1.0 - tb) * x0_rep
    v, _ = model_fn(x_t, t.reshape(-1))
    if old_fn is None:
        v_old = v.detach()
    else:
        with torch.no_grad():
            v_old, _ = old_fn(x_t, t.reshape(-1))
    v_pos = beta * v + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v
    errs = []
    for v_hat in (v_pos, v_neg):
        diff = (x_t - tb * v_hat) - x0_rep
        w = diff.detach().abs().reshape(B * K, -1).mean(1).clamp(min=1e-5) if adaptive_weight else None
        err = (diff**2).reshape(B * K, -1).mean(1)
        errs.append((err / w if w is not None else err).reshape(B, K))
    r = nft_optimality(
        torch.as_tensor(advantages, device=x0.device, dtype=errs[0].dtype).detach().reshape(B, 1), adv_max
    )
    return adv_max / beta * (r * errs[0] + (1.0 - r) * errs[1]).mean(1)
