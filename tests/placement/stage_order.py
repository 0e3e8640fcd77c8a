"""`StageByStage`: the reference for hybrid train-mode collections, in this process.

A hybrid collection of S stages calls the policy once per stage and decision, on that stage's
N/S envs, stage 0, 1, ..., S-1 in turn, all from one generator (`mmrl.placement.pipeline`). A
Flow-SDE train rollout makes several draws per call (start noise, then one per stochastic
denoising step), so S calls of N/S rows interleave the generator's numbers differently from one
call of N rows: hybrid and collocated collections are equal in distribution, not bit for bit.

`StageByStage` wraps a policy so that one train-mode call on N rows makes exactly those S calls on
N/S rows, in stage order, and concatenates their outputs (eval-mode calls pass through whole: a
trainer evaluates in-process, unsplit, in every placement). `collect_episodes` with it (one in-process
simulator) consumes the generator in the order the pipeline does, so it must reproduce a hybrid
collection bit for bit: every reward, action, denoising chain, old log-prob and value. Its
samples have the collocated policy's distribution, because every draw is an independent N(0, 1)
number either way (only which env receives which number changes), which is why "hybrid equals
this reference exactly" proves "hybrid equals collocated in distribution".
"""

from __future__ import annotations

import torch

from mmrl.batch import Batch
from mmrl.policies.base import Decision


class StageByStage:
    """``policy`` whose train-mode `rollout` on N observations runs as ``stages`` calls on N/S rows each."""

    def __init__(self, policy, stages: int):
        if stages < 1:
            raise ValueError(f"stages must be >= 1, got {stages}")
        self.policy, self.stages, self.cfg, self.chunk_size = policy, stages, policy.cfg, policy.chunk_size
        self._rollout = policy.rollout  # the bound method: `install` may replace the attribute

    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Batch:
        if mode != "train":
            return self._rollout(obs, generator=generator, mode=mode)
        n = obs.image.shape[0]
        if n % self.stages:
            raise ValueError(f"{self.stages} stages do not divide {n} envs")
        k = n // self.stages
        parts = [
            self._rollout(obs.index(torch.arange(s * k, (s + 1) * k)), generator=generator, mode=mode)
            for s in range(self.stages)
        ]
        batch = Batch.cat([p.batch for p in parts], dim=0)
        return Decision(batch, batch["actions"])

    def __getattr__(self, name: str):  # every other hook (e.g. `value`) is the policy's own
        policy = self.__dict__.get("policy")
        if policy is None or name.startswith("__"):  # (copy / pickle probe dunders on a bare object)
            raise AttributeError(name)
        return getattr(policy, name)

    @classmethod
    def install(cls, policy, stages: int) -> None:
        """Make ``policy.rollout`` itself sample stage by stage (for a policy inside a trainer)."""
        policy.rollout = cls(policy, stages).rollout
