"""Placement: which process / device renders (simulates), rolls out (infers), trains and rewards.

Declared in config (`PlacementConfig`, the ``placement`` section), not written into the loop:

- ``collocated``: `mmrl.trainer.rollout.collect_episodes` in the main process (simulate, then infer);
- ``disaggregated``: the simulator in a `SimWorker` process, inference in the main process;
- ``hybrid``: S sim workers, one per contiguous slice of the env batch, pipelined against
  inference by `collect_pipelined` (stage s simulates while stage s+1 infers).

The local backend uses ``spawn``-ed processes on this machine; the Ray backend (multi-node) is
declared but not implemented (`PlacementConfig.check_backend`).
"""

from mmrl.placement.config import BACKENDS, MODES, ROLES, PlacementConfig
from mmrl.placement.pipeline import collect, collect_pipelined
from mmrl.placement.worker import (
    SimWorker,
    WorkerCrashed,
    WorkerError,
    build_registered_sim,
    close_workers,
    registered_sim,
    start_sim_workers,
)

__all__ = [
    "BACKENDS", "MODES", "ROLES", "PlacementConfig", "SimWorker", "WorkerCrashed", "WorkerError",
    "build_registered_sim", "close_workers", "collect", "collect_pipelined", "registered_sim",
    "start_sim_workers",
]
