"""mmrl's SAC and PPO against Stable-Baselines3's SAC and PPO on Meta-World tasks (state), identical work.

(Not named metaworld.py: a script is first on its own import path, and would shadow the package.)

    pip install 'mmrl[metaworld,bench]'
    python benchmarks/metaworld_vs_sb3.py --jobs 2                 # 5 tasks x 4 methods x 3 seeds, 100k env steps
    python benchmarks/metaworld_vs_sb3.py --tasks reach-v3,push-v3 --env-steps 50000 --methods sb3_sac,mmrl_sac
    python benchmarks/metaworld_vs_sb3.py --validation ...     # choose settings here (other seeds and variations)
    python benchmarks/metaworld_vs_sb3.py --smoke                  # seconds: the whole path, no figure

Per task and seed, every method trains on the task's 50 training goal variations (Meta-World's own,
``simulators/metaworld.py``) for the same number of environment steps, then plays the same 50
held-out episodes deterministically: one per held-out goal variation (reset seeds ``1e9 + e``; 1e9 is
a multiple of 50, so episode e is variation e), each ending at its first success or at 500 steps, as
Meta-World's own evaluation does. The figure is the held-out success rate.

- ``sb3_sac``: ``SAC("MlpPolicy", env, train_freq=4, gradient_steps=1)``: SB3's defaults except one
  gradient step per 4 env steps (one per env step ran at about 57 env steps/s here: 100k steps would
  be 30 minutes a run); ``sb3_ppo``: ``PPO("MlpPolicy", env)``, SB3's defaults. Their env is the same
  simulator through mmrl's gymnasium view (``mmrl.gym_view.SimulatorEnv(MetaWorldSim(num_envs=1))``).
- ``mmrl_sac``: ``configs/metaworld_sac.yaml`` (the same SAC settings and update-to-data ratio, 4 envs
  stepping together); ``mmrl_ppo``: ``configs/metaworld_ppo.yaml`` (the gymnasium state template,
  mmrl's flow policy, unchanged). No setting was chosen for Meta-World: ``--validation`` exists to
  choose one (training seeds from 100, evaluation on another 50 held-out variations).

Baselines beside each task: uniform random actions and Meta-World's scripted expert on the same
held-out episodes (the ceiling). ``ratio_success`` = mmrl's best method's mean / SB3's best method's
mean; the goal counts a task only where SB3's best reaches 0.5 (``counted``); a task where neither
side learns is reported, not counted. ``ratio_steps_per_s_sac`` / ``_ppo``: training env steps per
second (rollouts and updates, evaluation excluded) of mmrl's method over SB3's same method. Each run is
a fresh subprocess with one torch thread; finished runs are kept in ``--out``/runs.jsonl, so the same
command after a kill only runs what is missing. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_sb3 import add_child_args, require_sb3, spawn, stats  # noqa: E402

TAG = "METAWORLD_RESULT "
TASKS = "reach-v3,drawer-close-v3,button-press-topdown-v3,push-v3,pick-place-v3"
METHODS = ("sb3_sac", "sb3_ppo", "mmrl_sac", "mmrl_ppo")
CONFIGS = {"mmrl_sac": "configs/metaworld_sac.yaml", "mmrl_ppo": "configs/metaworld_ppo.yaml"}
EVAL_SEED, EPISODES = 1_000_000_000, 50
VALIDATION_SEED0, VALIDATION_TASK_SEED = 100, 7  # --validation: training seeds, held-out variations
SB3_SAC = {"train_freq": 4, "gradient_steps": 1}  # = mmrl_sac's utd_ratio 0.25
COUNTED_AT = 0.5  # a task counts for the goal where SB3's best method reaches this held-out success


# ----------------------------------------------------------------------------------- one run
def held_out_sim(task: str, episodes: int, validation: bool):
    """The simulator of the held-out episodes: one env per episode, the evaluation protocol's."""
    sys.path.insert(0, str(ROOT))
    from mmrl.registry import SIMULATORS

    cls = SIMULATORS.get("metaworld")
    return cls(
        num_envs=episodes,
        task=task,
        **cls.eval_kwargs,
        **({"task_seed": VALIDATION_TASK_SEED} if validation else {}),
    )


def play(act, task: str, episodes: int, eval_seed: int, validation: bool) -> dict:
    """Held-out success and return of ``act(states [E, 39]) -> actions [E, 4]``: episode e resets with
    ``eval_seed + e`` and counts until it first ends."""
    import torch

    sim = held_out_sim(task, episodes, validation)
    obs = sim.reset([eval_seed + e for e in range(episodes)])
    done = torch.zeros(episodes, dtype=torch.bool)
    success, total = torch.zeros(episodes, dtype=torch.bool), torch.zeros(episodes)
    while not bool(done.all()):
        actions = torch.as_tensor(act(obs.state.numpy()), dtype=torch.float32).clamp(-1, 1)
        res = sim.step(actions)
        total += torch.where(done, torch.zeros_like(res.reward), res.reward)
        success |= ~done & res.success
        done |= res.done
        obs = res.obs
    sim.close()
    return {"success": success.float().mean().item(), "return": total.mean().item()}


