"""Build the `metaworld_demos` dataset: Meta-World's scripted experts, run through `MetaWorldSim`.

``build(num_episodes)`` runs the scripted expert of each episode's task (``metaworld.policies``)
closed loop, one action per sim step, from ``MetaWorldSim.reset(seed + i)`` for episode i, and
records one row per decision: the observation at a chunk's start and the ``chunk_size`` expert
actions executed from it. See CARD.md for the fields. Run as a script to save a ``.pt`` file::

    python datasets/metaworld_demos/builder.py --task MT10 --episodes 500 --out runs/metaworld_demos.pt
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

#: the registered simulator these demonstrations are recorded in: the trainer passes that
#: simulator's configured ``sim.kwargs`` as ``sim_kwargs`` when the experiment runs in it
SIMULATOR = "metaworld"

try:
    from mmrl.registry import adapter
except ImportError:  # run as a script from outside the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from mmrl.registry import adapter

_metaworld = adapter("simulators.metaworld")  # simulators/metaworld.py, wherever mmrl installed it
MetaWorldSim = _metaworld.MetaWorldSim

#: what every recording runs under, whatever ``sim_kwargs`` say: whole episodes (a training config's
#: staggered first episodes would cut them at random), each ending at its first success
RECORDING = {"terminate_on_success": True, "stagger_episodes": False}


def experts(tasks: list[str]) -> dict:
    """Meta-World's scripted expert of each task (``metaworld.policies.ENV_POLICY_MAP``), one instance
    each (they keep no state between calls)."""
    from metaworld.policies import ENV_POLICY_MAP

    missing = [t for t in tasks if t not in ENV_POLICY_MAP]
    if missing:
        raise ValueError(f"metaworld.policies has no scripted expert for {missing}")
    return {t: ENV_POLICY_MAP[t]() for t in tasks}


def expert_action(policy, state: np.ndarray, speed: float, noise: np.ndarray) -> np.ndarray:
    """The degraded expert's action on one 39-dim observation: the expert's own, clipped to [-1, 1]
    as the simulator clips it, the hand displacement (first 3 dims) scaled by ``speed``, plus
    ``noise``, clipped again: exactly what the simulator executes."""
    with warnings.catch_warnings():  # the experts' gains exceed 1 on purpose ("may be too high")
        warnings.simplefilter("ignore", UserWarning)
        a = np.clip(np.asarray(policy.get_action(state), dtype=np.float64), -1.0, 1.0)
    a[:3] *= speed
    return np.clip(a + noise, -1.0, 1.0).astype(np.float32)


def build(
    num_episodes: int,
    seed: int = 0,
    chunk_size: int = 4,
    sim_kwargs: dict | None = None,
    expert_noise: float = 0.0,
    expert_speed: float = 1.0,
    keep_failed: bool = True,
    batch_size: int = 50,
) -> dict:
    """Scripted-expert demonstrations as flat per-decision records (sorted by episode, then step).

    Returns ``image`` uint8 [M, H, W, 3] (all zeros, one shared frame, without ``render_images``),
    ``state`` float [M, 39], ``instruction`` list of M str, ``actions`` float [M, C, 4] (the expert's
    actions of the next C sim steps, computed closed loop; past the episode's end: no hand motion,
    the last gripper effort), ``episode`` long [M], ``step`` long [M] (decision index in the
    episode), ``rewards`` float [M] / ``terminated`` bool [M] / ``truncated`` bool [M] (what
    executing the chunk returned), ``episode_success`` bool [E], ``episode_length`` long [E] (sim
    steps), ``episode_task`` list of E str, ``final_image`` / ``final_state`` [E, ...] (the
    observation each episode ended on), ``success_rate`` float and ``meta`` (the build arguments).
    Episode ``i`` starts from ``MetaWorldSim.reset(seed + i)`` (task ``tasks[(seed + i) % T]``, its
    variation ``((seed + i) // T) % 50``) whatever ``batch_size``; its noise is drawn from a
    generator of ``(seed, i)``, so the data does not depend on the batching either. Episodes end at
    their first success or at the time limit (``sim_kwargs["max_episode_steps"]``, default 500).
    ``keep_failed=False`` drops the records of episodes that did not succeed.
    """
    if not 0 < expert_speed <= 1:
        raise ValueError(f"expert_speed must be in (0, 1], got {expert_speed}")
    if expert_noise < 0:
        raise ValueError(f"expert_noise must be >= 0, got {expert_noise}")
    if num_episodes < 1 or chunk_size < 1 or batch_size < 1:
        raise ValueError("num_episodes, chunk_size and batch_size must be >= 1")
    sim_kwargs = dict(sim_kwargs or {})
    for key in ("num_envs", "seed"):
        if key in sim_kwargs:
            raise ValueError(f"sim_kwargs must not set {key!r}: build() chooses it")
    b = min(batch_size, num_episodes)
    sim = MetaWorldSim(num_envs=b, seed=seed, **{**sim_kwargs, **RECORDING})
    policies = experts(sim.tasks)
    parts: dict[str, list] = {k: [] for k in ("state", "actions", "episode", "step", "rewards", "terminated")}
    parts.update(image=[], truncated=[])
    instructions: list[str] = []
    episode_success = torch.zeros(num_episodes, dtype=torch.bool)
    episode_length = torch.zeros(num_episodes, dtype=torch.long)
    episode_task = [""] * num_episodes
    final_state = torch.zeros(num_episodes, sim.state_dim)
    final_image = torch.zeros(num_episodes, *sim.image_shape, dtype=torch.uint8) if sim.has_images else None
    from tqdm import tqdm

    bar = tqdm(total=num_episodes, desc="demonstrations", unit="ep", dynamic_ncols=True, disable=None)
    try:
        for start in range(0, num_episodes, b):
            n = min(b, num_episodes - start)
            obs = sim.reset([seed + start + i for i in range(b)])  # slots past n: reset, never stepped
            rngs = [np.random.default_rng([seed % 2**63, start + i]) for i in range(n)]
            for i in range(n):
                episode_task[start + i] = obs.meta[i]["task"]
            active = torch.arange(b) < n
            step = 0
            while bool(active.any()):
                rows = active.nonzero().flatten()
                if sim.has_images:
                    parts["image"].append(obs.image[rows].cpu())
                parts["state"].append(obs.state[rows].cpu())
                parts["episode"].append(rows + start)
                parts["step"].append(torch.full((rows.numel(),), step, dtype=torch.long))
                instructions.extend(obs.instruction[i] for i in rows.tolist())
                chunk = torch.zeros(b, chunk_size, sim.action_dim)
                reward = torch.zeros(b)
                terminated, truncated = torch.zeros(b, dtype=torch.bool), torch.zeros(b, dtype=torch.bool)
                alive, current = active.clone(), obs
                for k in range(chunk_size):  # the expert closed loop, one sim step at a time
                    for i in alive.nonzero().flatten().tolist():
                        state = current.state[i].double().cpu().numpy()
                        noise = rngs[i].normal(0.0, expert_noise, 4) if expert_noise > 0 else 0.0
                        chunk[i, k] = torch.from_numpy(
                            expert_action(policies[current.meta[i]["task"]], state, expert_speed, noise)
                        )
                    # one masked step (the base class's step_chunk does the same): envs whose episode
                    # ended stay put instead of running their auto-reset episode
                    res = sim._step_masked(chunk[:, k].to(sim.device), alive.to(sim.device))
                    reward += res.reward.cpu()
                    done = alive & res.done.cpu()
                    terminated |= alive & res.terminated.cpu()
                    truncated |= alive & res.truncated.cpu()
                    for i in done.nonzero().flatten().tolist():
                        e = start + i
                        episode_success[e] = bool(res.success[i])
                        episode_length[e] = step * chunk_size + k + 1
                        final_state[e] = res.final_obs.state[i].cpu()
                        if final_image is not None:
                            final_image[e] = res.final_obs.image[i].cpu()
                        chunk[i, k + 1 :, :3] = 0.0  # past the end: hold the hand still, keep the grip
                        chunk[i, k + 1 :, 3] = chunk[i, k, 3]
                    alive &= ~done
                    current = res.obs
                    if not bool(alive.any()):
                        break
                parts["actions"].append(chunk[rows])
                parts["rewards"].append(reward[rows])
                parts["terminated"].append(terminated[rows])
                parts["truncated"].append(truncated[rows])
                ended = active & (terminated | truncated)
                bar.update(int(ended.sum()))
                active &= ~ended
                obs = current
                step += 1
    finally:
        sim.close()
        bar.close()
    out = {k: torch.cat(v) for k, v in parts.items() if v}
    from mmrl.data import record_order

    order = record_order(out["episode"], out["step"], None if keep_failed else episode_success)
    out = {k: v[order] for k, v in out.items()}
    m = len(order)
    if final_image is None:  # no pixels (state + instruction): one all-zero frame shared by every row
        frame = torch.zeros(1, *sim.image_shape, dtype=torch.uint8)
        out["image"] = frame.expand(m, *sim.image_shape)
        final_image = frame.expand(num_episodes, *sim.image_shape)
    out["instruction"] = [instructions[i] for i in order.tolist()]
    out["episode_success"] = episode_success
    out["episode_length"] = episode_length
    out["episode_task"] = episode_task
    out["final_image"], out["final_state"] = final_image, final_state
    out["success_rate"] = episode_success.float().mean().item()
    out["meta"] = {
        "num_episodes": num_episodes,
        "seed": seed,
        "chunk_size": chunk_size,
        "sim_kwargs": sim_kwargs,
        "recording": dict(RECORDING),
        "tasks": list(sim.tasks),
        "expert_noise": expert_noise,
        "expert_speed": expert_speed,
        "keep_failed": keep_failed,
    }
    return out


def summary(data: dict) -> dict:
    """Per task: episodes, success rate and mean episode length (sim steps) of a build's output."""
    out: dict[str, dict] = {}
    for task in dict.fromkeys(data["episode_task"]):
        idx = torch.tensor([t == task for t in data["episode_task"]])
        out[task] = {
            "episodes": int(idx.sum()),
            "success": round(data["episode_success"][idx].float().mean().item(), 3),
            "length": round(data["episode_length"][idx].float().mean().item(), 1),
        }
    return out


#: Meta-World's control rate: MuJoCo's 2.5 ms step x frame_skip 5 (its envs' ``metadata["render_fps"]``)
FPS = 80


def write_lerobot(data: dict, root: Path, repo_id: str = "local/metaworld_demos") -> Path:
    """Records built with ``chunk_size=1`` -> a LeRobotDataset at ``root`` (the `lerobot_dataset`
    writer: state, action, reward, the instruction as each frame's task; the ``corner`` camera
    when the records were rendered), at Meta-World's `FPS`."""
    from mmrl.data import builder_module

    rendered = bool(data["meta"]["sim_kwargs"].get("render_images"))
    camera = data["meta"]["sim_kwargs"].get("camera", "corner") if rendered else None
    writer = builder_module("lerobot_dataset").write
    return writer(data, root, repo_id=repo_id, fps=FPS, camera=camera, robot_type="sawyer")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="MT10", help="a task name, comma-separated names, MT10 or MT50")
    p.add_argument("--split", default="train", choices=("train", "heldout"))
    p.add_argument("--episodes", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=4)
    p.add_argument("--max-episode-steps", type=int, default=500)
    p.add_argument("--noise", type=float, default=0.0, help="expert_noise")
    p.add_argument("--speed", type=float, default=1.0, help="expert_speed")
    p.add_argument("--drop-failed", action="store_true", help="keep_failed=False")
    p.add_argument("--out", type=Path, help="where to torch.save the records (default: only the summary)")
    p.add_argument(
        "--lerobot", type=Path, help="also write a LeRobotDataset into this new folder (LeRobot venv; --chunk-size 1)"
    )
    p.add_argument("--repo-id", default="local/metaworld_demos", help="the LeRobotDataset's repo id (--lerobot)")
    args = p.parse_args(argv)
    if args.lerobot is not None and args.chunk_size != 1:
        p.error("--lerobot stores one action per frame: record with --chunk-size 1")
    task = args.task.split(",") if "," in args.task else args.task
    sim_kwargs = {"task": task, "split": args.split, "max_episode_steps": args.max_episode_steps}
    data = build(args.episodes, args.seed, args.chunk_size, sim_kwargs, args.noise, args.speed, not args.drop_failed)
    for task_name, row in summary(data).items():
        print(f"{task_name:32s} episodes {row['episodes']:4d}  success {row['success']:.3f}  length {row['length']}")
    rate = data["success_rate"]
    print(f"{len(data['instruction'])} decisions from {args.episodes} episodes, success rate {rate:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, args.out)
        print(f"-> {args.out}")
    if args.lerobot is not None:
        write_lerobot(data, args.lerobot, args.repo_id)
        print(f"-> {args.lerobot} (LeRobotDataset, {FPS} fps)")


if __name__ == "__main__":
    main()
