"""One denoising transition of a flow-matching sampler, as an explicit Gaussian.

Every step function maps the current state ``x`` (at time ``t``) and the model velocity ``v`` to
the ``(mean, std)`` of the Gaussian transition ``x_next ~ N(mean, std^2)`` at time
``t_next < t``. ``std`` is a tensor broadcastable to ``x`` (0-dim, ``[N, 1, ..]`` or full shape);
``std == 0`` means the step is deterministic. See ``mmrl/flow/__init__.py`` for the conventions
(t = 1 is noise, t = 0 is data, ``x_t = t*noise + (1-t)*x0``, ``v = noise - x0``).

Shapes. ``x`` and ``v`` are ``[N, *E]``. ``t`` and ``t_next`` are each one of
  * a python float or a 0-dim tensor (one time for the whole batch), or
  * a 1-D tensor ``[N]`` (one time per row; broadcast over the element dims ``E``), or
  * a tensor already broadcastable to ``x``.
"""

from __future__ import annotations

import math

import torch

TimeLike = float | torch.Tensor

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _as_time(t: TimeLike, x: torch.Tensor) -> torch.Tensor:
    """Return ``t`` as a tensor on ``x``'s device that broadcasts against ``x`` ([N, *E])."""
    t = torch.as_tensor(t, device=x.device)
    t = t.to(torch.promote_types(t.dtype, x.dtype) if t.is_floating_point() else x.dtype)
    if t.ndim == 1 and x.ndim > 1:
        t = t.reshape(-1, *([1] * (x.ndim - 1)))
    return t


def velocity_from_sample(x: torch.Tensor, x0_hat: torch.Tensor, t: TimeLike, t_min: float = 0.05) -> torch.Tensor:
    """The velocity of a model that predicts the clean sample ("x-prediction"): on the line
    ``x_t = t noise + (1 - t) x0`` with ``x0 = x0_hat``, ``v = noise - x0 = (x_t - x0_hat) / t``,
    ``t`` clamped below at ``t_min`` (the 1 / t weight grows without bound as t -> 0).

    An Euler step from ``t`` to ``t_next`` then lands at ``x_t t_next / t + x0_hat (1 - t_next / t)``:
    the last step (``t_next = 0``) returns ``x0_hat`` whatever ``x_t`` was. Args: x, x0_hat ``[N, *E]``;
    t float / 0-dim / ``[N]``. Returns ``v [N, *E]``.
    """
    return (x - x0_hat) / _as_time(t, x).clamp(min=t_min)


def ode_step(x: torch.Tensor, v: torch.Tensor, t: TimeLike, t_next: TimeLike) -> tuple[torch.Tensor, torch.Tensor]:
    """Euler ODE step: ``mean = x + (t_next - t) * v``, ``std = 0`` (0-dim tensor).

    Args: x, v ``[N, *E]``; t, t_next float / 0-dim / ``[N]``.
    Returns ``(mean [N, *E], std 0-dim)``.
    """
    t, t_next = _as_time(t, x), _as_time(t_next, x)
    mean = x + (t_next - t) * v
    return mean, torch.zeros((), dtype=mean.dtype, device=mean.device)


def sde_sigma(
    t: TimeLike, t_next: TimeLike, noise_level: float, x: torch.Tensor, sigma_max: TimeLike | None = None
) -> torch.Tensor:
    """Flow-SDE diffusion coefficient ``sigma_t = a * sqrt(t / (1 - t'))`` with ``a = noise_level``.

    ``t' = t`` except at the t = 1 edge, where ``1 - t`` is 0: there ``t'`` is ``sigma_max`` when
    given, else ``t_next``. For the first step of a grid, ``t_next = grid[1]``, which is exactly
    Flow-GRPO's choice (``sigma_max = sigmas[1]``, used only in the denominator), so
    ``sigma_1 = a * sqrt(1 / (1 - grid[1]))``. Returns a tensor broadcastable to ``x``.
    """
    t, t_next = _as_time(t, x), _as_time(t_next, x)
    edge = t_next if sigma_max is None else _as_time(sigma_max, x)
    t_den = torch.where(t >= 1.0, edge.to(t.dtype), t)
    return noise_level * torch.sqrt(t / (1.0 - t_den))


