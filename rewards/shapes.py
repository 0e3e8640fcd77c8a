"""Programmatic prompt-following reward for the synthetic `shapes` dataset (and its grammar).

The `shapes` dataset (``datasets/shapes/``) draws coloured shapes on a plain background and
describes them in a tiny grammar::

    "a red circle"                      tag single      (anywhere)
    "a green triangle at the top"       tag position    (left / right / top / bottom / center)
    "two blue squares"                  tag counting    (two or three, anywhere)
    "a red circle and a blue square"    tag color_attr  (two objects of different colours)

The grammar lives here (vocabulary, `describe`, `parse_prompt`, `REGIONS`) because both the
dataset builder and this reward need it, and ``datasets/`` is not an import package.

`ShapesReward` scores an image against the prompt's object list (``meta["objects"]``, or the
prompt parsed with `parse_prompt` when meta has none). Every step is a pure function:

1. `classify_colors`: each pixel gets the palette colour it is nearest to (RGB Euclidean), or -1
   when it is nearer the background or farther than ``max_color_dist`` from every colour.
2. `connected_components` (4-connectivity) per colour; components smaller than ``min_area`` pixels
   are noise and ignored ("kept" components are the rest).
3. `component_stats` / `shape_from_fill`: each kept component's shape from its fill ratio
   (pixels / bounding-box area): < 0.65 triangle, < 0.92 circle, else square (a drawn square
   fills 1.0, a circle 0.75-0.85, a triangle about 0.5).
4. Per requested object (colour c, shape s, count n, optional position p), with k = number of kept
   components of colour c (n summed over objects sharing colour c):

   - ``count``    = 1 - min(|k - n|, n) / n
   - ``shape``    = min(#kept components of colour c classified as s, n) / n
   - ``position`` = fraction of colour c's kept pixels inside region p (left / right / top / bottom
     half, center = the middle box [W/4, 3W/4) x [H/4, 3H/4)); only when the prompt names one
   - object score = weighted mean of these (weights ``w_count, w_shape, w_position``, default 1 each)

5. ``purity`` = pixels of kept components in the requested colours / pixels of kept components in
   any palette colour (1 when there are none).
6. score = purity * mean over requested objects of the object score, in [0, 1].

A colour never drawn gives that object 0; an image of the wrong colour scores 0; swapping colours
between the two objects of a color_attr prompt keeps ``count`` but loses ``shape`` (about 0.5).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from mmrl.reward import ComponentReward

# ---------------------------------------------------------------------------------------------
# The grammar shared with datasets/shapes/builder.py
# ---------------------------------------------------------------------------------------------

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 30, 30),
    "green": (30, 200, 40),
    "blue": (40, 80, 245),
    "yellow": (245, 225, 30),
    "purple": (190, 40, 230),
}
BACKGROUND: tuple[int, int, int] = (0, 0, 0)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
POSITIONS: tuple[str, ...] = ("left", "right", "top", "bottom", "center")
POSITION_PHRASES: dict[str, str] = {
    "left": "on the left",
    "right": "on the right",
    "top": "at the top",
    "bottom": "at the bottom",
    "center": "in the center",
}
COUNT_WORDS: dict[int, str] = {1: "a", 2: "two", 3: "three"}
TAGS: tuple[str, ...] = ("single", "position", "counting", "color_attr")
FILL_THRESHOLDS: tuple[float, float] = (0.65, 0.92)  # triangle below the first, circle below the second

_WORD_COUNTS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3}
_PHRASE_POSITIONS = {v: k for k, v in POSITION_PHRASES.items()}
_PHRASE_POSITIONS.update({"in the centre": "center", "in the middle": "center"})
_OBJECT_RE = re.compile(
    r"^(?P<count>a|an|one|two|three) (?P<color>\w+) (?P<shape>\w+?)s?"
    r"(?: (?P<pos>on the left|on the right|at the top|at the bottom|in the center|in the centre|in the middle))?$"
)


def object_phrase(obj: dict) -> str:
    """``{"color": "red", "shape": "circle", "count": 2, "position": None}`` -> "two red circles"."""
    n = int(obj.get("count", 1))
    text = f"{COUNT_WORDS[n]} {obj['color']} {obj['shape']}{'s' if n > 1 else ''}"
    if obj.get("position"):
        text += " " + POSITION_PHRASES[obj["position"]]
    return text


def describe(objects: Sequence[dict]) -> str:
    """The prompt for a list of objects: their phrases joined by " and "."""
    return " and ".join(object_phrase(o) for o in objects)


def infer_tag(objects: Sequence[dict]) -> str:
    if len(objects) > 1:
        return "color_attr"
    if int(objects[0].get("count", 1)) > 1:
        return "counting"
    return "position" if objects[0].get("position") else "single"


def make_meta(objects: Sequence[dict], tag: str | None = None) -> dict:
    """Meta of a prompt: ``tag``, ``objects`` (each color/shape/count/position) and, for
    convenience, the first object's ``color``, ``shape``, ``count`` and ``position`` at top level."""
    objects = [
        {"color": o["color"], "shape": o["shape"], "count": int(o.get("count", 1)), "position": o.get("position")}
        for o in objects
    ]
    first = objects[0]
    return {"tag": tag or infer_tag(objects), "objects": objects, **first}


