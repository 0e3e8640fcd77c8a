"""A benchmark's ``--jobs`` workers (`mmrl.utils.processes.side_by_side`) and child scripts started
with `child_env` stop when the process that started them is killed alone (``kill PID`` /
``pkill -f``), instead of training on as orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mmrl.utils.processes import side_by_side

ROOT = Path(__file__).resolve().parents[2]

# a "benchmark" whose two workers record their pids, then sleep far longer than the test waits
SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from mmrl.utils.processes import side_by_side

    def hold(path):
        open(path + ".part", "w").write(str(os.getpid()))
        os.replace(path + ".part", path)
        time.sleep(300)

    if __name__ == "__main__":
        side_by_side(hold, sys.argv[1:], jobs=2, poll_s=0.2)
    """
)


# the same with two child scripts (vs_sb3's `spawn`): started with child_env, they ask for the watchdog
CHILD = textwrap.dedent(
    """
    import os, sys, time
    from mmrl.utils.processes import exit_with_parent_if_asked

    exit_with_parent_if_asked(poll_s=0.2)
    path = sys.argv[1]
    open(path + ".part", "w").write(str(os.getpid()))
    os.replace(path + ".part", path)
    time.sleep(300)
    """
)
SCRIPTS = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from mmrl.utils.processes import child_env

    env = {**os.environ, **child_env()}
    kids = [subprocess.Popen([sys.executable, "-c", sys.argv[1], p], env=env) for p in sys.argv[2:]]
    time.sleep(300)
    """
)


def _running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan's zombie waits for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _wait(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
@pytest.mark.parametrize("kind", ["pool", "scripts"])
def test_workers_stop_when_their_parent_is_killed(tmp_path, kind):
    script = tmp_path / "bench.py"
    script.write_text(SCRIPT if kind == "pool" else SCRIPTS)
    marks = [tmp_path / "w0.pid", tmp_path / "w1.pid"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = [] if kind == "pool" else [CHILD]
    parent = subprocess.Popen(
        [sys.executable, str(script), *child, *map(str, marks)], stderr=subprocess.PIPE, text=True, env=env
    )
    pids: list[int] = []
    try:
        assert _wait(lambda: all(m.exists() for m in marks), 120), "the workers never started"
        pids = [int(m.read_text()) for m in marks]
        assert all(_running(p) for p in pids)
        parent.send_signal(signal.SIGKILL)  # the main process alone, as `kill -9 PID` does
        parent.wait(30)
        assert _wait(lambda: not any(_running(p) for p in pids), 15), "a worker outlived its killed parent"
        err = parent.stderr.read() if parent.stderr else ""
        assert err.count("this worker stops too") == 2, err
    finally:
        for p in pids:
            if _running(p):
                os.kill(p, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def _square(x: int) -> int:
    return x * x


def test_side_by_side_keeps_input_order_and_checks_jobs():
    assert side_by_side(_square, [3, 1, 2], jobs=2) == [9, 1, 4]
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        side_by_side(_square, [1], jobs=0)
