"""Likelihood-free flow-matching objectives: supervised flow matching and advantage-weighted
matching (AWM).

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
