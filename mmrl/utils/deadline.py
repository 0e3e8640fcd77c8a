"""Time limits on calls that may never return: one rule for sim workers' calls and for user code.

The automatic limit (a ``*timeout_s`` setting left null) of a call is
``max(AUTO_TIMEOUT_FLOOR_S, AUTO_TIMEOUT_FACTOR x the slowest successful call of that kind so far)``
(`auto_timeout_s`): 120 s, or 20 x the slowest when that is longer. A kind never answered yet gets
the floor, which also covers its first call's warm-up (loading a model, compiling). A number is a
fixed limit; ``float("inf")`` (YAML ``.inf``) waits forever.

`CallLimit` applies the rule to user code that runs in this process (a reward function,
``reward.timeout_s``): the call runs in a daemon thread and the caller waits at most the limit, then
raises `CallTimedOut`; ``sys.exit`` and ``os._exit`` inside it raise `UserCodeExit` (`trap_exits`)
instead of ending the process. A Python thread cannot be killed: the stuck call is left running (a daemon
thread, so it does not keep the process alive at exit), and the caller must end the run with an
error, since the stuck call may still hold or change what it shares with the run. Sim workers are
processes (`mmrl.placement.worker`): they are killed and restarted instead.

Pure: no torch, nothing of mmrl imported, so any layer may use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

# the automatic limit's floor (all a kind never answered yet gets) and factor (times the slowest
# answer so far). Read at each call, so a test may patch them.
AUTO_TIMEOUT_FLOOR_S = 120.0
AUTO_TIMEOUT_FACTOR = 20.0


def auto_timeout_s(slowest_s: float | None, floor_s: float | None = None, factor: float | None = None) -> float:
    """The automatic time limit of a call whose kind's slowest answer so far took ``slowest_s``
    seconds (None: never answered): ``max(floor_s, factor * slowest_s)``, or ``floor_s`` alone.
    ``floor_s`` / ``factor`` default to ``AUTO_TIMEOUT_FLOOR_S`` / ``AUTO_TIMEOUT_FACTOR``."""
    floor_s = AUTO_TIMEOUT_FLOOR_S if floor_s is None else floor_s
    factor = AUTO_TIMEOUT_FACTOR if factor is None else factor
    return floor_s if slowest_s is None else max(floor_s, factor * slowest_s)


def timeout_problem(setting: str, timeout_s: float | None) -> str | None:
    """Why ``timeout_s``, the value of the time-limit setting ``setting`` (``placement.step_timeout_s``,
    ``reward.timeout_s``), is not one: seconds > 0, inf or None (automatic); None when it is."""
    if timeout_s is None or timeout_s > 0:  # (NaN is not > 0)
        return None
    return (
        f"{setting} = {timeout_s} must be seconds > 0, .inf (wait forever) or null (automatic: "
        f"max({AUTO_TIMEOUT_FLOOR_S:g} s, {AUTO_TIMEOUT_FACTOR:g} x the slowest call so far))"
    )


class UserCodeExit(Exception):
    """User code called ``sys.exit`` or ``os._exit`` inside a limited call (`trap_exits`): what would
    have ended the whole run without a word ends only that call, as any other exception does."""

    def __init__(self, how: str):
        super().__init__(f"{how}, which would have ended the whole run: raise an exception or return instead")
        self.how = how


_REAL_EXIT = os._exit
_PID = os.getpid()  # a forked child keeps the parent's value: its os._exit stays the real one
_TRAPPED: set[int] = set()  # the threads running user code under `trap_exits`
_TRAP_LOCK = threading.Lock()


def _trapped_exit(status: int) -> NoReturn:
    if os.getpid() == _PID and threading.get_ident() in _TRAPPED:
        raise UserCodeExit(f"called os._exit({status})")
    _REAL_EXIT(status)


@contextlib.contextmanager
def trap_exits():
    """Inside: ``sys.exit`` (SystemExit) and ``os._exit`` called by this thread raise `UserCodeExit`
    instead of ending the process. Other threads and forked children exit as usual."""
    global _PID
    me = threading.get_ident()
    with _TRAP_LOCK:
        if not _TRAPPED:
            _PID = os.getpid()
        _TRAPPED.add(me)
        os._exit = _trapped_exit
    try:
        yield
    except SystemExit as exc:
        raise UserCodeExit(f"called sys.exit({exc.code!r})") from None
    finally:
        with _TRAP_LOCK:
            _TRAPPED.discard(me)
            if not _TRAPPED:
                os._exit = _REAL_EXIT


class CallTimedOut(Exception):
    """A call ran past its time limit; it is left running in its daemon thread."""

    def __init__(self, waited_s: float, limit_s: float, why: str):
        super().__init__(f"no answer after {waited_s:.1f} s, past its limit of {limit_s:g} s ({why})")
        self.waited_s, self.limit_s, self.why = waited_s, limit_s, why


class CallLimit:
    """The time limit of one kind of call (e.g. one reward function): ``timeout_s`` None =
    automatic (`auto_timeout_s` of the slowest call made through this object), a number = fixed,
    ``inf`` = none. ``setting`` names the config key that sets it, for the messages."""

    def __init__(self, timeout_s: float | None = None, setting: str = "timeout_s"):
        problem = timeout_problem(setting, timeout_s)
        if problem:
            raise ValueError(problem)
        self.timeout_s, self.setting = timeout_s, setting
        self.slowest_s: float | None = None  # the slowest call that returned (automatic limit)

    def limit(self) -> tuple[float | None, str]:
        """How long the next call may take (None: forever) and where that limit comes from."""
        if self.timeout_s is not None:
            if math.isinf(self.timeout_s):
                return None, f"{self.setting} = .inf"
            return self.timeout_s, f"{self.setting} = {self.timeout_s:g}"
        limit = auto_timeout_s(self.slowest_s)
        if self.slowest_s is None:
            return limit, f"automatic limit: the {AUTO_TIMEOUT_FLOOR_S:g} s floor, no call returned yet"
        return limit, (
            f"automatic limit: {AUTO_TIMEOUT_FACTOR:g} x the slowest call so far, {self.slowest_s:.3g} s, "
            f"at least {AUTO_TIMEOUT_FLOOR_S:g} s"
        )

    def hint(self) -> str:
        """How to change the limit."""
        return f"set {self.setting}=SECONDS for a fixed limit, or {self.setting}=.inf to wait forever"

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` within the limit: its value, or its exception re-raised (with its
        own traceback); `CallTimedOut` past the limit, the call left running (see the module
        docstring: the caller must end the run). Without a limit the call runs in this thread."""
        limit, why = self.limit()
        if limit is None:
            with trap_exits():
                return fn(*args, **kwargs)
        box: dict[str, Any] = {}
        done = threading.Event()
        context = contextvars.copy_context()

        def target() -> None:
            try:
                with trap_exits():
                    box["value"] = context.run(fn, *args, **kwargs)
            except BaseException as exc:  # handed to the caller, which re-raises it
                box["error"] = exc
            finally:
                done.set()

        start = time.monotonic()
        threading.Thread(target=target, name=f"mmrl-limited-{getattr(fn, '__name__', 'call')}", daemon=True).start()
        if not done.wait(limit):
            raise CallTimedOut(time.monotonic() - start, limit, why)
        seconds = time.monotonic() - start
        if "error" in box:
            error = box.pop("error")
            try:
                raise error
            finally:
                del error  # no reference cycle through this frame
        if self.slowest_s is None or seconds > self.slowest_s:
            self.slowest_s = seconds
        return box.pop("value")


__all__ = [
    "AUTO_TIMEOUT_FLOOR_S",
    "AUTO_TIMEOUT_FACTOR",
    "auto_timeout_s",
    "timeout_problem",
    "CallLimit",
    "CallTimedOut",
    "UserCodeExit",
    "trap_exits",
]
