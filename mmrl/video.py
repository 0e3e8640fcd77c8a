"""Video inputs of VLM questions: decode a sample's video once, choose its frames, fit a pixel budget.

A dataset's ``videos`` column holds, per question, a list of video sources (most questions: one);
each source is one of

* a path to a video file (``str`` / ``pathlib.Path``; mp4, webm, ... decoded by imageio's ffmpeg
  plugin, imageio-ffmpeg), its frame rate read from the container;
* a Hugging Face ``datasets.Video`` value stored undecoded (``Video(decode=False)``): a dict
  ``{"path": str | None, "bytes": bytes | None}``;
* frames: a list of uint8 ``[H, W, 3]`` arrays / tensors, PIL images or image file paths, or one uint8
  ``[F, H, W, 3]`` array / tensor, at ``frames_fps`` frames per second (frames carry no rate of their
  own), or a dict ``{"frames": ..., "fps": float}`` that states it.

``datasets.Video`` decoded (its default, ``decode=True``) hands out ``torchcodec`` decoders; torchcodec
is not a dependency of mmrl: cast such a column with ``Video(decode=False)``.

`load_clip` turns a source into a `Clip`, the frames the model sees:

    source -> all frames uint8 [T, H, W, 3] at ``fps_in``
      -> ``n = min(max_frames, T, max(1, floor(T / fps_in * fps)))`` frames evenly spaced over the clip
         (``fps`` None: every frame, at most ``max_frames``)
      -> each frame resized to at most ``max_pixels`` pixels (aspect kept, bilinear, antialiased)

``Clip.fps`` is the rate of the chosen frames (``n / duration``), which the processor turns into
the model's temporal positions (Qwen2.5-VL: ``second_per_grid_ts``).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class VideoOptions:
    """How a video becomes frames (see the module docstring); ``policy.video_*`` in a VLM config.
    A bad value raises `ValueError` starting with the field's name."""

    fps: float | None = 2.0  # frames per second to sample; None: every frame (at most max_frames)
    max_frames: int = 16
    max_pixels: int | None = None  # per frame, applied before the processor (its own budget applies after)
    frames_fps: float = 2.0  # the rate of a video given as frames (no container to read it from)

    def __post_init__(self):
        if self.fps is not None and self.fps <= 0:
            raise ValueError(f"fps must be > 0 or None (every frame), got {self.fps}")
        if self.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {self.max_frames}")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1 or None, got {self.max_pixels}")
        if self.frames_fps <= 0:
            raise ValueError(f"frames_fps must be > 0, got {self.frames_fps}")


@dataclass
class Clip:
    """The frames of a video that a model sees.

    ``frames`` uint8 [n, H, W, 3]; ``indices`` [n]: their positions among the ``total_frames`` frames
    of the source, which plays at ``source_fps``; ``fps``: the rate of the chosen frames."""

    frames: torch.Tensor
    indices: list[int]
    total_frames: int
    source_fps: float
    fps: float = field(init=False)

    def __post_init__(self):
        self.fps = len(self.indices) / (self.total_frames / self.source_fps)

    def metadata(self):
        """transformers ``VideoMetadata`` of the chosen frames (the processor's ``sampled_fps`` is ``fps``)."""
        from transformers.video_utils import VideoMetadata

        h, w = self.frames.shape[1:3]
        return VideoMetadata(
            total_num_frames=self.total_frames,
            fps=self.source_fps,
            width=int(w),
            height=int(h),
            duration=self.total_frames / self.source_fps,
            frames_indices=list(self.indices),
        )


def describe(source: Any) -> str:
    """A short name of a video source for error messages."""
    if isinstance(source, (str, Path)):
        return str(source)
    if isinstance(source, dict):
        return str(source.get("path") or f"<dict with keys {sorted(source)}>")
    return f"<{type(source).__name__}>"


def decode(source: Any, frames_fps: float = 2.0) -> tuple[torch.Tensor, float]:
    """All frames of ``source`` (module docstring) -> (uint8 [T, H, W, 3], frames per second)."""
    if isinstance(source, (str, Path)):
        return _read_file(Path(source))
    if isinstance(source, dict) and "frames" in source:
        return _stack(source["frames"]), float(source.get("fps") or frames_fps)
    if isinstance(source, dict) and ("path" in source or "bytes" in source):  # datasets.Video(decode=False)
        if source.get("bytes"):
            suffix = Path(source.get("path") or "video.mp4").suffix or ".mp4"
            with tempfile.NamedTemporaryFile(suffix=suffix) as f:  # the ffmpeg plugin reads files
                f.write(source["bytes"])
                f.flush()
                return _read_file(Path(f.name))
        if source.get("path"):
            return _read_file(Path(source["path"]))
    if isinstance(source, (list, tuple, torch.Tensor)) or hasattr(source, "__array__"):
        return _stack(source), float(frames_fps)
    raise TypeError(
        f"unsupported video source {describe(source)}: give a file path, a list of uint8 [H, W, 3] frames, "
        "a uint8 [F, H, W, 3] array, {'frames', 'fps'}, or datasets.Video(decode=False)'s {'path', 'bytes'} "
        "(decoded datasets.Video values need torchcodec: cast the column with Video(decode=False))"
    )


