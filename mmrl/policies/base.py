"""The policy contract shared by every family (VLA, VLM, diffusion).

A policy turns a batch of observations into actions plus everything training needs later, and
evaluates log-probs / values / entropy of given actions:

- ``rollout(obs, generator, mode)`` -> `Batch` with ``actions`` (what the environment executes),
  ``old_logp`` (behaviour log-prob at the policy's log-prob level), ``old_values`` (critic, if any)
  and the replay inputs that ``evaluate`` needs (observations as tensors, a flow chain, tokens...).
- ``evaluate(batch)`` -> dict with ``logp`` (same shape as ``old_logp``), ``values`` and ``entropy``,
  differentiable w.r.t. the policy's parameters.
- ``supervised_loss(batch)`` -> per-sample loss for warm start on demonstrations.
- ``likelihood_free_loss(batch, advantages)`` -> per-sample loss for objectives that need no
  log-likelihood (advantage-weighted matching).

Observations cross into a `Batch` as tensors only: instruction strings are stored as padded UTF-8
bytes (``encode_text`` / ``decode_text``) so they index, flatten and checkpoint like any tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mmrl.batch import Batch
from mmrl.config import Variants

TEXT_BYTES = 96  # default width of a stored instruction (longer ones are rejected, not cut)


def encode_text(texts: list[str], width: int = TEXT_BYTES) -> torch.Tensor:
    """Strings -> uint8 [B, width] zero-padded UTF-8 (raises if one does not fit)."""
    out = torch.zeros(len(texts), width, dtype=torch.uint8)
    for i, text in enumerate(texts):
        data = text.encode("utf-8")
        if len(data) > width:
            raise ValueError(
                f"instruction of {len(data)} bytes exceeds the {width}-byte text field: {text[:40]!r}... "
                f"Fix: raise policy text width or shorten the instruction"
            )
        if data:
            out[i, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def decode_text(data: torch.Tensor) -> list[str]:
    """uint8 [B, width] -> strings (inverse of `encode_text`)."""
    rows = data.reshape(-1, data.shape[-1]).cpu().numpy()
    return [bytes(r).rstrip(b"\0").decode("utf-8") for r in rows]


@dataclass
class PolicyConfig(Variants):
    """The ``policy`` section; its ``type`` picks a family's config (e.g. `FlowVLAConfig`)."""

    type: str = "flow_vla"


class Policy(nn.Module):
    """Base class of every policy family; see the module docstring for the contract."""

    #: shape of one sample's log-prob after the leading batch dim, e.g. () chunk-level, (C, A) per dim
    logp_shape: tuple[int, ...] = ()
    has_critic: bool = False
    #: whether rollouts carry ``ref_logp`` (log-probs under a frozen reference) for a KL penalty
    provides_ref_logp: bool = False
    #: why background rollout by a deep copy of the policy (trainer.async_staleness) cannot work;
    #: None = it can
    async_unsupported: str | None = None

    @classmethod
    def kl_support(cls, cfg) -> str | None:
        """None if this policy (with config ``cfg``) can compute a KL to a reference, else the fix."""
        return None if cls.provides_ref_logp else "set algorithm.kl_coef=0"

    def after_warm_start(self) -> None:
        """Called once the supervised warm start is done (e.g. to take a reference copy)."""

    def after_step(self) -> None:
        """Called after every optimizer step of the RL update (e.g. to update an EMA copy)."""

    def sync_rollout(self) -> None:
        """Called after each RL update: push weights to an out-of-process rollout engine and release
        per-iteration caches (default: nothing; the policy samples with its own weights)."""

    def rollout_stats(self) -> dict[str, float]:
        """Metrics of the last training rollout for the log (e.g. engine-vs-trainer log-prob mismatch)."""
        return {}

    def value(self, obs) -> torch.Tensor | None:
        """Critic value ``[B]`` of observations (an `Observation` of B envs), or None without a
        critic. The trainer bootstraps with it where a rollout is cut without the episode ending
        (a time limit, or the end of a fixed-length rollout)."""
        return None

    def update_statistics(self, batch: Batch) -> None:
        """Called once per RL iteration after the update, with the iteration's rollout [T, N, ...]:
        update running statistics the policy keeps (e.g. observation normalisation). Updating them
        after the update, not during the rollout, keeps the PPO ratio exactly 1 on the first
        minibatch: rollout and update see the same statistics."""

    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Batch:
        raise NotImplementedError

    def evaluate(self, batch: Batch) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no supervised warm start")

    def likelihood_free_loss(self, batch: Batch, advantages: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no likelihood-free objective")
