"""Reward per step of random actions N(0, s^2) (clipped to the action space) at several noise levels
s, per gymnasium task: what exploration noise alone costs an untrained policy whose mean action is
about 0, as the state template's is (issue 33's probe for an initial action std chosen from the env).

    python scripts/noise_probe.py --tasks Ant-v5,Hopper-v5 --steps 8000

One JSON line per task: for each s, the mean reward per step and the mean length of the episodes
that ended within the steps.
"""

from __future__ import annotations

import argparse
import json
import math


def probe(task: str, stds: list[float], steps: int, seed: int) -> dict:
    import gymnasium as gym
    import numpy as np

    env = gym.make(task)
    low, high = env.action_space.low, env.action_space.high
    out = {}
    for std in stds:
        rng = np.random.default_rng(seed)
        rewards, lengths, length = [], [], 0
        env.reset(seed=seed)
        for _ in range(steps):
            action = np.clip(rng.normal(0.0, std, env.action_space.shape), low, high).astype(env.action_space.dtype)
            _, reward, terminated, truncated, _ = env.step(action)
            rewards.append(float(reward))
            length += 1
            if terminated or truncated:
                lengths.append(length)
                length = 0
                env.reset()
        out[f"{std:.3f}"] = {
            "reward_per_step": round(float(np.mean(rewards)), 4),
            "reward_std": round(float(np.std(rewards)), 4),
            "episode_length": round(float(np.mean(lengths)), 1) if lengths else None,
        }
    env.close()
    return {"task": task, "seed": seed, "steps": steps, "by_std": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="Ant-v5,Hopper-v5,HalfCheetah-v5,Walker2d-v5,Swimmer-v5,InvertedPendulum-v5")
    p.add_argument("--log-stds", default="0,-0.5,-1,-1.5,-2", help="log of each noise level s")
    p.add_argument("--steps", type=int, default=8000)
    p.add_argument("--seed", type=int, default=100)
    args = p.parse_args()
    stds = [math.exp(float(v)) for v in args.log_stds.split(",")]
    for task in args.tasks.split(","):
        print(json.dumps(probe(task.strip(), stds, args.steps, args.seed)), flush=True)


if __name__ == "__main__":
    main()