def parse_prompt(prompt: str) -> dict:
    """Parse a prompt of the shapes grammar into its meta (see `make_meta`); ValueError otherwise."""
    text = prompt.strip().lower().rstrip(".")
    objects = []
    for part in text.split(" and "):
        m = _OBJECT_RE.match(part.strip())
        if m is None or m["color"] not in COLORS or m["shape"] not in SHAPES:
            raise ValueError(
                f"cannot parse shapes prompt {prompt!r}: expected e.g. 'a red circle on the left', "
                f"'two blue squares', 'a red circle and a blue square' (colours {sorted(COLORS)}, "
                f"shapes {list(SHAPES)}, counts a/two/three, positions {list(POSITION_PHRASES.values())})"
            )
        objects.append(
            {
                "color": m["color"],
                "shape": m["shape"],
                "count": _WORD_COUNTS[m["count"]],
                "position": _PHRASE_POSITIONS[m["pos"]] if m["pos"] else None,
            }
        )
    return make_meta(objects)


def region_masks(height: int, width: int) -> torch.Tensor:
    """bool [5, H, W] in `POSITIONS` order: left/right/top/bottom halves (by pixel centre) and the
    center box [W/4, 3W/4) x [H/4, 3H/4)."""
    ys = (torch.arange(height, dtype=torch.float32) + 0.5).view(height, 1).expand(height, width)
    xs = (torch.arange(width, dtype=torch.float32) + 0.5).view(1, width).expand(height, width)
    center = (xs > width / 4) & (xs < 3 * width / 4) & (ys > height / 4) & (ys < 3 * height / 4)
    return torch.stack([xs < width / 2, xs > width / 2, ys < height / 2, ys > height / 2, center])


# ---------------------------------------------------------------------------------------------
# Pure image functions
# ---------------------------------------------------------------------------------------------


def palette_tensor(colors: dict[str, tuple[int, int, int]] = COLORS) -> torch.Tensor:
    return torch.tensor(list(colors.values()), dtype=torch.float32)


def classify_colors(
    images: torch.Tensor, palette: torch.Tensor, background: Sequence[int] = BACKGROUND, max_dist: float = 60.0
) -> torch.Tensor:
    """uint8 [B, H, W, 3] -> long [B, H, W]: index of the nearest palette colour, or -1 where the
    pixel is nearest the background or farther than ``max_dist`` (RGB Euclidean) from all colours."""
    refs = torch.cat([palette.float(), torch.tensor([list(background)], dtype=torch.float32)])  # [P+1, 3]
    dist = torch.linalg.vector_norm(images.float().unsqueeze(-2) - refs, dim=-1)  # [B, H, W, P+1]
    best, idx = dist.min(-1)
    idx = torch.where((idx == len(palette)) | (best > max_dist), -1, idx)
    return idx


