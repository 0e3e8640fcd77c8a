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
