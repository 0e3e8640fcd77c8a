"""Build the `reach_demos` dataset: scripted-expert demonstrations in the embedded ReachSim.

``build(num_episodes)`` runs the privileged straight-line expert from ``reset(seed + i)`` for
episode i and records one row per decision step (every ``chunk_size`` sim steps) until the
episode ends. See CARD.md for the fields. Run as a script to save a ``.pt`` file::

    python datasets/reach_demos/builder.py --episodes 2000 --out runs/reach_demos.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

#: the registered simulator these demonstrations are recorded in: the trainer passes that
#: simulator's configured ``sim.kwargs`` as ``sim_kwargs`` when the experiment runs in it
SIMULATOR = "reach"

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_reach = adapter("simulators.reach")  # simulators/reach.py, wherever mmrl installed it (mmrl_simulators in a wheel)
ReachSim = _reach.ReachSim


def build(
    num_episodes: int,
    seed: int = 0,
    chunk_size: int = 4,
    sim_kwargs: dict | None = None,
    expert_noise: float = 0.0,
    batch_size: int = 256,
    keep_failed: bool = True,
    expert_speed: float = 1.0,
) -> dict:
    """Expert demonstrations as flat per-decision records (sorted by episode, then step).

    Returns ``image`` uint8 [M, H, W, 3], ``state`` float [M, D], ``instruction`` list of M str,
    ``actions`` float [M, C, 2] (the expert chunk executed from that observation; zeros after the
    planned success), ``episode`` long [M], ``step`` long [M] (decision index in the episode),
    ``rewards`` float [M] / ``terminated`` bool [M] / ``truncated`` bool [M] (what executing the
    chunk returned: the transitions RLPD replays), ``episode_success`` bool [E], ``final_image`` /
    ``final_state`` [E, ...] (the observation each episode ended on), ``success_rate`` float and
    ``meta`` (the build arguments).
    Episode ``i`` starts from ``reset(seed + i)`` whatever the batching. ``keep_failed=False`` drops
    the records of episodes that did not succeed (with ``expert_noise > 0``, or an expert too slow
    for the time limit). ``expert_speed`` in (0, 1] scales the expert's speed: a cautious
    demonstrator, as teleoperators are, whose imitation times out on far targets.
    """
    if not 0 < expert_speed <= 1:
        raise ValueError(f"expert_speed must be in (0, 1], got {expert_speed}")
    if num_episodes < 1 or chunk_size < 1:
        raise ValueError("num_episodes and chunk_size must be >= 1")
    sim_kwargs = dict(sim_kwargs or {})
    for key in ("num_envs", "seed"):
        if key in sim_kwargs:
            raise ValueError(f"sim_kwargs must not set {key!r}: build() chooses it")
    parts: dict[str, list] = {
        k: [] for k in ("image", "state", "actions", "episode", "step", "rewards", "terminated", "truncated")
    }
    instructions: list[str] = []
    episode_success = torch.zeros(num_episodes, dtype=torch.bool)
    final: dict[str, torch.Tensor] = {}  # each episode's last observation (image, state)
    vocab: list[str] = []
    from tqdm import tqdm

    bar = tqdm(total=num_episodes, desc="demonstrations", unit="ep", dynamic_ncols=True)
    for start in range(0, num_episodes, batch_size):
        n = min(batch_size, num_episodes - start)
        sim = ReachSim(num_envs=n, seed=seed + start, **sim_kwargs)
        vocab = sim.instruction_vocab()
        obs = sim.reset([seed + start + i for i in range(n)])
        active = torch.ones(n, dtype=torch.bool, device=sim.device)
        step = 0
        while bool(active.any()):
            chunk = sim.expert_chunk(chunk_size, noise=expert_noise, speed=expert_speed)
            rows = active.nonzero().flatten()
            parts["image"].append(obs.image[rows].cpu())
            parts["state"].append(obs.state[rows].cpu())
            parts["actions"].append(chunk[rows].cpu())
            parts["episode"].append((rows + start).cpu())
            parts["step"].append(torch.full((rows.numel(),), step, dtype=torch.long))
            instructions.extend(obs.instruction[i] for i in rows.tolist())
            res = sim.step_chunk(chunk)
            parts["rewards"].append(res.reward[rows].float().cpu())
            parts["terminated"].append(res.terminated[rows].cpu())
            parts["truncated"].append(res.truncated[rows].cpu())
            ended = active & res.done
            if bool(ended.any()):
                assert res.final_obs is not None
                done_rows = ended.nonzero().flatten()
                for key in ("image", "state"):
                    value = getattr(res.final_obs, key)
                    if key not in final:
                        final[key] = torch.zeros(num_episodes, *value.shape[1:], dtype=value.dtype)
                    final[key][done_rows.cpu() + start] = value[done_rows].cpu()
            bar.update(int(ended.sum()))
            episode_success[(ended & res.success).nonzero().flatten().cpu() + start] = True
            active &= ~res.done
            obs = res.obs
            step += 1
        sim.close()
    bar.close()
    out = {k: torch.cat(v) for k, v in parts.items()}
    from mmrl.data import record_order

    order = record_order(out["episode"], out["step"], None if keep_failed else episode_success)
    out = {k: v[order] for k, v in out.items()}
    out["instruction"] = [instructions[i] for i in order.tolist()]
    out["episode_success"] = episode_success
    out["final_image"], out["final_state"] = final["image"], final["state"]
    out["success_rate"] = episode_success.float().mean().item()
    out["meta"] = {
        "num_episodes": num_episodes,
        "seed": seed,
        "chunk_size": chunk_size,
        "sim_kwargs": sim_kwargs,
        "expert_noise": expert_noise,
        "expert_speed": expert_speed,
        "instruction_vocab": vocab,
    }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=4)
    p.add_argument("--noise", type=float, default=0.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    data = build(args.episodes, args.seed, args.chunk_size, expert_noise=args.noise)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    print(
        f"{len(data['instruction'])} decisions from {args.episodes} episodes, "
        f"success rate {data['success_rate']:.3f} -> {args.out}"
    )


if __name__ == "__main__":
    main()