def connected_components(classes: torch.Tensor) -> torch.Tensor:
    """4-connected components of equal class. ``classes``: long [N, H, W] (-1 = no object) or a
    bool mask [N, H, W]. Returns long [N, H, W]: 0 off the objects; on them, 1 + the largest flat
    pixel index of the component (so equal labels <=> same component, within one image).

    Label propagation (each pixel takes the largest label among its same-class 4-neighbours) with a
    pointer jump per round (a pixel also takes the label of the pixel its label names), until
    nothing changes."""
    if classes.dtype == torch.bool:
        classes = torch.where(classes, 0, -1)
    n, h, w = classes.shape
    on = classes >= 0
    down = on[:, 1:] & (classes[:, 1:] == classes[:, :-1])  # pixel (y, x) joined to (y - 1, x)
    right = on[:, :, 1:] & (classes[:, :, 1:] == classes[:, :, :-1])  # (y, x) joined to (y, x - 1)
    lab = torch.where(on, torch.arange(1, h * w + 1, dtype=torch.long).view(1, h, w), 0)
    while True:
        new = lab.clone()
        new[:, 1:] = torch.where(down, torch.maximum(new[:, 1:], lab[:, :-1]), new[:, 1:])
        new[:, :-1] = torch.where(down, torch.maximum(new[:, :-1], lab[:, 1:]), new[:, :-1])
        new[:, :, 1:] = torch.where(right, torch.maximum(new[:, :, 1:], lab[:, :, :-1]), new[:, :, 1:])
        new[:, :, :-1] = torch.where(right, torch.maximum(new[:, :, :-1], lab[:, :, 1:]), new[:, :, :-1])
        flat = new.view(n, -1)
        jumped = torch.cat([torch.zeros(n, 1, dtype=torch.long), flat], 1).gather(1, flat).view(n, h, w)
        new = torch.maximum(new, jumped)
        if torch.equal(new, lab):
            return lab
        lab = new


def shape_from_fill(fill: torch.Tensor) -> torch.Tensor:
    """Fill ratio (component pixels / bbox area) -> shape index in `SHAPES` (circle 0, square 1,
    triangle 2): below 0.65 triangle, below 0.92 circle, else square."""
    lo, hi = FILL_THRESHOLDS
    return torch.where(fill < lo, 2, torch.where(fill < hi, 0, 1))


def component_stats(labels: torch.Tensor, min_area: int) -> dict[str, torch.Tensor]:
    """Per-label statistics of `connected_components` output [N, H, W] (label slots 0..H*W; slot 0
    is the background and never kept). Returns ``size`` long [N, L], ``fill`` float [N, L],
    ``shape`` long [N, L] (`shape_from_fill`) and ``kept`` bool [N, L] (size >= min_area)."""
    n, h, w = labels.shape
    slots = h * w + 1
    flat = labels.reshape(n, -1)
    size = torch.zeros(n, slots, dtype=torch.long).scatter_add_(1, flat, torch.ones_like(flat))
    ys = torch.arange(h).repeat_interleave(w).expand(n, -1)
    xs = torch.arange(w).repeat(h).expand(n, -1)

    def reduce(src, how, init):
        out = torch.full((n, slots), init, dtype=torch.long)
        return out.scatter_reduce_(1, flat, src, reduce=how, include_self=True)

    big = h + w
    width = reduce(xs, "amax", -1) - reduce(xs, "amin", big) + 1
    height = reduce(ys, "amax", -1) - reduce(ys, "amin", big) + 1
    size[:, 0] = 0
    fill = size.float() / (width * height).clamp(min=1).float()
    kept = size >= max(int(min_area), 1)
    return {"size": size, "fill": fill, "shape": shape_from_fill(fill), "kept": kept}


