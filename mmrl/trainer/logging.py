"""Run logs: JSONL always, TensorBoard always, Weights & Biases when asked."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from mmrl.utils import jsonio
from mmrl.utils.durable import fsync_path
from mmrl.utils.faults import fault_point


class RunLogger:
    def __init__(
        self,
        out_dir: Path,
        use_wandb: bool = False,
        wandb_project: str = "mmrl",
        config: dict | None = None,
        name: str | None = None,
    ):
        out_dir.mkdir(parents=True, exist_ok=True)
        self.out_dir = out_dir
        self.jsonl = open(out_dir / "metrics.jsonl", "a", buffering=1)
        self.tb = self._writer()
        self._phases: dict = {}  # TensorBoard writers of the phases before RL (tb/<phase>)
        if config is not None:  # TensorBoard's text tab shows the run's resolved config
            import yaml

            self.tb.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)
        self.wandb = None
        if use_wandb:
            try:
                import wandb
            except ImportError as exc:
                raise ImportError("run.wandb=true needs wandb: pip install 'mmrl[wandb]'") from exc
            self.wandb = wandb.init(project=wandb_project, dir=str(out_dir), config=config, name=name, resume="allow")

    def _writer(self, purge_step: int | None = None, sub: str | None = None):
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(self.out_dir / "tb" / sub if sub else self.out_dir / "tb"), purge_step=purge_step)

    def rewind(self, step: int) -> None:
        """Forget what was logged after ``step`` (a resumed run redoes those steps). The kept rows
        go to a temporary file, fsynced, that then replaces ``metrics.jsonl`` in one rename: a kill
        at any instant leaves the old log or the new one. A torn last row (a kill mid-write) goes."""
        self.jsonl.close()
        path, tmp = self.out_dir / "metrics.jsonl", self.out_dir / "metrics.jsonl.tmp"
        keep = [line for line in path.read_text().splitlines() if _step(line) <= step]
        with open(tmp, "w") as f:
            f.write("".join(line + "\n" for line in keep))
            f.flush()
            os.fsync(f.fileno())
        fault_point("log.mid_rewind", tmp)
        os.replace(tmp, path)
        fsync_path(self.out_dir)
        fault_point("log.after_rewind", path)
        self.jsonl = open(path, "a", buffering=1)
        self.tb.close()
        # TensorBoard drops every scalar and image at ``step`` and later; the kept scalars of
        # ``step`` (logged before the checkpoint) are written again, so its scalars are metrics.jsonl's
        # exactly: an evaluation logged between two saves of one iteration and redone by the resumed
        # run appears once. (TensorBoard purges no text: a table redone at ``step`` shows twice;
        # an image logged at ``step`` before the save is dropped.)
        self.tb = self._writer(purge_step=step)
        for line in keep:
            if _step(line) == step:
                row = json.loads(line)
                row.pop("step")
                self._to_tensorboard(step, row, tables=False)

    def log(self, step: int, metrics: dict, phase: str | None = None, phase_step: int = 0) -> None:
        """One row of ``metrics`` at iteration ``step``. A ``phase`` before the RL iterations (the
        warm start) keeps its rows before them in the log (``step`` < 0, with ``phase`` and
        ``phase_step``), and shows them in TensorBoard as a run of its own, ``tb/<phase>``, at
        ``phase_step`` >= 0 (W&B gets their last values in the run's summary: its steps only grow)."""
        clean = {k: _scalar(v) for k, v in metrics.items()}
        where = {"phase": phase, "phase_step": phase_step} if phase else {}
        row = jsonio.dumps({"step": step, **where, **clean}) + "\n"  # strict JSON: NaN is written null
        self.jsonl.write(row)  # line-buffered: on disk (in the page cache) once written
        fault_point("log.mid_row", self.jsonl.name, cut=len(row) // 2)
        fault_point("log.after_row", self.jsonl.name)
        if phase:
            writer = self._phases.get(phase)
            if writer is None:  # a phase (re)started in this process: what an earlier try logged goes
                writer = self._phases[phase] = self._writer(purge_step=0, sub=phase)
            self._to_tensorboard(phase_step, clean, tables=False, writer=writer)
            if self.wandb is not None:
                self.wandb.summary.update({k: v for k, v in clean.items() if isinstance(v, (int, float))})
            return
        self._to_tensorboard(step, clean)
        if self.wandb is not None:
            import wandb

            self.wandb.log(
                {
                    k: wandb.Table(columns=list(v[0]), data=[list(r.values()) for r in v]) if _is_table(v) else v
                    for k, v in clean.items()
                },
                step=step,
            )

    def _to_tensorboard(self, step: int, clean: dict, tables: bool = True, writer=None) -> None:
        writer = self.tb if writer is None else writer  # a phase's own run (tb/<phase>), else the run's
        for k, v in clean.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                writer.add_scalar(k, v, step)
            elif tables and _is_table(v):  # e.g. the completions of a VLM iteration: a markdown table
                writer.add_text(k, _markdown(v), step)

    def media(self, step: int, key: str, video: Path) -> None:
        """An evaluation's video and its still grid (the PNG beside it): the grid as a TensorBoard
        image and the video as an animated one (``<key>/video``, a GIF of at most `GIF_FRAMES`
        frames: TensorBoard plays GIFs in its images tab), both to W&B (``wandb.Video``,
        ``wandb.Image``) when it is on."""
        still = Path(video).with_suffix(".png")
        if still.exists():
            import imageio.v2 as imageio

            self.tb.add_image(key, imageio.imread(str(still)), step, dataformats="HWC")
        gif = animated_gif(Path(video))
        if gif is not None:
            from tensorboard.compat.proto.summary_pb2 import Summary

            data, (h, w) = gif
            image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=data)
            self.tb._get_file_writer().add_summary(
                Summary(value=[Summary.Value(tag=f"{key}/video", image=image)]), step
            )
        if self.wandb is not None:
            import wandb

            self.wandb.log(
                {
                    f"{key}/video": wandb.Video(str(video), format="mp4"),
                    **({f"{key}/grid": wandb.Image(str(still))} if still.exists() else {}),
                },
                step=step,
            )

    def close(self) -> None:
        self.jsonl.close()
        self.tb.close()
        for writer in self._phases.values():
            writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def log_size(out_dir: Path) -> int:
    """Bytes in the run's ``metrics.jsonl`` now: every row logged so far (rows are written line-
    buffered, so none is held back). A checkpoint records it (`mmrl.trainer.checkpoint.save`)."""
    path = Path(out_dir) / "metrics.jsonl"
    return path.stat().st_size if path.exists() else 0


def cut_log(out_dir: Path, size: int | None) -> None:
    """Cut ``metrics.jsonl`` back to ``size`` bytes, its length when a checkpoint was saved, when it
    is longer and ends a row there: a resumed run redoes the rows logged after that save, those of its
    step included (the evaluation logged between a periodic save and the final save of one iteration,
    which `RunLogger.rewind` by step keeps). One truncate call: a kill leaves the log cut or not."""
    path = Path(out_dir) / "metrics.jsonl"
    if size is None or not path.exists() or path.stat().st_size <= size:
        return
    if size:
        with open(path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) != b"\n":  # not the log this checkpoint saw: leave it to rewind by step
                return
    os.truncate(path, size)
    fault_point("log.after_cut", path)


def _step(line: str) -> float:
    """A row's step; a torn row (the process killed while writing it) counts as after every step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def _scalar(v):
    if hasattr(v, "item"):
        v = v.item()
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _is_table(v) -> bool:
    """A list of rows (dicts with the same keys): logged as a table."""
    return isinstance(v, list) and bool(v) and all(isinstance(r, dict) for r in v)


def _markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    cell = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return "\n".join(
        [
            "| " + " | ".join(cols) + " |",
            "|" + "---|" * len(cols),
            *("| " + " | ".join(cell(r.get(c, "")) for c in cols) + " |" for r in rows),
        ]
    )


GIF_FRAMES = 64  # frames of a video's TensorBoard preview (longer videos: evenly spaced frames)


def animated_gif(video: Path, fps: int = 4) -> tuple[bytes, tuple[int, int]] | None:
    """The video (mp4, or its GIF fallback) as animated GIF bytes and its (height, width), at most
    `GIF_FRAMES` evenly spaced frames; None when there is no such file or it cannot be read (no
    ffmpeg: the video was written as a GIF, which is read instead)."""
    import io

    import imageio.v2 as imageio
    from PIL import Image

    path = video if video.exists() else video.with_suffix(".gif")
    if not path.exists():
        return None
    try:
        frames = imageio.mimread(str(path), memtest=False)
    except (OSError, ValueError, RuntimeError):  # no reader for the format here
        return None
    if not frames:
        return None
    if len(frames) > GIF_FRAMES:
        frames = [frames[round(i * (len(frames) - 1) / (GIF_FRAMES - 1))] for i in range(GIF_FRAMES)]
    images = [Image.fromarray(f[..., :3]) for f in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=1000 // fps, loop=0)
    return buf.getvalue(), (images[0].height, images[0].width)


class SilentLogger:
    """The logger of a rank other than 0: rank 0 writes the run's logs, the others write nothing."""

    def rewind(self, step: int) -> None:
        pass

    def log(self, step: int, metrics: dict, phase: str | None = None, phase_step: int = 0) -> None:
        pass

    def media(self, step: int, key: str, video: Path) -> None:
        pass

    def close(self) -> None:
        pass
