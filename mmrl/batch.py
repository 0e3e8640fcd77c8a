"""The one batch type that flows between collector, reward, advantage and loss.

A `Batch` is a dict of tensors that share leading dimensions. Rollouts of simulators are stored
time-major as ``[T, N, ...]`` (T decision steps, N environments) and flattened to ``[T*N, ...]``
for the update; single-turn tasks (a VLM answer, a generated image) are episodes of length T=1.
Every key the core uses is documented in `KEYS`; components may add their own keys (a policy's
replay inputs, say) and should document them next to where they are produced.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def random_indices(high: int, n: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Row indices for a Batch: a permutation of ``range(high)`` (``n`` None) or ``n`` draws from it,
    as a CPU tensor, which indexes rows on either device. They are drawn on ``generator``'s own
    device: a run's generator lives on the run's device, and CUDA refuses a CUDA generator for a
    draw on the CPU ("Expected a 'cpu' device type for generator but found 'cuda'")."""
    device = generator.device if generator is not None else torch.device("cpu")
    if n is None:
        return torch.randperm(high, generator=generator, device=device).cpu()
    return torch.randint(0, high, (n,), generator=generator, device=device).cpu()


KEYS: dict[str, str] = {
    # observations (what the policy saw at each decision)
    "image": "uint8 [.., H, W, 3] camera image (several cameras: [.., V, H, W, 3])",
    "state": "float [.., D] proprioceptive / low-dimensional state (optional)",
    "instruction": "uint8 [.., W] instruction / prompt as zero-padded UTF-8 (`mmrl.policies.base.encode_text`)",
    # what the rollout produced
    "actions": "float [.., C, A] what the environment executes (an action chunk of C steps of A dims)",
    "old_logp": "float [.., *R] behaviour log-prob at the policy's log-prob level R (see policy)",
    "old_values": "float [..] critic value at rollout time",
    "ref_logp": "float [.., *R] log-prob under the frozen reference (policies with provides_ref_logp)",
    "flow_chain": "float [.., K+1, C, A] denoising chain x_K..x_0 (replay input of flow policies)",
    "flow_stoch": "bool [.., K] which denoising transitions were stochastic",
    "flow_action": "float [.., C, A] executed chunk, normalised, drawn by a Gaussian on x_0 (flow VLA action_noise)",
    "action_tokens": "long [.., C*A] generated action-bin tokens (replay input of the token VLA)",
    "completion": "long [.., L] generated answer tokens (VLM; right-padded)",
    "completion_mask": "bool [.., L] real answer tokens of ``completion``",
    "uid": "long [..] key of the prompt encoding a VLM rollout cached for its update",
    "engine_logp": "float [.., L] log-probs reported by the rollout engine (VLM with recompute_logp)",
    "is_weight": "float [.., L] truncated importance weight trainer-vs-engine (VLM with tis_cap)",
    "index": "long [..] row of a policy-held warm-start record (VLM supervised batch)",
    # environment feedback
    "rewards": "float [..] reward summed over the executed chunk",
    "dones": "bool [..] episode ended (terminated or truncated) during this chunk",
    "terminated": "bool [..] ended by success/failure (no bootstrap)",
    "truncated": "bool [..] ended by the time limit (the return is bootstrapped, see bootstrap)",
    "bootstrap": "float [..] critic value of the last observation where the time limit cut the episode, else 0",
    "success": "bool [..] task success reached during this chunk",
    "env_steps": "long [..] environment steps executed by this decision (< C when the episode ended mid-chunk)",
    "valid": "bool [..] this decision happened (False after the episode ended)",
    "group": "long [..] id of the group of episodes that share an initial state (GRPO)",
    "task": "long [..] id of the episode's task (`mmrl.rollout.task_ids`; simulators naming tasks in meta)",
    # computed by the trainer
    "advantages": "float [.., *R] advantage, broadcastable to old_logp",
    "returns": "float [..] value targets",
}


class Batch(dict):
    """A dict of tensors sharing leading dimensions, with a few helpers."""

    @property
    def size(self) -> int:
        first = next(iter(self.values()))
        return first.shape[0]

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.items()})

    def index(self, idx: torch.Tensor | slice) -> Batch:
        return Batch({k: v[idx] for k, v in self.items()})

    def flatten(self, dims: int = 2) -> Batch:
        """Merge the first ``dims`` leading dimensions, e.g. [T, N, ...] -> [T*N, ...]."""
        return Batch({k: v.reshape(-1, *v.shape[dims:]) for k, v in self.items()})

    def minibatches(self, size: int, generator: torch.Generator | None = None) -> Iterator[Batch]:
        """Shuffled minibatches of ``size`` rows (the last one may be smaller)."""
        perm = random_indices(self.size, generator=generator)
        for start in range(0, self.size, size):
            yield self.index(perm[start : start + size])

    @staticmethod
    def stack(batches: list[Batch], dim: int = 0) -> Batch:
        return Batch({k: torch.stack([b[k] for b in batches], dim) for k in batches[0]})

    @staticmethod
    def cat(batches: list[Batch], dim: int = 0) -> Batch:
        return Batch({k: torch.cat([b[k] for b in batches], dim) for k in batches[0]})
