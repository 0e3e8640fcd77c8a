"""`RaySimWorker`: a simulator owned by a Ray actor (the ``render`` role of the Ray backend).

The same interface as the local backend's `SimWorker` (`collect_pipelined` drives either): the actor
builds its simulator from the same picklable ``factory`` and serves the same requests through
`handle_request`. `submit` calls the actor and keeps the ObjectRef in a FIFO; `result` waits for
the oldest one, so answers come back in request order and those marked by `discard_pending` are
dropped. Tensors travel as numpy buffers (the local wire format); everything arrives on CPU.

Placement: `start_sim_workers` puts the workers of one call in a Ray placement group
(`RayPlacement`) of one bundle per worker, ``PACK``-ed on as few nodes as possible or ``SPREAD``
(``placement.ray_strategy``). A bundle reserves a sliver of a CPU (``ACTOR_CPUS``), plus a sliver of
a GPU when the simulator renders on CUDA, so that many sim actors fit on a small machine; each
actor runs ``torch_threads`` intra-op threads. A restarted worker gets its bundle again.

Ray is imported on first use (``pip install 'mmrl[ray]'``) and, unless the caller already did,
initialised: connected to the cluster at ``RAY_ADDRESS`` when set, else a new local one. Every node
needs mmrl (and the simulator's dependencies) installed.

Failures: an exception in the simulator (`ray.exceptions.RayTaskError`) is `WorkerError`; a dead
actor (killed, crashed, its node lost: any other Ray error) or one silent past its call's time limit
(then killed) is `WorkerCrashed`, and `restart` creates a fresh actor (at most ``max_restarts``
times). The time limits are the local backend's (`WorkerBase.call_limit_s`: ``timeout_s`` fixed,
``inf`` none, ``None`` automatic from the durations the actor measures and reports with each answer).
`is_alive` is what this side knows: a crash is noticed at the next `result`.
"""

from __future__ import annotations

import functools
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from mmrl.errors import UserError
from mmrl.placement.worker import (
    STARTUP_TIMEOUT_S,
    WorkerBase,
    WorkerCrashed,
    WorkerError,
    from_wire,
    handle_request,
    sim_meta,
    to_wire,
)

ACTOR_CPUS = 0.01  # CPU reserved per sim actor (a bundle may not be empty; 0.01 lets 100 share a core)
ACTOR_GPUS = 0.01  # GPU reserved per sim actor rendering on CUDA (Ray then assigns it one GPU)
CLOSE_TIMEOUT_S = 10.0  # for the simulator's own close() before the actor is killed


def import_ray():
    """The ``ray`` module, or an ImportError naming the extra that installs it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError("placement.backend = 'ray' needs Ray, which is not installed: pip install 'mmrl[ray]'") from e
    return ray


#: seconds a connection to ``RAY_ADDRESS`` may take before the cluster is said to be unreachable
#: (Ray itself retries an absent head node without end, printing "GCS TimedOut" every 30 s)
CONNECT_TIMEOUT_S = 10.0


def ray_endpoint(address: str | None) -> tuple[str, int] | None:
    """``(host, port)`` of a ``RAY_ADDRESS`` that names one (``HOST:PORT``, ``ray://HOST:PORT``), or
    None for the addresses Ray resolves itself (unset, ``auto``, ``local``)."""
    if not address or address in ("auto", "local"):
        return None
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise UserError(f"RAY_ADDRESS={address!r} is not HOST:PORT (or ray://HOST:PORT, auto): set it to the head's")
    return host.strip("[]") or "127.0.0.1", int(port)


def check_reachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A `UserError` in one line when nothing answers at ``address`` (a TCP connection within
    ``timeout_s``), before Ray would wait for it without end."""
    import socket

    endpoint = ray_endpoint(address)
    if endpoint is None:
        return
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__).lower()
        raise UserError(
            f"placement.backend=ray: no Ray cluster answers at RAY_ADDRESS={address} ({why} within "
            f"{timeout_s:g} s); start its head node there (ray start --head --port {endpoint[1]}), or unset "
            "RAY_ADDRESS to start a local Ray"
        ) from None