def run_sb3(method: str, task: str, seed: int, env_steps: int, args) -> dict:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO, SAC

    from mmrl.gym_view import SimulatorEnv
    from mmrl.registry import SIMULATORS

    torch.set_num_threads(1)
    sim = SIMULATORS.get("metaworld")(num_envs=1, task=task, seed=seed)
    env = gym.wrappers.FlattenObservation(SimulatorEnv(sim, keys=("state",)))
    if method == "sb3_sac":
        model = SAC("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **SB3_SAC)
    else:
        model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0)
    t0 = time.perf_counter()
    model.learn(total_timesteps=env_steps)
    train_s = time.perf_counter() - t0
    eval_seed = EVAL_SEED + (EPISODES * 1000 if args.validation else 0)
    out = play(lambda s: model.predict(s, deterministic=True)[0], task, args.eval_episodes, eval_seed, args.validation)
    env.close()
    return {**out, "train_s": train_s, "env_steps": int(model.num_timesteps)}


def run_mmrl(method: str, task: str, seed: int, env_steps: int, args) -> dict:
    sys.path.insert(0, str(ROOT))
    from mmrl.experiment import build_trainer, load_experiment

    eval_seed = EVAL_SEED + (EPISODES * 1000 if args.validation else 0)
    cfg = load_experiment(
        ROOT / CONFIGS[method],
        [
            f"run.name=bench_metaworld_{task}_{method}_{seed}",
            "trainer.resume=false",
            f"run.seed={seed}",
            "run.threads=1",
            f"sim.kwargs.task={task}",
            f"trainer.env_steps={env_steps}",
            "trainer.checkpoint_every=1000000",
            f"trainer.eval_episodes={args.eval_episodes}",
            f"sim.eval_num_envs={args.eval_episodes}",
            f"trainer.eval_seed={eval_seed}",
            *([f"sim.eval_kwargs.task_seed={VALIDATION_TASK_SEED}"] if args.validation else []),
            *args.overrides,
        ],
    )
    trainer = build_trainer(cfg)
    final = trainer.run()["final"]
    return {
        "success": final["success_rate"],
        "return": final["return"],
        "train_s": final["rl_seconds"],
        "env_steps": final["env_steps"],
    }


def run_baseline(method: str, task: str, args) -> dict:
    """``random`` (uniform actions) or ``expert`` (Meta-World's scripted policy) on the held-out episodes."""
    import numpy as np

    if method == "random":
        rng = np.random.default_rng(0)
        return play(lambda s: rng.uniform(-1, 1, (len(s), 4)), task, args.eval_episodes, EVAL_SEED, args.validation)
    from metaworld.policies import ENV_POLICY_MAP

    expert = ENV_POLICY_MAP[task]()
    act = lambda s: np.stack([expert.get_action(row.astype(np.float64)) for row in s])  # noqa: E731
    return play(act, task, args.eval_episodes, EVAL_SEED, args.validation)


def child(args: argparse.Namespace) -> None:
    from mmrl.utils.processes import exit_with_parent_if_asked

    exit_with_parent_if_asked()  # started by `spawn`: stop if the orchestrator is killed
    side, task, seed, steps = args.side, args.task, args.seed, args.env_steps
    if side in ("random", "expert"):
        out = run_baseline(side, task, args)
    elif side.startswith("sb3"):
        out = run_sb3(side, task, seed, steps, args)
    else:
        out = run_mmrl(side, task, seed, steps, args)
    print(TAG + json.dumps(out), flush=True)


# --------------------------------------------------------------------------------- orchestration
def summarise(task: str, steps: int, runs: dict, seeds: list[int], methods: list[str], baselines: dict) -> dict:
    """One task's figures: per method the per-seed success and env steps/s (`stats`), the baselines,
    ``ratio_success``, ``counted`` and the speed ratios."""
    row: dict = {
        "env_steps": steps,
        "random_success": round(baselines["random"]["success"], 3),
        "expert_success": round(baselines["expert"]["success"], 3),
    }
    for m in methods:
        rs = [runs[(m, s)] for s in seeds]
        row[m] = {
            "success": stats([r["success"] for r in rs]),
            "return": stats([r["return"] for r in rs]),
            "steps_per_s": stats([r["env_steps"] / r["train_s"] for r in rs]),
        }
    best = {
        side: max((row[m]["success"]["mean"] for m in methods if m.startswith(side)), default=None)
        for side in ("sb3", "mmrl")
    }
    if best["sb3"] is not None and best["mmrl"] is not None:
        row["sb3_best_success"], row["mmrl_best_success"] = round(best["sb3"], 3), round(best["mmrl"], 3)
        row["ratio_success"] = round(best["mmrl"] / best["sb3"], 3) if best["sb3"] > 0 else None
        row["counted"] = best["sb3"] >= COUNTED_AT
    for algo in ("sac", "ppo"):
        if f"sb3_{algo}" in methods and f"mmrl_{algo}" in methods:
            ratio = row[f"mmrl_{algo}"]["steps_per_s"]["mean"] / row[f"sb3_{algo}"]["steps_per_s"]["mean"]
            row[f"ratio_steps_per_s_{algo}"] = round(ratio, 3)
    return row


