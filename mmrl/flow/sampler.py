"""Flow-matching sampling with exact per-step log-likelihood, and its recomputation for training.

Rollout: :func:`sample` runs the K transitions of a grid, records the whole chain and the
per-element Gaussian log-prob of every stochastic transition. Training: :func:`chain_log_prob`
recomputes those log-probs of the stored chain under the current model (gradients flow through
``model_fn``); with the rollout model unchanged the two agree (PPO ratio == 1).
:func:`reduce_log_prob` turns per-element log-probs into the level the loss needs.

Shapes: ``B`` batch, ``K`` transitions (grid of K+1 times), ``E`` element shape (``[C, A]`` action
chunk, ``[Ch, H, W]`` latent). ``model_fn(x [N, *E], t [N]) -> (v [N, *E], std or None)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mmrl.flow.losses import awm_loss, flow_matching_loss  # noqa: F401  (re-exported)
from mmrl.flow.steps import STEP_METHODS, compute_dtype, gaussian_log_prob, ode_step, transition
from mmrl.utils.rows import rand_rows, randint_rows, randn_rows

ModelFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]

MASK_MODES = ("all", "one", "window", "none")


def time_grid(num_steps: int, shift: float = 1.0, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Decreasing grid ``[K+1]`` from 1 (noise) to 0 (data), ``K = num_steps``.

    Linear ``t_i = 1 - i/K``, then the SD3 time shift ``t' = shift t / (1 + (shift - 1) t)``
    (``shift = 1`` leaves it linear; ``shift > 1`` spends more steps at high noise). The shift keeps
    ``t'(1) = 1`` and ``t'(0) = 0``.
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    t = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    t = shift * t / (1.0 + (shift - 1.0) * t)
    return t.to(dtype=dtype, device=device)


def check_window(window: Sequence[int] | None, num_steps: int) -> tuple[int, int]:
    """``(start, end)`` of a ``stochastic: window`` setting, or a ValueError naming the fix unless
    ``0 <= start < end <= num_steps`` (policies call it when their config is checked)."""
    if window is None or len(window) != 2 or not 0 <= int(window[0]) < int(window[1]) <= num_steps:
        shown = None if window is None else list(window)
        raise ValueError(
            f"policy.window = {shown} with stochastic: window needs [start, end] with 0 <= start < end <= "
            f"num_steps ({num_steps}): e.g. policy.window=[0,{min(3, num_steps)}]"
        )
    return int(window[0]), int(window[1])


def stochastic_mask(
    batch: int,
    num_steps: int,
    mode: str,
    generator: torch.Generator | None = None,
    window: Sequence[int] | None = None,
    device=None,
) -> torch.Tensor:
    """Which transitions of each sample are stochastic: bool ``[B, K]``.

    * ``"all"``: every transition.
    * ``"one"``: one transition per sample, uniform over ``0..K-1`` (drawn with ``generator`` on
      its own device, then moved to ``device``); the others are ODE steps (pi_RL's Flow-SDE rollout,
      Flow-GRPO-Fast).
    * ``"window"``: transitions ``window[0] <= k < window[1]`` (``window = (start, end)``, python
      slice semantics).
    * ``"none"``: no transition (pure ODE).
    """
    K = num_steps
    if mode == "all":
        return torch.ones(batch, K, dtype=torch.bool, device=device)
    if mode == "none":
        return torch.zeros(batch, K, dtype=torch.bool, device=device)
    if mode == "one":
        gen_device = generator.device if generator is not None else device
        idx = randint_rows(K, (batch,), generator=generator, device=gen_device)
        return torch.nn.functional.one_hot(idx.to(device), K).to(torch.bool)
    if mode == "window":
        start, end = check_window(window, K)
        mask = torch.zeros(batch, K, dtype=torch.bool, device=device)
        mask[:, start:end] = True
        return mask
    raise ValueError(f"unknown stochastic mask mode {mode!r}; allowed: {MASK_MODES}")


def subsample_steps(stoch: torch.Tensor, fraction: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """DanceGRPO's timestep subsampling: of each sample's stochastic transitions (``stoch`` bool
    ``[B, K]``), keep ``max(1, round(fraction * n))`` chosen uniformly without replacement (drawn
    with ``generator`` on its own device); a row without one stays empty. ``fraction = 1`` keeps
    ``stoch`` as it is, without drawing."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return stoch
    gen_device = generator.device if generator is not None else stoch.device
    score = rand_rows(tuple(stoch.shape), generator=generator, device=gen_device).to(stoch.device)
    score = score.masked_fill(~stoch, 2.0)  # the rows' stochastic steps first, in random order
    rank = score.argsort(1).argsort(1)
    n = stoch.sum(1, keepdim=True)
    keep = (n.float() * fraction).round().clamp(min=1).minimum(n)
    return stoch & (rank < keep)


