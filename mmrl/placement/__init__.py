"""Placement: which process / device renders (simulates), rolls out (infers), trains and rewards.

Declared in config (`PlacementConfig`, the ``placement`` section), not written into the loop:

- ``collocated``: `mmrl.rollout.collect_episodes` in the main process (simulate, then infer);
- ``disaggregated``: the simulator in a `SimWorker` process, inference in the main process;
- ``hybrid``: S sim workers, one per contiguous slice of the env batch, pipelined against
  inference by `collect_pipelined` (stage s simulates while stage s+1 infers).

The local backend uses ``spawn``-ed processes on this machine; the Ray backend (multi-node) puts
each sim worker in a Ray actor (`RaySimWorker`), the workers of one placement in a Ray placement
group (``pip install 'mmrl[ray]'``; Ray is imported only when used).
"""

from mmrl.placement.config import BACKENDS, MODES, ROLES, PlacementConfig
from mmrl.placement.pipeline import LazySim, SimGroup, collect, collect_pipelined
from mmrl.placement.ray_worker import RaySimWorker
from mmrl.placement.start import build_registered_sim, registered_sim, start_sim_workers
from mmrl.placement.worker import SimWorker, WorkerCrashed, WorkerError, close_workers

__all__ = [
    "BACKENDS",
    "LazySim",
    "MODES",
    "ROLES",
    "PlacementConfig",
    "RaySimWorker",
    "SimGroup",
    "SimWorker",
    "WorkerCrashed",
    "WorkerError",
    "build_registered_sim",
    "close_workers",
    "collect",
    "collect_pipelined",
    "registered_sim",
    "start_sim_workers",
]
