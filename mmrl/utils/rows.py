"""Random draws that belong to rows of a batch, the same whichever process holds the rows.

With N ranks each rank holds a slice of the global batch (its environments in a rollout, its part of
a minibatch in an update). For the run to equal the one-process run, a row must get the noise it
would get there: every rank draws the global batch's noise from the same generator (all ranks hold
it in the same state) and keeps its own rows. The caller that knows the slice says so:

    with batch_rows(offset=rank * n, count=n, total=world * n):
        out = policy.rollout(obs, generator=g)     # inside: randn_rows((n, C, A), generator=g)

Outside `batch_rows`, or for a draw whose leading size is not ``count`` (a draw that is not one row
per batch row), each function is exactly the torch call it names: one process draws what it always
drew. The global draw costs ``total / count`` times the noise of a local one, which is small next
to the model it feeds.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rows:
    """Rows ``[offset, offset + count)`` of a batch of ``total`` rows."""

    offset: int
    count: int
    total: int

    def __post_init__(self):
        if not 0 <= self.offset <= self.offset + self.count <= self.total:
            raise ValueError(f"rows [{self.offset}, {self.offset + self.count}) do not lie in a batch of {self.total}")


_ROWS: ContextVar[Rows | None] = ContextVar("mmrl_batch_rows", default=None)


@contextlib.contextmanager
def batch_rows(offset: int, count: int, total: int):
    """Draws of ``count`` rows inside are rows ``[offset, offset + count)`` of a ``total``-row draw."""
    token = _ROWS.set(Rows(offset, count, total) if (offset, count) != (0, total) else None)
    try:
        yield
    finally:
        _ROWS.reset(token)


@contextlib.contextmanager
def sub_rows(start: int, count: int):
    """Inside `batch_rows`: rows ``[start, start + count)`` of the rows it names (a pipeline stage
    of a rank's envs); outside, nothing changes."""
    outer = _ROWS.get()
    if outer is None:
        yield
        return
    with batch_rows(outer.offset + start, count, outer.total):
        yield


def _global(shape) -> tuple[tuple[int, ...], slice | None]:
    shape = tuple(shape)
    rows = _ROWS.get()
    if rows is None or not shape or shape[0] != rows.count:
        return shape, None
    return (rows.total, *shape[1:]), slice(rows.offset, rows.offset + rows.count)


def randn_rows(shape, generator=None, device=None, dtype=None) -> torch.Tensor:
    """`torch.randn` of ``shape`` whose rows are those of the global batch (see the module docstring)."""
    full, keep = _global(shape)
    out = torch.randn(full, generator=generator, device=device, dtype=dtype)
    return out if keep is None else out[keep]


def rand_rows(shape, generator=None, device=None, dtype=None) -> torch.Tensor:
    """`torch.rand` of ``shape`` whose rows are those of the global batch."""
    full, keep = _global(shape)
    out = torch.rand(full, generator=generator, device=device, dtype=dtype)
    return out if keep is None else out[keep]


def randint_rows(high: int, shape, generator=None, device=None) -> torch.Tensor:
    """`torch.randint(0, high, shape)` whose rows are those of the global batch."""
    full, keep = _global(shape)
    out = torch.randint(0, high, full, generator=generator, device=device)
    return out if keep is None else out[keep]


def rows_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """A generator for draws that cannot be taken as rows of a global draw (a multinomial over a
    vocabulary, an engine's sampling seed): ``generator`` itself outside `batch_rows`; inside, a
    generator of these rows' own, seeded from one number drawn from ``generator`` (every rank draws
    it, so their generators stay in step) and the rows' offset (so no two ranks sample alike)."""
    rows = _ROWS.get()
    if rows is None or generator is None:
        return generator
    base = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
    own = torch.Generator(device=generator.device)
    own.manual_seed(base + rows.offset)
    return own