def noisy_steps(grid: torch.Tensor, method: str, noise_level: float = 0.0) -> torch.Tensor:
    """bool ``[K]``: whether transition k of ``grid`` has std > 0 under ``method``.

    ``"ode"``: none. ``"noise"``: all (the learned std is bounded away from 0). ``"sde"``/``"cps"``:
    computed from the step's std, so ``noise_level = 0`` gives none, and the cps last step
    (``t_next = 0``) is deterministic. The samplers drop such transitions from the stochastic mask:
    a deterministic transition has no density, so it contributes no log-prob and is not counted.
    """
    K = grid.shape[0] - 1
    if method not in STEP_METHODS:
        raise ValueError(f"unknown flow method {method!r}; allowed: {STEP_METHODS}")
    if method == "ode":
        return torch.zeros(K, dtype=torch.bool, device=grid.device)
    if method == "noise":
        return torch.ones(K, dtype=torch.bool, device=grid.device)
    z = torch.zeros(K, dtype=torch.float64, device=grid.device)
    g = grid.to(torch.float64)
    _, std = transition(method, z, z, g[:-1], g[1:], noise_level)
    return torch.broadcast_to(std, (K,)) > 0


@dataclass
class FlowSample:
    """One rollout of a flow sampler.

    x0:    ``[B, *E]`` the generated sample (``chain[:, K]``).
    chain: ``[B, K+1, *E]``, ``chain[:, 0]`` the initial noise, ``chain[:, k]`` the state at
           ``grid[k]``.
    stoch: bool ``[B, K]``, the transitions that were sampled stochastically with std > 0 (the
           requested mask and :func:`noisy_steps`); pass it to :func:`chain_log_prob`.
    logp:  ``[B, K, *E]`` per-element log-prob of ``chain[:, k+1]`` given ``chain[:, k]`` under the
           rollout model; 0 where ``stoch`` is False. Dtype: the chain's, promoted to >= float32
           (steps and log-probs are computed in float32 for bf16 / fp16 models, as Flow-GRPO does;
           the chain keeps the noise's dtype).
    """

    x0: torch.Tensor
    chain: torch.Tensor
    stoch: torch.Tensor
    logp: torch.Tensor


def _elem_view(mask: torch.Tensor, ndim: int) -> torch.Tensor:
    """``[N]`` mask -> ``[N, 1, ..]`` with ``ndim`` dims in all."""
    return mask.reshape(-1, *([1] * (ndim - 1)))


def _resolve_mask(
    stoch: torch.Tensor | None, B: int, grid: torch.Tensor, method: str, noise_level: float, device
) -> torch.Tensor:
    K = grid.shape[0] - 1
    if stoch is None:
        stoch = torch.full((B, K), method != "ode", dtype=torch.bool, device=device)
    stoch = stoch.to(device=device, dtype=torch.bool)
    if stoch.shape != (B, K):
        raise ValueError(f"stoch mask has shape {tuple(stoch.shape)}, expected {(B, K)}")
    return stoch & noisy_steps(grid.to(device), method, noise_level)[None]


def sample(
    model_fn: ModelFn,
    noise: torch.Tensor,
    grid: torch.Tensor,
    method: str,
    noise_level: float = 0.0,
    stoch: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    grad: bool = False,
) -> FlowSample:
    """Integrate from ``noise`` (t = 1) to data (t = 0) along ``grid``, recording log-probs.

    Transition k goes from ``grid[k]`` to ``grid[k+1]``; the model is called once per transition on
    the whole batch: ``model_fn(x [B, *E], t [B])``. Where ``stoch[b, k]`` is True the next state is
    ``mean + std * eps`` (``eps ~ N(0, I)`` drawn with ``generator``, on ``noise``'s device) with
    the ``method``'s ``(mean, std)``, and its per-element log-prob is recorded; elsewhere the Euler
    ODE step is taken. ``stoch=None`` means all transitions stochastic (none for ``"ode"``).

    Runs under ``torch.no_grad()`` unless ``grad=True`` (a rollout does not need the graph).
    Returns :class:`FlowSample`.
    """
    if method not in STEP_METHODS:
        raise ValueError(f"unknown flow method {method!r}; allowed: {STEP_METHODS}")
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        B, K = noise.shape[0], grid.shape[0] - 1
        grid = grid.to(device=noise.device)
        mask = _resolve_mask(stoch, B, grid, method, noise_level, noise.device)
        cd = compute_dtype(noise.dtype)
        x = noise
        chain, logps = [x], []
        for k in range(K):
            t, t_next = grid[k], grid[k + 1]
            v, std_model = model_fn(x, t.repeat(B))
            some = bool(mask[:, k].any())
            every = some and bool(mask[:, k].all())
            if every:  # the whole batch steps stochastically (the usual case): no ODE step, no masking
                mean, std = transition(method, x, v, t, t_next, noise_level, std_model)
                eps = randn_rows(x.shape, generator=generator, device=x.device, dtype=cd)
                # round to the chain dtype BEFORE the log-prob, so recompute sees the same value
                x_next = (mean + std * eps).to(x.dtype)
                logp = gaussian_log_prob(x_next.to(cd), mean, std).expand(x.shape)
            else:
                x_next = ode_step(x.to(cd), v.to(cd), t, t_next)[0].to(x.dtype)
                logp = torch.zeros(x.shape, dtype=cd, device=x.device)
            if some and not every:
                mean, std = transition(method, x, v, t, t_next, noise_level, std_model)
                eps = randn_rows(x.shape, generator=generator, device=x.device, dtype=cd)
                m = _elem_view(mask[:, k], x.ndim)
                x_next = torch.where(m, (mean + std * eps).to(x.dtype), x_next)
                safe_std = torch.where(m, std, torch.ones_like(std))
                logp = torch.where(m, gaussian_log_prob(x_next.to(cd), mean, safe_std), logp)
            x = x_next
            chain.append(x)
            logps.append(logp)
        return FlowSample(x0=x, chain=torch.stack(chain, 1), stoch=mask, logp=torch.stack(logps, 1))


