"""The device check's CPU dry run (issue 30): ``scripts/device_check.py --cpu --tiny`` runs every step
of the GPU check on the CPU, so the script cannot rot between the times a GPU machine is lent.

The dry run hides the packages the GPU machine lacks (``--hide device``), so an import that would
fail there fails here. Every step gets a status; the steps whose packages this interpreter has are
``ok`` with finite figures, the others are skipped naming the package. A step that raises, or
hangs past its limit, is marked failed with the reason, and the run exits 1.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "device_check.py"
TIMEOUT_S = 1200  # about 100 s on 2 quiet cores; several times that on a loaded machine


def script():
    """scripts/device_check.py as a module (its `STEPS`)."""
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["device_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def dry_run(out: Path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(SCRIPT), "--cpu", "--tiny", "--out", str(out), *flags]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    report = json.loads((out / "device_check.json").read_text())
    return proc, report


def numbers(figures, path=""):
    """(dotted key, value) of every number in nested ``figures``."""
    if isinstance(figures, dict):
        return [kv for k, v in figures.items() for kv in numbers(v, f"{path}{k}.")]
    return [(path.rstrip("."), figures)] if isinstance(figures, int | float) else []


def test_dry_run_runs_every_step(tmp_path):
    dc = script()
    proc, report = dry_run(tmp_path, "--hide", "device", "--budget", str(TIMEOUT_S - 60))
    log = (tmp_path / "device_check.log").read_text()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}\n{log[-3000:]}"
    assert report["device"] == "cpu" and report["torch"] and report["commit"]
    assert list(report["steps"]) == [s.name for s in dc.STEPS]
    for step in dc.STEPS:
        entry = report["steps"][step.name]
        missing = [m for m in step.needs if importlib.util.find_spec(m) is None]
        if missing:
            assert entry["status"] == "skipped" and missing[0] in entry["reason"], (step.name, entry)
            continue
        assert entry["status"] == "ok", f"{step.name}: {entry}"
        assert entry["seconds"] > 0 and f"===== step {step.name}" in log
        values = numbers(entry["figures"])
        assert values, f"{step.name} measured nothing"
        assert all(math.isfinite(v) for _, v in values), f"{step.name}: non-finite figures {values}"
    # the hybrid step measured every placement mode (its GPU figures are env steps/s per mode)
    modes = report["steps"]["hybrid"]["figures"]["synthetic"]["modes"]
    assert {"collocated_1t", "disaggregated", "hybrid_s2"} <= set(modes), modes
    assert all(m["env_sps"] > 0 for m in modes.values()), modes


def test_a_step_that_raises_or_hangs_is_marked_failed(tmp_path):
    """A bad config override raises in one step, another hangs past its limit: both are failed with
    the reason (the error's last lines), the run goes on to the end and exits 1."""
    flags = ["--only", "quickstart", "diffusion", "--set", "quickstart:trainer.lr=-1"]
    proc, report = dry_run(tmp_path, *flags, "--inject", "diffusion=hang", "--step-timeout", "15")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert list(report["steps"]) == ["quickstart", "diffusion"]
    bad, hung = report["steps"]["quickstart"], report["steps"]["diffusion"]
    assert bad["status"] == "failed" and "ConfigError" in bad["error"] and "'lr' = -1" in bad["error"]
    assert hung["status"] == "failed" and hung["error"].startswith("timed out after 15 s")
    assert 15 <= hung["seconds"] < 60  # killed at its limit, not waited for
