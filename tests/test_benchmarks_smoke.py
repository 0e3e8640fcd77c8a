"""Every benchmark still runs (issue 28, "benchmarks rot unseen"): ``python benchmarks/<name>.py
--smoke`` (tiny settings, the whole code path, seconds to a minute) exits 0, its last line of stdout
is one JSON object, and it wrote nothing under ``runs/``, where documented runs live.

The benchmarks are found by glob, so a new one without ``--smoke`` fails here; ``benchmarks/_*.py``
are helpers (``_smoke.py``), not benchmarks. Each runs in a subprocess of this interpreter from the
repository root, its checkout first on ``PYTHONPATH``. A benchmark that needs what this interpreter
lacks is skipped, naming it (`NEEDS`): ``pretrained_vla`` runs in the LeRobot venv only
(``.venv-lerobot/bin/python -m pytest -q tests/test_benchmarks_smoke.py -k pretrained_vla``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
# most take 10-60 s on a quiet 2-core machine, libero_real and placement minutes (each LIBERO / ManiSkill env
# starts in seconds to tens of seconds); several times that on a loaded machine
TIMEOUT_S = 900


def libero_assets() -> bool:
    from simulators.libero import assets_expected

    return assets_expected()


def installed(name: str):
    return lambda: importlib.util.find_spec(name) is not None


# benchmark -> (check, what is missing and how to get it); the check runs in this interpreter
NEEDS = {
    "pretrained_vla": (
        installed("lerobot"),
        (
            "LeRobot, which runs in its own venv: bash scripts/setup_lerobot.sh, "
            "then .venv-lerobot/bin/python -m pytest -q "
            "tests/test_benchmarks_smoke.py -k pretrained_vla"
        ),
    ),
    "libero_real": (
        lambda: installed("libero")() and libero_assets(),
        "LIBERO and its scene assets: bash scripts/setup.sh libero && bash scripts/setup_libero_assets.sh",
    ),
    "vs_sb3": (installed("stable_baselines3"), "Stable-Baselines3: pip install -e '.[bench]'"),
    "distributed": (installed("deepspeed"), "DeepSpeed (its ZeRO rows): pip install -e '.[deepspeed]'"),
    "sample_efficiency": (installed("stable_baselines3"), "Stable-Baselines3: pip install -e '.[bench]'"),
    "vs_trl": (installed("trl"), "TRL: pip install -e '.[vlm,bench]'"),
    "semantic_reward": (installed("open_clip"), "open_clip: pip install -e '.[clip]'"),
}


def snapshot(folder: Path) -> dict[str, int]:
    """Modification times of ``folder`` and of what lies up to two levels below it (an added, removed
    or atomically replaced entry changes its parent's)."""
    if not folder.exists():
        return {}
    paths = [folder, *folder.glob("*"), *folder.glob("*/*")]
    return {str(p): p.lstat().st_mtime_ns for p in paths}


@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_smoke(name):
    check, missing = NEEDS.get(name, (lambda: True, ""))
    if not check():
        pytest.skip(f"benchmarks/{name}.py needs {missing}")
    runs = snapshot(ROOT / "runs")
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), "--smoke"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # its own process group: a timeout kills its workers too
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"benchmarks/{name}.py --smoke ran over {TIMEOUT_S} s; output ends:\n{out[-2000:]}\n{err[-3000:]}")
    tail = f"stdout ends:\n{out[-2000:]}\nstderr ends:\n{err[-3000:]}"
    seconds = time.time() - t0
    assert proc.returncode == 0, f"benchmarks/{name}.py --smoke exited {proc.returncode} after {seconds:.0f} s; {tail}"
    lines = out.splitlines()
    try:
        figures = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        figures = None
    assert isinstance(figures, dict), f"benchmarks/{name}.py --smoke: the last stdout line is not a JSON object; {tail}"
    assert snapshot(ROOT / "runs") == runs, f"benchmarks/{name}.py --smoke wrote under runs/ (documented runs)"
