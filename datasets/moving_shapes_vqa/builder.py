"""Build `moving_shapes_vqa`: video questions about one coloured shape moving across a short clip,
whose answer needs more than one frame ("Which direction does the red square move? Answer left,
right, up or down." -> "left"). Nothing is downloaded.

``build(num_samples=256, split="train", seed=0, num_frames=8, image_size=32, fps=4.0, tasks=None,
video_dir=None)`` -> ``{"prompt": [str], "images": [[]], "videos": [[video]], "meta": [dict],
"solution": [str]}`` (the `vlm_records` format plus a ``videos`` column, read by `simulators.qa.QASim`
and decoded by the VLM policy, `mmrl.video`). A video is ``{"frames": uint8 [F, H, W, 3], "fps": fps}``,
or with ``video_dir`` the path of an mp4 written there. Clips are the `moving_shapes` dataset's
(``draw``); its prompt pools give the splits: ``eval`` holds the 12 (colour, shape, direction)
combinations `moving_shapes.held_out` keeps out of training, ``validation`` 12 more (`validation`),
``train`` the other 36: three disjoint pools. Sample i depends only on (seed, split, i) and the
options. Run as a script to print questions::

    python datasets/moving_shapes_vqa/builder.py --num 8
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

_grammar = adapter("rewards.moving_shapes")
DIRECTIONS = _grammar.DIRECTIONS
TASKS = ("direction", "color")
SPLITS = ("train", "validation", "eval")
ANSWER_WORDS = "Answer left, right, up or down."
assert sorted(DIRECTIONS) == ["down", "left", "right", "up"], "ANSWER_WORDS lists the grammar's directions"


def _moving_shapes():
    from mmrl.data import builder_module

    return builder_module("moving_shapes")  # spec_pool() and draw() of datasets/moving_shapes/builder.py


def spec_pool(split: str = "train") -> list[dict]:
    """The ``{"color", "shape", "direction"}`` combinations of ``split`` (see `SPLITS`), in
    vocabulary order: ``eval`` is `moving_shapes.spec_pool`'s eval pool, ``validation`` the
    combinations of its train pool that `moving_shapes.validation` picks, ``train`` the rest (its
    train pool with the validation prompts carved out, ``val_fraction=0.2``)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return _moving_shapes().spec_pool(split, val_fraction=0.2)


def question(task: str, spec: dict) -> tuple[str, str]:
    """(question, answer) of one task about a clip of ``spec`` (``{"color", "shape", "direction"}``).
    ``direction`` needs two frames at least; ``color`` (a one-frame control) does not."""
    if task == "direction":
        return f"Which direction does the {spec['color']} {spec['shape']} move? {ANSWER_WORDS}", spec["direction"]
    if task == "color":
        return f"What color is the moving {spec['shape']}? Answer with one word.", spec["color"]
    raise ValueError(f"unknown task {task!r}; tasks: {TASKS}")


def _tasks(tasks) -> list[str]:
    tasks = ["direction"] if tasks is None else [tasks] if isinstance(tasks, str) else list(tasks)
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise ValueError(f"tasks must name some of {list(TASKS)}, got {tasks!r}")
    return tasks


def _draw_seed(seed: int, split: str) -> int:
    digest = hashlib.sha256(f"moving_shapes_vqa|{split}|{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def write_mp4(frames: torch.Tensor, path: Path, fps: float) -> str:
    """uint8 [F, H, W, 3] -> an mp4 file at ``fps`` (imageio-ffmpeg; lossy: colours shift slightly)."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(str(path), list(frames.numpy()), fps=fps, format="ffmpeg", macro_block_size=1)
    return str(path)


def build(
    num_samples: int | None = 256,
    split: str = "train",
    seed: int = 0,
    num_frames: int = 8,
    image_size: int = 32,
    fps: float = 4.0,
    tasks=None,
    video_dir: str | None = None,
    num_prompts: int | None = None,
) -> dict:
    """``num_samples`` video questions of ``split`` ("train" / "validation" / "eval"): one clip of
    ``num_frames`` frames of ``image_size`` px (even, 16-64) at ``fps`` each. ``tasks``: a list of `TASKS`
    (default ``["direction"]``), drawn uniformly. ``video_dir``: write the clips as mp4 files there
    (``<split>_<seed>_<i>.mp4``) and return their paths instead of frames. meta = ``{"answer",
    "task", "color", "shape", "direction", "split", "index"}``; solution =
    the answer. ``num_prompts`` is an alias of ``num_samples``."""
    num_samples = num_prompts if num_prompts is not None else num_samples
    if num_samples is None or num_samples < 1:
        raise ValueError("num_samples must be >= 1")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if fps <= 0:
        raise ValueError(f"fps must be > 0, got {fps}")
    names = _tasks(tasks)
    shapes = _moving_shapes()
    pool = spec_pool(split)
    specs, tasks_of = [], []
    for i in range(num_samples):  # one generator per sample: it depends on (seed, split, i) only
        rng = random.Random(f"moving_shapes_vqa|{split}|{seed}|{i}")
        specs.append(dict(rng.choice(pool)))
        tasks_of.append(rng.choice(names))
    videos = shapes.draw(specs, num_frames, image_size, _draw_seed(seed, split))  # [M, F, H, W, 3]
    prompts, answers, metas, sources = [], [], [], []
    for i, (spec, task) in enumerate(zip(specs, tasks_of)):
        q, a = question(task, spec)
        prompts.append(q)
        answers.append(a)
        metas.append({"answer": a, "task": task, **spec, "split": split, "index": i})
        if video_dir is not None:
            sources.append([write_mp4(videos[i], Path(video_dir) / f"{split}_{seed}_{i}.mp4", fps)])
        else:
            sources.append([{"frames": videos[i].clone(), "fps": float(fps)}])
    return {
        "prompt": prompts,
        "images": [[] for _ in prompts],
        "videos": sources,
        "meta": metas,
        "solution": answers,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split", default="train", choices=SPLITS)
    p.add_argument("--tasks", nargs="*", default=None, choices=TASKS)
    args = p.parse_args(argv)
    data = build(args.num, args.split, args.seed, tasks=args.tasks or None)
    for i, (q, a) in enumerate(zip(data["prompt"], data["solution"])):
        print(f"{i:3d}  {q}  ->  {a}")


if __name__ == "__main__":
    main()