def main() -> None:
    from _smoke import parse_args, scratch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=TASKS, help="comma-separated Meta-World task names")
    p.add_argument("--methods", default=",".join(METHODS), help=f"which of {', '.join(METHODS)}")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--env-steps", type=int, default=100_000, help="training env steps of every run")
    p.add_argument("--eval-episodes", type=int, default=EPISODES, help="held-out episodes (50 = every variation)")
    p.add_argument("--validation", action="store_true", help="seeds from 100, held-out variations of task_seed 7")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (each one torch thread)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_metaworld", help="run folders and runs.jsonl")
    p.add_argument(
        "--report",
        action="store_true",
        help="run nothing: the figures of the tasks whose runs --out already holds, the others listed as incomplete",
    )
    add_child_args(p)
    args = parse_args(p, tasks="reach-v3", seeds=1, env_steps=300, eval_episodes=2, jobs=2, out=lambda: Path(scratch()))
    if args.child:
        return child(args)
    require_sb3("metaworld")
    if args.jobs < 1:
        sys.exit(f"--jobs must be >= 1, got {args.jobs}")
    sys.path.insert(0, str(ROOT))
    from mmrl.errors import UserError
    from simulators.metaworld import resolve_tasks

    try:
        tasks = resolve_tasks([t for t in args.tasks.split(",") if t])
    except UserError as exc:
        sys.exit(f"--tasks: {exc}")
    methods = [m for m in args.methods.split(",") if m]
    if set(methods) - set(METHODS):
        sys.exit(f"--methods: unknown {sorted(set(methods) - set(METHODS))}; choose from {', '.join(METHODS)}")
    seed0 = VALIDATION_SEED0 if args.validation else 0
    seeds = list(range(seed0, seed0 + args.seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    args.overrides = [f"run.output_dir={args.out / 'runs'}", *args.overrides]  # the mmrl runs' folders
    log = args.out / ("validation_runs.jsonl" if args.validation else "runs.jsonl")
    done = {}
    if log.exists():  # finished runs of an earlier start of the same command
        for line in log.read_text().splitlines():
            r = json.loads(line)
            done[(r["task"], r["method"], r["seed"], r["env_steps_asked"], r["eval_episodes"])] = r["result"]
    todo = [
        (task, m, s)
        for task in tasks
        for s in seeds
        for m in (methods if s % 2 == 0 else methods[::-1])
        if (task, m, s, args.env_steps, args.eval_episodes) not in done
    ]
    todo += [
        (task, b, 0) for task in tasks for b in ("random", "expert") if (task, b, 0, 0, args.eval_episodes) not in done
    ]
    print(f"{len(todo)} runs to go ({len(done)} kept from {log})", flush=True)
    if args.report:  # what an interrupted or still-running command has so far
        todo = []

    def one(job):
        task, method, seed = job
        steps = 0 if method in ("random", "expert") else args.env_steps
        r = spawn(method, task, seed, steps, args, script=__file__, tag=TAG)
        key = {
            "task": task,
            "method": method,
            "seed": seed,
            "env_steps_asked": steps,
            "eval_episodes": args.eval_episodes,
        }
        with open(log, "a") as f:
            f.write(json.dumps({**key, "result": r}) + "\n")
        done[(task, method, seed, steps, args.eval_episodes)] = r
        sps = f", {r['env_steps'] / r['train_s']:6.0f} env steps/s" if "train_s" in r else ""
        print(f"{task} {method} seed {seed}: held-out success {r['success']:.2f}{sps}", flush=True)

    figures: dict = {
        "load_avg_start": round(os.getloadavg()[0], 2),
        "split": "validation" if args.validation else "test",
    }
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(one, todo))
    incomplete = {}
    for task in tasks:
        keys = [(task, m, s, args.env_steps, args.eval_episodes) for m in methods for s in seeds]
        keys += [(task, b, 0, 0, args.eval_episodes) for b in ("random", "expert")]
        missing = [f"{k[1]} seed {k[2]}" for k in keys if k not in done]
        if missing:  # only under --report: a full run has run them all
            incomplete[task] = missing
            continue
        runs = {(m, s): done[(task, m, s, args.env_steps, args.eval_episodes)] for m in methods for s in seeds}
        base = {b: done[(task, b, 0, 0, args.eval_episodes)] for b in ("random", "expert")}
        figures[task] = summarise(task, args.env_steps, runs, seeds, methods, base)
        print(f"{task}: {figures[task]}", flush=True)
    if incomplete:
        figures["incomplete"] = incomplete
        print(f"incomplete (runs missing): {incomplete}", flush=True)
    tasks = [t for t in tasks if t in figures]
    counted = [t for t in tasks if figures[t].get("counted")]
    figures["counted_tasks"] = counted
    figures["goal_met"] = all((figures[t].get("ratio_success") or 0) >= 1 for t in counted) if counted else None
    figures["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
