"""The pretrained-VLA family learns end to end on CPU: a tiny LeRobot SmolVLA, behaviour-cloned, then RL.

    .venv-lerobot/bin/python benchmarks/pretrained_vla.py                  # 3 seeds, one after another
    .venv-lerobot/bin/python benchmarks/pretrained_vla.py --jobs 2         # two seeds at a time, 1 thread each
    .venv-lerobot/bin/python benchmarks/pretrained_vla.py --config configs/reach_smolvla_flow_noise.yaml \\
        policy.model=tiny:pi0                                            # dotted overrides for every run
    .venv-lerobot/bin/python benchmarks/pretrained_vla.py --smoke          # seconds: 1 seed, 2 iterations, no figure

Runs ``configs/reach_smolvla_flow_noise.yaml`` (LeRobot's own ``SmolVLAPolicy``, a tiny random
initialisation of the real architecture, on the embedded reach task): behaviour cloning on
demonstrations of a slow scripted demonstrator with LeRobot's flow-matching loss, then Flow-Noise
PPO through mmrl's sampler over SmolVLA's ``denoise_step``. Each seed starts from scratch in
``runs/bench_<config>_s<seed>`` with ``run.seed`` = the seed (demonstrations, initial weights,
rollouts). The held-out episodes (``trainer.eval_seed``) are the same for every seed and were never
used to choose a setting: settings were chosen on validation episodes (``trainer.eval_seed=2000000000``).
Baselines on the same held-out episodes: the scripted expert (ceiling), the demonstrator the warm
start imitates (a perfect imitator's level) and random actions.

The last line is one JSON object: ``family``, ``model``, per-seed lists ``sft_success``,
``rl_success``, ``gain`` (points) and ``wall_s`` (whole run: demonstrations, warm start, RL, two
evaluations) with means and stds, the baselines, and ``bar`` (mean gain >= 20 points and every
seed within 15 minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from quickstart import baselines, run_config, summary  # noqa: E402  (the same per-seed run and figures)

CONFIG = "configs/reach_smolvla_flow_noise.yaml"
BAR_POINTS, BAR_SECONDS = 20.0, 900.0
SMOKE = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "warm_start.num_episodes=20",
    "warm_start.steps=3",
    "warm_start.batch_size=8",
    "warm_start.warmup_steps=1",
    "algorithm.minibatch_size=16",
    "algorithm.epochs=1",
    "trainer.iterations=2",
    "trainer.checkpoint_every=2",
    "trainer.eval_episodes=8",
    "trainer.video_episodes=0",
]


def one_seed(config: str, seed: int, overrides: list[str]) -> dict:
    r = run_config(config, seed, overrides)
    r["gain"] = round(100 * (r["rl_success"] - r["sft_success"]), 2)
    return r


def seeds_in_subprocesses(config: str, seeds: int, jobs: int, overrides: list[str]) -> list[dict]:
    """``jobs`` seeds at a time, each its own process with one torch thread."""
    runs: dict[int, dict] = {}
    pending = list(range(seeds))
    while pending:
        batch, pending = pending[:jobs], pending[jobs:]
        procs = {
            s: subprocess.Popen(
                [sys.executable, __file__, "--config", config, "--one-seed", str(s), *overrides, "run.threads=1"],
                stdout=subprocess.PIPE,
                text=True,
            )
            for s in batch
        }
        for s, p in procs.items():
            out, _ = p.communicate()
            if p.returncode:
                raise SystemExit(f"seed {s} failed (exit {p.returncode})")
            runs[s] = json.loads(out.strip().splitlines()[-1])
    return [runs[s] for s in range(seeds)]


def main() -> None:
    from _smoke import parse_args, scratch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run at a time (each one torch thread if > 1)")
    parser.add_argument("--one-seed", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parse_args(parser, seeds=1)
    if args.smoke:  # run folders in a temporary folder
        args.overrides = [*SMOKE, f"run.output_dir={scratch()}", *args.overrides]
    if args.one_seed is not None:
        print(json.dumps(one_seed(args.config, args.one_seed, args.overrides)))
        return
    from mmrl.experiment import load_experiment

    cfg = load_experiment(ROOT / args.config, args.overrides)
    load = os.getloadavg()[0]
    base = baselines(args.config, args.overrides)
    print(
        f"held-out baselines: scripted expert {base['expert']:.3f}, the demonstrator the warm start imitates "
        f"{base['demonstrator']:.3f}, random actions {base['random']:.3f}",
        flush=True,
    )
    runs = (
        seeds_in_subprocesses(args.config, args.seeds, args.jobs, args.overrides)
        if args.jobs > 1
        else [one_seed(args.config, s, args.overrides) for s in range(args.seeds)]
    )
    figures = {
        "family": cfg.policy.model.removeprefix("tiny:"),
        "model": cfg.policy.model,
        "method": cfg.policy.method,
        **summary(runs),
        **base,
        "jobs": args.jobs,
    }
    figures["bar"] = bool(figures["gain_mean"] >= BAR_POINTS and max(figures["wall_s"]) <= BAR_SECONDS)
    figures.update(load_avg_start=round(load, 2), load_avg_end=round(os.getloadavg()[0], 2))
    print(
        f"held-out success over {args.seeds} seeds: BC {figures['sft_success_mean']:.3f} -> RL "
        f"{figures['rl_success_mean']:.3f} (gain {figures['gain_mean']:.1f} +- {figures['gain_std']:.1f} points; "
        f"bar >= {BAR_POINTS:.0f} points within {BAR_SECONDS:.0f} s per seed: "
        f"{'met' if figures['bar'] else 'NOT met'})"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
