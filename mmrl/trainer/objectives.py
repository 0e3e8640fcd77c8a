"""Advantages and losses for a collected rollout, composed from the pure functions in
`mmrl.algorithms`. Read top to bottom: episode rewards -> advantages -> per-sample loss.

The objectives the config can name (``algorithm.objective``) are registered in
`mmrl.registry.OBJECTIVES` beside their definitions, with the registry's one signature
``objective(policy, minibatch, algo) -> (loss, metrics)`` and what they need from the policy
(`mmrl.capabilities.Component`): a plugin adds one the same way (or by the ``mmrl.objectives``
entry point)."""

from __future__ import annotations

import torch

from mmrl.algorithms import aggregate_loss, kl_penalty, ppo_clip_loss, psr_nsr_weights, value_loss
from mmrl.algorithms.losses import gspo_token_ratio
from mmrl.batch import Batch
from mmrl.capabilities import component
from mmrl.registry import ADVANTAGES, OBJECTIVES


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
