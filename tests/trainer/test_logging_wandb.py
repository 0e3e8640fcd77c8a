"""W&B gets the run's config and name, tables (the VLM completions) and evaluation media; run offline
(WANDB_MODE=offline: nothing leaves the machine)."""

import pytest
import torch

wandb = pytest.importorskip("wandb")

from mmrl.rollout import write_video  # noqa: E402
from mmrl.trainer.logging import RunLogger  # noqa: E402


def test_wandb_gets_config_name_tables_and_media(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged = []
    logger = RunLogger(tmp_path, use_wandb=True, wandb_project="t", config={"trainer": {"lr": 0.1}}, name="myrun")
    real = logger.wandb.log
    monkeypatch.setattr(
        logger.wandb, "log", lambda data, step=None: (logged.append((step, data)), real(data, step=step))
    )
    assert logger.wandb.name == "myrun" and dict(logger.wandb.config) == {"trainer": {"lr": 0.1}}
    logger.log(1, {"train/x": 1.0, "train/completions": [{"prompt": "p", "completion": "c", "reward": 1.0}]})
    write_video(torch.zeros(2, 4, 16, 16, 3, dtype=torch.uint8), tmp_path / "videos" / "v.mp4", captions=["a"] * 4)
    logger.media(1, "eval/final", tmp_path / "videos" / "v.mp4")
    logger.close()
    assert isinstance(logged[0][1]["train/completions"], wandb.Table) and logged[0][1]["train/x"] == 1.0
    assert isinstance(logged[1][1]["eval/final/video"], wandb.Video)
    assert isinstance(logged[1][1]["eval/final/grid"], wandb.Image)


def test_the_warm_start_is_a_tensorboard_run_of_its_own_at_steps_from_zero(tmp_path, monkeypatch):
    """Issue 31: warm-start rows stay before the RL iterations in metrics.jsonl (step < 0, with their
    phase and phase step) but TensorBoard shows them as the run tb/warm_start at steps 0, 1, ...;
    W&B, whose steps only grow, gets their last values in its summary (not dropped with a warning)."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = RunLogger(tmp_path, use_wandb=True, wandb_project="t")
    for s in range(3):
        logger.log(s - 3, {"warm_start/loss": 1.0 / (s + 1)}, phase="warm_start", phase_step=s)
    logger.log(1, {"train/x": 1.0})
    assert logger.wandb.summary["warm_start/loss"] == pytest.approx(1 / 3)
    logger.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r.get("phase"), r.get("phase_step")) for r in rows] == [
        (-3, "warm_start", 0),
        (-2, "warm_start", 1),
        (-1, "warm_start", 2),
        (1, None, None),
    ]
    warm = EventAccumulator(str(tmp_path / "tb" / "warm_start")).Reload()
    assert [e.step for e in warm.Scalars("warm_start/loss")] == [0, 1, 2]
    main = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert "warm_start/loss" not in main.Tags()["scalars"] and "train/x" in main.Tags()["scalars"]
