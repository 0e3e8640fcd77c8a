"""`LoadedSim`: a simulator wrapper that adds a calibrated compute load to every step.

The embedded ReachSim steps in about a millisecond, far cheaper than any policy, so a placement
benchmark on it would measure nothing but inference. ``LoadedSim`` wraps a simulator and after
each ``step_chunk`` burns ``work`` rounds of a matmul + tanh on ``num_envs * C * 16`` rows: CPU
time proportional to the env-steps simulated, like a physics engine or a renderer. The benchmark
(`benchmarks/placement.py`) calibrates ``work`` so one decision of the simulator costs what one
decision of the policy costs. The results are those of the wrapped simulator, untouched.

``delay_s`` instead (or as well) sleeps that many seconds per env-step: a simulator that runs on
another device (a GPU renderer, a remote physics server) and leaves this machine's CPU free.
"""

from __future__ import annotations

import time

import torch

from mmrl.simulator import Simulator

WIDTH = 64  # busy-work row width
ROWS = 16  # busy-work rows per env-step: big enough matmuls that the per-op overhead is negligible
BLOCK = 512  # rows per matmul (128 KiB: stays in cache)
# the cost must stay proportional to the env-steps at any batch size, or a stage of N/S envs would
# not cost 1/S of the whole batch (per-op overhead for small batches, cache misses for big ones)


class LoadedSim(Simulator):
    """``inner`` plus ``work`` busy-work rounds over ``num_envs * C`` rows per ``step_chunk`` (and
    ``delay_s`` seconds of sleep per env-step)."""

    def __init__(self, inner: Simulator, work: int = 0, delay_s: float = 0.0):
        self.inner, self.work, self.delay_s = inner, int(work), float(delay_s)
        for key in ("num_envs", "action_dim", "max_episode_steps", "image_shape", "state_dim", "device"):
            setattr(self, key, getattr(inner, key))
        self._w, self._x = burn_weights()

    def reset(self, seed=None):
        return self.inner.reset(seed)

    def step_chunk(self, actions: torch.Tensor, trace: bool = False):
        res = self.inner.step_chunk(actions, trace=trace)
        burn(self.work, self.num_envs * actions.shape[1], self._w, self._x)
        if self.delay_s:
            time.sleep(self.delay_s * self.num_envs * actions.shape[1])
        return res

    def close(self) -> None:
        self.inner.close()

    def get_state(self) -> dict:
        return self.inner.get_state()

    def set_state(self, state: dict) -> None:
        self.inner.set_state(state)


def burn_weights() -> tuple[torch.Tensor, torch.Tensor]:
    """Fixed busy-work weights with gain 2: tanh keeps the rows in (-1, 1) without decaying them
    towards denormal floats (which would make the cost drift with the number of rounds)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(WIDTH, WIDTH, generator=g) * (2.0 / WIDTH**0.5), torch.randn(1, WIDTH, generator=g)


def burn(work: int, rows: int, w: torch.Tensor, x: torch.Tensor) -> float:
    """``work`` rounds of ``h = tanh(h @ w)`` on ``rows * ROWS`` rows, in cache-sized blocks so the
    cost is proportional to ``rows`` at any size; returns a checksum (keeps the work live)."""
    total, check = rows * ROWS, 0.0
    for start in range(0, total, BLOCK):
        h = x.expand(min(BLOCK, total - start), -1).contiguous()
        for _ in range(work):
            h = torch.tanh(h @ w)
        check += float(h[0, 0])
    return check


def loaded_reach(
    num_envs: int, seed: int = 0, device: str = "cpu", work: int = 0, delay_s: float = 0.0, **kwargs
) -> LoadedSim:
    """A `LoadedSim` around `simulators.reach.ReachSim` (a picklable worker factory target)."""
    from .reach import ReachSim

    return LoadedSim(ReachSim(num_envs=num_envs, seed=seed, device=device, **kwargs), work, delay_s)


def time_burn(work: int, rows: int, repeats: int = 5) -> float:
    """Median seconds of one `burn` of ``work`` rounds on ``rows`` rows (for calibration)."""
    w, x = burn_weights()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        burn(work, rows, w, x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
