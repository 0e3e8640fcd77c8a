"""`SimWorker`: a simulator owned by its own process (the ``render`` role of the local backend).

The worker is a ``spawn``-ed process that builds its simulator from a picklable ``factory`` (a
top-level function or a ``functools.partial`` of one, e.g. `registered_sim`) and serves requests
over a pipe: ``reset``, ``step_chunk``, ``get_state`` / ``set_state``, ``close``. Tensors cross
the pipe as numpy buffers (a copy, no shared-memory segments to leak); everything arrives on CPU.

Requests are asynchronous underneath (`submit` then `result`), which is what lets the pipelined
collector simulate one stage while it runs inference on another; `reset` / `step_chunk` are the
blocking forms with the `Simulator` signatures. Results come back in request order; a request
marked with `discard_pending` is answered but its answer is dropped.

Failures: an exception inside the simulator comes back as `WorkerError` (a bug: not retried). A
worker process that dies, or stays silent past its call's time limit (then it is killed), raises
`WorkerCrashed`; `restart` starts a fresh process from the same factory (at most ``max_restarts``
times) and warns why.

Time limits (``timeout_s``, from ``placement.step_timeout_s``): a number of seconds is a fixed limit
on every call; ``float("inf")`` (YAML ``.inf``) waits forever; ``None`` (the default) is automatic:
a call may take ``max(AUTO_TIMEOUT_FLOOR_S, AUTO_TIMEOUT_FACTOR x the slowest successful call of the
same method this worker has answered)`` (`auto_timeout_s`): 120 s, or 20 x the slowest when that is
longer. The durations are measured inside the worker (simulation alone) and kept per method
(``reset`` may cost far more than ``step_chunk``) in ``slowest_s``, which survives a restart; a
method never answered yet gets the floor, which also covers its first call's warm-up (compiling,
loading a scene, the renderer's first frame). Starting a worker has its own limit,
``STARTUP_TIMEOUT_S``. The clock of a call starts when `result` starts waiting for it, and keeps
running while an answer that started arriving is read: a worker stopped halfway through sending a
large answer is killed too (`READ_GRACE_S` after its first bytes at least).

`WorkerBase` is what both backends share: the blocking API, `restart`, and `handle_request` (one
request served on the simulator). The Ray backend's `RaySimWorker` (`mmrl.placement.ray_worker`)
serves the same requests from a Ray actor; `start_sim_workers` starts either kind, per
``placement.backend``.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
import multiprocessing as mp
import multiprocessing.util  # its exit hook must be registered before ours
import os
import pickle
import signal
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from mmrl.utils import deadline

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import SpawnProcess

STARTUP_TIMEOUT_S = 120.0  # spawn + import torch + build the simulator
# the automatic time limit of a call (placement.step_timeout_s = null): at least the floor (which is
# all a method never answered yet gets: its first call may include warm-up), else this many times
# the slowest answer of that method so far; the rule and its defaults are `mmrl.utils.deadline`'s,
# shared with user code's limits. Read at each call, so a test may patch them here.
AUTO_TIMEOUT_FLOOR_S = deadline.AUTO_TIMEOUT_FLOOR_S
AUTO_TIMEOUT_FACTOR = deadline.AUTO_TIMEOUT_FACTOR
READ_GRACE_S = 5.0  # an answer that started arriving gets at least this long to arrive whole
SET_TIMEOUT_HINT = (
    "set placement.step_timeout_s=SECONDS for a fixed limit, or placement.step_timeout_s=.inf to wait forever"
)


def auto_timeout_s(slowest_s: float | None, floor_s: float | None = None, factor: float | None = None) -> float:
    """The automatic time limit of a call whose method's slowest answer so far took ``slowest_s``
    seconds (None: never answered): ``max(floor_s, factor * slowest_s)``, or ``floor_s`` alone.
    ``floor_s`` / ``factor`` default to ``AUTO_TIMEOUT_FLOOR_S`` / ``AUTO_TIMEOUT_FACTOR``."""
    floor_s = AUTO_TIMEOUT_FLOOR_S if floor_s is None else floor_s
    factor = AUTO_TIMEOUT_FACTOR if factor is None else factor
    return deadline.auto_timeout_s(slowest_s, floor_s, factor)


class WorkerError(RuntimeError):
    """The simulator raised inside the worker; the message holds the remote traceback."""


class WorkerCrashed(RuntimeError):
    """The worker process died (or timed out); `SimWorker.restart` brings a fresh one."""


# ---------------------------------------------------------------------------------- wire format
class _Arr:
    """A tensor on the wire: a numpy buffer plus its torch dtype (bfloat16 travels as int16)."""

    __slots__ = ("data", "dtype")

    def __init__(self, t: torch.Tensor):
        t = t.detach().cpu().contiguous()
        self.dtype = str(t.dtype).removeprefix("torch.")
        self.data = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()

    def __getstate__(self):
        return self.data, self.dtype

    def __setstate__(self, state):
        self.data, self.dtype = state

    def tensor(self) -> torch.Tensor:
        # a buffer read zero-copy from Ray's object store is read-only: torch needs its own copy
        t = torch.from_numpy(self.data if self.data.flags.writeable else self.data.copy())
        return t.view(torch.bfloat16) if self.dtype == "bfloat16" else t


def to_wire(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return _Arr(x)
    if isinstance(x, (list, tuple)):
        return type(x)(to_wire(v) for v in x)
    if isinstance(x, dict):
        return {k: to_wire(v) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x)(**{f.name: to_wire(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


def from_wire(x: Any) -> Any:
    if isinstance(x, _Arr):
        return x.tensor()
    if isinstance(x, (list, tuple)):
        return type(x)(from_wire(v) for v in x)
    if isinstance(x, dict):
        return {k: from_wire(v) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return type(x)(**{f.name: from_wire(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


def _dumps(x: Any) -> bytes:
    return pickle.dumps(to_wire(x), protocol=pickle.HIGHEST_PROTOCOL)


# ---------------------------------------------------------------------------------- the process
#: the simulator attributes a worker mirrors (`sim_meta`) and a `SimGroup` exposes
SHAPE_KEYS = (
    "num_envs",
    "action_dim",
    "action_type",
    "max_episode_steps",
    "image_shape",
    "state_dim",
    "has_images",
    "has_success",
)


def sim_meta(sim) -> dict:
    return {
        "class": type(sim).__name__,  # for messages
        "num_envs": int(sim.num_envs),
        "action_dim": int(sim.action_dim),
        "action_type": str(sim.action_type),
        "max_episode_steps": int(sim.max_episode_steps),
        "image_shape": tuple(sim.image_shape),
        "state_dim": sim.state_dim,
        "has_images": bool(sim.has_images),
        "has_success": bool(sim.has_success),
        "device": str(sim.device),
        "pid": os.getpid(),
    }


def handle_request(sim, method: str, args: tuple) -> Any:
    """Serve one request on ``sim`` (both backends): the answer; raises what the simulator raises."""
    if method == "reset":
        seeds, torch_seed = args
        if torch_seed is not None:  # global-RNG use inside the simulator
            torch.manual_seed(torch_seed)
        return sim.reset(seeds)
    if method == "step_chunk":
        actions, with_final_obs, trace = args
        t0 = time.perf_counter()
        actions = actions.to(sim.device) if isinstance(actions, torch.Tensor) else actions
        res = sim.step_chunk(actions, trace=True) if trace else sim.step_chunk(actions)
        res.info["worker_s"] = time.perf_counter() - t0  # simulation time in the worker
        if not with_final_obs:
            res.final_obs = None  # not needed by the collector: half the traffic
        return res
    if method in ("get_state", "set_state"):
        return getattr(sim, method)(*args)
    raise ValueError(f"unknown request {method!r}")


def _serve(factory: Callable, conn, torch_threads: int) -> None:
    """Body of the worker process: build the simulator, then answer requests until ``close``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    if torch_threads:
        torch.set_num_threads(torch_threads)
    t0 = time.perf_counter()
    try:
        sim = factory()
        conn.send_bytes(_dumps(("ok", sim_meta(sim), time.perf_counter() - t0)))
    except Exception:
        conn.send_bytes(_dumps(("error", traceback.format_exc(), time.perf_counter() - t0)))
        return
    try:
        while True:
            try:
                method, args = pickle.loads(conn.recv_bytes())
            except EOFError:  # the main process went away
                break
            if method == "close":
                break
            t0 = time.perf_counter()
            try:
                status, payload = "ok", handle_request(sim, method, from_wire(args))
            except Exception:
                status, payload = "error", traceback.format_exc()
            conn.send_bytes(_dumps((status, payload, time.perf_counter() - t0)))  # (seconds it took)
    finally:
        sim.close()


