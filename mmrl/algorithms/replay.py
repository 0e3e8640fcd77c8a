"""A replay buffer for the off-policy mode (issue 36), and RLPD's demonstration mixing.

`ReplayBuffer` keeps the newest ``capacity`` transitions as a dict of tensors (any fields, each
``[capacity, ...]``, allocated on the first `add` with that batch's shapes and dtypes) in host
memory or on the device (``device``), written in a ring. `sample` draws rows uniformly with
replacement from a ``torch.Generator``, so a run that restores the buffer and the generator draws
the same batches again. `state_dict` holds only the filled rows and the ring position: a checkpoint
that saves it resumes the buffer exactly (`load_state_dict`).

`mixed_sample` is RLPD's symmetric sampling (Ball et al. 2023): each batch takes a fixed fraction of
its rows (one half by default) from the demonstrations and the rest from the online buffer.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


class ReplayBuffer:
    """Ring buffer of transitions (see the module docstring)."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu"):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity, self.device = int(capacity), torch.device(device)
        self.data: dict[str, Tensor] = {}
        self.pos = 0  # the next row written
        self.size = 0  # rows filled

    def __len__(self) -> int:
        return self.size

    def add(self, batch: dict[str, Tensor]) -> None:
        """Append ``batch`` (every field ``[B, ...]`` with the same B): the oldest rows are overwritten
        once the buffer is full."""
        if not batch:
            raise ValueError("add needs at least one field")
        sizes = {k: v.shape[0] for k, v in batch.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"every field must have the same number of rows, got {sizes}")
        if self.data and set(batch) != set(self.data):
            raise ValueError(f"fields {sorted(batch)} differ from the buffer's {sorted(self.data)}")
        for k, v in batch.items():
            if k not in self.data:
                self.data[k] = torch.zeros(self.capacity, *v.shape[1:], dtype=v.dtype, device=self.device)
            elif self.data[k].shape[1:] != v.shape[1:]:
                raise ValueError(
                    f"field '{k}' has rows {tuple(v.shape[1:])}, the buffer's {tuple(self.data[k].shape[1:])}"
                )
        b = next(iter(sizes.values()))
        if b > self.capacity:  # only the newest capacity rows survive
            batch = {k: v[-self.capacity :] for k, v in batch.items()}
            b = self.capacity
        rows = (self.pos + torch.arange(b)) % self.capacity
        for k, v in batch.items():
            self.data[k][rows.to(self.device)] = v.to(self.device)
        self.pos = (self.pos + b) % self.capacity
        self.size = min(self.size + b, self.capacity)

    def sample(self, n: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """``n`` rows drawn uniformly with replacement (indices from ``generator`` on the CPU)."""
        if self.size == 0:
            raise ValueError("cannot sample an empty replay buffer: add transitions first")
        idx = torch.randint(0, self.size, (n,), generator=generator).to(self.device)
        return {k: v[idx] for k, v in self.data.items()}

    def state_dict(self) -> dict:
        """The filled rows (in storage order) and the ring position, for a checkpoint."""
        return {
            "capacity": self.capacity,
            "pos": self.pos,
            "size": self.size,
            "data": {k: v[: self.size].cpu().clone() for k, v in self.data.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"the saved buffer held {state['capacity']} transitions, this one {self.capacity}: resume "
                "with the same capacity"
            )
        self.pos, self.size = int(state["pos"]), int(state["size"])
        self.data = {}
        for k, v in state["data"].items():
            full = torch.zeros(self.capacity, *v.shape[1:], dtype=v.dtype, device=self.device)
            full[: self.size] = v.to(self.device)
            self.data[k] = full


def mixed_sample(
    online: ReplayBuffer,
    demos: ReplayBuffer,
    n: int,
    demo_fraction: float = 0.5,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """RLPD's batch: ``round(demo_fraction * n)`` rows from ``demos``, the rest from ``online``,
    concatenated (demonstrations first) with an ``is_demo`` bool field."""
    if not 0.0 <= demo_fraction <= 1.0:
        raise ValueError(f"demo_fraction must be in [0, 1], got {demo_fraction}")
    k = round(demo_fraction * n)
    parts = []
    for buf, m, flag in ((demos, k, True), (online, n - k, False)):
        if m:
            rows = buf.sample(m, generator)
            rows["is_demo"] = torch.full((m,), flag, dtype=torch.bool, device=buf.device)
            parts.append(rows)
    return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