def color_features(
    images: torch.Tensor,
    palette: torch.Tensor,
    background: Sequence[int] = BACKGROUND,
    max_dist: float = 60.0,
    min_area: int = 4,
) -> dict[str, torch.Tensor]:
    """What every score is computed from, per image and palette colour (P colours):

    ``count`` long [B, P] (kept components), ``shape_count`` long [B, P, 3] (kept components per
    shape), ``pixels`` long [B, P] (pixels in kept components), ``position`` float [B, P, 5]
    (fraction of those pixels in each `POSITIONS` region; 0 when there are none).
    """
    b, h, w, _ = images.shape
    p = len(palette)
    cls = classify_colors(images, palette, background, max_dist)  # [B, H, W]
    labels = connected_components(cls)
    st = component_stats(labels, min_area)
    # a component's label names one of its own pixels: label l is the component of pixel l - 1
    slot_color = torch.cat([torch.full((b, 1), -1, dtype=torch.long), cls.reshape(b, -1)], 1)  # [B, L]
    of_color = slot_color.unsqueeze(1) == torch.arange(p).view(1, p, 1)  # [B, P, L]
    kept = st["kept"].unsqueeze(1) & of_color
    shape_count = torch.stack([(kept & (st["shape"] == s).unsqueeze(1)).sum(-1) for s in range(len(SHAPES))], -1)
    kept_px = st["kept"].gather(1, labels.reshape(b, -1))  # [B, HW]
    onehot = (kept_px.unsqueeze(1) & (cls.reshape(b, 1, -1) == torch.arange(p).view(1, p, 1))).float()  # [B, P, HW]
    pixels = onehot.sum(-1)
    in_region = onehot @ region_masks(h, w).reshape(len(POSITIONS), -1).float().T  # [B, P, 5]
    return {
        "count": kept.sum(-1),
        "shape_count": shape_count,
        "pixels": pixels.long(),
        "position": in_region / pixels.clamp(min=1).unsqueeze(-1),
    }


def object_specs(metas: Sequence[dict], colors: Sequence[str]) -> dict[str, torch.Tensor]:
    """Object lists -> padded tensors [B, K]: ``color``, ``shape``, ``count``, ``position`` (-1 when
    none) and ``valid``. ValueError for an unknown colour, shape or position."""
    k = max(len(m["objects"]) for m in metas)
    out = {key: torch.full((len(metas), k), -1, dtype=torch.long) for key in ("color", "shape", "count", "position")}
    out["valid"] = torch.zeros(len(metas), k, dtype=torch.bool)
    for i, m in enumerate(metas):
        for j, o in enumerate(m["objects"]):
            pos = o.get("position")
            if o.get("color") not in colors or o.get("shape") not in SHAPES or (pos and pos not in POSITIONS):
                raise ValueError(
                    f"unknown object {o!r}: colours {list(colors)}, shapes {list(SHAPES)}, positions {list(POSITIONS)}"
                )
            out["color"][i, j] = list(colors).index(o["color"])
            out["shape"][i, j] = SHAPES.index(o["shape"])
            out["count"][i, j] = int(o.get("count", 1))
            out["position"][i, j] = POSITIONS.index(o["position"]) if o.get("position") else -1
            out["valid"][i, j] = True
    return out


