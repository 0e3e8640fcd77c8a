"""Build the `shapes` dataset: coloured shapes on a plain background with a describing prompt.

``build(num_samples)`` draws images (uint8 [M, H, W, 3]) and prompts such as "a red circle on the
left", "two blue squares" or "a red circle and a blue square", with the ground truth in ``meta``.
``build_prompts(num_prompts, split=...)`` draws prompts only (for RL), from disjoint train / eval
pools; ``draw(objects)`` renders correct images of given prompts. The grammar and vocabulary live
in `rewards.shapes` (shared with `ShapesReward`). See CARD.md. Run as a script to save a ``.pt``
file (and optionally a preview grid)::

    python datasets/shapes/builder.py --num 10000 --out runs/shapes16.pt --preview runs/shapes16.png
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import sys
from pathlib import Path

import torch

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_shapes = adapter("rewards.shapes")  # rewards/shapes.py, wherever mmrl installed it (mmrl_rewards in a wheel)
BACKGROUND = _shapes.BACKGROUND
COLORS = _shapes.COLORS
POSITIONS = _shapes.POSITIONS
SHAPES = _shapes.SHAPES
TAGS = _shapes.TAGS
describe = _shapes.describe
make_meta = _shapes.make_meta

CHUNK = 1024  # samples drawn per generator; sample i depends only on (seed, i), not on num_samples
DEFAULT_TAG_WEIGHTS = {"single": 0.2, "position": 0.3, "counting": 0.2, "color_attr": 0.3}
SPLITS = ("train", "eval", "validation", "all")


# ---------------------------------------------------------------------------------------------
# Prompt pools
# ---------------------------------------------------------------------------------------------


def _obj(color, shape, count=1, position=None) -> dict:
    return {"color": color, "shape": shape, "count": count, "position": position}


def _all_specs() -> dict[str, list[list[dict]]]:
    """Every prompt of the grammar, by tag, as object lists (color_attr pairs unordered: listed
    once, in vocabulary order)."""
    pairs = list(itertools.product(COLORS, SHAPES))
    return {
        "single": [[_obj(c, s)] for c, s in pairs],
        "position": [[_obj(c, s, 1, p)] for c, s in pairs for p in POSITIONS],
        "counting": [[_obj(c, s, n)] for c, s in pairs for n in (2, 3)],
        "color_attr": [[_obj(*a), _obj(*b)] for a, b in itertools.combinations(pairs, 2) if a[0] != b[0]],
    }


def _split_key(tag: str, objects: list[dict]) -> str:
    return hashlib.sha256(f"{tag}|{describe(objects)}".encode()).hexdigest()


def spec_pool(
    split: str = "train", eval_fraction: float = 0.2, val_fraction: float = 0.0
) -> dict[str, list[list[dict]]]:
    """Object lists of one split, by tag. Per tag, the specs are sorted by the SHA-256 of
    "tag|canonical prompt" and the first max(1, round(eval_fraction * n)) are the eval pool, the
    rest the train pool: disjoint, fixed (independent of the seed) and the same on every machine.
    With ``val_fraction`` > 0 the next max(1, round(val_fraction * n)) after the eval pool are a
    validation pool ("validation"), taken out of the train pool: settings are chosen on it, and the eval
    pool stays unseen. ``val_fraction`` 0 (the default) leaves the train pool whole."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    if not 0.0 <= val_fraction < 1.0 - eval_fraction:
        raise ValueError(f"val_fraction must be in [0, 1 - eval_fraction), got {val_fraction}")
    if split == "validation" and val_fraction == 0.0:
        raise ValueError("split 'validation' needs val_fraction > 0 (e.g. 0.2): it is carved out of the train pool")
    out = {}
    for tag, specs in _all_specs().items():
        if split == "all":
            out[tag] = specs
            continue
        ranked = sorted(specs, key=lambda objs: _split_key(tag, objs))
        n_eval = max(1, round(eval_fraction * len(ranked)))
        n_val = max(1, round(val_fraction * len(ranked))) if val_fraction > 0 else 0
        pools = {
            "eval": ranked[:n_eval],
            "validation": ranked[n_eval : n_eval + n_val],
            "train": ranked[n_eval + n_val :],
        }
        out[tag] = pools[split]
    return out


def prompt_pool(split: str = "train", eval_fraction: float = 0.2, val_fraction: float = 0.0) -> list[str]:
    """The canonical prompts of a split (a color_attr pair is also sampled in the other order)."""
    return [describe(objs) for specs in spec_pool(split, eval_fraction, val_fraction).values() for objs in specs]


