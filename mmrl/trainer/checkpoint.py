"""Checkpoints: model, optimizer, RNG states and counters, with the resolved config beside them.

Layout: ``OUT/checkpoints/iter_000010/{state.pt, config.yaml}`` and ``OUT/checkpoints/latest``
naming the newest complete one. A checkpoint is written to a temporary folder and renamed, so a
run killed while saving leaves the previous checkpoint intact.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch


def save(out_dir: Path, cfg, policy, optimizer, state, keep: int = 2, extra: dict | None = None) -> Path:
    """Write checkpoint ``iter_<state.iteration>``; ``extra`` holds the trainer's other resumable
    state (e.g. the episodes in progress of fixed-length rollouts, the reward scaler)."""
    from mmrl.config import save_config

    root = Path(out_dir) / "checkpoints"
    name = f"iter_{state.iteration:06d}"
    final, tmp = root / name, root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(
        {
            # a training engine gathers ZeRO-3's partitioned weights; else the module's own
            "policy": optimizer.module_state_dict() if hasattr(optimizer, "module_state_dict")
            else policy.state_dict(),
            "optimizer": optimizer.state_dict(),
            "state": asdict(state),
            "extra": extra or {},
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                    "python": random.getstate()},
        },
        tmp / "state.pt",
    )
    save_config(cfg, tmp / "config.yaml")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest.tmp").write_text(name)
    (root / "latest.tmp").replace(root / "latest")
    for old in sorted(p for p in root.glob("iter_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_path(out_dir: Path) -> Path | None:
    pointer = Path(out_dir) / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.pt").exists() else None


def load_policy(path: Path, policy) -> dict:
    """Load weights from a checkpoint folder (or its state.pt); returns the saved counters."""
    path = Path(path)
    file = path / "state.pt" if path.is_dir() else path
    data = torch.load(file, map_location="cpu", weights_only=False)
    policy.load_state_dict(data["policy"])
    return data


def load_latest(out_dir: Path, policy, optimizer) -> tuple[dict, dict] | None:
    """Restore the newest checkpoint: weights, then the optimizer (``optimizer`` may be a callable
    returning it, so that an engine that copies the weights when built is built after they load).
    Returns ``(counters, extra)`` (see `save`), or None when there is no checkpoint."""
    path = latest_path(out_dir)
    if path is None:
        return None
    data = load_policy(path, policy)
    (optimizer() if callable(optimizer) else optimizer).load_state_dict(data["optimizer"])
    torch.set_rng_state(data["rng"]["torch"])
    np.random.set_state(data["rng"]["numpy"])
    random.setstate(data["rng"]["python"])
    return data["state"], data.get("extra", {})
