"""Sim worker time limits (``placement.step_timeout_s``): null (the default) is automatic,
max(floor, factor x the slowest answer of the same method so far), measured in the worker and kept
across restarts; a number is a fixed limit; .inf waits forever. A worker that stops answering after
a few fast steps is killed by the automatic limit, restarted (with a warning saying why) and serves
again.

The floor and factor are module constants of `mmrl.placement.worker`, read at every call: the
process-level test patches them down so that a stopped worker is found within about a second. Every
test that could wait on a stopped worker carries a pytest-timeout guard, so a broken limit fails
instead of hanging.
"""

import functools
import math
import os
import signal
import time

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.placement import PlacementConfig, SimWorker, WorkerCrashed
from mmrl.placement import worker as worker_module
from mmrl.placement.worker import STARTUP_TIMEOUT_S, WorkerBase, auto_timeout_s
from simulators.loaded import loaded_reach

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the main process waits while a worker runs


def test_auto_timeout_is_the_floor_or_factor_times_the_slowest_call():
    floor, factor = worker_module.AUTO_TIMEOUT_FLOOR_S, worker_module.AUTO_TIMEOUT_FACTOR
    assert (floor, factor) == (120.0, 20.0)  # the documented defaults (PlacementConfig's comment)
    assert auto_timeout_s(None) == 120.0  # nothing measured yet: the floor covers warm-up
    assert auto_timeout_s(0.01) == 120.0  # fast calls: the floor
    assert auto_timeout_s(6.0) == 120.0  # 20 x 6 s = the floor exactly
    assert auto_timeout_s(10.0) == 200.0  # slow calls: 20 x the slowest
    assert auto_timeout_s(0.5, floor_s=1.0, factor=10.0) == 5.0
    assert auto_timeout_s(0.05, floor_s=1.0, factor=10.0) == 1.0
    assert auto_timeout_s(None, floor_s=2.0, factor=10.0) == 2.0


def test_auto_timeout_reads_the_module_constants_at_call_time(monkeypatch):
    monkeypatch.setattr(worker_module, "AUTO_TIMEOUT_FLOOR_S", 3.0)
    monkeypatch.setattr(worker_module, "AUTO_TIMEOUT_FACTOR", 4.0)
    assert auto_timeout_s(None) == 3.0 and auto_timeout_s(1.0) == 4.0


def limits(timeout_s, slowest=None):
    """A worker (never started) with ``timeout_s`` that measured ``slowest`` {method: seconds}."""
    w = WorkerBase(lambda: None, "w", torch_threads=1, max_restarts=3, timeout_s=timeout_s)
    w.slowest_s.update(slowest or {})
    return w


def test_each_method_gets_its_own_automatic_limit():
    w = limits(None, {"reset": 9.0, "step_chunk": 0.02})
    assert w.call_limit_s("reset") == (180.0, "automatic limit: 20 x the slowest 'reset' so far, 9 s, at least 120 s")
    assert w.call_limit_s("step_chunk")[0] == 120.0
    assert w.call_limit_s("get_state") == (120.0, "automatic limit: the 120 s floor, no 'get_state' answered yet")
    assert w.call_limit_s("start") == (STARTUP_TIMEOUT_S, "the start-up limit, STARTUP_TIMEOUT_S")


def test_only_slower_answers_raise_the_automatic_limit():
    w = limits(None)
    for seconds in (0.5, 7.0, 0.1):
        w._measured("step_chunk", seconds)
    w._measured("start", 30.0)  # start-up has its own limit: not a call's measure
    assert w.slowest_s == {"step_chunk": 7.0}
    assert w.call_limit_s("step_chunk")[0] == 140.0


def test_a_fixed_limit_wins_and_inf_waits_forever():
    w = limits(2.5, {"step_chunk": 100.0})
    assert w.call_limit_s("step_chunk") == (2.5, "placement.step_timeout_s = 2.5")
    assert w.call_limit_s("reset")[0] == 2.5
    assert limits(math.inf).call_limit_s("step_chunk") == (None, "placement.step_timeout_s = .inf")
    assert limits(math.inf).call_limit_s("start")[0] == STARTUP_TIMEOUT_S  # start-up keeps its own


