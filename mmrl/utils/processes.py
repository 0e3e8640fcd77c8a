"""Runs side by side in worker processes that never outlive the process that started them.

A benchmark's ``--jobs N`` runs its seeds in a `ProcessPoolExecutor`. Ctrl-C reaches the whole
process group, but a kill of the main process alone (``kill PID``, ``pkill -f`` on its command
line, a scheduler that stops the job's leader) leaves the pool's workers running as orphans:
they go on training for an hour, writing into the folder the next (``--resume``) run will use,
and taking the cores it needs. `side_by_side` gives every worker a watchdog that ends it, with one
line on stderr, as soon as its parent is gone; a benchmark that runs its children as scripts
(``subprocess``) passes `child_env` to them and they call `exit_with_parent_if_asked` (a child
started by hand, e.g. under ``nohup``, is not asked and outlives its shell as usual).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

POLL_S = 1.0  # how often a worker checks that its parent is still there
PARENT_ENV = "MMRL_EXIT_WITH_PARENT"  # a child script stops when this pid stops being its parent


def _watch_parent(parent_pid: int, poll_s: float) -> None:
    while True:
        time.sleep(poll_s)
        if os.getppid() != parent_pid:  # re-parented: the process that started this one is gone
            print(
                f"[worker {os.getpid()}] the process that started it ({parent_pid}) is gone: this worker stops too",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)


def exit_with_parent(parent_pid: int, poll_s: float = POLL_S) -> None:
    """Worker initializer: a daemon thread ends this process once ``parent_pid`` is no longer its
    parent (checked every ``poll_s`` seconds)."""
    threading.Thread(target=_watch_parent, args=(parent_pid, poll_s), name="exit-with-parent", daemon=True).start()


def child_env() -> dict[str, str]:
    """Environment entries that make a child script calling `exit_with_parent_if_asked` stop with
    this process."""
    return {PARENT_ENV: str(os.getpid())}


def exit_with_parent_if_asked(poll_s: float = POLL_S) -> None:
    """In a child script: `exit_with_parent` for the pid its starter put in `child_env`, if any."""
    pid = os.environ.get(PARENT_ENV, "")
    if pid.isdigit():
        exit_with_parent(int(pid), poll_s)


def side_by_side(
    fn: Callable[..., Any], *iterables: Iterable, jobs: int, context: str | None = "spawn", poll_s: float = POLL_S
) -> list:
    """``list(map(fn, *iterables))`` with up to ``jobs`` calls at a time, each in a worker process
    (``context``: a `multiprocessing` start method, None for the platform's default) that stops
    when this process goes away; with one job (or one call) they run here, one after another.
    Results in input order; a worker's exception is raised here."""
    if jobs < 1:
        raise ValueError(f"side_by_side: jobs must be >= 1, got {jobs}")
    calls = list(zip(*iterables))
    if min(jobs, len(calls)) <= 1:
        return [fn(*args) for args in calls]
    ctx = multiprocessing.get_context(context)
    parent = os.getpid()
    workers = min(jobs, len(calls))
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=exit_with_parent, initargs=(parent, poll_s)) as pool:
        return list(pool.map(fn, *zip(*calls)))
