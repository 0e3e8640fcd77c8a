"""`LoadedSim`: a simulator wrapper that adds a calibrated compute load to every step.

The embedded ReachSim steps in about a millisecond, far cheaper than any policy, so a placement
benchmark on it would measure nothing but inference. ``LoadedSim`` wraps a simulator and after
each ``step_chunk`` burns ``work`` rounds of a small matmul + tanh on ``num_envs * C`` rows: CPU
time proportional to the env-steps simulated, like a physics engine or a renderer. The benchmark
(`benchmarks/placement.py`) calibrates ``work`` so one decision of the simulator costs what one
decision of the policy costs. The results are those of the wrapped simulator, untouched.
"""

from __future__ import annotations

import time

import torch

from simulators.base import Simulator

WIDTH = 64  # busy-work row width


class LoadedSim(Simulator):
    """``inner`` plus ``work`` busy-work rounds over ``num_envs * C`` rows per ``step_chunk``."""

    def __init__(self, inner: Simulator, work: int = 0):
        self.inner, self.work = inner, int(work)
        for key in ("num_envs", "action_dim", "max_episode_steps", "image_shape", "state_dim", "device"):
            setattr(self, key, getattr(inner, key))
        g = torch.Generator().manual_seed(0)
        self._w = torch.randn(WIDTH, WIDTH, generator=g) / WIDTH**0.5
        self._x = torch.randn(1, WIDTH, generator=g)

    def reset(self, seed=None):
        return self.inner.reset(seed)

    def step_chunk(self, actions: torch.Tensor):
        res = self.inner.step_chunk(actions)
        burn(self.work, self.num_envs * actions.shape[1], self._w, self._x)
        return res

    def close(self) -> None:
        self.inner.close()

    def get_state(self) -> dict:
        return self.inner.get_state()

    def set_state(self, state: dict) -> None:
        self.inner.set_state(state)


def burn(work: int, rows: int, w: torch.Tensor, x: torch.Tensor) -> float:
    """``work`` rounds of ``x = tanh(x @ w)`` on ``rows`` rows; returns a checksum (keeps it live)."""
    h = x.expand(rows, -1).contiguous()
    for _ in range(work):
        h = torch.tanh(h @ w)
    return float(h[0, 0])


def loaded_reach(num_envs: int, seed: int = 0, device: str = "cpu", work: int = 0, **kwargs) -> LoadedSim:
    """A `LoadedSim` around `simulators.reach.ReachSim` (a picklable worker factory target)."""
    from simulators.reach import ReachSim

    return LoadedSim(ReachSim(num_envs=num_envs, seed=seed, device=device, **kwargs), work)


def time_burn(work: int, rows: int, repeats: int = 5) -> float:
    """Median seconds of one `burn` of ``work`` rounds on ``rows`` rows (for calibration)."""
    w, x = torch.eye(WIDTH) * 0.5, torch.ones(1, WIDTH)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        burn(work, rows, w, x)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