def test_step_timeout_config_values():
    assert PlacementConfig().step_timeout_s is None  # automatic by default
    assert load_config(PlacementConfig, {}, ["step_timeout_s=.inf"]).step_timeout_s == math.inf
    assert load_config(PlacementConfig, {}, ["step_timeout_s=30"]).step_timeout_s == 30.0
    assert load_config(PlacementConfig, {"step_timeout_s": None}).step_timeout_s is None
    for bad in (0, -1.0, math.nan):
        with pytest.raises(
            ConfigError,
            match=r"must be seconds > 0, \.inf \(wait forever\) or null "
            r"\(automatic: max\(120 s, 20 x the slowest call so far\)\)",
        ):
            PlacementConfig(step_timeout_s=bad)


STEP = torch.zeros(2, 1, 2)  # one 1-step action chunk for 2 envs


@pytest.mark.timeout(60)  # a broken limit waits forever on the stopped worker: fail instead
def test_a_worker_that_stops_after_fast_steps_is_killed_restarted_and_serves_again(monkeypatch):
    monkeypatch.setattr(worker_module, "AUTO_TIMEOUT_FLOOR_S", 0.2)
    monkeypatch.setattr(worker_module, "AUTO_TIMEOUT_FACTOR", 10.0)
    sim = functools.partial(loaded_reach, num_envs=2, delay_s=0.05)  # ~0.1 s per 1-step chunk
    with SimWorker(sim, name="stops") as w:
        assert w.timeout_s is None  # the default: automatic
        w.reset([0, 1])
        for _ in range(3):
            w.step_chunk(STEP)
        slowest = w.slowest_s["step_chunk"]
        assert 0.1 <= slowest < 1.0  # measured in the worker: the simulation's own time
        limit, why = w.call_limit_s("step_chunk")
        assert limit == pytest.approx(10 * slowest)  # the factor, not the floor, sets this limit
        assert w.call_limit_s("reset")[0] == max(0.2, 10 * w.slowest_s["reset"])  # reset: its own

        os.kill(w.pid, signal.SIGSTOP)  # stopped between requests: alive, but never answers
        t0 = time.monotonic()
        with pytest.raises(WorkerCrashed) as crash:
            w.step_chunk(STEP)
        waited = time.monotonic() - t0
        assert limit < waited < limit + 5.0  # killed once the limit passed, not long after
        message = str(crash.value)
        assert "sim worker 'stops'" in message and "was killed: silent for" in message
        assert (
            f"on 'step_chunk', past its limit of {limit:g} s (automatic limit: 10 x the slowest "
            f"'step_chunk' so far, {slowest:.3g} s, at least 0.2 s)" in message
        )
        assert "set placement.step_timeout_s=SECONDS for a fixed limit" in message

        old_pid = w.pid
        with pytest.warns(
            RuntimeWarning,
            match=r"restarting sim worker 'stops' \(restart 1 of "
            r"max_restarts=3\): pid \d+ was killed: silent for",
        ):
            w.restart()
        assert w.restarts == 1 and w.is_alive() and w.pid != old_pid
        assert w.slowest_s["step_chunk"] >= slowest  # the measures survive the restart
        assert w.call_limit_s("step_chunk")[0] >= limit  # not the floor again
        assert w.reset([0, 1]).image.shape == (2, 32, 32, 3)
        assert w.step_chunk(STEP).reward.shape == (2,)


@pytest.mark.timeout(60)  # without the read watchdog the main process waits forever: fail instead
def test_a_worker_stopped_halfway_through_sending_its_answer_is_killed(monkeypatch):
    """An answer larger than the socket's buffers (here 2 x 1024 px images, 6 MB; the buffers hold
    a few hundred KB) blocks the worker until the main process reads; stopped then, the answer is
    part there and a plain read would block forever once data has arrived. The call's limit still
    ends it, naming what happened."""
    monkeypatch.setattr(worker_module, "READ_GRACE_S", 0.5)
    sim = functools.partial(loaded_reach, num_envs=2, image_size=1024)
    with SimWorker(sim, name="half", timeout_s=1.5) as w:
        w.submit("reset", [0, 1], None)
        deadline = time.monotonic() + 30
        while not w.poll(0.05):  # the first bytes of the answer are in the pipe; the rest waits
            assert time.monotonic() < deadline, "the worker never answered"
        time.sleep(0.2)
        os.kill(w.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(WorkerCrashed) as crash:
            w.result()
        assert time.monotonic() - t0 < 5.0
        message = str(crash.value)
        assert "sim worker 'half'" in message and "was killed: silent for" in message
        assert "it stopped halfway through sending its answer" in message
        with pytest.warns(RuntimeWarning, match="halfway through sending its answer"):
            w.restart()
        assert w.reset([0, 1]).image.shape == (2, 1024, 1024, 3)  # and it serves again
