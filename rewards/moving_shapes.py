"""Programmatic prompt-following reward for the synthetic `moving_shapes` videos (and their grammar).

The `moving_shapes` dataset (``datasets/moving_shapes/``) draws ONE coloured shape moving in a
straight line on a plain background and describes it as::

    "a red square moving to the right"      (colour, shape, direction)

Colours, shapes, the background and the per-frame image analysis are those of `rewards.shapes`
(imported, not copied); this module adds the directions, `describe` / `parse_prompt`, and
`MovingShapesReward`. The grammar lives here because both the dataset builder and the reward need
it, and ``datasets/`` is not an import package.

`MovingShapesReward` scores a video uint8 ``[F, H, W, 3]`` against its prompt (``meta["color"]``,
``["shape"]``, ``["direction"]``, or the prompt parsed with `parse_prompt`). Every step is a pure
function:

1. `track` (per frame, `rewards.shapes.classify_colors` then `connected_components` and
   `component_stats`, components smaller than ``min_area`` ignored): the largest component of the
   prompt's colour c (the "blob"): whether there is one (``present``), its shape from the fill ratio
   (`rewards.shapes.shape_from_fill`: square ~1, circle ~pi/4, triangle ~1/2 of its bounding box),
   its centroid, and ``purity`` = pixels of kept components of colour c / pixels of kept components
   of any palette colour (1 when there are none).
2. `score_track`, per video of F frames:

   - ``color``     = fraction of frames with a blob of colour c
   - ``shape``     = fraction of frames whose blob is classified as the prompt's shape
   - ``direction`` = clip(p / ``min_travel``, 0, 1), where p is the blob centroid's displacement
     from the first to the last frame with a blob, projected on the prompt's direction and
     normalised by the frame size along it (dx / W for left / right, dy / H for up / down): a blob
     that travels at least ``min_travel`` (default `MIN_TRAVEL` = 1/4) of the frame the right way
     gets full credit, a still one or one moving another way 0
   - ``purity``    = mean over frames of the frame's purity
   - score = purity * (w_color * color + w_shape * shape + w_direction * direction) /
     (w_color + w_shape + w_direction), in [0, 1]

The dataset's own videos score 1.0; the same video of the wrong direction, or of the wrong shape,
about 2/3; a still shape about 2/3; a video of another colour 0 (no blob of the prompt's colour).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from mmrl.reward import ComponentReward

from .shapes import (
    BACKGROUND,
    COLORS,
    SHAPES,
    classify_colors,
    component_stats,
    connected_components,
    palette_tensor,
)

# ---------------------------------------------------------------------------------------------
# The grammar shared with datasets/moving_shapes/builder.py
# ---------------------------------------------------------------------------------------------

DIRECTIONS: tuple[str, ...] = ("right", "left", "up", "down")
DIRECTION_PHRASES: dict[str, str] = {
    "right": "moving to the right",
    "left": "moving to the left",
    "up": "moving up",
    "down": "moving down",
}
#: unit vector (dx, dy) of each direction in image coordinates (x to the right, y down)
DIRECTION_VECTORS: dict[str, tuple[int, int]] = {"right": (1, 0), "left": (-1, 0), "up": (0, -1), "down": (0, 1)}
#: the travel (fraction of the frame along the direction) that earns full direction credit; the
#: dataset's shapes always travel at least this far
MIN_TRAVEL = 0.25

_PHRASE_DIRECTIONS = {v: k for k, v in DIRECTION_PHRASES.items()}
_PROMPT_RE = re.compile(r"^(?:a|an|one) (?P<color>\w+) (?P<shape>\w+) (?P<direction>moving .+)$")


def describe(color: str, shape: str, direction: str) -> str:
    """``("red", "square", "right")`` -> "a red square moving to the right"."""
    return f"a {color} {shape} {DIRECTION_PHRASES[direction]}"


def parse_prompt(prompt: str) -> dict:
    """A prompt of the grammar -> ``{"color", "shape", "direction"}``; ValueError otherwise."""
    m = _PROMPT_RE.match(prompt.strip().lower().rstrip("."))
    if m is None or m["color"] not in COLORS or m["shape"] not in SHAPES or m["direction"] not in _PHRASE_DIRECTIONS:
        raise ValueError(
            f"cannot parse moving shapes prompt {prompt!r}: expected e.g. 'a red square moving to the right' "
            f"(colours {sorted(COLORS)}, shapes {list(SHAPES)}, directions {list(DIRECTION_PHRASES.values())})"
        )
    return {"color": m["color"], "shape": m["shape"], "direction": _PHRASE_DIRECTIONS[m["direction"]]}


# ---------------------------------------------------------------------------------------------
# Pure video functions
# ---------------------------------------------------------------------------------------------


def track(
    frames: torch.Tensor,
    color: torch.Tensor,
    palette: torch.Tensor,
    background: Sequence[int] = BACKGROUND,
    max_dist: float = 60.0,
    min_area: int = 4,
) -> dict[str, torch.Tensor]:
    """The blob of colour ``color[n]`` (palette index, long [N]) in each frame ``frames[n]`` (uint8
    [N, H, W, 3]): ``present`` bool [N] (a kept component of that colour exists), ``shape`` long [N]
    (index in `SHAPES` of its largest such component; meaningless where absent), ``centroid`` float
    [N, 2] (x, y in pixels of that component; 0 where absent) and ``purity`` float [N] (see the
    module doc)."""
    n, h, w, _ = frames.shape
    cls = classify_colors(frames, palette, background, max_dist)  # [N, H, W]
    labels = connected_components(cls)
    st = component_stats(labels, min_area)
    # a component's label names one of its own pixels: label l is the component of pixel l - 1
    slot_color = torch.cat([torch.full((n, 1), -1, dtype=torch.long), cls.reshape(n, -1)], 1)  # [N, L]
    of_color = st["kept"] & (slot_color == color.view(n, 1))
    best_size, best = torch.where(of_color, st["size"], 0).max(1)
    present = best_size > 0
    blob = (labels == best.view(n, 1, 1)) & present.view(n, 1, 1)  # [N, H, W]
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    area = blob.sum((1, 2)).clamp(min=1).float()
    centroid = torch.stack([(blob * xs).sum((1, 2)) / area, (blob * ys).sum((1, 2)) / area], -1)
    kept_px = st["kept"].gather(1, labels.reshape(n, -1))  # [N, HW]: pixel in a kept component
    any_px = kept_px.sum(1).float()
    own_px = (kept_px & (cls.reshape(n, -1) == color.view(n, 1))).sum(1).float()
    purity = torch.where(any_px > 0, own_px / any_px.clamp(min=1), torch.ones(n))
    shape = st["shape"].gather(1, best.view(n, 1)).squeeze(1)
    return {"present": present, "shape": shape, "centroid": centroid, "purity": purity}


def travel(
    centroid: torch.Tensor, present: torch.Tensor, direction: torch.Tensor, size: tuple[int, int]
) -> torch.Tensor:
    """How far the blob went the prompt's way, as a fraction of the frame: ``centroid`` float
    [B, F, 2], ``present`` bool [B, F], ``direction`` float [B, 2] (unit (dx, dy)), ``size`` (H, W).
    p = (c[last] - c[first]) . direction / (W, H), first / last = the first / last frame with a
    blob; 0 with fewer than two such frames. Returns float [B] (negative: the other way)."""
    b, f = present.shape
    steps = torch.arange(f).expand(b, f)
    first = torch.where(present, steps, f).min(1).values.clamp(max=f - 1)
    last = torch.where(present, steps, -1).max(1).values.clamp(min=0)
    rows = torch.arange(b)
    shift = centroid[rows, last] - centroid[rows, first]  # [B, 2]
    h, w = size
    moved = (shift / torch.tensor([float(w), float(h)]) * direction).sum(-1)
    return torch.where(last > first, moved, torch.zeros(b))  # whatever the centroids of absent frames


def score_track(
    tracked: dict[str, torch.Tensor],
    shape: torch.Tensor,
    direction: torch.Tensor,
    size: tuple[int, int],
    min_travel: float = MIN_TRAVEL,
    weights: Sequence[float] = (1.0, 1.0, 1.0),
) -> dict[str, torch.Tensor]:
    """Combine `track` output reshaped to [B, F, ...] with each video's prompt (``shape`` long [B],
    ``direction`` float [B, 2]) into the components [B] of the module doc: ``color``, ``shape``,
    ``direction``, ``purity``, ``objects`` (the weighted mean of the first three) and ``score``
    (purity * objects)."""
    wc, ws, wd = (float(x) for x in weights)
    present = tracked["present"]
    color_ok = present.float().mean(1)
    shape_ok = (present & (tracked["shape"] == shape.view(-1, 1))).float().mean(1)
    moved = travel(tracked["centroid"], present, direction, size)
    direction_ok = (moved / min_travel).clamp(0.0, 1.0)
    purity = tracked["purity"].mean(1)
    objects = (wc * color_ok + ws * shape_ok + wd * direction_ok) / (wc + ws + wd)
    return {
        "color": color_ok,
        "shape": shape_ok,
        "direction": direction_ok,
        "purity": purity,
        "objects": objects,
        "score": purity * objects,
    }


# ---------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------


class MovingShapesReward(ComponentReward):
    """Programmatic prompt following in [0, 1] for moving-shapes prompts: colour, shape and
    direction of the one moving shape (see the module doc).

    ``min_area`` defaults to max(2, H*W // 64) pixels (4 at 16 px). ``min_travel``: the fraction of
    the frame a shape must travel the prompt's way for full direction credit. ``use_purity=False``
    drops the purity factor. Sample-independent: each video is scored on its own pixels only.
    """

    name = "moving_shapes"
    kind = "video"
    logged = ("color", "shape", "direction", "purity")  # logged beside the score by `parts`
    # what `mmrl.checks.reward.check_reward` scores (it only understands moving-shapes prompts)
    example_prompts = ["a red square moving to the right", "a blue circle moving up", "a green triangle moving down"]

    def __init__(
        self,
        *,
        colors: dict[str, tuple[int, int, int]] | None = None,
        background: Sequence[int] = BACKGROUND,
        max_color_dist: float = 60.0,
        min_area: int | None = None,
        min_travel: float = MIN_TRAVEL,
        w_color: float = 1.0,
        w_shape: float = 1.0,
        w_direction: float = 1.0,
        use_purity: bool = True,
    ):
        if not 0.0 < min_travel <= 1.0:
            raise ValueError(f"min_travel must be in (0, 1], got {min_travel}")
        if min(w_color, w_shape, w_direction) < 0 or w_color + w_shape + w_direction <= 0:
            raise ValueError("the weights w_color, w_shape, w_direction must be >= 0 and not all 0")
        self.colors = dict(colors or COLORS)
        self.palette = palette_tensor(self.colors)
        self.background = tuple(int(v) for v in background)
        self.max_color_dist = float(max_color_dist)
        self.min_area = min_area
        self.min_travel = float(min_travel)
        self.weights = (w_color, w_shape, w_direction)
        self.use_purity = use_purity

    def _spec(self, prompt: str, meta: dict) -> dict:
        spec = meta if meta and all(k in meta for k in ("color", "shape", "direction")) else parse_prompt(prompt)
        if spec["color"] not in self.colors or spec["shape"] not in SHAPES or spec["direction"] not in DIRECTIONS:
            raise ValueError(
                f"unknown moving shape {spec!r}: colours {list(self.colors)}, shapes {list(SHAPES)}, "
                f"directions {list(DIRECTIONS)}"
            )
        return spec

    def components(
        self, videos: torch.Tensor, prompts: Sequence[str], meta: Sequence[dict] | None = None
    ) -> dict[str, torch.Tensor]:
        """All components [B] (color, shape, direction, purity, objects, score) for logging."""
        prompts = list(prompts)
        meta = list(meta) if meta is not None else [{} for _ in prompts]
        specs = [self._spec(p, m) for p, m in zip(prompts, meta)]
        b, f, h, w, _ = videos.shape
        min_area = self.min_area if self.min_area is not None else max(2, (h * w) // 64)
        color = torch.tensor([list(self.colors).index(s["color"]) for s in specs])
        shape = torch.tensor([SHAPES.index(s["shape"]) for s in specs])
        direction = torch.tensor([DIRECTION_VECTORS[s["direction"]] for s in specs], dtype=torch.float32)
        frames = videos.cpu().reshape(b * f, h, w, 3)
        tracked = track(
            frames, color.repeat_interleave(f), self.palette, self.background, self.max_color_dist, min_area
        )
        tracked = {k: v.reshape(b, f, *v.shape[1:]) for k, v in tracked.items()}
        out = score_track(tracked, shape, direction, (h, w), self.min_travel, self.weights)
        if not self.use_purity:
            out["score"] = out["objects"]
        return out


__all__ = [
    "MovingShapesReward",
    "DIRECTIONS",
    "DIRECTION_PHRASES",
    "DIRECTION_VECTORS",
    "MIN_TRAVEL",
    "describe",
    "parse_prompt",
    "track",
    "travel",
    "score_track",
]