def _tag_weights(tags) -> dict[str, float]:
    if tags is None:
        return dict(DEFAULT_TAG_WEIGHTS)
    weights = {t: 1.0 for t in tags} if not isinstance(tags, dict) else {k: float(v) for k, v in tags.items()}
    bad = sorted(set(weights) - set(TAGS))
    if bad or not weights or any(v < 0 for v in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"tags must name some of {list(TAGS)} with non-negative weights, got {tags!r}")
    return weights


def _generator(seed: int, chunk: int) -> torch.Generator:
    digest = hashlib.sha256(f"shapes:{seed}:{chunk}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def _draw_specs(n: int, g: torch.Generator, pool: dict[str, list], weights: dict[str, float]):
    """(tag, pool index, objects) for n samples; the random numbers are always drawn for CHUNK."""
    tags = [t for t in TAGS if weights.get(t, 0) > 0]
    w = torch.tensor([weights[t] for t in tags], dtype=torch.float64)
    tag_idx = torch.multinomial(w, CHUNK, replacement=True, generator=g)
    pick = torch.rand(CHUNK, generator=g, dtype=torch.float64)
    swap = torch.rand(CHUNK, generator=g) < 0.5
    out = []
    for i in range(n):
        tag = tags[int(tag_idx[i])]
        idx = min(int(pick[i] * len(pool[tag])), len(pool[tag]) - 1)
        objs = pool[tag][idx]
        out.append((tag, idx, objs[::-1] if len(objs) == 2 and bool(swap[i]) else objs))
    return out


def build_prompts(
    num_prompts: int,
    seed: int = 0,
    split: str = "train",
    tags=None,
    eval_fraction: float = 0.2,
    val_fraction: float = 0.0,
) -> dict:
    """Prompts only (for RL rollouts), from the ``split`` pool ("train", "eval", "validation" or "all").

    Returns ``prompt`` (list of str) and ``meta`` (list of dicts: ``tag``, ``objects`` [each
    ``color``, ``shape``, ``count``, ``position`` or None], and the first object's ``color``,
    ``shape``, ``count``, ``position`` at top level). ``tags``: a list of tags or a dict of sampling
    weights (default single 0.2, position 0.3, counting 0.2, color_attr 0.3). Prompt i depends
    only on (seed, i, split, tags).
    """
    if num_prompts < 1:
        raise ValueError("num_prompts must be >= 1")
    weights, pool = _tag_weights(tags), spec_pool(split, eval_fraction, val_fraction)
    prompts, metas = [], []
    for c in range((num_prompts + CHUNK - 1) // CHUNK):
        n = min(CHUNK, num_prompts - c * CHUNK)
        for tag, _, objs in _draw_specs(n, _generator(seed, c), pool, weights):
            prompts.append(describe(objs))
            metas.append(make_meta(objs, tag))
    return {"prompt": prompts, "meta": metas}


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def object_sizes(image_size: int) -> list[int]:
    """Odd object sizes (bounding-box side, px) for an image size: odd values in
    [0.28 W, 0.45 W], at most W/2 - 1 so two objects in neighbouring quadrants never touch
    (16 px: 5 and 7; 32 px: 9, 11, 13)."""
    lo, hi = int(-(-0.28 * image_size // 1)), min(int(0.45 * image_size), image_size // 2 - 1)
    sizes = [s for s in range(lo, hi + 1) if s % 2 == 1]
    return sizes or [hi if hi % 2 else hi - 1]


def render(
    color: torch.Tensor,
    shape: torch.Tensor,
    box: torch.Tensor,
    valid: torch.Tensor,
    image_size: int,
    background=BACKGROUND,
    colors=None,
) -> torch.Tensor:
    """Draw instances [B, K] (palette ``color`` index or an explicit rgb [B, K, 3], ``shape`` index
    in SHAPES, ``box`` [B, K, 3] = x0, y0, side in pixels) -> uint8 [B, H, W, 3]. Pixel (x, y)
    belongs to a shape when its centre, in box units u, v in (0, 1), satisfies: square: always;
    circle: (u - 1/2)^2 + (v - 1/2)^2 <= 1/4; triangle (apex up): |u - 1/2| <= v / 2."""
    b, k = shape.shape
    w = image_size
    rgb = color if color.dim() == 3 else torch.tensor(list((colors or COLORS).values()), dtype=torch.long)[color]
    px = torch.arange(w, dtype=torch.float32) + 0.5
    x0, y0, side = (box[..., i].float().view(b, k, 1, 1) for i in range(3))
    u = (px.view(1, 1, 1, w) - x0) / side
    v = (px.view(1, 1, w, 1) - y0) / side
    inside = (u > 0) & (u < 1) & (v > 0) & (v < 1)
    circle = (u - 0.5) ** 2 + (v - 0.5) ** 2 <= 0.25
    triangle = (u - 0.5).abs() <= v / 2
    sh = shape.view(b, k, 1, 1)
    mask = inside & valid.view(b, k, 1, 1) & torch.where(sh == 0, circle, torch.where(sh == 1, True, triangle))
    img = torch.tensor(list(background), dtype=torch.uint8).expand(b, w, w, 3).clone()
    for j in range(k):
        img = torch.where(mask[:, j].unsqueeze(-1), rgb[:, j].clamp(0, 255).to(torch.uint8).view(b, 1, 1, 3), img)
    return img


def _layout(specs, g: torch.Generator, image_size: int, color_jitter: int):
    """Instance tensors for CHUNK draws (the random numbers are always drawn for CHUNK x 3 slots)."""
    w, half = image_size, image_size // 2
    sizes = torch.tensor(object_sizes(w))
    size = sizes[torch.randint(len(sizes), (CHUNK, 3), generator=g)]
    ux, uy = torch.rand(CHUNK, 3, generator=g), torch.rand(CHUNK, 3, generator=g)
    cells = torch.rand(CHUNK, 4, generator=g).argsort(1)[:, :3]
    jitter = torch.randint(-color_jitter, color_jitter + 1, (CHUNK, 3, 3), generator=g)
    n = len(specs)
    regions = {  # x, y, width, height of the box the whole object must lie in
        None: (0, 0, w, w),
        "left": (0, 0, half, w),
        "right": (half, 0, half, w),
        "top": (0, 0, w, half),
        "bottom": (0, half, w, half),
        "center": (w // 4, w // 4, half, half),
    }
    color = torch.zeros(n, 3, dtype=torch.long)
    shape = torch.zeros(n, 3, dtype=torch.long)
    region = torch.zeros(n, 3, 4, dtype=torch.long)
    valid = torch.zeros(n, 3, dtype=torch.bool)
    palette = list(COLORS)
    for i, (_tag, _idx, objs) in enumerate(specs):
        instances = [o for o in objs for _ in range(o["count"])]
        for j, o in enumerate(instances):
            color[i, j], shape[i, j], valid[i, j] = palette.index(o["color"]), SHAPES.index(o["shape"]), True
            if len(instances) == 1:
                region[i, j] = torch.tensor(regions[o["position"]])
            else:  # one quadrant each, 1 px gap to the next quadrant
                cell = int(cells[i, j])
                region[i, j] = torch.tensor([(cell % 2) * half, (cell // 2) * half, half - 1, half - 1])
    size = size[:n]
    x0 = region[..., 0] + (ux[:n] * (region[..., 2] - size + 1)).long()
    y0 = region[..., 1] + (uy[:n] * (region[..., 3] - size + 1)).long()
    rgb = palette_rgb()[color] + jitter[:n]
    return color, rgb, shape, torch.stack([x0, y0, size], -1), valid


def palette_rgb() -> torch.Tensor:
    return torch.tensor(list(COLORS.values()), dtype=torch.long)


def draw(objects: list[list[dict]], seed: int = 0, image_size: int = 16) -> torch.Tensor:
    """Correct images of given prompts: ``objects`` is one object list per image (a prompt's
    ``meta["objects"]``) -> uint8 [M, H, W, 3], laid out and rendered as `build` does (the
    "gold" images a reward is measured against; image i depends on (seed, i))."""
    if not objects:
        raise ValueError("draw needs at least one object list")
    parts = []
    for c in range(0, len(objects), CHUNK):
        specs = [(None, 0, objs) for objs in objects[c : c + CHUNK]]
        _, rgb, shape, box, valid = _layout(specs, _generator(seed, c // CHUNK), image_size, 0)
        parts.append(render(rgb, shape, box, valid, image_size))
    return torch.cat(parts)


def build(
    num_samples: int | None = None,
    seed: int = 0,
    image_size: int = 16,
    split: str = "train",
    tags=None,
    caption_noise: float = 0.0,
    color_jitter: int = 0,
    eval_fraction: float = 0.2,
    val_fraction: float = 0.0,
    prompts_only: bool = False,
    num_episodes: int | None = None,
    chunk_size: int | None = None,
) -> dict:
    """Images with describing prompts (see CARD.md). ``num_episodes`` is an alias of
    ``num_samples`` (what the trainer's warm start passes); ``chunk_size`` is ignored.

    Returns ``image`` uint8 [M, H, W, 3] (H = W = ``image_size``, even, 16-64; designed for 16-32),
    ``prompt`` (list of M str) and ``meta`` (list of M dicts: the prompt's ``tag`` / ``objects`` /
    ``color`` / ``shape`` / ``count`` / ``position`` as in `build_prompts`, plus ``instances``: one
    ``{"color", "shape", "box": [x0, y0, x1, y1]}`` per drawn object (x1, y1 exclusive), and
    ``noisy``: whether the caption was corrupted). ``split`` picks the prompt pool: "train" by
    default, so pre-training never sees a held-out prompt; "eval" or "all" only when asked for.
    ``val_fraction`` > 0 carves a validation pool ("validation") out of the train pool (`spec_pool`).
    ``caption_noise`` = p replaces the prompt by a different prompt of the same tag and the same
    split pool with probability p (the image keeps the original; ``meta`` then describes the
    prompt and ``meta["drawn"]`` the image). ``color_jitter`` = j adds a uniform integer in [-j, j]
    per channel to each object's colour. ``prompts_only=True`` returns `build_prompts` so
    ``load_dataset("shapes", prompts_only=True, split="eval", num_samples=...)`` works by name.
    Sample i depends only on (seed, i) and the other arguments, never on ``num_samples``.
    """
    num_samples = num_samples if num_samples is not None else num_episodes
    if prompts_only:
        return build_prompts(num_samples, seed, split, tags, eval_fraction, val_fraction)
    if num_samples is None or num_samples < 1:
        raise ValueError("num_samples must be >= 1")
    if image_size % 2 or not 16 <= image_size <= 64:
        raise ValueError(f"image_size must be even and in [16, 64], got {image_size}")
    if not 0.0 <= caption_noise <= 1.0 or color_jitter < 0:
        raise ValueError("caption_noise must be in [0, 1] and color_jitter >= 0")
    weights, pool = _tag_weights(tags), spec_pool(split, eval_fraction, val_fraction)
    names = list(COLORS)
    images, prompts, metas = [], [], []
    for c in range((num_samples + CHUNK - 1) // CHUNK):
        n = min(CHUNK, num_samples - c * CHUNK)
        g = _generator(seed, c)
        specs = _draw_specs(n, g, pool, weights)
        color, rgb, shape, box, valid = _layout(specs, g, image_size, color_jitter)
        noisy = torch.rand(CHUNK, generator=g) < caption_noise
        other = torch.rand(CHUNK, generator=g, dtype=torch.float64)
        images.append(render(rgb, shape, box, valid, image_size))
        corners = torch.cat([box[..., :2], box[..., :2] + box[..., 2:]], -1).tolist()
        for i, (tag, idx, objs) in enumerate(specs):
            caption, size = objs, len(pool[tag])
            if bool(noisy[i]) and size > 1:  # another prompt of the same tag, from the same split pool
                caption = pool[tag][(idx + 1 + min(int(other[i] * (size - 1)), size - 2)) % size]
            meta = make_meta(caption, tag)
            meta["instances"] = [
                {"color": names[int(color[i, j])], "shape": SHAPES[int(shape[i, j])], "box": corners[i][j]}
                for j in range(3)
                if bool(valid[i, j])
            ]
            meta["noisy"] = caption is not objs
            if meta["noisy"]:
                meta["drawn"] = make_meta(objs, tag)["objects"]
            prompts.append(describe(caption))
            metas.append(meta)
    return {"image": torch.cat(images), "prompt": prompts, "meta": metas}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--caption-noise", type=float, default=0.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--preview", type=Path, default=None, help="PNG grid of the first 64 images (needs pillow)")
    args = p.parse_args(argv)
    data = build(args.num, args.seed, args.image_size, args.split, caption_noise=args.caption_noise)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    if args.preview is not None:
        from PIL import Image

        imgs = data["image"][:64]
        n, s = imgs.shape[0], args.image_size
        cols = 8
        rows = (n + cols - 1) // cols
        grid = torch.zeros(rows * (s + 1), cols * (s + 1), 3, dtype=torch.uint8) + 128
        for i in range(n):
            r, c = divmod(i, cols)
            grid[r * (s + 1) : r * (s + 1) + s, c * (s + 1) : c * (s + 1) + s] = imgs[i]
        Image.fromarray(grid.numpy()).resize((grid.shape[1] * 4, grid.shape[0] * 4), Image.NEAREST).save(args.preview)
    print(f"{args.num} samples ({args.image_size} px, split {args.split}) -> {args.out}")


if __name__ == "__main__":
    main()
