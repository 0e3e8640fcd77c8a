"""The learner: the one part of the trainer's loop that differs between the on- and the off-policy
modes, behind one small interface, so that the loop itself (`mmrl.trainer.trainer.Trainer`) holds one
``learner`` and never asks which mode it runs.

- `mmrl.trainer.on_policy.OnPolicy` (PPO, GRPO, AWM, DiffusionNFT): trains on the rollout it was
  given (reward scaling, advantages, minibatch epochs), then forgets it.
- `mmrl.trainer.off_policy.OffPolicy` (SAC, RLPD): stores the rollout's transitions in a replay
  buffer and takes gradient steps on batches replayed from it; acts at random before learning starts
  and adds RLPD's demonstrations after the warm start.

Each keeps its own state in checkpoints under its ``checkpoint_key`` (``"reward_scaler"`` /
``"off_policy"``: the names checkpoints have always used, so an older checkpoint resumes the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from mmrl.batch import Batch


@runtime_checkable
class Learner(Protocol):
    """The learn stage of the trainer's loop, and what it keeps between iterations."""

    #: the key of its state among a checkpoint's extras
    checkpoint_key: str

    def behaviour(self, policy, env_steps: int):
        """Who acts in the next rollout, after ``env_steps`` environment steps: ``policy`` itself, or
        something that acts in its place (the off-policy mode's uniform actions before learning starts)."""
        ...

    def learn(self, it: int, batch: Batch, info: dict, gen: torch.Generator, env_steps: int) -> dict:
        """Learn from iteration ``it``'s rollout (``batch`` [T, N, ...], the collector's ``info``),
        ``gen`` continuing the rollout's random stream, after ``env_steps`` environment steps in all;
        returns the metrics to log (``train/...``)."""
        ...

    def after_warm_start(self, records: Callable[..., dict], log: Callable[[str], None]) -> None:
        """Called once the warm start is done, with the warm start's dataset loader
        (`mmrl.trainer.warm_start.WarmStart.load_records`) and the trainer's line for the user."""
        ...

    def state_dict(self) -> dict | None:
        """What a resume needs beside the policy, the engine and the counters; None: nothing to save."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (from a checkpoint)."""
        ...
