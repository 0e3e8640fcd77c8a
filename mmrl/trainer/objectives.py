"""Advantages and losses for a collected rollout, composed from the pure functions in
`mmrl.algorithms`. Read top to bottom: episode rewards -> advantages -> per-sample loss."""

from __future__ import annotations

import torch

from mmrl.algorithms import (aggregate_loss, gae, kl_penalty, ppo_clip_loss, psr_nsr_weights,
                             reinforce_pp_advantages, value_loss)
from mmrl.algorithms.losses import gspo_token_ratio
from mmrl.batch import Batch
from mmrl.registry import ADVANTAGES


def compute_advantages(batch: Batch, algo, last_values: torch.Tensor | None = None) -> Batch:
    """Adds ``advantages`` [T, N] and ``returns`` [T, N] to a time-major batch.

    ``gae`` uses the critic's ``old_values``. Where the time limit cut an episode (``bootstrap``
    [T, N]: the value of its last observation, see `mmrl.rollout.truncation_values`) the
    reward gets ``gamma * bootstrap`` added and the step stays terminal for GAE (SB3's scheme);
    ``last_values`` [N] bootstraps envs still running at the end of a fixed-length rollout.
    ``reinforce_pp`` (REINFORCE++) needs neither critic nor groups: each decision's discounted
    return-to-go, whitened over the batch's valid decisions. Every other estimator is group-based
    (GRPO family): the episode return is scored within its group of episodes that share an initial
    state, and that advantage is given to every valid decision of the episode.
    """
    valid = batch["valid"]
    rewards = batch["rewards"] * valid
    if algo.advantage == "gae":
        if "old_values" not in batch:
            raise ValueError("advantage 'gae' needs a critic: set policy.critic=true or use a "
                             f"group estimator ({', '.join(n for n in ADVANTAGES.names() if n != 'gae')})")
        if "bootstrap" in batch:
            rewards = rewards + algo.gamma * batch["bootstrap"].to(rewards) * valid
        values = batch["old_values"] * valid
        last = torch.zeros_like(values[0]) if last_values is None else last_values.to(values)
        adv, ret = gae(rewards, values, batch["dones"], last, algo.gamma, algo.lam, valid=valid)
    elif algo.advantage == "reinforce_pp":
        adv = reinforce_pp_advantages(rewards.T, valid.T, algo.gamma).T
        ret = rewards.sum(0)[None].expand_as(rewards)
    else:
        episode_return = rewards.sum(0)  # [N]
        group = batch["group"][0]
        adv_ep = ADVANTAGES.get(algo.advantage)(episode_return, group)
        adv = adv_ep[None].expand_as(rewards) * valid
        ret = episode_return[None].expand_as(rewards)
    batch["advantages"], batch["returns"] = adv.float(), ret.float()
    return batch


def valid_samples(batch: Batch, normalize: bool) -> Batch:
    """[T, N, ...] -> the valid decisions as rows [M, ...]; optionally whitened advantages."""
    flat = batch.flatten()
    flat = flat.index(flat["valid"])
    if normalize and flat.size > 1:
        a = flat["advantages"]
        flat["advantages"] = (a - a.mean()) / (a.std() + 1e-8)
    return flat


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


def ppo_loss(policy, mb: Batch, algo) -> tuple[torch.Tensor, dict]:
    """PPO-clip (clip-higher, dual clip) + value loss + optional entropy bonus, on a minibatch."""
    out = policy.evaluate(mb)
    logp, old = out.logp, mb["old_logp"]
    mask = out.logp_mask  # e.g. the real tokens of a completion, the stochastic denoising steps
    flat_mask = torch.ones(logp.shape[0], logp[0].numel(), dtype=torch.bool, device=logp.device) if mask is None \
        else mask.reshape(logp.shape[0], -1).bool()
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


def awm_objective(policy, mb: Batch, algo) -> tuple[torch.Tensor, dict]:
    """Advantage-weighted matching: flow-matching loss on rollout actions weighted by advantage."""
    per_sample = policy.likelihood_free_loss(mb, mb["advantages"])
    loss = per_sample.mean()
    return loss, {"awm_loss": loss.detach()}


OBJECTIVES = {"ppo": ppo_loss, "awm": awm_objective}
