"""Sample efficiency of mmrl's off-policy mode (issue 36), in two parts.

    pip install 'stable-baselines3==2.9.2'            # benchmark-only (the `bench` extra)
    python benchmarks/sample_efficiency.py             # both parts, 3 seeds each
    python benchmarks/sample_efficiency.py --part sac --seeds 1 --tasks Pendulum-v1 --env-steps 20000
    python benchmarks/sample_efficiency.py --part reach --seeds 3 --dsrl-set policy.noise_bound=3
    python benchmarks/sample_efficiency.py --smoke     # seconds: tiny runs of both parts, no figure

**reach** (``--part reach``): on the quickstart's reach task, from one warm start per seed, PPO
(``configs/quickstart.yaml``: the warm-started flow VLA trained on) against DSRL
(``configs/quickstart_dsrl.yaml``: the same weights frozen, SAC steering their initial noise) and
RLPD (``configs/quickstart_rlpd.yaml``: the same weights frozen, SAC on a bounded correction of
their chunk, with the warm start's demonstrations as half of every batch); ``--methods`` picks.
Per seed the warm start runs once (``trainer.iterations=0``); PPO resumes a copy of that run folder
for its iterations, and DSRL and RLPD load the same checkpoint as their frozen base
(``policy.base_checkpoint``), so all start from bit-identical weights. Figures per method:
held-out success at the start and the end, and the env steps and RL seconds (evaluation excluded)
of the first evaluation at or above ``--level`` (0.85; null where never reached), read from the
run's evaluations (``trainer.eval_every``, so the steps are as coarse as the evaluations). PPO's
start is the warm-started policy's; DSRL's is its untrained actor's, which steers the base with the
noise ``noise_bound * tanh(mean)``, not with the base's own draws; RLPD's is the base's chunk from
zero noise (its actor starts at a zero correction).
``--ppo-set`` / ``--dsrl-set`` / ``--rlpd-set`` add overrides for one side.

**sac** (``--part sac``): mmrl's SAC against Stable-Baselines3's SAC on gymnasium control tasks with
state observations, at equal env steps.

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
SB3's. The last line is one JSON object: ``{"sac_vs_sb3": {...}, "reach": {...}}`` (the parts run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(1, str(ROOT))  # tests.reliability.kill_harness: the smoke's tiny quickstart

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
REACH_PPO = "configs/quickstart.yaml"  # the warm start, then PPO
REACH_DSRL = "configs/quickstart_dsrl.yaml"  # the same warm start frozen, SAC on its initial noise
REACH_RLPD = "configs/quickstart_rlpd.yaml"  # the same warm start frozen, RLPD on a correction of its chunk
METHODS = ("ppo", "dsrl", "rlpd")
#: the reach part's smoke settings: the kill harness's tiny quickstart, and a DSRL of the same size
REACH_SMOKE_DSRL = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs={max_episode_steps: 12}",
    "policy.hidden=16",
    "algorithm.sac.critic_hidden=16",
    "algorithm.sac.batch_size=8",
    "algorithm.sac.learning_starts=16",
    "trainer.env_steps=200",
    "trainer.eval_every=2",
    "trainer.eval_episodes=8",
    "trainer.video_episodes=0",
    "run.threads=1",
]
REACH_SMOKE_RLPD = [*REACH_SMOKE_DSRL, "algorithm.sac.demo_episodes=4"]
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


def evaluations(results: dict) -> list[dict]:
    """The run's held-out evaluations (``Trainer.run``'s results: every evaluation by name, a resumed
    run's included) as ``[{env_steps, rl_seconds, success}]`` in order of env steps, once per env
    step count (the final evaluation repeats the last iteration's)."""
    seen = {
        int(r["env_steps"]): {
            "env_steps": int(r["env_steps"]),
            "rl_seconds": round(float(r["rl_seconds"]), 1),
            "success": round(float(r["success_rate"]), 4),
        }
        for r in results.values()
    }
    return [seen[k] for k in sorted(seen)]


def to_level(curve: list[dict], level: float) -> tuple[int | None, float | None]:
    """``(env steps, RL seconds)`` of the first evaluation at or above ``level``; ``(None, None)``
    if none reached it."""
    for point in curve:
        if point["success"] >= level:
            return point["env_steps"], point["rl_seconds"]
    return None, None


def train(config: str, overrides: list[str]) -> dict:
    """Run one experiment to its end in this process; its results (every evaluation, by name)."""
    from mmrl.experiment import build_trainer, load_experiment

    return build_trainer(load_experiment(ROOT / config, overrides)).run()


def reach_run(side: str, seed: int) -> str:
    """The run name of one side (``base``: the warm start, ``ppo``, ``dsrl``, ``rlpd``) of a reach seed."""
    return f"se_reach_{side}_s{seed}"


def reach_base(seed: int, args: argparse.Namespace, fresh: bool = True) -> Path:
    """The reach part's warm start of ``seed`` (the PPO run's first part, which every method of the
    seed starts from): its run folder, trained anew (``fresh``) or kept where a complete checkpoint
    of it is there already."""
    from mmrl.experiment import load_experiment, output_dir
    from mmrl.trainer.checkpoint import latest_path
    from mmrl.trainer.run_folder import check_resume_config

    warm = [f"run.name={reach_run('base', seed)}", f"run.seed={seed}", *args.reach_set, *args.ppo_set]
    cfg = load_experiment(ROOT / REACH_PPO, warm)
    base = output_dir(cfg)
    done = latest_path(base) if not fresh and base.is_dir() else None
    if done is not None:
        check_resume_config(cfg, done)  # one trained with other settings: ConfigChangedError
        print(f"reach seed {seed}: the warm start in {base} is complete, reused", flush=True)
        return base
    shutil.rmtree(base, ignore_errors=True)
    train(REACH_PPO, [*warm, "trainer.iterations=0", "trainer.resume=false"])
    return base


def reach_seed(seed: int, args: argparse.Namespace, base: Path | None = None) -> dict[str, dict]:
    """One seed of the reach part: the warm start once (or ``base``, one `reach_base` made), then PPO
    (resuming a copy of it), DSRL and RLPD (its frozen base; those of ``args.methods``); each side's
    evaluations and its steps / seconds to ``args.level``."""
    common = [f"run.seed={seed}", *args.reach_set]
    warm = [*common, *args.ppo_set]  # the warm start's run is the PPO run's first part
    if base is None:
        base = reach_base(seed, args)
    ppo_dir = base.with_name(reach_run("ppo", seed))
    shutil.rmtree(ppo_dir, ignore_errors=True)
    shutil.copytree(base, ppo_dir, ignore=shutil.ignore_patterns(".lock"))
    frozen = [f"policy.base_checkpoint={base}", "warm_start.dataset=null", "trainer.resume=false", *common]
    jobs = {
        "ppo": lambda: train(REACH_PPO, [f"run.name={ppo_dir.name}", *warm, "trainer.resume=true"]),
        "dsrl": lambda: train(REACH_DSRL, [f"run.name={reach_run('dsrl', seed)}", *frozen, *args.dsrl_set]),
        "rlpd": lambda: train(REACH_RLPD, [f"run.name={reach_run('rlpd', seed)}", *frozen, *args.rlpd_set]),
    }
    runs = {side: jobs[side]() for side in args.methods}
    out = {}
    for side, results in runs.items():
        curve = evaluations(results)
        steps, seconds = to_level(curve, args.level)
        out[side] = {
            "start": curve[0]["success"],
            "final": curve[-1]["success"],
            "steps_to_level": steps,
            "seconds_to_level": seconds,
            "env_steps": curve[-1]["env_steps"],
        }
        points = ", ".join(f"{p['success']:.3f}@{p['env_steps']}" for p in curve)
        print(f"reach seed {seed} {side}: held-out success @ env steps: {points}", flush=True)
    return out


def reach_part(args: argparse.Namespace) -> dict:
    """PPO against DSRL and RLPD on reach from the same warm start, ``args.seeds`` seeds (see the
    docstring)."""
    seeds = list(range(args.seeds))
    from mmrl.utils.processes import side_by_side

    per_seed = side_by_side(reach_seed, seeds, [args] * len(seeds), jobs=args.jobs)  # --jobs > 1: own processes
    figures: dict = {"seeds": seeds, "level": args.level}
    for side in args.methods:
        rows = [r[side] for r in per_seed]
        side_figs: dict = {k: [r[k] for r in rows] for k in rows[0]}
        for k in ("start", "final"):
            side_figs[f"{k}_mean"] = round(statistics.mean(side_figs[k]), 4)
            side_figs[f"{k}_std"] = round(statistics.stdev(side_figs[k]), 4) if len(rows) > 1 else 0.0
        side_figs["reached"] = sum(s is not None for s in side_figs["steps_to_level"])
        figures[side] = side_figs
    # the goal: DSRL or RLPD at the level in at most a third of PPO's env steps (seeds where
    # both got there)
    for side in ("dsrl", "rlpd"):
        if side in figures and "ppo" in figures:
            both = zip(figures[side]["steps_to_level"], figures["ppo"]["steps_to_level"])
            figures[f"{side}_over_ppo_steps"] = [round(d / p, 3) for d, p in both if d and p] or None
    return figures


def sac_part(args: argparse.Namespace) -> dict:
    """mmrl's SAC against SB3's SAC on the gymnasium tasks (see the docstring)."""
    sides = [s for s in args.sides.split(",") if s]
    tasks = [t for t in args.tasks.split(",") if t]
    return side_by_side(
        tasks,
        sides,
        range(args.seeds),
        lambda task: args.env_steps or TASKS.get(task, 20_000),
        lambda side, task, seed, steps: spawn(side, task, seed, steps, args, script=__file__, tag=TAG),
        {"sac": "ratio_return"},
        speed_side="sac",
        jobs=args.jobs,
    )


def main() -> None:
    from _smoke import parse_args, scratch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("all", "sac", "reach"), default="all", help="which part to run")
    p.add_argument("--tasks", default=",".join(TASKS), help="sac part: comma-separated gymnasium ids")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--env-steps", type=int, default=None, help="sac part: override every task's training env steps")
    p.add_argument("--eval-episodes", type=int, default=10, help="sac part: held-out episodes per run")
    p.add_argument("--sides", default=",".join(SIDES), help="sac part: which of sb3, sac to run")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (sac: each one torch thread; reach: seeds)")
    p.add_argument("--level", type=float, default=0.85, help="reach part: the held-out success to reach")
    p.add_argument("--reach-set", action="append", default=[], help="reach part: an override for both sides")
    p.add_argument("--ppo-set", action="append", default=[], help="reach part: an override for PPO and its warm start")
    p.add_argument("--dsrl-set", action="append", default=[], help="reach part: an override for DSRL only")
    p.add_argument("--rlpd-set", action="append", default=[], help="reach part: an override for RLPD only")
    p.add_argument("--methods", default=",".join(METHODS), help="reach part: which of ppo, dsrl, rlpd to run")
    add_child_args(p)
    args = parse_args(p, seeds=1, env_steps=300, eval_episodes=1, jobs=2)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    if args.smoke:  # the runs' folders in a temporary folder; the reach runs tiny
        from tests.reliability.kill_harness import TINY

        args.overrides = [f"run.output_dir={scratch()}", *args.overrides]
        args.reach_set = [f"run.output_dir={scratch()}", *args.reach_set]
        args.ppo_set = [*TINY, "trainer.iterations=2", "trainer.eval_every=1", *args.ppo_set]
        args.dsrl_set = [*REACH_SMOKE_DSRL, *args.dsrl_set]
        args.rlpd_set = [*REACH_SMOKE_RLPD, *args.rlpd_set]
    if args.child:
        return child(args)
    parts = ("sac", "reach") if args.part == "all" else (args.part,)
    if "sac" in parts:  # every check before any run
        require_sb3("sample_efficiency")
        sides = [s for s in args.sides.split(",") if s]
        if set(sides) - set(SIDES):
            sys.exit(f"--sides: unknown {sorted(set(sides) - set(SIDES))}; choose from {', '.join(SIDES)}")
        check_tasks([t for t in args.tasks.split(",") if t])
    if not 0 < args.level <= 1:
        sys.exit(f"--level {args.level}: a held-out success rate in (0, 1]")
    args.methods = [m for m in args.methods.split(",") if m]
    if "reach" in parts and (not args.methods or set(args.methods) - set(METHODS)):
        sys.exit(f"--methods {','.join(args.methods)!r}: choose from {', '.join(METHODS)}")
    figures: dict = {"load_avg_start": round(os.getloadavg()[0], 2)}
    if "sac" in parts:
        figures["sac_vs_sb3"] = sac_part(args)
    if "reach" in parts:
        figures["reach"] = reach_part(args)
    figures["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
