"""Build the `moving_shapes` dataset: short clips of ONE coloured shape moving in a direction.

``build(num_samples)`` draws videos (uint8 [M, F, H, W, 3]) with prompts such as "a red square
moving to the right" and the ground truth in ``meta``; ``build_prompts(num_prompts, split=...)``
draws prompts only (for RL) from disjoint train / eval pools; ``draw(metas)`` renders correct
videos of given prompts. The grammar lives in `rewards.moving_shapes` (shared with
`MovingShapesReward`); colours, shapes, object sizes and rendering are the `shapes` dataset's. See
CARD.md. Run as a script to save a ``.pt`` file and / or an animated preview grid::

    python datasets/moving_shapes/builder.py --num 16 --preview runs/moving_shapes.gif
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import sys
from pathlib import Path

import torch

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_grammar = adapter("rewards.moving_shapes")  # rewards/moving_shapes.py, wherever mmrl installed it
COLORS = _grammar.COLORS
SHAPES = _grammar.SHAPES
DIRECTIONS = _grammar.DIRECTIONS
DIRECTION_VECTORS = _grammar.DIRECTION_VECTORS
MIN_TRAVEL = _grammar.MIN_TRAVEL
describe = _grammar.describe

CHUNK = 1024  # samples drawn per generator; sample i depends only on (seed, i), not on num_samples
SPLITS = ("train", "validation", "eval", "all")
#: ``val_fraction`` values a pool takes: none, or the fifth of the 60 prompts `validation` picks
VAL_FRACTIONS = (0.0, 0.2)


def _shapes_builder():
    from mmrl.data import builder_module

    return builder_module("shapes")  # render() and object_sizes() of datasets/shapes/builder.py


# ---------------------------------------------------------------------------------------------
# Prompt pools
# ---------------------------------------------------------------------------------------------


def _residue(color: str, shape: str, direction: str) -> int:
    """(colour index + shape index + direction index) modulo the number of colours: the pools' rule."""
    return (list(COLORS).index(color) + SHAPES.index(shape) + DIRECTIONS.index(direction)) % len(COLORS)


def held_out(color: str, shape: str, direction: str) -> bool:
    """Whether a prompt is in the eval pool: (colour index + shape index + direction index) is a
    multiple of the number of colours (12 of the 60 prompts). Every (shape, direction) pair keeps 4
    of its 5 colours in train, every (colour, shape) pair 3 or 4 of its directions, every (colour,
    direction) pair 2 or 3 of its shapes: each held-out prompt is a new combination of attribute
    pairs all seen in training."""
    return _residue(color, shape, direction) == 0


def validation(color: str, shape: str, direction: str) -> bool:
    """Whether a prompt is in the validation pool: (colour index + shape index + direction index) is 1
    modulo the number of colours, one more than `held_out`'s: 12 of the 48 train prompts, 3 per
    direction. Like the eval pool, each is a new combination of attribute pairs all still seen in the
    remaining 36 (every (shape, direction) pair keeps 3 of its 5 colours there, every (colour,
    shape) pair 2 or more of its directions, every (colour, direction) pair 1 or more of its shapes),
    so settings chosen on it face the generalisation eval measures without touching an eval prompt."""
    return _residue(color, shape, direction) == 1


