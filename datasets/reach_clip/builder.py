"""Build the `reach_clip` dataset: ReachSim frames for a tiny CLIP and for measuring its rewards.

Two kinds of data, never mixed (see CARD.md):

- ``build(num_samples, seed)`` (the default): **(image, captions) pairs for CLIP pretraining**. Each
  caption describes what is in the picture in absolute terms only: which colour of disc is in which
  cell of a coarse ``grid`` x ``grid`` grid over the arena, and which cell the gripper is in, in
  several phrasings. Captions come from the rendered positions alone (`grid_cells`): the episode's
  instruction, goal disc, success flag, success radius and goal distance are never read (the scenes
  come from `ReachSim.reset`, the gripper positions from this module's own generator; ``tests/rewards/
  test_reach_clip_pretraining.py`` builds the set with those simulator fields poisoned and checks the
  output is unchanged). These pairs train `rewards.train_tiny_clip` contrastively, as CLIP is.
- ``build(num_samples, seed, labelled=True)``: **evaluation frames** with the frame's instruction,
  distance to the instructed disc and the simulator's success label, for measuring how a reward
  tracks success (the benchmark's validation and held-out frames). They carry no captions and are
  never trained on.

    python datasets/reach_clip/builder.py --samples 20000 --out runs/reach_clip.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_reach = adapter("simulators.reach")  # simulators/reach.py, wherever mmrl installed it (mmrl_simulators in a wheel)
ReachSim = _reach.ReachSim

ROWS = ("top", "middle", "bottom")
COLS = ("left", "center", "right")
#: caption phrasings of one frame; ``{objects}`` parts are listed in a random order per frame
PHRASINGS = ("sentence", "list", "cells")
#: the extra phrasings of ``relations=True``: where the gripper is relative to each disc (`relation_of`),
#: and relative to the disc nearest to it alone (what a person would say first)
RELATIONAL = ("relations", "nearest")
#: how training frames place the gripper: anywhere, near a disc picked at random (not the
#: instructed one: the instruction is never read), on the way from its spawn point to such a disc
GRIPPER_MIX = {"anywhere": 0.4, "near_disc": 0.3, "path": 0.3}
#: labelled evaluation frames: gripper on / near the instructed disc, on another disc, anywhere
LABELLED_MIX = {"on_goal": 0.25, "near_goal": 0.25, "on_other": 0.25, "anywhere": 0.25}


# ----------------------------------------------------------------------------- captions (pure)
def cell_names(grid: int = 3) -> list[str]:
    """Names of the cells, row-major from the top left (3 x 3: "top left", ..., "center", ...)."""
    if grid != 3:
        return [f"row {r + 1} column {c + 1}" for r in range(grid) for c in range(grid)]
    return ["center" if (r, c) == ("middle", "center") else f"{r} {c}" for r in ROWS for c in COLS]


def grid_cells(xy: torch.Tensor, grid: int = 3) -> torch.Tensor:
    """Row-major cell index (long ``[...]``) of world points ``xy [..., 2]`` in ``[-1, 1]^2`` (row 0 is
    the top, ``y = +1``, as in the rendered image)."""
    col = ((xy[..., 0] + 1) * (grid / 2)).floor().long().clamp(0, grid - 1)
    row = ((1 - xy[..., 1]) * (grid / 2)).floor().long().clamp(0, grid - 1)
    return row * grid + col


def _at(cell: str) -> str:
    return "in the center" if cell == "center" else f"at the {cell}"


def relation_of(offset: tuple[float, float], disc_radius: float, arm: float) -> str:
    """Where a gripper is relative to one disc, from its offset ``(dx, dy)`` to the disc's centre
    (``y`` up) and the drawn sizes: ``on`` (its centre inside the drawn disc), ``touching`` (its cross
    overlaps the disc), else the dominant direction: ``left of``, ``right of``, ``above``, ``below``.
    What a picture shows, for every disc alike: no instruction, goal or success radius enters."""
    dx, dy = offset
    dist = (dx * dx + dy * dy) ** 0.5
    if dist <= disc_radius:
        return "on"
    if dist <= disc_radius + arm:
        return "touching"
    if abs(dx) >= abs(dy):
        return "left of" if dx < 0 else "right of"
    return "above" if dy > 0 else "below"


def captions_of(
    disc_cells: list[int],
    disc_colors: list[str],
    gripper_cell: int,
    order: list[int],
    grid: int = 3,
    relations: list[str] | None = None,
    nearest: int = 0,
) -> list[str]:
    """The captions (one per phrasing of `PHRASINGS`) of one frame from its discs' cells and colours
    and the gripper's cell; ``order`` is the order the discs are named in (a permutation). With
    ``relations`` (per disc, `relation_of`) and ``nearest`` (the index of the disc nearest to the
    gripper), two more captions (`RELATIONAL`): where the gripper is relative to each disc, and
    relative to the nearest one."""
    names = cell_names(grid)
    discs = [(disc_colors[i], names[disc_cells[i]]) for i in order]
    grip = names[gripper_cell]
    sentence = ", ".join(f"the {c} disc is {_at(n)}" for c, n in discs) + f" and the gripper is {_at(grip)}"
    listing = " ".join(f"{c} disc: {n}." for c, n in discs) + f" gripper: {grip}."
    cells: dict[str, list[str]] = {}
    for c, n in discs:
        cells.setdefault(n, []).append(f"the {c} disc")
    cells.setdefault(grip, []).append("the gripper")
    by_cell = " ".join(f"{n}: {' and '.join(things)}." for n, things in cells.items())
    if relations is None:
        return [sentence, listing, by_cell]
    rel = [f"{relations[i]} the {disc_colors[i]} disc" for i in order]
    every = "the gripper is " + ", ".join(rel[:-1]) + f" and {rel[-1]}"
    return [sentence, listing, by_cell, every, f"the gripper is {relations[nearest]} the {disc_colors[nearest]} disc"]


# ----------------------------------------------------------------------------- training pairs
def _scenes(sim: ReachSim, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Discs ``[n, K, 2]``, their colour ids ``[n, K]`` and the spawn gripper ``[n, 2]`` of fresh scenes."""
    sim.reset([int(s) for s in torch.randint(0, 2**62, (sim.num_envs,), generator=gen)])
    return sim.objects.clone(), sim.colors.clone(), sim.gripper.clone()