def _read_file(path: Path) -> tuple[torch.Tensor, float]:
    if not path.is_file():
        raise FileNotFoundError(
            f"video file {path} does not exist: fix the dataset's video path (relative paths are read from "
            f"{Path.cwd()})"
        )
    import imageio.v2 as imageio

    reader = imageio.get_reader(str(path), format="ffmpeg")
    try:
        fps = float(reader.get_meta_data().get("fps") or 0)
        frames = [torch.from_numpy(frame[..., :3].copy()) for frame in reader.iter_data()]
    finally:
        reader.close()
    if not frames or fps <= 0:
        raise ValueError(f"video file {path} has no frames or no frame rate ({len(frames)} frames, {fps} fps)")
    return torch.stack(frames), fps


def _stack(frames: Any) -> torch.Tensor:
    import numpy as np

    if isinstance(frames, torch.Tensor) or (hasattr(frames, "__array__") and not isinstance(frames, list)):
        out = torch.as_tensor(np.asarray(frames))
    else:
        if len(frames) == 0:
            raise ValueError("a video given as frames needs at least one frame")
        out = torch.stack([torch.as_tensor(_frame(f)) for f in frames])
    if out.dim() != 4 or out.shape[-1] != 3 or out.dtype != torch.uint8:
        raise ValueError(f"video frames must be uint8 [F, H, W, 3], got {out.dtype} {list(out.shape)}")
    return out


def _frame(f: Any):
    """One frame as a numpy array: an image file path (read by Pillow) or a PIL image as RGB, an array as is."""
    import numpy as np

    if isinstance(f, (str, Path)):
        from PIL import Image

        with Image.open(f) as im:
            return np.array(im.convert("RGB"))
    return np.array(f.convert("RGB") if hasattr(f, "convert") else f)


def frame_indices(total: int, fps_in: float, opts: VideoOptions) -> list[int]:
    """Which of ``total`` frames (at ``fps_in``) to keep: ``n`` evenly spaced (module docstring)."""
    n = total if opts.fps is None else max(1, math.floor(total / fps_in * opts.fps + 1e-9))
    n = min(n, opts.max_frames, total)
    if n == 1:
        return [0]
    return [round(i * (total - 1) / (n - 1)) for i in range(n)]


def fit_pixels(frames: torch.Tensor, max_pixels: int | None) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> the same, downscaled (aspect kept) so that H * W <= ``max_pixels``."""
    h, w = frames.shape[1:3]
    if max_pixels is None or h * w <= max_pixels:
        return frames
    scale = math.sqrt(max_pixels / (h * w))
    size = (max(1, math.floor(h * scale)), max(1, math.floor(w * scale)))
    x = F.interpolate(frames.permute(0, 3, 1, 2).float(), size=size, mode="bilinear", antialias=True)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def load_clip(source: Any, opts: VideoOptions) -> Clip:
    """``source`` decoded, its frames chosen and fitted to the pixel budget (module docstring)."""
    frames, fps_in = decode(source, opts.frames_fps)
    idx = frame_indices(frames.shape[0], fps_in, opts)
    return Clip(fit_pixels(frames[idx], opts.max_pixels), idx, int(frames.shape[0]), fps_in)


def first_frame(source: Any, frames_fps: float = 2.0) -> torch.Tensor:
    """uint8 [H, W, 3]: the first frame of ``source`` (a thumbnail)."""
    return decode(source, frames_fps)[0][0]


class ClipCache:
    """`load_clip` once per source: a GRPO group's answers share their question's decoded video.
    Keyed by the path (a file source) or the object's identity (frames held by the dataset); the
    owner calls `clear` once an iteration is over."""

    def __init__(self, opts: VideoOptions):
        self.opts = opts
        self._clips: dict[Any, Clip] = {}

    @staticmethod
    def key(source: Any):
        if isinstance(source, (str, Path)):
            return ("path", str(source))
        if isinstance(source, dict) and source.get("path") and not source.get("bytes"):
            return ("path", str(source["path"]))
        return ("object", id(source))

    def get(self, source: Any) -> Clip:
        key = self.key(source)
        if key not in self._clips:
            self._clips[key] = load_clip(source, self.opts)
        return self._clips[key]

    def clear(self) -> None:
        self._clips.clear()

    def __len__(self) -> int:
        return len(self._clips)


__all__ = ["VideoOptions", "Clip", "ClipCache", "load_clip", "decode", "frame_indices", "fit_pixels", "first_frame"]