def init_ray():
    """``ray``, initialised: as the caller set it up, else the cluster at ``RAY_ADDRESS`` (which must
    answer within `CONNECT_TIMEOUT_S`, `check_reachable`), else a new local one."""
    ray = import_ray()
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        check_reachable(address)
        ray.init(address=address, ignore_reinit_error=True, include_dashboard=False)
    return ray


class _SimActor:
    """The actor's body: builds the simulator, then serves requests (`handle_request`)."""

    def __init__(self, torch_threads: int):
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.sim = None

    def build(self, factory: Callable) -> dict:
        self.sim = factory()
        return sim_meta(self.sim)

    def call(self, method: str, args: tuple) -> tuple[Any, float]:
        """The answer on the wire and the seconds it took (the automatic time limits' measure)."""
        t0 = time.perf_counter()
        answer = handle_request(self.sim, method, from_wire(args))
        return to_wire(answer), time.perf_counter() - t0

    def close(self) -> None:
        if self.sim is not None:
            self.sim.close()


@functools.cache
def _actor_class():
    return import_ray().remote(_SimActor)


class RayPlacement:
    """The Ray placement group of one `start_sim_workers` call, one bundle per sim worker.

    Each `RaySimWorker` given the group takes its own bundle (kept across restarts) and gives it
    back when closed; the group is removed with the last one."""

    def __init__(self, num_workers: int, strategy: str = "PACK", gpu: bool = False):
        ray = init_ray()
        from ray.util.placement_group import placement_group, remove_placement_group

        self.bundle = {"CPU": ACTOR_CPUS, **({"GPU": ACTOR_GPUS} if gpu else {})}
        self.pg = placement_group([dict(self.bundle) for _ in range(num_workers)], strategy=strategy)
        if not self.pg.wait(STARTUP_TIMEOUT_S):
            remove_placement_group(self.pg)
            raise RuntimeError(
                f"Ray could not place {num_workers} sim workers ({self.bundle} each, "
                f"strategy {strategy}) within {STARTUP_TIMEOUT_S:g} s; available: "
                f"{ray.available_resources()}"
            )
        self.num_bundles, self.taken, self.users = num_workers, 0, 0

    def take(self) -> int:
        """The index of a bundle no other worker has taken."""
        if self.taken == self.num_bundles:
            raise RuntimeError(f"all {self.num_bundles} bundles of the placement group are taken")
        self.taken += 1
        self.users += 1
        return self.taken - 1

    def give_back(self) -> None:
        self.users -= 1
        ray = import_ray()
        if self.users == 0 and ray.is_initialized():
            ray.util.remove_placement_group(self.pg)

    def actor_options(self, bundle: int) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": self.bundle["CPU"],
            "num_gpus": self.bundle.get("GPU", 0),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle),
        }


