"""Run logs: JSONL always, TensorBoard always, Weights & Biases when asked."""

from __future__ import annotations

import json
import math
from pathlib import Path


class RunLogger:
    def __init__(self, out_dir: Path, use_wandb: bool = False, wandb_project: str = "mmrl",
                 config: dict | None = None):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.jsonl = open(out_dir / "metrics.jsonl", "a", buffering=1)
        self.tb = self._writer()
        self.wandb = None
        if use_wandb:
            try:
                import wandb
            except ImportError as exc:
                raise ImportError("run.wandb=true needs wandb: pip install 'mmrl[wandb]'") from exc
            self.wandb = wandb.init(project=wandb_project, dir=str(out_dir), config=config, resume="allow")

    def _writer(self, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.out_dir / "tb"), purge_step=purge_step)

    def rewind(self, step: int) -> None:
        """Forget what was logged after ``step`` (a resumed run redoes those steps)."""
        self.jsonl.close()
        path = self.out_dir / "metrics.jsonl"
        keep = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))
        self.jsonl = open(path, "a", buffering=1)
        self.tb.close()
        self.tb = self._writer(purge_step=step + 1)

    def log(self, step: int, metrics: dict) -> None:
        clean = {k: _scalar(v) for k, v in metrics.items()}
        self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        for k, v in clean.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(clean, step=step)

    def close(self) -> None:
        self.jsonl.close()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def _scalar(v):
    if hasattr(v, "item"):
        v = v.item()
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