def score_objects(
    feats: dict[str, torch.Tensor], specs: dict[str, torch.Tensor], weights: Sequence[float] = (1.0, 1.0, 1.0)
) -> dict[str, torch.Tensor]:
    """Combine `color_features` [B, P, ...] and `object_specs` [B, K] into per-sample components
    [B]: ``count``, ``shape``, ``position`` (means over the requested objects; position over the
    objects that name one, 1.0 when none does), ``purity`` and the final ``score``."""
    wc, ws, wp = (float(x) for x in weights)
    valid = specs["valid"]
    color = specs["color"].clamp(min=0)
    n = specs["count"].clamp(min=1).float()
    b, p = feats["count"].shape
    # expected components per colour: objects sharing a colour add up
    expected = torch.zeros(b, p).scatter_add_(1, color, torch.where(valid, n, 0.0))
    n_col = expected.gather(1, color).clamp(min=1)
    k = feats["count"].gather(1, color).float()
    count = 1 - torch.minimum((k - n_col).abs(), n_col) / n_col
    m = feats["shape_count"].gather(1, color.unsqueeze(-1).expand(-1, -1, len(SHAPES)))
    shape = torch.minimum(m.gather(2, specs["shape"].clamp(min=0).unsqueeze(-1)).squeeze(-1).float(), n) / n
    has_pos = valid & (specs["position"] >= 0)
    pos_all = feats["position"].gather(1, color.unsqueeze(-1).expand(-1, -1, len(POSITIONS)))
    position = pos_all.gather(2, specs["position"].clamp(min=0).unsqueeze(-1)).squeeze(-1)
    obj = (wc * count + ws * shape + wp * position * has_pos) / (wc + ws + wp * has_pos)
    requested = torch.zeros(b, p, dtype=torch.long).scatter_add_(1, color, valid.long()) > 0
    px = feats["pixels"].float()
    total = px.sum(1)
    purity = torch.where(total > 0, (px * requested).sum(1) / total.clamp(min=1), torch.ones(b))

    def mean(x, mask):
        return (x * mask).sum(1) / mask.sum(1).clamp(min=1)

    objects = mean(obj, valid)
    return {
        "count": mean(count, valid),
        "shape": mean(shape, valid),
        "position": torch.where(has_pos.any(1), mean(position, has_pos), torch.ones(b)),
        "purity": purity,
        "objects": objects,
        "score": purity * objects,
    }


# ---------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------


class ShapesReward(ComponentReward):
    """Programmatic prompt-following score in [0, 1] for shapes-grammar prompts (see module doc).

    ``min_area`` defaults to max(2, H*W // 64) pixels (4 at 16 px, 16 at 32 px). ``use_purity=False``
    drops the purity factor. Sample-independent: each image is scored on its own pixels only.
    """

    name = "shapes"
    kind = "image"
    logged = ("count", "shape", "position", "purity")  # logged beside the score by `parts`
    # what `mmrl.checks.reward.check_reward` scores (it only understands shapes-grammar prompts)
    example_prompts = ["a red circle on the left", "two blue squares", "a green triangle and a yellow square"]

    def __init__(
        self,
        *,
        colors: dict[str, tuple[int, int, int]] | None = None,
        background: Sequence[int] = BACKGROUND,
        max_color_dist: float = 60.0,
        min_area: int | None = None,
        w_count: float = 1.0,
        w_shape: float = 1.0,
        w_position: float = 1.0,
        use_purity: bool = True,
    ):
        self.colors = dict(colors or COLORS)
        self.palette = palette_tensor(self.colors)
        self.background = tuple(int(v) for v in background)
        self.max_color_dist = float(max_color_dist)
        self.min_area = min_area
        self.weights = (w_count, w_shape, w_position)
        self.use_purity = use_purity

    def _metas(self, prompts: list[str], meta: list[dict]) -> list[dict]:
        out = []
        for prompt, m in zip(prompts, meta):
            out.append(m if m and m.get("objects") else parse_prompt(prompt))
        return out

    def components(
        self, images: torch.Tensor, prompts: Sequence[str], meta: Sequence[dict] | None = None
    ) -> dict[str, torch.Tensor]:
        """All components [B] (count, shape, position, purity, objects, score) for logging."""
        prompts = list(prompts)
        meta = list(meta) if meta is not None else [{} for _ in prompts]
        h, w = images.shape[1:3]
        min_area = self.min_area if self.min_area is not None else max(2, (h * w) // 64)
        feats = color_features(images.cpu(), self.palette, self.background, self.max_color_dist, min_area)
        specs = object_specs(self._metas(prompts, meta), list(self.colors))
        out = score_objects(feats, specs, self.weights)
        if not self.use_purity:
            out["score"] = out["objects"]
        return out