def sde_step(
    x: torch.Tensor,
    v: torch.Tensor,
    t: TimeLike,
    t_next: TimeLike,
    noise_level: float,
    sigma_max: TimeLike | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flow-SDE step (Flow-GRPO's ODE-to-SDE conversion, the same marginals as the ODE).

    With ``sigma_t`` from :func:`sde_sigma` and ``dt = t_next - t < 0``::

        mean = x + [v + sigma_t^2 / (2 t) * (x + (1 - t) v)] * dt
        std  = sigma_t * sqrt(-dt)

    ``x + (1-t) v`` is the model's estimate of the noise, so the bracket is the velocity plus the
    score correction that keeps the marginals of the ODE. Identical (as written, term by term) to
    Flow-GRPO's ``sde_step_with_logprob`` (``sde_type="sde"``):
    ``mean = x (1 + s^2 dt / 2t) + v (1 + s^2 (1-t) / 2t) dt``. ``noise_level = 0`` gives the Euler
    step exactly. The t = 1 edge is handled by :func:`sde_sigma`; ``t = 0`` is never a start time.

    Args: x, v ``[N, *E]``; t, t_next float / 0-dim / ``[N]``; noise_level ``a >= 0``.
    Returns ``(mean [N, *E], std broadcastable to x)``.
    """
    sigma = sde_sigma(t, t_next, noise_level, x, sigma_max)
    t, t_next = _as_time(t, x), _as_time(t_next, x)
    dt = t_next - t
    mean = x + (v + sigma**2 / (2.0 * t) * (x + (1.0 - t) * v)) * dt
    std = sigma * torch.sqrt(-dt)
    return mean, std


def cps_step(
    x: torch.Tensor, v: torch.Tensor, t: TimeLike, t_next: TimeLike, noise_level: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficients-Preserving Sampling step (flow_grpo ``sde_type="cps"``).

    ::

        std      = t_next * sin(noise_level * pi / 2)
        x0_hat   = x - t v                 (predicted data)
        noise_hat = x + (1 - t) v          (predicted noise)
        mean     = (1 - t_next) x0_hat + sqrt(t_next^2 - std^2) noise_hat

    so ``x_next = (1 - t_next) x0_hat + t_next * (cos * noise_hat + sin * fresh noise)`` keeps the
    interpolation coefficients of ``x_t``. ``noise_level = 0`` gives the Euler step (up to
    rounding). The last step of a grid (``t_next = 0``) has ``std = 0`` (deterministic). Unlike
    flow_grpo, whose cps log-prob drops all constants, :func:`gaussian_log_prob` gives the exact
    density.
    Unlike Flow-SDE, CPS does not keep the ODE's marginals for large ``noise_level``: every step
    re-draws a ``sin(a pi / 2)`` share of the noise around the posterior-mean estimate, which
    shrinks the spread (1-D Gaussian data with the exact velocity, K = 100: std 0.42 instead of
    0.5 at a = 0.7; 0.495 at a = 0.1).

    Args: x, v ``[N, *E]``; t, t_next float / 0-dim / ``[N]``; noise_level in [0, 1].
    Returns ``(mean [N, *E], std broadcastable to x)``.
    """
    t, t_next = _as_time(t, x), _as_time(t_next, x)
    std = t_next * math.sin(noise_level * math.pi / 2.0)
    x0_hat = x - t * v
    noise_hat = x + (1.0 - t) * v
    coef = torch.sqrt(torch.clamp(t_next**2 - std**2, min=0.0))
    mean = (1.0 - t_next) * x0_hat + coef * noise_hat
    return mean, std


def noise_step(
    x: torch.Tensor, v: torch.Tensor, t: TimeLike, t_next: TimeLike, std: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flow-Noise step (pi_RL): Euler mean ``x + (t_next - t) v`` with a learned ``std``.

    ``std`` (e.g. from :class:`mmrl.flow.noise_net.FlowNoiseHead`) is used as given: it must be
    positive and broadcastable to ``x``. Returns ``(mean [N, *E], std)``.
    """
    if std is None:
        raise ValueError("noise_step needs the learned std; model_fn returned std=None")
    mean, _ = ode_step(x, v, t, t_next)
    return mean, std


def gaussian_log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Exact per-element Gaussian log-density of ``x_next`` under ``N(mean, std^2)``.

    ``log p = -(x_next - mean)^2 / (2 std^2) - log std - 0.5 log(2 pi)`` (the same as
    ``torch.distributions.Normal(mean, std).log_prob(x_next)``). All three broadcast; the result
    has the broadcast shape. ``std`` must be > 0 (callers mask deterministic steps first).
    """
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    return -((x_next - mean) ** 2) / (2.0 * std**2) - torch.log(std) - _HALF_LOG_2PI


STEP_METHODS = ("ode", "sde", "cps", "noise")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the sampler computes steps and log-probs in: ``dtype`` promoted to >= float32."""
    return torch.promote_types(dtype, torch.float32)


def transition(
    method: str,
    x: torch.Tensor,
    v: torch.Tensor,
    t: TimeLike,
    t_next: TimeLike,
    noise_level: float = 0.0,
    std: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch to the step function of ``method`` in ``{"ode", "sde", "cps", "noise"}``.

    ``std`` is the model's learned std, used only by ``"noise"``. Returns ``(mean, std)``.
    The arithmetic runs in at least float32 (:func:`compute_dtype`): x, v and std are upcast, so
    bf16 / fp16 models neither overflow here nor round differently between rollout and recompute.
    """
    cd = compute_dtype(x.dtype)
    x, v = x.to(cd), v.to(cd)
    if isinstance(std, torch.Tensor):
        std = std.to(cd)
    if method == "ode":
        return ode_step(x, v, t, t_next)
    if method == "sde":
        return sde_step(x, v, t, t_next, noise_level)
    if method == "cps":
        return cps_step(x, v, t, t_next, noise_level)
    if method == "noise":
        return noise_step(x, v, t, t_next, std)
    raise ValueError(f"unknown flow method {method!r}; allowed: {STEP_METHODS}")