# ---------------------------------------------------------------------------------- main side
class WorkerBase:
    """What every sim worker kind shares: the simulator's shape attributes (mirrored once ready),
    `wait_ready`, `restart`, the time limit of each call (`call_limit_s`, with the durations it is
    derived from, ``slowest_s``) and the blocking `Simulator`-shaped API. A subclass implements
    `start`, `_shutdown`, `close`, `submit`, `result`, `poll`, `discard_pending`, `is_alive`, `pid`.
    Its ready answer is the pending request named ``"start"``."""

    num_envs: int
    action_dim: int
    action_type: str
    max_episode_steps: int
    image_shape: tuple
    state_dim: int | None
    has_images: bool
    has_success: bool
    device: torch.device = torch.device("cpu")  # where results arrive (always CPU)

    def __init__(self, factory: Callable, name: str, torch_threads: int, max_restarts: int, timeout_s: float | None):
        self.factory, self.name = factory, name
        self.torch_threads, self.max_restarts, self.timeout_s = torch_threads, max_restarts, timeout_s
        self.restarts = 0
        self.sim_device = "cpu"
        self.meta: dict | None = None  # what the simulator reported when ready (shapes, device, pid)
        # per method: the seconds its slowest successful answer took in the worker (kept across
        # restarts: the automatic time limits derive from it)
        self.slowest_s: dict[str, float] = {}
        self.last_crash: str | None = None  # why the worker last crashed (`restart` warns with it)

    def call_limit_s(self, method: str) -> tuple[float | None, str]:
        """How long a ``method`` request may stay unanswered (None: forever) and where that limit
        comes from (for the error message): ``STARTUP_TIMEOUT_S`` for the ready answer, else
        ``timeout_s`` when set, else automatic (`auto_timeout_s` of ``slowest_s[method]``)."""
        if method == "start":
            return STARTUP_TIMEOUT_S, "the start-up limit, STARTUP_TIMEOUT_S"
        if self.timeout_s is not None:
            if math.isinf(self.timeout_s):
                return None, "placement.step_timeout_s = .inf"
            return self.timeout_s, f"placement.step_timeout_s = {self.timeout_s:g}"
        slowest = self.slowest_s.get(method)
        limit = auto_timeout_s(slowest)
        if slowest is None:
            return limit, (f"automatic limit: the {AUTO_TIMEOUT_FLOOR_S:g} s floor, no {method!r} answered yet")
        return limit, (
            f"automatic limit: {AUTO_TIMEOUT_FACTOR:g} x the slowest {method!r} so far, "
            f"{slowest:.3g} s, at least {AUTO_TIMEOUT_FLOOR_S:g} s"
        )

    def _measured(self, method: str, seconds: float | None) -> None:
        """Record that a ``method`` request was answered after ``seconds`` in the worker."""
        if seconds is not None and method != "start" and seconds > self.slowest_s.get(method, -1.0):
            self.slowest_s[method] = float(seconds)

    def _silent(self, method: str, waited_s: float, limit_s: float, why: str) -> str:
        """The reason of a `WorkerCrashed` for a worker killed for silence."""
        hint = "" if method == "start" else f"; {SET_TIMEOUT_HINT}"
        return f"silent for {waited_s:.1f} s on {method!r}, past its limit of {limit_s:g} s ({why}){hint}"

    def _limit_for(self, method: str, timeout_s: float | None) -> tuple[float | None, str]:
        if timeout_s is None:
            return self.call_limit_s(method)
        return (None if math.isinf(timeout_s) else timeout_s), f"{timeout_s:g} s given to result()"

    def wait_ready(self) -> WorkerBase:
        meta = self.result()  # the "start" request: STARTUP_TIMEOUT_S
        for key in SHAPE_KEYS:
            setattr(self, key, meta[key])
        self.sim_device, self.meta = meta["device"], meta
        return self

    def restart(self) -> None:
        """Replace a crashed worker by a fresh one built from the same factory."""
        why = self.last_crash or "it crashed"
        if self.restarts >= self.max_restarts:
            self.close()
            raise WorkerCrashed(
                f"sim worker {self.name!r} crashed more than max_restarts="
                f"{self.max_restarts} times; giving up (last: {why})"
            )
        warnings.warn(
            f"restarting sim worker {self.name!r} (restart {self.restarts + 1} of "
            f"max_restarts={self.max_restarts}): {why}",
            RuntimeWarning,
            stacklevel=2,
        )
        self._shutdown(kill=True)
        self.restarts += 1
        self.start()
        self.wait_ready()
        self.last_crash = None

    def __enter__(self) -> WorkerBase:
        return self

    # ---- what a subclass implements -----------------------------------------------------------
    def start(self) -> None:
        """Start the worker (returns at once; its ready answer is the pending ``"start"`` request)."""
        raise NotImplementedError

    def _shutdown(self, kill: bool) -> None:
        """Stop the worker (``kill``: at once), leaving it restartable."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def submit(self, method: str, *args) -> None:
        """Send a request without waiting; its answer is the next `result`."""
        raise NotImplementedError

    def result(self, timeout_s: float | None = None) -> Any:
        """The answer of the oldest kept request (blocking); raises WorkerCrashed / WorkerError."""
        raise NotImplementedError

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Whether an answer is ready to be read."""
        raise NotImplementedError

    def discard_pending(self) -> None:
        """Drop the answers of every outstanding request."""
        raise NotImplementedError

    def is_alive(self) -> bool:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- the Simulator-shaped blocking API ----------------------------------------------------
    def reset(self, seed: int | list[int] | None = None, torch_seed: int | None = None):
        self.submit("reset", seed, torch_seed)
        return self.result()

    def step_chunk(self, actions: torch.Tensor, trace: bool = False, with_final_obs: bool = True):
        self.submit("step_chunk", actions, with_final_obs, trace)
        return self.result()

    def step(self, actions: torch.Tensor):
        return self.step_chunk(actions[:, None])

    def get_state(self) -> dict:
        self.submit("get_state")
        return self.result()

    def set_state(self, state: dict) -> None:
        self.submit("set_state", state)
        self.result()


