"""Sample efficiency of mmrl's off-policy mode (issue 36). First part: mmrl's SAC against
Stable-Baselines3's SAC on gymnasium control tasks with state observations, at equal env steps.

    pip install 'stable-baselines3==2.9.2'            # benchmark-only (the `bench` extra)
    python benchmarks/sample_efficiency.py             # Pendulum-v1 and InvertedPendulum-v5, 3 seeds, 20k steps
    python benchmarks/sample_efficiency.py --seeds 1 --tasks Pendulum-v1 --env-steps 20000
    python benchmarks/sample_efficiency.py --smoke     # seconds: a few hundred steps per run, no figure

Identical work on both sides, per task and seed, as in ``benchmarks/vs_sb3.py`` (whose helpers this
reuses: the held-out episodes, the random baseline, the statistics): the same env id, the same env
steps of training, then the same held-out episodes (reset seeds ``1e9 + e``) played deterministically
(SB3: ``predict(deterministic=True)``; mmrl: the squashed Gaussian's ``tanh(mean)``). Each run is a
fresh subprocess with one torch thread.

- ``sb3``: ``SAC("MlpPolicy", env_id, seed=seed)`` with SB3's defaults (1 env, buffer 1M, batch 256,
  100 random steps, one gradient step per env step, lr 3e-4, tau 0.005, gamma 0.99, automatic
  entropy temperature from 1.0 toward -action_dim, 256x256 ReLU actor and twin critics).
- ``sac``: mmrl's off-policy mode from ``configs/gym_pendulum_sac.yaml`` (its env id swapped for
  the task's): the same settings, the Gaussian MLP policy as the tanh-squashed actor.

Figures per task: the final held-out return per seed, mean and std; ``ratio_return`` = (mmrl mean -
random) / (SB3 mean - random), random being the uniform random policy's mean return on the same
held-out episodes (1 = SB3's level); ``ratio_steps_per_s`` = mmrl's training env steps per second /
SB3's. The last line is one JSON object of them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from vs_sb3 import (  # noqa: E402
    EVAL_SEED,
    add_child_args,
    check_tasks,
    play,
    require_sb3,
    run_mmrl,
    run_random,
    side_by_side,
    spawn,
)

TAG = "SAMPLE_EFFICIENCY_RESULT "
CONFIG = "configs/gym_pendulum_sac.yaml"  # mmrl's SAC; other tasks swap their env id in
TASKS = {"Pendulum-v1": 20_000, "InvertedPendulum-v5": 20_000}  # env steps per run
SIDES = ("sb3", "sac")


def run_sb3_sac(task: str, seed: int, env_steps: int, episodes: int) -> dict:
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(1)
    model = SAC("MlpPolicy", task, seed=seed, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    train_s = time.perf_counter() - t0
    returns = play(lambda o: model.predict(o, deterministic=True)[0], task, episodes, EVAL_SEED)
    return {"return": statistics.mean(returns), "train_s": train_s, "env_steps": int(model.num_timesteps)}


def child(args: argparse.Namespace) -> None:
    if args.side == "sb3":
        out = run_sb3_sac(args.task, args.seed, args.env_steps, args.eval_episodes)
    elif args.side == "random":
        out = run_random(args.task, args.eval_episodes, EVAL_SEED)
    else:
        steps, episodes = args.env_steps, args.eval_episodes
        out = run_mmrl(args.task, args.seed, steps, episodes, EVAL_SEED, "sac", args.overrides, CONFIG)
    print(TAG + json.dumps(out), flush=True)


def main() -> None:
    from _smoke import parse_args, scratch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated gymnasium ids")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--env-steps", type=int, default=None, help="override every task's training env steps")
    p.add_argument("--eval-episodes", type=int, default=10)
    p.add_argument("--sides", default=",".join(SIDES), help="which of sb3, sac to run")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each one torch thread)")
    add_child_args(p)
    args = parse_args(p, seeds=1, env_steps=300, eval_episodes=1, jobs=2)
    if args.smoke:  # the mmrl runs' folders in a temporary folder
        args.overrides = [f"run.output_dir={scratch()}", *args.overrides]
    if args.child:
        return child(args)
    require_sb3("sample_efficiency")
    sides = [s for s in args.sides.split(",") if s]
    if set(sides) - set(SIDES):
        sys.exit(f"--sides: unknown {sorted(set(sides) - set(SIDES))}; choose from {', '.join(SIDES)}")
    tasks = [t for t in args.tasks.split(",") if t]
    check_tasks(tasks)
    figures: dict = {"part": "sac_vs_sb3", "load_avg_start": round(os.getloadavg()[0], 2)}
    figures |= side_by_side(
        tasks,
        sides,
        range(args.seeds),
        lambda task: args.env_steps or TASKS.get(task, 20_000),
        lambda side, task, seed, steps: spawn(side, task, seed, steps, args, script=__file__, tag=TAG),
        {"sac": "ratio_return"},
        speed_side="sac",
        jobs=args.jobs,
    )
    figures["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
