"""Starting the sim workers of a placement: one per stage, local processes (`SimWorker`) or Ray
actors (`RaySimWorker`), and the picklable factory of a registered simulator they build.

The one module that knows both backends; `worker` and `ray_worker` do not import each other
backwards (Ray's worker builds on the local one's wire format).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from mmrl.placement.worker import SimWorker, WorkerBase, close_workers


def build_registered_sim(sim_type: str, num_envs: int, seed: int = 0, device: str = "cpu", **kwargs):
    """Build registered simulator ``sim_type`` (a picklable factory target for worker processes)."""
    from mmrl.registry import SIMULATORS

    return SIMULATORS.build(sim_type, num_envs=num_envs, seed=seed, device=device, **kwargs)


def registered_sim(sim_type: str, **kwargs) -> Callable:
    """A factory ``f(num_envs=, seed=, device=)`` of a registered simulator, for `start_sim_workers`."""
    return functools.partial(build_registered_sim, sim_type, **kwargs)


def start_sim_workers(factory: Callable, num_envs: int, placement, seed: int = 0) -> list[WorkerBase]:
    """One worker per stage of ``placement`` (a `PlacementConfig`), stage s holding the envs of
    ``placement.stage_slices(num_envs)[s]``. ``factory(num_envs=, seed=, device=)`` builds a
    simulator; the workers start in parallel. ``placement.backend`` picks the kind: `SimWorker`
    processes (local) or `RaySimWorker` actors in one Ray placement group (ray)."""
    placement.validate()
    placement.check_backend()
    if placement.mode == "collocated":
        raise ValueError(
            "placement.mode = 'collocated' simulates in the main process: no workers "
            "to start (valid modes for workers: disaggregated, hybrid)"
        )
    slices = placement.stage_slices(num_envs)
    make: Callable[..., WorkerBase] = SimWorker
    if placement.backend == "ray":
        from mmrl.placement.ray_worker import RayPlacement, RaySimWorker

        group = RayPlacement(
            placement.num_workers, placement.ray_strategy, gpu=placement.render_device.startswith("cuda")
        )
        make = functools.partial(RaySimWorker, group=group)  # each worker takes a bundle
    workers: list[WorkerBase] = []
    try:
        for s, part in enumerate(slices):
            f = functools.partial(
                factory, num_envs=part.stop - part.start, seed=seed + s, device=placement.render_device
            )
            workers.append(
                make(
                    f,
                    name=f"sim{s}",
                    torch_threads=placement.torch_threads,
                    max_restarts=placement.max_restarts,
                    timeout_s=placement.step_timeout_s,
                    start=False,
                )
            )
            workers[-1].start()
        for w in workers:
            w.wait_ready()
    except BaseException:
        close_workers(workers)
        raise
    return workers