def gripper_positions(objects: torch.Tensor, spawn: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``[n, 2]`` gripper positions for the image distribution of the training frames (`GRIPPER_MIX`):
    uniform over the arena; within 0.4 of a disc drawn uniformly; or a uniform point of the path from
    the spawn point to such a disc, plus noise. Depends on disc positions only, never on the goal."""
    n, k = objects.shape[:2]
    kinds = list(GRIPPER_MIX)
    kind = torch.multinomial(torch.tensor([GRIPPER_MIX[c] for c in kinds]), n, replacement=True, generator=gen)
    disc = objects[torch.arange(n), torch.randint(0, k, (n,), generator=gen)]
    angle = torch.rand(n, generator=gen) * 2 * torch.pi
    unit = torch.stack([angle.cos(), angle.sin()], 1)
    near = disc + unit * (0.4 * torch.rand(n, 1, generator=gen))
    frac = torch.rand(n, 1, generator=gen)
    path = spawn + frac * (disc - spawn) + 0.05 * torch.randn(n, 2, generator=gen)
    anywhere = torch.rand(n, 2, generator=gen) * 2 - 1
    g = torch.where((kind == 0)[:, None], anywhere, torch.where((kind == 1)[:, None], near, path))
    return g.clamp(-1, 1)


def build_pairs(
    num_samples: int, seed: int, sim_kwargs: dict, grid: int, batch_size: int, relations: bool = False
) -> dict:
    """``num_samples`` (image, captions) pairs; see the module doc."""
    gen = torch.Generator().manual_seed(int(seed))
    sim = ReachSim(num_envs=batch_size, seed=int(seed), **sim_kwargs)
    images, captions, gripper_cells, disc_cells = [], [], [], []
    for start in range(0, num_samples, batch_size):
        m = min(batch_size, num_samples - start)
        objects, colors, spawn = _scenes(sim, gen)
        objects, colors = objects[:m], colors[:m]
        g = gripper_positions(objects, spawn[:m], gen)
        images.append(sim.render(g, objects, colors))
        gc, dc = grid_cells(g, grid), grid_cells(objects, grid)
        order = torch.rand(m, objects.shape[1], generator=gen).argsort(1)
        offsets = g[:, None] - objects  # [m, K, 2]: the gripper from each disc
        nearest = offsets.norm(dim=-1).argmin(1).tolist()
        offsets = offsets.tolist()
        for i in range(m):
            names = [sim.color_names[c] for c in colors[i].tolist()]
            rel = [relation_of(o, sim.object_radius, sim._arm) for o in offsets[i]] if relations else None
            captions.append(captions_of(dc[i].tolist(), names, int(gc[i]), order[i].tolist(), grid, rel, nearest[i]))
        gripper_cells.append(gc)
        disc_cells.append(dc)
    return {
        "image": torch.cat(images),
        "captions": captions,
        "gripper_cell": torch.cat(gripper_cells),
        "disc_cell": torch.cat(disc_cells),
        "phrasings": [*PHRASINGS, *(RELATIONAL if relations else ())],
        "cells": cell_names(grid),
    }


# ----------------------------------------------------------------------------- labelled evaluation frames
def build_labelled(num_samples: int, seed: int, sim_kwargs: dict, batch_size: int) -> dict:
    """``num_samples`` evaluation frames with the instruction and the simulator's success label
    (`LABELLED_MIX`: the gripper on / near the instructed disc, on another disc, or anywhere)."""
    gen = torch.Generator().manual_seed(int(seed))
    sim = ReachSim(num_envs=batch_size, seed=int(seed), **sim_kwargs)
    parts: dict[str, list] = {"image": [], "goal_distance": [], "instruction": [], "goal_color_name": []}
    kinds = list(LABELLED_MIX)
    for start in range(0, num_samples, batch_size):
        m = min(batch_size, num_samples - start)
        objects, colors, _ = _scenes(sim, gen)
        objects, colors, target = objects[:m], colors[:m], sim.target[:m].clone()
        rows, k = torch.arange(m), objects.shape[1]
        kind = torch.multinomial(torch.tensor([LABELLED_MIX[c] for c in kinds]), m, replacement=True, generator=gen)
        other = (target + 1 + torch.randint(0, max(k - 1, 1), (m,), generator=gen)) % k
        angle = torch.rand(m, generator=gen) * 2 * torch.pi
        unit = torch.stack([angle.cos(), angle.sin()], 1)
        r_on = sim.success_radius * torch.rand(m, generator=gen).sqrt() * 0.98
        r_near = sim.success_radius + (0.35 - sim.success_radius) * torch.rand(m, generator=gen)
        centre = torch.where((kind == 2)[:, None], objects[rows, other], objects[rows, target])
        g = centre + unit * torch.where(kind == 1, r_near, r_on)[:, None]
        g = torch.where((kind == 3)[:, None], torch.rand(m, 2, generator=gen) * 2 - 1, g).clamp(-1, 1)
        parts["image"].append(sim.render(g, objects, colors))
        parts["goal_distance"].append((g - objects[rows, target]).norm(dim=-1))
        parts["instruction"].extend(sim._instructions[:m])
        parts["goal_color_name"].extend(sim.color_names[c] for c in colors[rows, target].tolist())
    out = {k: (torch.cat(v) if isinstance(v[0], torch.Tensor) else v) for k, v in parts.items()}
    out["success"] = out["goal_distance"] <= sim.success_radius
    out["success_radius"] = sim.success_radius
    return out


def build(
    num_samples: int = 20000,
    seed: int = 0,
    labelled: bool = False,
    grid: int = 3,
    sim_kwargs: dict | None = None,
    batch_size: int = 512,
    relations: bool = False,
) -> dict:
    """Training pairs (``labelled=False``) or labelled evaluation frames (``labelled=True``); see
    CARD.md for the fields. Equal arguments give identical data."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if grid < 2:
        raise ValueError(f"grid must be >= 2 cells a side, got {grid}")
    sim_kwargs = dict(sim_kwargs or {})
    for key in ("num_envs", "seed"):
        if key in sim_kwargs:
            raise ValueError(f"sim_kwargs must not set {key!r}: build() chooses it")
    if labelled and relations:
        raise ValueError("relations=True adds a caption to training pairs; labelled frames carry no captions")
    if labelled:
        out = build_labelled(num_samples, seed, sim_kwargs, batch_size)
    else:
        out = build_pairs(num_samples, seed, sim_kwargs, grid, batch_size, relations)
    out["meta"] = {
        "num_samples": num_samples,
        "seed": seed,
        "labelled": labelled,
        "grid": grid,
        "sim_kwargs": sim_kwargs,
        "relations": relations,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--labelled", action="store_true", help="evaluation frames instead of training pairs")
    parser.add_argument("--relations", action="store_true", help="add the gripper-to-disc relations caption")
    parser.add_argument("--out", default="runs/reach_clip.pt")
    args = parser.parse_args()
    data = build(args.samples, seed=args.seed, labelled=args.labelled, relations=args.relations)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    print(f"{data['image'].shape[0]} frames -> {args.out}")
    if not args.labelled:
        for text in data["captions"][0]:
            print(" ", text)


if __name__ == "__main__":
    main()
