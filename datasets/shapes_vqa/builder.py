"""Build `shapes_vqa`: synthetic visual questions with exact answers about 1-4 coloured shapes on a
plain background (the VLM quickstart / test task). Nothing is downloaded.

``build(num_samples=256, split="train", seed=0, image_size=32, tasks=None)`` -> ``{"prompt": [str],
"images": [[uint8 [H, W, 3]]], "meta": [dict], "solution": [str]}`` (the `vlm_records` format).
Question types (``tasks``): ``count`` ("How many shapes are there?" -> "3"), ``count_color`` ("How
many red shapes are there?" -> "0".."4"), ``color`` ("What color is the square?", exactly one
square -> "red"), ``compare`` ("Are there more red shapes than blue shapes?" -> "yes" / "no").

Images are drawn by the `shapes` dataset's renderer (``render``, ``object_sizes``); the vocabulary
is `rewards.shapes` (COLORS, SHAPES). Sample i depends only on (seed, split, i) and the options.
Splits: ``train``, ``val`` (for choosing settings) and ``eval`` (held out, for reporting); no two
of them ever share an image: see `scene_split`. Run as a script for a preview::

    python datasets/shapes_vqa/builder.py --num 32 --preview runs/shapes_vqa.png
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from pathlib import Path

import torch

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_shapes = adapter("rewards.shapes")  # rewards/shapes.py, wherever mmrl installed it (mmrl_rewards in a wheel)
COLORS = _shapes.COLORS
SHAPES = _shapes.SHAPES

TASKS = ("count", "count_color", "color", "compare")
SPLITS = ("train", "val", "eval")
EVAL_FRACTION, VAL_FRACTION = 0.2, 0.1  # shares of the scene-hash range held out for eval and val
MAX_OBJECTS = 4  # one per image quadrant
COLOR_NAMES = tuple(COLORS)
RENDER_BATCH = 1024
MAX_TRIES = 1000
# (a, b) = (#colour A, #colour B) for compare questions, a + b <= 4
_COMPARE_YES = [(a, b) for a in range(5) for b in range(5) if a > b and a + b <= MAX_OBJECTS]
_COMPARE_NO = [(a, b) for a in range(5) for b in range(5) if a <= b and 1 <= a + b <= MAX_OBJECTS]


def _shapes():
    from mmrl.data import builder_module

    return builder_module("shapes")


# ---------------------------------------------------------------------------------------------
# Questions and scenes (pure Python, one random.Random per sample)
# ---------------------------------------------------------------------------------------------


def _objects(rng: random.Random, specs: list[tuple[str | None, str | None]]) -> list[tuple[str, str]]:
    """Fill unspecified (None) colours / shapes at random."""
    return [(c or rng.choice(COLOR_NAMES), s or rng.choice(SHAPES)) for c, s in specs]


def draw_question(rng: random.Random, task: str) -> tuple[str, str, list[tuple[str, str]]]:
    """(question, answer, objects as (colour, shape)) for one task; answers are drawn first, so
    they are close to uniform: count 1-4, count_color 0-4, color over the 5 colours, compare yes/no."""
    if task == "count":
        n = rng.randint(1, MAX_OBJECTS)
        return "How many shapes are there?", str(n), _objects(rng, [(None, None)] * n)
    if task == "count_color":
        color = rng.choice(COLOR_NAMES)
        k = rng.randint(0, MAX_OBJECTS)
        n = rng.randint(max(k, 1), MAX_OBJECTS)
        others = [c for c in COLOR_NAMES if c != color]
        specs = [(color, None)] * k + [(rng.choice(others), None) for _ in range(n - k)]
        return f"How many {color} shapes are there?", str(k), _objects(rng, specs)
    if task == "color":
        shape = rng.choice(SHAPES)
        n = rng.randint(1, MAX_OBJECTS)
        color = rng.choice(COLOR_NAMES)
        others = [s for s in SHAPES if s != shape]
        specs = [(color, shape)] + [(None, rng.choice(others)) for _ in range(n - 1)]
        return f"What color is the {shape}?", color, _objects(rng, specs)
    if task == "compare":
        a_color, b_color = rng.sample(COLOR_NAMES, 2)
        yes = rng.random() < 0.5
        a, b = rng.choice(_COMPARE_YES if yes else _COMPARE_NO)
        rest = [c for c in COLOR_NAMES if c not in (a_color, b_color)]
        extra = rng.randint(0, MAX_OBJECTS - a - b)
        specs = [(a_color, None)] * a + [(b_color, None)] * b + [(rng.choice(rest), None) for _ in range(extra)]
        return (f"Are there more {a_color} shapes than {b_color} shapes?", "yes" if yes else "no", _objects(rng, specs))
    raise ValueError(f"unknown task {task!r}; tasks: {TASKS}")


def place(rng: random.Random, objects: list[tuple[str, str]], image_size: int, sizes: list[int]) -> list[dict]:
    """One distinct quadrant per object (the `shapes` rule for several objects): an odd side from
    ``sizes`` and a position wholly inside the quadrant less a 1 px gap, so objects never touch.
    Returns ``{"color", "shape", "box": [x0, y0, x1, y1]}`` (x1, y1 exclusive) per object."""
    half = image_size // 2
    cells = rng.sample(range(4), len(objects))
    out = []
    for (color, shape), cell in zip(objects, cells):
        side = rng.choice(sizes)
        x0 = (cell % 2) * half + rng.randrange(half - 1 - side + 1)
        y0 = (cell // 2) * half + rng.randrange(half - 1 - side + 1)
        out.append({"color": color, "shape": shape, "box": [x0, y0, x0 + side, y0 + side]})
    return out


def scene_split(
    objects: list[dict], image_size: int, eval_fraction: float = EVAL_FRACTION, val_fraction: float = VAL_FRACTION
) -> str:
    """ "eval", "val" or "train" for a scene, from the SHA-256 of its canonical description (image
    size and the sorted (colour, shape, box) of its objects, which fix the pixels): the first 8
    bytes as a fraction f; f < ``eval_fraction`` -> "eval", else f < ``eval_fraction +
    val_fraction`` -> "val", else "train". Fixed, seed-independent: no image is on two sides, for
    any seeds (with the same fractions on every split)."""
    key = repr((image_size, sorted((o["color"], o["shape"], tuple(o["box"])) for o in objects)))
    frac = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little") / 2**64
    return "eval" if frac < eval_fraction else "val" if frac < eval_fraction + val_fraction else "train"


def _task_weights(tasks) -> tuple[list[str], list[float]]:
    if tasks is None:
        return list(TASKS), [1.0] * len(TASKS)
    if isinstance(tasks, str):
        tasks = [tasks]
    weights = {k: float(v) for k, v in tasks.items()} if isinstance(tasks, dict) else {t: 1.0 for t in tasks}
    bad = sorted(set(weights) - set(TASKS))
    if bad or not weights or any(v < 0 for v in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(
            f"tasks must name some of {list(TASKS)} (a list, or a dict of non-negative weights), got {tasks!r}"
        )
    names = [t for t in TASKS if weights.get(t, 0) > 0]
    return names, [weights[t] for t in names]


def draw_sample(
    seed: int,
    split: str,
    i: int,
    image_size: int,
    tasks=None,
    eval_fraction: float = EVAL_FRACTION,
    sizes: list[int] | None = None,
    val_fraction: float = VAL_FRACTION,
) -> dict:
    """Sample i of (seed, split): its own ``random.Random("shapes_vqa|split|seed|i")`` (so the
    splits' streams never share a generator) draws a task, a question with its answer and a scene,
    again until `scene_split` puts the scene on ``split``'s side."""
    names, weights = _task_weights(tasks)
    sizes = sizes or _shapes().object_sizes(image_size)
    rng = random.Random(f"shapes_vqa|{split}|{seed}|{i}")
    for _ in range(MAX_TRIES):
        task = rng.choices(names, weights)[0]
        question, answer, objs = draw_question(rng, task)
        scene = place(rng, objs, image_size, sizes)
        if scene_split(scene, image_size, eval_fraction, val_fraction) == split:
            return {"question": question, "answer": answer, "task": task, "objects": scene}
    raise RuntimeError(
        f"no {split} scene in {MAX_TRIES} draws (eval_fraction={eval_fraction}, val_fraction={val_fraction})"
    )


def render_scenes(scenes: list[list[dict]], image_size: int) -> torch.Tensor:
    """uint8 [M, H, W, 3] for lists of placed objects, with the `shapes` renderer."""
    shapes = _shapes()
    m = len(scenes)
    color = torch.zeros(m, MAX_OBJECTS, dtype=torch.long)
    shape = torch.zeros(m, MAX_OBJECTS, dtype=torch.long)
    box = torch.zeros(m, MAX_OBJECTS, 3, dtype=torch.long)
    valid = torch.zeros(m, MAX_OBJECTS, dtype=torch.bool)
    for i, objs in enumerate(scenes):
        for j, o in enumerate(objs):
            x0, y0, x1, _ = o["box"]
            color[i, j], shape[i, j] = COLOR_NAMES.index(o["color"]), SHAPES.index(o["shape"])
            box[i, j] = torch.tensor([x0, y0, x1 - x0])
            valid[i, j] = True
    parts = [
        shapes.render(
            color[s : s + RENDER_BATCH],
            shape[s : s + RENDER_BATCH],
            box[s : s + RENDER_BATCH],
            valid[s : s + RENDER_BATCH],
            image_size,
        )
        for s in range(0, m, RENDER_BATCH)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, image_size, image_size, 3, dtype=torch.uint8)


def build(
    num_samples: int | None = 256,
    split: str = "train",
    seed: int = 0,
    image_size: int = 32,
    tasks=None,
    eval_fraction: float = EVAL_FRACTION,
    suffix: str = "",
    min_pixels: int | None = None,
    max_pixels: int | None = None,
    factor: int = 28,
    num_prompts: int | None = None,
    val_fraction: float = VAL_FRACTION,
) -> dict:
    """``num_samples`` questions of ``split`` ("train" / "val" / "eval"), one ``image_size`` px image
    each (even, 16-128). ``eval_fraction`` / ``val_fraction``: the shares of scenes held out for
    eval and val (`scene_split`; keep them equal across the splits of one experiment). ``tasks``: a
    list of task names or a dict of sampling weights (default: the four tasks equally). ``suffix``
    is appended to every prompt (e.g. " Answer with one word.").
    ``min_pixels`` / ``max_pixels`` resize the images like `vlm_records` does. meta = ``{"answer",
    "task", "objects": [{"color", "shape", "box": [x0, y0, x1, y1]}], "split", "index"}``; solution
    = the answer. ``num_prompts`` is an alias of ``num_samples``."""
    num_samples = num_prompts if num_prompts is not None else num_samples
    if num_samples is None or num_samples < 1:
        raise ValueError("num_samples must be >= 1")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if image_size % 2 or not 16 <= image_size <= 128:
        raise ValueError(f"image_size must be even and in [16, 128], got {image_size}")
    if not 0.0 < eval_fraction < 1.0 or not 0.0 <= val_fraction or eval_fraction + val_fraction >= 1.0:
        raise ValueError(
            f"need 0 < eval_fraction < 1, val_fraction >= 0 and eval_fraction + val_fraction < 1, "
            f"got {eval_fraction} and {val_fraction}"
        )
    if split == "val" and val_fraction == 0.0:
        raise ValueError("split 'val' needs val_fraction > 0 (the share of scenes kept for validation, e.g. 0.1)")
    _task_weights(tasks)
    sizes = _shapes().object_sizes(image_size)
    samples = [
        draw_sample(seed, split, i, image_size, tasks, eval_fraction, sizes, val_fraction) for i in range(num_samples)
    ]
    images = render_scenes([s["objects"] for s in samples], image_size)
    if min_pixels is not None or max_pixels is not None:
        from mmrl.data import builder_module

        resize = builder_module("vlm_records").resize_image
        per_sample = [[resize(img, min_pixels, max_pixels, factor)] for img in images]
    else:
        per_sample = [[img.clone()] for img in images]
    return {
        "prompt": [s["question"] + suffix for s in samples],
        "images": per_sample,
        "meta": [
            {"answer": s["answer"], "task": s["task"], "objects": s["objects"], "split": split, "index": i}
            for i, s in enumerate(samples)
        ],
        "solution": [s["answer"] for s in samples],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--tasks", nargs="*", default=None, choices=TASKS)
    p.add_argument("--preview", type=Path, default=None, help="PNG grid of the first 64 images (needs pillow)")
    args = p.parse_args(argv)
    data = build(args.num, args.split, args.seed, args.image_size, args.tasks or None)
    for i, (q, a) in enumerate(zip(data["prompt"][:16], data["solution"][:16])):
        print(f"{i:3d}  {q}  ->  {a}")
    if args.preview is not None:
        from PIL import Image

        imgs = [im[0] for im in data["images"][:64]]
        s, cols = args.image_size, 8
        rows = (len(imgs) + cols - 1) // cols
        grid = torch.full((rows * (s + 1), cols * (s + 1), 3), 128, dtype=torch.uint8)
        for i, img in enumerate(imgs):
            r, c = divmod(i, cols)
            grid[r * (s + 1) : r * (s + 1) + s, c * (s + 1) : c * (s + 1) + s] = img
        args.preview.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(grid.numpy()).resize((grid.shape[1] * 4, grid.shape[0] * 4), Image.NEAREST).save(args.preview)
        print(f"preview of {len(imgs)} images (row-major, questions above) -> {args.preview}")


if __name__ == "__main__":
    main()