class SimWorker(WorkerBase):
    """A simulator in its own process; mirrors the simulator's shape attributes once ready."""

    def __init__(
        self,
        factory: Callable,
        *,
        name: str = "sim",
        torch_threads: int = 1,
        max_restarts: int = 3,
        timeout_s: float | None = None,
        start: bool = True,
    ):
        super().__init__(factory, name, torch_threads, max_restarts, timeout_s)
        self._ctx = mp.get_context("spawn")
        self._proc: SpawnProcess | None = None  # both set while started
        self._conn: Connection | None = None
        self._pending: list[tuple[str, bool]] = []  # per outstanding request: (method, keep its answer?)
        self._broken = False
        self._read_killed: str | None = None  # why the watchdog of `_read_answer` killed the worker
        if start:
            self.start()
            self.wait_ready()

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn the process (returns at once; `wait_ready` waits for the simulator to be built)."""
        parent, child = self._ctx.Pipe(duplex=True)
        # not a daemon: a simulator may start processes of its own (ManiSkill on CPU, gym vector envs);
        # `_close_live_workers` stops every worker when the main process exits
        self._proc = self._ctx.Process(
            target=_serve, args=(self.factory, child, self.torch_threads), name=f"mmrl-{self.name}", daemon=False
        )
        self._proc.start()
        _LIVE.add(self)
        child.close()  # so that the worker's death reads as EOF here
        self._conn, self._pending, self._broken = parent, [("start", True)], False  # the ready message

    def close(self) -> None:
        if self._proc is None:
            return
        assert self._conn is not None  # set with _proc
        if self._proc.is_alive() and not self._broken:
            try:
                self._conn.send_bytes(pickle.dumps(("close", None)))
            except OSError:
                pass
        self._shutdown(kill=False)

    def _shutdown(self, kill: bool) -> None:
        if self._proc is None:
            return
        if kill and self._proc.is_alive():
            self._proc.kill()
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        assert self._conn is not None  # set with _proc
        self._conn.close()
        self._proc, self._conn, self._pending = None, None, []
        _LIVE.discard(self)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    # ---- requests -----------------------------------------------------------------------------
    def submit(self, method: str, *args) -> None:
        """Send a request without waiting; its answer is the next `result`."""
        if self._proc is None:
            raise RuntimeError(f"sim worker {self.name!r} is closed")
        assert self._conn is not None  # set with _proc
        self._pending.append((method, True))
        if self._broken:
            return
        try:
            self._conn.send_bytes(_dumps((method, args)))
        except OSError:  # broken pipe: the process is gone; `result` reports the crash
            self._broken = True

    def poll(self, timeout_s: float = 0.0) -> bool:
        """Whether an answer (or the worker's end of the pipe) is ready to be read."""
        return self._conn is not None and self._conn.poll(timeout_s)

    def discard_pending(self) -> None:
        """Drop the answers of every outstanding request (they are still read, in order)."""
        self._pending = [(method, False) for method, _ in self._pending]

    def result(self, timeout_s: float | None = None) -> Any:
        """The answer of the oldest kept request (blocking); raises WorkerCrashed / WorkerError."""
        if not any(keep for _, keep in self._pending):
            raise RuntimeError(f"sim worker {self.name!r}: no request waiting for a result")
        while True:
            method, keep = self._pending[0]
            status, payload, seconds = self._recv(method, *self._limit_for(method, timeout_s))
            self._pending.pop(0)
            if status == "ok":
                self._measured(method, seconds)
            if not keep:
                continue
            if status == "error":
                raise WorkerError(f"sim worker {self.name!r} failed:\n{payload}")
            return from_wire(payload)

    def _recv(self, method: str, limit_s: float | None, why: str) -> tuple:
        """The next answer, (status, payload, seconds in the worker); kills a worker silent for
        longer than ``limit_s`` (None: waits forever)."""
        proc, conn = self._proc, self._conn
        assert proc is not None and conn is not None, "a request is pending only on a started worker"
        start = time.monotonic()
        while True:
            if self._broken:
                raise self._crashed("the pipe to it is broken")
            try:
                if conn.poll(0.05):
                    return pickle.loads(self._read_answer(method, start, limit_s, why))
            except (EOFError, OSError):
                self._broken = True
                if self._read_killed is not None:  # stopped halfway through sending its answer
                    raise self._crashed(self._read_killed, "was killed") from None
                raise self._crashed("it closed its pipe") from None
            if not proc.is_alive() and not conn.poll(0):
                self._broken = True
                raise self._crashed(f"exit code {proc.exitcode}")
            waited = time.monotonic() - start
            if limit_s is not None and waited > limit_s:
                proc.kill()
                self._broken = True
                raise self._crashed(self._silent(method, waited, limit_s, why), "was killed")

    def _read_answer(self, method: str, start: float, limit_s: float | None, why: str) -> bytes:
        """The answer's bytes, once some have arrived. A worker that stops halfway through sending
        (a large observation fills the pipe; then it is stopped, or hangs in a C extension) would
        block this read forever: a watchdog kills it when the call's limit has passed (at least
        `READ_GRACE_S` after the first bytes), which ends the read with EOF."""
        self._read_killed = None
        proc, conn = self._proc, self._conn
        assert proc is not None and conn is not None, "a request is pending only on a started worker"
        if limit_s is None:
            return conn.recv_bytes()

        def kill():
            waited = time.monotonic() - start
            self._read_killed = self._silent(
                method, waited, limit_s, f"{why}; it stopped halfway through sending its answer"
            )
            proc.kill()

        timer = threading.Timer(max(limit_s - (time.monotonic() - start), READ_GRACE_S), kill)
        timer.daemon = True
        timer.start()
        try:
            return conn.recv_bytes()
        finally:
            timer.cancel()

    def _crashed(self, why: str, what: str = "died") -> WorkerCrashed:
        self.last_crash = f"pid {self.pid} {what}: {why}"
        return WorkerCrashed(f"sim worker {self.name!r} (pid {self.pid}) {what}: {why}")


_LIVE: weakref.WeakSet[SimWorker] = weakref.WeakSet()


@atexit.register
def _close_live_workers() -> None:
    """Runs before multiprocessing's exit hook (which would wait forever on a worker still serving)."""
    for w in list(_LIVE):
        try:
            w.close()
        except Exception:
            pass


def close_workers(workers: Iterable[WorkerBase]) -> None:
    for w in workers:
        w.close()
