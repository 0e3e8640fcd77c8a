"""Build the `reach_clip` dataset: (image, caption) pairs rendered from the embedded ReachSim, for
training a tiny CLIP whose contrasting-goal reward tells whether the gripper is at the instructed
target.

``build(num_samples)`` renders ReachSim frames from three sources (see CARD.md): direct gripper
placements around the named disc / another disc / anywhere, frames of noisy scripted-expert
episodes, and frames of random-action episodes. Every frame is labelled with the distance from the
gripper to the disc of every palette colour, so a trainer can build positive / negative goal
captions for any colour, not only the instructed one. Run as a script to save a ``.pt`` file::

    python datasets/reach_clip/builder.py --samples 20000 --out runs/reach_clip.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

try:
    from simulators.reach import ReachSim
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from simulators.reach import ReachSim

POSITIVE = "the gripper is on the {color} target"
NEGATIVE = "the gripper is far from the {color} target"
SOURCES = ("placement", "expert", "random")
#: share of placement samples per kind: on the named disc, near it, on another disc, anywhere
PLACEMENT_MIX = {"on_goal": 0.35, "near_goal": 0.2, "on_other": 0.2, "anywhere": 0.25}
INF = float("inf")


def color_distances(sim: ReachSim, gripper: torch.Tensor, objects: torch.Tensor, colors: torch.Tensor) -> torch.Tensor:
    """``[n, P]`` distance from the gripper to the disc of each palette colour (inf when absent)."""
    n, p = gripper.shape[0], sim.num_colors
    d = (gripper[:, None] - objects).norm(dim=-1)  # [n, K]
    out = torch.full((n, p), INF, device=gripper.device)
    return out.scatter(1, colors, d)  # discs have distinct colours


def _record(parts: dict, sim: ReachSim, image, gripper, objects, colors, target, instructions, source: int) -> None:
    rows = torch.arange(gripper.shape[0], device=gripper.device)
    parts["image"].append(image.cpu())
    parts["color_distance"].append(color_distances(sim, gripper, objects, colors).cpu())
    parts["goal_color"].append(colors[rows, target].cpu())
    parts["goal_distance"].append((gripper - objects[rows, target]).norm(dim=-1).cpu())
    parts["source"].append(torch.full((gripper.shape[0],), source, dtype=torch.long))
    parts["instruction"].extend(instructions)


def _placements(parts, sim: ReachSim, m: int, gen: torch.Generator) -> None:
    """``m`` frames with the gripper put directly on / near the named disc, on another disc, or anywhere."""
    sim.reset([int(s) for s in torch.randint(0, 2**62, (sim.num_envs,), generator=gen)])
    objects, colors, target = sim.objects[:m], sim.colors[:m], sim.target[:m]
    kinds = list(PLACEMENT_MIX)
    kind = torch.multinomial(torch.tensor([PLACEMENT_MIX[k] for k in kinds]), m, replacement=True, generator=gen)
    rows = torch.arange(m)
    k = sim.num_objects
    other = (target + 1 + torch.randint(0, max(k - 1, 1), (m,), generator=gen)) % k
    angle = torch.rand(m, generator=gen) * 2 * torch.pi
    unit = torch.stack([angle.cos(), angle.sin()], 1)
    r_on = sim.success_radius * torch.rand(m, generator=gen).sqrt() * 0.98
    r_near = sim.success_radius + (0.35 - sim.success_radius) * torch.rand(m, generator=gen)
    centre = torch.where((kind == 2)[:, None], objects[rows, other], objects[rows, target])
    radius = torch.where(kind == 1, r_near, r_on)
    g = centre + unit * radius[:, None]
    g = torch.where((kind == 3)[:, None], torch.rand(m, 2, generator=gen) * 2 - 1, g).clamp(-1, 1)
    image = sim.render(g, objects, colors)
    _record(parts, sim, image, g, objects, colors, target, list(sim._instructions[:m]), 0)


def _episodes(parts, sim: ReachSim, count: int, gen: torch.Generator, expert: bool, noise: float) -> None:
    """``count`` frames after the steps of noisy-expert (or uniformly random) episodes, run back to back
    with auto reset (final frames included: the frame where a finished episode ended)."""
    sim.reset([int(s) for s in torch.randint(0, 2**62, (sim.num_envs,), generator=gen)])
    got = 0
    while got < count:
        objects, colors, target = sim.objects.clone(), sim.colors.clone(), sim.target.clone()
        instructions = list(sim._instructions)
        if expert:
            a = sim.expert_action(noise=noise, generator=gen)
        else:
            a = torch.rand(sim.num_envs, 2, generator=gen) * 2 - 1
        res = sim.step(a)
        image, g = res.obs.image.clone(), res.obs.state[:, :2].clone()
        done = res.done
        if done.any():  # the finished episode's last frame and gripper, not the auto-reset ones
            image[done] = res.final_obs.image[done]
            g[done] = res.final_obs.state[done, :2]
        take = min(sim.num_envs, count - got)
        _record(parts, sim, image[:take], g[:take], objects[:take], colors[:take], target[:take],
                instructions[:take], 1 if expert else 2)
        got += take


def build(
    num_samples: int = 20000,
    seed: int = 0,
    sim_kwargs: dict | None = None,
    mix: tuple[float, float, float] = (0.5, 0.3, 0.2),
    expert_noise: float = 0.6,
    batch_size: int = 512,
) -> dict:
    """``num_samples`` labelled frames: a ``mix`` share each of placements, noisy-expert episode
    frames and random episode frames (in that order; see CARD.md for the fields)."""
    if num_samples < 1:
        raise ValueError("num_samples must be >= 1")
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        raise ValueError(f"mix must be 3 non-negative shares, got {mix}")
    sim_kwargs = dict(sim_kwargs or {})
    for key in ("num_envs", "seed"):
        if key in sim_kwargs:
            raise ValueError(f"sim_kwargs must not set {key!r}: build() chooses it")
    gen = torch.Generator().manual_seed(int(seed))
    shares = torch.tensor(mix, dtype=torch.float64) / sum(mix)
    counts = (shares * num_samples).floor().long()
    counts[0] += num_samples - int(counts.sum())
    parts: dict[str, list] = {k: [] for k in ("image", "color_distance", "goal_color", "goal_distance", "source",
                                             "instruction")}
    placer = ReachSim(num_envs=batch_size, seed=int(seed), **sim_kwargs)
    for start in range(0, int(counts[0]), batch_size):
        _placements(parts, placer, min(batch_size, int(counts[0]) - start), gen)
    for source in (1, 2):  # a smaller batch of envs, so episodes run to their end many times
        sim = ReachSim(num_envs=min(batch_size, 64), seed=int(seed) + source, **sim_kwargs)
        _episodes(parts, sim, int(counts[source]), gen, expert=source == 1, noise=expert_noise)
    out = {k: (torch.cat(v) if k != "instruction" else v) for k, v in parts.items()}
    names = placer.color_names
    out["goal_color_name"] = [names[i] for i in out["goal_color"].tolist()]
    out["success"] = out["goal_distance"] <= sim.success_radius
    out["colors"] = names
    out["positive"] = [POSITIVE.format(color=c) for c in out["goal_color_name"]]
    out["negative"] = [NEGATIVE.format(color=c) for c in out["goal_color_name"]]
    out["meta"] = {
        "num_samples": num_samples, "seed": seed, "sim_kwargs": sim_kwargs, "mix": list(mix),
        "expert_noise": expert_noise, "success_radius": placer.success_radius,
        "positive_template": POSITIVE, "negative_template": NEGATIVE,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/reach_clip.pt")
    args = parser.parse_args()
    data = build(args.samples, seed=args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    print(f"{len(data['instruction'])} frames, success share {data['success'].float().mean():.3f} -> {args.out}")


if __name__ == "__main__":
    main()
