"""The dataset recipes ship in the wheel as ``mmrl_datasets`` and are found there.

``datasets/`` is no import package (a top-level ``datasets`` would shadow Hugging Face datasets), so
pyproject.toml lists the packages by hand and maps ``mmrl_datasets`` to the folder. These tests keep
that list complete and check that `mmrl.data` finds the recipes in a wheel's layout (no source tree
beside the package). scripts/check_wheel.sh builds and installs the real wheel.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    """Every package folder ships, the adapters under names that belong to mmrl (issue 31: a wheel
    must not take the top-level names `simulators` / `rewards` from other projects)."""
    st = _setuptools()
    installed_as = {"simulators": "mmrl_simulators", "rewards": "mmrl_rewards"}
    found = {
        ".".join(
            [installed_as.get(p.parent.relative_to(ROOT).parts[0], p.parent.relative_to(ROOT).parts[0])]
            + list(p.parent.relative_to(ROOT).parts[1:])
        )
        for top in ("mmrl", "simulators", "rewards")
        for p in (ROOT / top).rglob("__init__.py")
    }
    missing = sorted(found - set(st["packages"]))
    assert not missing, f"add {missing} to [tool.setuptools] packages in pyproject.toml (the wheel lacks them)"
    assert all(st["package-dir"][v] == k for k, v in installed_as.items())
    assert not {"datasets", "simulators", "rewards"} & set(st["packages"])
    assert not (ROOT / "datasets" / "__init__.py").exists()


def test_every_recipe_file_ships_as_mmrl_datasets():
    st = _setuptools()
    assert st["package-dir"]["mmrl_datasets"] == "datasets" and "mmrl_datasets" in st["packages"]
    patterns = st["package-data"]["mmrl_datasets"]
    for f in (ROOT / "datasets").glob("*/*"):
        if f.is_file() and f.suffix != ".pyc":
            rel = f.relative_to(ROOT / "datasets").as_posix()
            assert any(fnmatch.fnmatch(rel, p) for p in patterns), f"datasets/{rel} would not be in the wheel"


def test_recipes_found_in_a_wheel_layout(tmp_path):
    """mmrl and mmrl_datasets side by side as pip installs them: the recipes load from there, and a
    builder that imports another by path (shapes_prompts -> shapes) works."""
    site = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "mmrl", site / "mmrl", ignore=ignore)
    for folder, name in (("datasets", "mmrl_datasets"), ("simulators", "mmrl_simulators"), ("rewards", "mmrl_rewards")):
        shutil.copytree(ROOT / folder, site / name, ignore=ignore)
    code = (
        "import importlib.util, mmrl.data as d; print(d.__file__); print(d.DATASETS_DIR); "
        "print(len(d.load_dataset('shapes_prompts', split='eval')['prompt'])); "
        "from mmrl.registry import SIMULATORS; print(SIMULATORS.get('reach').__module__); "
        "print(importlib.util.find_spec('simulators'), importlib.util.find_spec('rewards'))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}  # the wheel's layout alone
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    module, folder, count, reach, *specs = out.stdout.split()
    assert Path(module).is_relative_to(site) and Path(folder) == site / "mmrl_datasets"
    assert int(count) > 0  # shapes_prompts reads rewards/shapes.py as mmrl_rewards.shapes
    assert reach == "mmrl_simulators.reach" and specs == ["None", "None"]  # no top-level simulators / rewards
