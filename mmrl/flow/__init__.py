"""Flow-matching samplers with exact per-step Gaussian log-likelihood.

Shared by flow-matching VLA action experts (pi0 / pi0.5 / SmolVLA style) and flow-matching image
generators (SD3 / FLUX, Flow-GRPO).

Conventions
-----------
* Time runs from ``t = 1`` (pure noise) to ``t = 0`` (data):
  ``x_t = t * noise + (1 - t) * x0``; the model predicts the velocity ``v = noise - x0``
  (pi0 / rectified flow; ``t`` is Flow-GRPO's ``sigma``; diffusers timesteps are ``1000 * t``).
* Euler ODE step from ``t`` to ``t_next < t``: ``x_next = x + (t_next - t) * v``.
* A grid is a decreasing 1-D tensor of K+1 times, ``grid[0] = 1 ... grid[K] = 0``
  (:func:`time_grid`, optional SD3 shift). Transition ``k`` goes from ``grid[k]`` to ``grid[k+1]``.
* ``model_fn(x, t) -> (v, std)``: ``x`` is ``[N, *E]`` (any element shape E: ``[C, A]`` action
  chunk, ``[Ch, H, W]`` latent), ``t`` a float tensor ``[N]``, ``v`` like ``x``; ``std`` is None or
  a tensor broadcastable to ``x`` (the learned Flow-Noise std, read only by method ``"noise"``).
* Batched model calls (:func:`chain_log_prob` with ``batch_steps=True``, :func:`awm_loss`) call
  ``model_fn`` on ``N = B * K'`` rows ordered sample-major (row ``r`` belongs to sample
  ``r // (N // B)``): a model with per-sample conditioning repeats it with
  ``cond.repeat_interleave(N // B, 0)``.
* Every transition is a Gaussian ``x_next ~ N(mean, std^2)`` (:mod:`mmrl.flow.steps`); std 0 means
  deterministic. Methods: ``"ode"`` (Euler), ``"sde"`` (Flow-SDE, noise level ``a``),
  ``"cps"`` (coefficients-preserving), ``"noise"`` (Flow-Noise, learned std).
* A bool mask ``stoch [B, K]`` says which transitions are stochastic (:func:`stochastic_mask`:
  all / one random step / a window / none); the others take the ODE step. Transitions whose std
  is 0 (``a = 0``; cps's last step) are removed from the mask by the sampler.
* Log-probs are exact per-element Gaussian log-densities (``-log std - 0.5 log 2 pi`` included),
  kept per element ``[B, K, *E]`` and 0 off the mask; :func:`reduce_log_prob` states the sum / mean
  over elements and over stochastic steps explicitly.
* Self-checks (tests/flow): ``a = 0`` reproduces the ODE; recomputed log-probs equal rollout
  log-probs (ratio == 1) before the first update.
"""

from mmrl.flow.losses import (
    awm_loss,
    flow_matching_error,
    flow_matching_loss,
    nft_loss,
    nft_optimality,
    sample_times,
)
from mmrl.flow.noise_net import FlowNoiseHead
from mmrl.flow.sampler import (
    FlowSample,
    chain_log_prob,
    mean_path,
    noisy_steps,
    reduce_log_prob,
    sample,
    stochastic_mask,
    subsample_steps,
    time_grid,
)
from mmrl.flow.steps import (
    compute_dtype,
    cps_step,
    gaussian_log_prob,
    noise_step,
    ode_step,
    sde_sigma,
    sde_step,
    transition,
    velocity_from_sample,
)

__all__ = [
    "FlowNoiseHead",
    "FlowSample",
    "awm_loss",
    "nft_loss",
    "nft_optimality",
    "chain_log_prob",
    "compute_dtype",
    "cps_step",
    "flow_matching_error",
    "flow_matching_loss",
    "gaussian_log_prob",
    "mean_path",
    "noise_step",
    "noisy_steps",
    "ode_step",
    "reduce_log_prob",
    "sample",
    "sample_times",
    "sde_sigma",
    "sde_step",
    "stochastic_mask",
    "subsample_steps",
    "time_grid",
    "transition",
    "velocity_from_sample",
]