def spec_pool(split: str = "train", val_fraction: float = 0.0) -> list[dict]:
    """The ``{"color", "shape", "direction"}`` of every prompt of ``split`` ("train", "validation",
    "eval" or "all"), in vocabulary order; fixed (independent of the seed): see `held_out`. With
    ``val_fraction`` 0.2 the `validation` prompts are carved out of the train pool (train keeps 36;
    split "validation" needs it); 0 (the default) leaves the train pool whole (48)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if val_fraction not in VAL_FRACTIONS:
        raise ValueError(
            f"val_fraction must be 0 or 0.2 (the validation pool is a fixed fifth of the prompts), got {val_fraction}"
        )
    if split == "validation" and not val_fraction:
        raise ValueError("split 'validation' needs val_fraction=0.2: it is carved out of the train pool")
    specs = [{"color": c, "shape": s, "direction": d} for c, s, d in itertools.product(COLORS, SHAPES, DIRECTIONS)]
    if split == "all":
        return specs
    if split == "eval":
        return [m for m in specs if held_out(**m)]
    train = [m for m in specs if not held_out(**m)]
    if not val_fraction:
        return train
    return [m for m in train if validation(**m) == (split == "validation")]


def prompt_pool(split: str = "train", val_fraction: float = 0.0) -> list[str]:
    """The prompts of a split (see `spec_pool`)."""
    return [describe(**m) for m in spec_pool(split, val_fraction)]


def _generator(seed: int, chunk: int) -> torch.Generator:
    digest = hashlib.sha256(f"moving_shapes:{seed}:{chunk}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def build_prompts(num_prompts: int, split: str = "train", seed: int = 0, val_fraction: float = 0.0) -> dict:
    """``num_prompts`` prompts drawn uniformly from the ``split`` pool (for RL rollouts; see
    `spec_pool` for ``val_fraction``): ``prompt`` (list of str) and ``meta`` (list of ``{"color",
    "shape", "direction"}``). Prompt i depends only on (seed, i, split, val_fraction), and is the
    prompt of `build`'s sample i for the same arguments."""
    if num_prompts < 1:
        raise ValueError("num_prompts must be >= 1")
    pool = spec_pool(split, val_fraction)
    metas = []
    for c in range((num_prompts + CHUNK - 1) // CHUNK):
        pick = torch.rand(CHUNK, generator=_generator(seed, c), dtype=torch.float64)
        for i in range(min(CHUNK, num_prompts - c * CHUNK)):
            metas.append(dict(pool[min(int(pick[i] * len(pool)), len(pool) - 1)]))
    return {"prompt": [describe(**m) for m in metas], "meta": metas}


# ---------------------------------------------------------------------------------------------
# Motion and rendering
# ---------------------------------------------------------------------------------------------


def travel_range(size: int, side):
    """(least, most) pixels a shape of ``side`` px (an int or a long tensor) travels in a ``size`` px frame: at least
    ceil(MIN_TRAVEL * size) (the reward's full direction credit), at most size - side (it stays in
    the frame)."""
    return math.ceil(MIN_TRAVEL * size), size - side


def paths(
    direction: torch.Tensor, side: torch.Tensor, u: torch.Tensor, frames: int, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-left corners of each shape in each frame. ``direction`` long [N] (index in
    `DIRECTIONS`), ``side`` long [N], ``u`` float [N, 3] uniform in [0, 1): the travel T (an integer
    in `travel_range`), the start along the motion (so the whole path stays in the frame) and the
    position across it. Frame t is at start + round(T * t / (frames - 1)) along the direction: a
    constant speed of T / (frames - 1) px per frame, whole pixels (every frame the same raster).
    Returns (x0, y0) long [N, frames] and the travel long [N]."""
    lo, hi = travel_range(size, side)  # per shape
    span = hi - lo + 1
    total = lo + (u[:, 0] * span).long().clamp(max=span - 1)  # T in [lo, hi]
    room = size - side - total  # free start positions along the motion: 0..room
    start = (u[:, 1] * (room + 1)).long().clamp(max=room)
    across = (u[:, 2] * (size - side + 1)).long().clamp(max=size - side)
    vec = torch.tensor([DIRECTION_VECTORS[d] for d in DIRECTIONS])[direction]  # [N, 2]
    step = torch.round(total.view(-1, 1) * torch.arange(frames).view(1, -1) / (frames - 1)).long()  # [N, F]
    along = torch.where(
        vec.sum(1, keepdim=True) > 0, start.view(-1, 1) + step, start.view(-1, 1) + total.view(-1, 1) - step
    )
    horizontal = (vec[:, 0] != 0).view(-1, 1)
    x0 = torch.where(horizontal, along, across.view(-1, 1))
    y0 = torch.where(horizontal, across.view(-1, 1), along)
    return torch.stack([x0, y0], -1), total


def _render(metas: list[dict], g: torch.Generator, frames: int, size: int) -> tuple[torch.Tensor, list[dict]]:
    """Videos of ``metas`` (at most CHUNK) with the random numbers of one chunk (always drawn for
    CHUNK), and each sample's meta with its motion (``side``, ``travel``, ``start`` [x0, y0])."""
    shapes = _shapes_builder()
    sizes = torch.tensor(shapes.object_sizes(size))
    side_all = sizes[torch.randint(len(sizes), (CHUNK,), generator=g)]
    u_all = torch.rand(CHUNK, 3, generator=g)
    n = len(metas)
    color = torch.tensor([list(COLORS).index(m["color"]) for m in metas])
    shape = torch.tensor([SHAPES.index(m["shape"]) for m in metas])
    direction = torch.tensor([DIRECTIONS.index(m["direction"]) for m in metas])
    side = side_all[:n]
    corners, total = paths(direction, side, u_all[:n], frames, size)  # [N, F, 2]
    box = torch.cat([corners, side.view(n, 1, 1).expand(n, frames, 1)], -1).reshape(n * frames, 1, 3)
    video = shapes.render(
        color.repeat_interleave(frames).view(-1, 1),
        shape.repeat_interleave(frames).view(-1, 1),
        box,
        torch.ones(n * frames, 1, dtype=torch.bool),
        size,
    ).reshape(n, frames, size, size, 3)
    out = [
        {**m, "side": int(side[i]), "travel": int(total[i]), "start": corners[i, 0].tolist()}
        for i, m in enumerate(metas)
    ]
    return video, out


def _check(frames: int, size: int) -> None:
    if frames < 2:
        raise ValueError(f"num_frames must be >= 2 (a shape moves between frames), got {frames}")
    if size % 2 or not 16 <= size <= 64:
        raise ValueError(f"image_size must be even and in [16, 64], got {size}")


def draw(metas: list[dict], num_frames: int = 8, image_size: int = 16, seed: int = 0) -> torch.Tensor:
    """Correct videos of given prompts (``metas``: one ``{"color", "shape", "direction"}`` each) ->
    uint8 [M, num_frames, image_size, image_size, 3], moved and rendered as `build` does (the
    "gold" videos a reward is measured against; video i depends on (seed, i) and its meta)."""
    if not metas:
        raise ValueError("draw needs at least one meta")
    frames, size = num_frames, image_size
    _check(frames, size)
    parts = []
    for c in range(0, len(metas), CHUNK):
        g = _generator(seed, c // CHUNK)
        torch.rand(CHUNK, generator=g, dtype=torch.float64)  # the prompt draws of `build`: same motion
        parts.append(_render(metas[c : c + CHUNK], g, frames, size)[0])
    return torch.cat(parts)


def build(
    num_samples: int | None = None,
    num_frames: int = 8,
    image_size: int = 16,
    seed: int = 0,
    split: str = "train",
    caption_noise: float = 0.0,
    num_episodes: int | None = None,
    chunk_size: int | None = None,
    val_fraction: float = 0.0,
) -> dict:
    """Clips of one shape moving in a straight line (see CARD.md). ``num_episodes`` is an alias of
    ``num_samples`` (what the trainer's warm start passes); ``chunk_size`` is ignored.

    Returns ``video`` uint8 [M, num_frames, image_size, image_size, 3] (``num_frames`` >= 2;
    ``image_size`` even, 16-64), ``prompt`` (list of M str, e.g. "a red square moving to the
    right") and ``meta`` (list of M dicts: ``color``, ``shape``, ``direction``, and the motion:
    ``side`` (px), ``travel`` (px from the first to the last frame) and ``start`` ([x0, y0] of the
    first frame's box), and ``noisy``). ``split`` picks the prompt pool: "train" by default, so
    pretraining never sees a held-out prompt; "eval" or "all" only when asked for; with
    ``val_fraction`` 0.2 (the benchmarks' ``--validation``) "train" also leaves out the validation
    prompts (`spec_pool`), so neither pretraining nor RL sees what settings are chosen on.
    ``caption_noise`` = p replaces the caption by another prompt of the same pool with probability
    p (like noisy web captions; the clip keeps what was drawn: ``meta`` then describes the caption
    and ``meta["drawn"]`` the clip), so a generator pretrained on it follows its prompt only part
    of the time. Sample i depends only on (seed, i) and the other arguments, never on ``num_samples``.
    """
    num_samples = num_samples if num_samples is not None else num_episodes
    if num_samples is None or num_samples < 1:
        raise ValueError("num_samples must be >= 1")
    if not 0.0 <= caption_noise <= 1.0:
        raise ValueError(f"caption_noise must be in [0, 1], got {caption_noise}")
    frames, size = num_frames, image_size
    _check(frames, size)
    pool = spec_pool(split, val_fraction)
    videos, metas = [], []
    for c in range((num_samples + CHUNK - 1) // CHUNK):
        g = _generator(seed, c)
        pick = torch.rand(CHUNK, generator=g, dtype=torch.float64)
        n = min(CHUNK, num_samples - c * CHUNK)
        chunk = [dict(pool[min(int(pick[i] * len(pool)), len(pool) - 1)]) for i in range(n)]
        video, meta = _render(chunk, g, frames, size)
        noisy = torch.rand(CHUNK, generator=g) < caption_noise
        other = torch.rand(CHUNK, generator=g, dtype=torch.float64)
        for i, m in enumerate(meta):
            m["noisy"] = bool(noisy[i]) and len(pool) > 1
            if m["noisy"]:  # another prompt of the pool: the caption's spec replaces the drawn one
                drawn = {k: m[k] for k in ("color", "shape", "direction")}
                idx = pool.index(drawn)
                m.update(pool[(idx + 1 + min(int(other[i] * (len(pool) - 1)), len(pool) - 2)) % len(pool)])
                m["drawn"] = drawn
        videos.append(video)
        metas += meta
    prompts = [describe(m["color"], m["shape"], m["direction"]) for m in metas]
    return {"video": torch.cat(videos), "prompt": prompts, "meta": metas}


# ---------------------------------------------------------------------------------------------
# Preview
# ---------------------------------------------------------------------------------------------


def grid(videos: torch.Tensor, cols: int = 8, scale: int = 4) -> torch.Tensor:
    """uint8 [M, F, H, W, 3] -> uint8 [F, rows * (H + 1) * scale, cols * (W + 1) * scale, 3]: the
    videos side by side on a grey 1 px border, each pixel ``scale`` x ``scale``."""
    m, f, h, w, _ = videos.shape
    cols = min(cols, m)
    rows = (m + cols - 1) // cols
    out = torch.full((f, rows * (h + 1), cols * (w + 1), 3), 128, dtype=torch.uint8)
    for i in range(m):
        r, c = divmod(i, cols)
        out[:, r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = videos[i]
    return out.repeat_interleave(scale, 1).repeat_interleave(scale, 2)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-frames", type=int, default=8)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--caption-noise", type=float, default=0.0)
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--out", type=Path, default=None, help=".pt file of the built dataset")
    p.add_argument("--preview", type=Path, default=None, help="animated GIF grid of the first 64 videos (imageio)")
    args = p.parse_args(argv)
    if args.out is None and args.preview is None:
        p.error("nothing to write: give --out and / or --preview")
    data = build(args.num, args.num_frames, args.image_size, args.seed, args.split, args.caption_noise)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, args.out)
    if args.preview is not None:
        import imageio.v2 as imageio

        args.preview.parent.mkdir(parents=True, exist_ok=True)
        imageio.mimsave(args.preview, list(grid(data["video"][:64]).numpy()), duration=200, loop=0)
    written = " and ".join(str(x) for x in (args.out, args.preview) if x is not None)
    print(f"{args.num} videos ({args.num_frames} frames, {args.image_size} px, split {args.split}) -> {written}")


if __name__ == "__main__":
    main()
