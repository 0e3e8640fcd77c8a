"""DAPO dynamic sampling: drop groups whose rewards are all equal, refill until the batch is full.

A group whose samples all got the same reward has zero group-relative advantage, so it only
dilutes the gradient. DAPO (Yu et al. 2025) filters such groups out and keeps generating rollout
batches until ``target_groups`` informative groups are collected.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

__all__ = ["nonconstant_group_mask", "DynamicSamplingBuffer"]


def nonconstant_group_mask(rewards: Tensor, group: Tensor, atol: float = 0.0) -> Tensor:
    """Keep-mask of the DAPO filter. rewards ``[M]``, group ``[M]`` long -> bool ``[M]``.

    ``keep_i = max_{j in g(i)} r_j - min_{j in g(i)} r_j > atol``: True for every sample of a group
    whose rewards are not all equal (within ``atol``). A single-sample group is constant.
    """
    _, index = torch.unique(group, return_inverse=True)
    num = int(index.max()) + 1 if index.numel() else 0
    r = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    gmax = torch.full((num,), -torch.inf, dtype=r.dtype, device=r.device)
    gmin = torch.full((num,), torch.inf, dtype=r.dtype, device=r.device)
    gmax = gmax.scatter_reduce(0, index, r, reduce="amax")
    gmin = gmin.scatter_reduce(0, index, r, reduce="amin")
    return (gmax - gmin)[index] > atol


class DynamicSamplingBuffer:
    """Accumulates the non-constant groups of successive rollout batches.

    Usage::

        buf = DynamicSamplingBuffer(target_groups=32)
        while not buf.ready:
            batch, rewards, group = rollout()
            buf.add(batch, rewards, group)
        train_batch = buf.pop()   # exactly 32 groups; extra groups wait for the next pop

    ``add`` takes a dict of tensors whose first dim is the sample dim M, plus rewards ``[M]`` and
    group ids ``[M]``. ``pop`` returns the dict's keys concatenated over ``target_groups`` whole
    groups (in arrival order: batch by batch, by group id within a batch), plus ``reward_key``
    (the rewards) and ``group_key`` (group ids renumbered 0..target_groups-1, so groups from
    different batches never share an id).
    Counters are cumulative over the buffer's life: ``num_batches`` (calls to ``add``),
    ``num_filtered_groups`` (groups dropped as constant), ``num_kept_groups``.
    """

    def __init__(
        self,
        target_groups: int,
        atol: float = 0.0,
        group_key: str = "group",
        reward_key: str = "rewards",
    ):
        if target_groups < 1:
            raise ValueError(f"target_groups must be >= 1, got {target_groups}")
        self.target_groups = target_groups
        self.atol = atol
        self.group_key = group_key
        self.reward_key = reward_key
        self._groups: list[dict[str, Tensor]] = []
        self.num_batches = 0
        self.num_filtered_groups = 0
        self.num_kept_groups = 0

    def add(self, batch_dict: dict[str, Tensor], rewards: Tensor, group: Tensor) -> None:
        """Filter one rollout batch and keep its non-constant groups."""
        m = rewards.shape[0]
        if group.shape[0] != m:
            raise ValueError(f"rewards has {m} samples but group has {group.shape[0]}")
        for key, value in batch_dict.items():
            if not torch.is_tensor(value) or value.shape[0] != m:
                raise ValueError(f"batch_dict['{key}'] must be a tensor with first dim {m}")
        self.num_batches += 1
        keep = nonconstant_group_mask(rewards, group, self.atol)
        for gid in torch.unique(group):
            idx = (group == gid).nonzero(as_tuple=True)[0]
            if not bool(keep[idx[0]]):
                self.num_filtered_groups += 1
                continue
            entry = {k: v[idx] for k, v in batch_dict.items()}
            entry[self.reward_key] = rewards[idx]
            self._groups.append(entry)
            self.num_kept_groups += 1

    @property
    def num_groups(self) -> int:
        """Groups waiting in the buffer."""
        return len(self._groups)

    @property
    def ready(self) -> bool:
        return len(self._groups) >= self.target_groups

    def pop(self, partial: bool = False) -> dict[str, Tensor]:
        """The first ``target_groups`` groups as one dict of tensors; the rest stay buffered.
        ``partial``: fewer groups are fine (all that are buffered, at least one) -- for a rollout
        budget that ran out before the batch was full."""
        if not self._groups or not (self.ready or partial):
            raise RuntimeError(f"only {len(self._groups)} of {self.target_groups} groups collected; add more")
        taken, self._groups = self._groups[: self.target_groups], self._groups[self.target_groups :]
        out = {k: torch.cat([g[k] for g in taken]) for k in taken[0] if k != self.group_key}
        sizes = torch.tensor([g[self.reward_key].shape[0] for g in taken])
        device = taken[0][self.reward_key].device
        out[self.group_key] = torch.repeat_interleave(torch.arange(len(taken)), sizes).to(device)
        return out

    def clear(self) -> None:
        """Drop buffered groups (counters are kept)."""
        self._groups = []