class RaySimWorker(WorkerBase):
    """A simulator in a Ray actor; mirrors the simulator's shape attributes once ready.

    ``group``: the `RayPlacement` to take a bundle of (`start_sim_workers` passes one); without it
    the actor is scheduled anywhere with ``ACTOR_CPUS`` of a CPU."""

    def __init__(
        self,
        factory: Callable,
        *,
        name: str = "sim",
        torch_threads: int = 1,
        max_restarts: int = 3,
        timeout_s: float | None = None,
        start: bool = True,
        group: RayPlacement | None = None,
    ):
        import_ray()
        super().__init__(factory, name, torch_threads, max_restarts, timeout_s)
        self.actor: Any = None  # the Ray actor handle once started
        self._pending: deque = deque()  # per outstanding request: (ObjectRef, method, keep its answer?)
        self._broken = False
        self.group = group
        self.bundle = None if group is None else group.take()
        if start:
            try:
                self.start()
                self.wait_ready()
            except BaseException:
                self.close()
                raise

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Create the actor (returns at once; `wait_ready` waits for the simulator to be built)."""
        init_ray()
        if self.group is None:
            options = {"num_cpus": ACTOR_CPUS}
        else:
            assert self.bundle is not None  # taken with the group
            options = self.group.actor_options(self.bundle)
        self.actor = _actor_class().options(**options).remote(self.torch_threads)
        self._pending = deque([(self.actor.build.remote(self.factory), "start", True)])  # the ready answer
        self._broken, self.meta = False, None

    def close(self) -> None:
        self._shutdown(kill=False)
        if self.group is not None:
            self.group.give_back()
            self.group = None

    def _shutdown(self, kill: bool) -> None:
        if self.actor is None:
            return
        ray = import_ray()
        if ray.is_initialized():  # else the actor went with the cluster
            if not kill and not self._broken:
                try:  # the simulator's own close(), after the requests before it
                    ray.get(self.actor.close.remote(), timeout=CLOSE_TIMEOUT_S)
                except ray.exceptions.RayError:
                    pass
            ray.kill(self.actor)
        self.actor, self._pending, self.meta = None, deque(), None

    @property
    def pid(self) -> int | None:
        """The actor's process id (on its node), once ready."""
        return None if self.meta is None else self.meta["pid"]

    def is_alive(self) -> bool:
        return self.actor is not None and not self._broken

    # ---- requests -----------------------------------------------------------------------------
    def submit(self, method: str, *args) -> None:
        """Call the actor without waiting; its answer is the next `result`."""
        if self.actor is None:
            raise RuntimeError(f"sim worker {self.name!r} is closed")
        self._pending.append((self.actor.call.remote(method, to_wire(args)), method, True))

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Whether the oldest outstanding answer (or the actor's death) is in."""
        if not self._pending:
            return False
        ready, _ = import_ray().wait([self._pending[0][0]], timeout=timeout_s)
        return bool(ready)

    def discard_pending(self) -> None:
        """Drop the answers of every outstanding request (they are still awaited, in order)."""
        self._pending = deque((ref, method, False) for ref, method, _ in self._pending)

    def result(self, timeout_s: float | None = None) -> Any:
        """The answer of the oldest kept request (blocking); raises WorkerCrashed / WorkerError."""
        if not any(keep for _, _, keep in self._pending):
            raise RuntimeError(f"sim worker {self.name!r}: no request waiting for a result")
        ray = import_ray()
        while True:
            ref, method, keep = self._pending[0]
            limit_s, why = self._limit_for(method, timeout_s)
            start = time.monotonic()
            try:
                payload = ray.get(ref, timeout=limit_s)
            except ray.exceptions.RayTaskError as e:  # the simulator raised: the actor lives on
                self._pending.popleft()
                if keep:
                    raise WorkerError(f"sim worker {self.name!r} failed:\n{e}") from None
                continue
            except ray.exceptions.GetTimeoutError:
                assert limit_s is not None  # ray.get times out only given a timeout
                ray.kill(self.actor)
                self._broken = True
                raise self._crashed(
                    self._silent(method, time.monotonic() - start, limit_s, why), "was killed"
                ) from None
            except ray.exceptions.RayError as e:  # the actor (or its node) died
                self._broken = True
                raise self._crashed(f"{type(e).__name__}: {e}") from None
            self._pending.popleft()
            if method != "start":  # a request's answer comes with the seconds it took
                payload, seconds = payload
                self._measured(method, seconds)
            if keep:
                return from_wire(payload)

    def _crashed(self, why: str, what: str = "died") -> WorkerCrashed:
        self.last_crash = f"Ray actor, pid {self.pid}, {what}: {why.splitlines()[0]}"  # (Ray's are long)
        return WorkerCrashed(f"sim worker {self.name!r} (Ray actor, pid {self.pid}) {what}: {why}")