@torch.no_grad()
def mean_path(model_fn: ModelFn, noise: torch.Tensor, grid: torch.Tensor, method: str, noise_level: float = 0.0):
    """The chain of ``method`` with its noise left out: every transition goes to its Gaussian's mean.

    The deterministic counterpart of the stochastic sampler a policy was trained with, as a Gaussian
    policy's mean is of its samples: from ``noise`` (zeros give one action per observation), step k
    goes from ``grid[k]`` to ``grid[k+1]`` by the ``(mean, std)`` of :func:`transition`, keeping the
    mean. ``"ode"`` and ``"noise"`` (whose mean is the Euler step) give the ODE sample; ``"sde"``
    keeps its score correction and ``"cps"`` its re-weighting of the predicted noise, which the ODE
    drops (at a large ``noise_level`` the ODE is then another policy than the one RL trained).
    Returns a :class:`FlowSample` whose ``stoch`` is all False and ``logp`` 0 (no step was drawn),
    as :func:`sample` with ``"ode"``.
    """
    if method not in STEP_METHODS:
        raise ValueError(f"unknown flow method {method!r}; allowed: {STEP_METHODS}")
    B, K = noise.shape[0], grid.shape[0] - 1
    grid = grid.to(device=noise.device)
    x, chain = noise, [noise]
    for k in range(K):
        v, std_model = model_fn(x, grid[k].repeat(B))
        x = transition(method, x, v, grid[k], grid[k + 1], noise_level, std_model)[0].to(noise.dtype)
        chain.append(x)
    stoch = torch.zeros(B, K, dtype=torch.bool, device=noise.device)
    logp = torch.zeros(B, K, *noise.shape[1:], dtype=compute_dtype(noise.dtype), device=noise.device)
    return FlowSample(x0=x, chain=torch.stack(chain, 1), stoch=stoch, logp=logp)


def chain_log_prob(
    model_fn: ModelFn,
    chain: torch.Tensor,
    grid: torch.Tensor,
    stoch: torch.Tensor,
    method: str,
    noise_level: float = 0.0,
    batch_steps: bool = True,
) -> torch.Tensor:
    """Per-element log-probs ``[B, K, *E]`` of a stored chain under the current model.

    This is what a PPO update calls; gradients flow through ``model_fn``. Only the transitions
    where some sample is stochastic (``stoch.any(0)``, say K' of them) are evaluated; entries with
    ``stoch`` False (or whose step has std 0, :func:`noisy_steps`) are 0. Pass the ``stoch``
    returned by :func:`sample`. Dtype: the chain's promoted to >= float32.

    ``batch_steps=True`` (default, fastest): ONE model call on ``x [B*K', *E]``, ``t [B*K']``, rows
    ordered sample-major (row ``r`` is sample ``r // K'``, transition ``r % K'``), so a model with
    per-sample conditioning (prompt embeddings, an observation prefix / KV cache) repeats it with
    ``cond.repeat_interleave(x.shape[0] // B, 0)``. ``batch_steps=False``: K' calls on ``[B, *E]``
    each, for models that cannot batch over steps (or to save memory).
    """
    if method not in STEP_METHODS:
        raise ValueError(f"unknown flow method {method!r}; allowed: {STEP_METHODS}")
    B, K = chain.shape[0], chain.shape[1] - 1
    E = chain.shape[2:]
    grid = grid.to(chain.device)
    stoch = stoch.to(device=chain.device, dtype=torch.bool)
    if grid.shape[0] != K + 1 or stoch.shape != (B, K):
        raise ValueError(
            f"chain {tuple(chain.shape)}, grid {tuple(grid.shape)} and stoch "
            f"{tuple(stoch.shape)} disagree on B={B}, K={K}"
        )
    stoch = stoch & noisy_steps(grid, method, noise_level)[None]  # no density where std == 0
    out = chain.new_zeros(B, K, *E, dtype=compute_dtype(chain.dtype))
    if method == "ode":
        return out
    steps = stoch.any(0).nonzero().flatten()
    if steps.numel() == 0:
        return out
    Kp = steps.numel()
    x, x_next = chain[:, steps], chain[:, steps + 1]  # [B, K', *E]
    t, t_next = grid[steps], grid[steps + 1]  # [K']
    m = stoch[:, steps]  # [B, K']
    if batch_steps:
        xf = x.reshape(B * Kp, *E)
        tf = t[None].expand(B, Kp).reshape(-1)
        tnf = t_next[None].expand(B, Kp).reshape(-1)
        v, std_model = model_fn(xf, tf)
        mean, std = transition(method, xf, v, tf, tnf, noise_level, std_model)
        lp = _masked_log_prob(x_next.reshape(B * Kp, *E), mean, std, m.reshape(-1))
        lp = lp.reshape(B, Kp, *E)
    else:
        cols = []
        for j in range(Kp):
            v, std_model = model_fn(x[:, j], t[j].repeat(B))
            mean, std = transition(method, x[:, j], v, t[j], t_next[j], noise_level, std_model)
            cols.append(_masked_log_prob(x_next[:, j], mean, std, m[:, j]))
        lp = torch.stack(cols, 1)
    return out.index_copy(1, steps, lp.to(out.dtype))


def _masked_log_prob(
    x_next: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, row_mask: torch.Tensor
) -> torch.Tensor:
    """Per-element log-prob where ``row_mask [N]`` is True, 0 elsewhere (NaN-safe gradients)."""
    m = _elem_view(row_mask, x_next.ndim)
    std = torch.as_tensor(std, dtype=mean.dtype, device=mean.device)
    safe_std = torch.where(m, std, torch.ones_like(std))
    lp = gaussian_log_prob(x_next.to(mean.dtype), mean, safe_std)
    return torch.where(m, lp, torch.zeros_like(lp))


def reduce_log_prob(
    logp: torch.Tensor,
    stoch: torch.Tensor,
    elem_dims: int | None = None,
    elem_reduce: str = "sum",
    step_reduce: str = "sum",
    keep: int = 0,
) -> torch.Tensor:
    """Reduce per-element log-probs ``[B, K, *E]`` over elements and stochastic steps.

    Elements: ``elem_reduce`` ("sum" or "mean") over the first ``elem_dims - keep`` element dims;
    the last ``keep`` element dims stay. ``elem_dims = len(E)`` (``None`` infers
    ``logp.ndim - 2``). Steps: ``step_reduce`` over the K transitions where ``stoch [B, K]`` is
    True: "sum"; "mean" (divide by the number of stochastic steps of the sample, at least 1); or
    "none" (keep K). The result is ``[B, *E[-keep:]]`` (``[B, K, *E[-keep:]]`` for "none").

    For an action chunk ``E = [C, A]``: ``keep=0`` is the chunk-level log-prob ``[B]`` (pi_RL
    "chunk level"), ``keep=2`` the per-dimension log-prob ``[B, C, A]`` (one ratio per action
    dimension), ``keep=1`` per action dim summed over the chunk ``[B, A]``. For an image latent,
    ``elem_reduce="mean"`` gives Flow-GRPO's per-element mean.
    """
    if elem_dims is None:
        elem_dims = logp.ndim - 2
    if logp.ndim != 2 + elem_dims:
        raise ValueError(f"logp has {logp.ndim} dims, expected 2 + elem_dims = {2 + elem_dims}")
    if not 0 <= keep <= elem_dims:
        raise ValueError(f"keep must be in [0, elem_dims={elem_dims}], got {keep}")
    if elem_reduce not in ("sum", "mean") or step_reduce not in ("sum", "mean", "none"):
        raise ValueError(
            f"elem_reduce in ('sum', 'mean') and step_reduce in ('sum', 'mean', "
            f"'none'), got {elem_reduce!r}, {step_reduce!r}"
        )
    dims = tuple(range(2, 2 + elem_dims - keep))
    x = logp
    if dims:
        x = x.sum(dims) if elem_reduce == "sum" else x.mean(dims)  # [B, K, *kept]
    m = stoch.to(device=x.device, dtype=torch.bool).reshape(*stoch.shape, *([1] * keep))
    x = torch.where(m, x, torch.zeros_like(x))
    if step_reduce == "none":
        return x
    total = x.sum(1)
    if step_reduce == "mean":
        count = m.sum(1).clamp(min=1).to(total.dtype)
        total = total / count
    return total
