"""One language-conditioned policy over Meta-World's MT10: the warm start, then RL, per task, per seed.

    pip install 'mmrl[metaworld]'
    python benchmarks/metaworld_mt10.py                         # configs/metaworld_mt10.yaml, seeds 0-2
    python benchmarks/metaworld_mt10.py --validation            # choose settings here: seeds 100-102, other variations
    python benchmarks/metaworld_mt10.py trainer.iterations=50   # dotted overrides for every run
    python benchmarks/metaworld_mt10.py --report                # train nothing: the seeds finished so far
    python benchmarks/metaworld_mt10.py --first-seed 2 --seeds 1  # seed 2 alone (side by side with others)
    python benchmarks/metaworld_mt10.py --smoke                 # seconds: the code path, no figure

Each seed runs ``configs/metaworld_mt10.yaml`` from scratch (``run.seed`` = the seed: the
demonstrations' noise, the initial weights, the rollouts): one flow VLA that reads the state and the
task's instruction (``policy.backbone: state_text``), warm-started by flow matching on demonstrations
of Meta-World's scripted experts slowed and made noisy (``datasets/metaworld_demos``), then Flow-SDE
PPO on all ten tasks at once, each env's task and training goal variation drawn from its reset seed.

Evaluation, after the warm start and after RL, on the same held-out episodes for every seed: reset
seeds ``1e9 + e``, so episode ``e`` plays task ``e % 10`` on held-out goal variation ``e // 10``
(variations no run trained on), deterministically, each ending at its first success or at 500 steps
(Meta-World's protocol, ``simulators/metaworld.py``). ``--episodes`` per evaluation (default 200: 20
per task, variations 0-19). ``--validation`` uses seeds from 100 and the held-out variations 30-49:
settings are chosen there, never on the test episodes.

Baselines on the same held-out episodes, per task: Meta-World's scripted expert (the ceiling), the
demonstrator the warm start imitates (the expert at the config's ``expert_speed`` / ``expert_noise``:
what a perfect imitator would reach) and uniform random actions.

The last line is one JSON object: per seed and over seeds (mean, std) the overall held-out success
after the warm start (``sft_success``) and after RL (``rl_success``), the ``gain`` in points and the
wall time; per task the same means and per-seed lists (``tasks``); the baselines (``baselines``);
and ``goal``: the mean gain is at least 20 points and above twice its std, and no task's mean ends
below its warm start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from quickstart import run_config, summary  # noqa: E402  (the same per-seed run and figures)

CONFIG = "configs/metaworld_mt10.yaml"
EVAL_SEED = 1_000_000_000  # a multiple of 500: episode e = task e % 10, held-out variation e // 10
VALIDATION_SEED0, VALIDATION_VARIATION0 = 100, 30
GOAL_POINTS = 20.0
SMOKE_EXTRA = ["trainer.iterations=1", "trainer.eval_every=0", "trainer.checkpoint_every=1"]


def smoke_overrides(config: str) -> list[str]:
    """--smoke: the config's short settings (scripts/param_fingerprints.py keeps one list per config)."""
    from scripts.param_fingerprints import SHORT

    return [*SHORT[Path(config).stem], *SMOKE_EXTRA]


def baselines(config: str, overrides: list[str], episodes: int, eval_seed: int) -> dict:
    """Held-out success per task and overall of the scripted expert, the demonstrator and random
    actions, on the episodes the runs are evaluated on (``eval_seed + e``)."""
    import numpy as np
    import torch

    from mmrl.data import builder_module
    from mmrl.experiment import build_sim, load_experiment

    cfg = load_experiment(ROOT / config, overrides)
    sim_kwargs = {**cfg.sim.kwargs, "split": "heldout"}
    ws = cfg.warm_start.kwargs
    out = {}
    for name, speed, noise in (
        ("expert", 1.0, 0.0),
        ("demonstrator", float(ws.get("expert_speed", 1.0)), float(ws.get("expert_noise", 0.0))),
    ):
        build = builder_module("metaworld_demos").build
        data = build(episodes, seed=eval_seed, sim_kwargs=sim_kwargs, expert_speed=speed, expert_noise=noise)
        out[name] = rates(data["episode_task"], data["episode_success"].float().tolist())
    sim = build_sim(cfg, min(episodes, 50), 0, evaluation=True)
    rng, tasks, success = np.random.default_rng(0), [], []
    for start in range(0, episodes, sim.num_envs):
        n = min(sim.num_envs, episodes - start)
        obs = sim.reset([eval_seed + start + i for i in range(sim.num_envs)])
        tasks += [obs.meta[i]["task"] for i in range(n)]
        won = torch.zeros(sim.num_envs, dtype=torch.bool)
        alive = torch.ones(sim.num_envs, dtype=torch.bool)
        for _ in range(sim.max_episode_steps):
            res = sim.step(torch.from_numpy(rng.uniform(-1, 1, (sim.num_envs, sim.action_dim)).astype("float32")))
            won |= res.success.cpu() & alive
            alive &= ~res.done.cpu()
            if not alive[:n].any():
                break
        success += won[:n].float().tolist()
    sim.close()
    out["random"] = rates(tasks, success)
    return out


def cached_baselines(config: str, overrides: list[str], episodes: int, eval_seed: int) -> dict:
    """`baselines`, kept in run.output_dir (named by the task set, the held-out episodes and the
    demonstrator's speed and noise: all they depend on), so a later --report reuses them."""
    from mmrl.experiment import load_experiment

    cfg = load_experiment(ROOT / config, overrides)
    ws, folder = cfg.warm_start.kwargs, Path(cfg.run.output_dir)
    demonstrator = f"{ws.get('expert_speed', 1.0)}_{ws.get('expert_noise', 0.0)}"  # what the demonstrator is
    path = folder / f"metaworld_mt10_baselines_{cfg.sim.kwargs.get('task')}_{eval_seed}_{episodes}_{demonstrator}.json"
    if path.exists():
        return json.loads(path.read_text())
    base = baselines(config, overrides, episodes, eval_seed)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(base))
    return base


def finished_run(config: str, seed: int, overrides: list[str]) -> dict | None:
    """``--report``: what `run_config` returns for ``seed``, read from its run folder's results.json
    (None while the run has no final evaluation)."""
    from mmrl.experiment import load_experiment, output_dir

    cfg = load_experiment(ROOT / config, [f"run.name=bench_{Path(config).stem}_s{seed}", *overrides])
    path = output_dir(cfg) / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if "final" not in results:
        return None
    start, final = results["start"], results["final"]
    return {
        "sft_success": start["success_rate"],
        "rl_success": final["success_rate"],
        "episodes": final["episodes"],
        "wall_s": round(final["rl_seconds"], 1),  # the RL iterations only: the whole run's time is not kept
        "sft_tasks": start["tasks"],
        "rl_tasks": final["tasks"],
    }


def rates(tasks: list[str], success: list[float]) -> dict:
    """``{"overall": rate, "tasks": {task: rate}}`` of per-episode successes."""
    per: dict[str, list[float]] = {}
    for t, s in zip(tasks, success):
        per.setdefault(t, []).append(float(s))
    return {
        "overall": round(statistics.mean(success), 4),
        "tasks": {t: round(statistics.mean(v), 4) for t, v in sorted(per.items())},
    }


def per_task(runs: list[dict]) -> dict:
    """Per task: warm-start and RL success per seed, their means and the gain in points."""
    out = {}
    for task in sorted(runs[0]["sft_tasks"]):
        sft = [r["sft_tasks"][task]["success_rate"] for r in runs]
        rl = [r["rl_tasks"][task]["success_rate"] for r in runs]
        out[task] = {
            "sft_success": [round(v, 4) for v in sft],
            "rl_success": [round(v, 4) for v in rl],
            "sft_mean": round(statistics.mean(sft), 4),
            "rl_mean": round(statistics.mean(rl), 4),
            "gain_mean": round(100 * (statistics.mean(rl) - statistics.mean(sft)), 2),
            "episodes": runs[0]["rl_tasks"][task]["episodes"],
        }
    return out


def goal(figures: dict) -> dict:
    """The issue's bar: mean gain >= 20 points and > 2 std, and no task ending below its warm start."""
    below = [t for t, r in figures["tasks"].items() if r["rl_mean"] < r["sft_mean"]]
    return {
        "gain_at_least_20": figures["gain_mean"] >= GOAL_POINTS,
        "gain_above_2_std": figures["gain_mean"] > 2 * figures["gain_std"],
        "tasks_below_warm_start": below,
        "met": figures["gain_mean"] >= GOAL_POINTS and figures["gain_mean"] > 2 * figures["gain_std"] and not below,
    }


def main() -> None:
    from _smoke import parse_args, scratch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (from 100 with --validation)")
    parser.add_argument("--episodes", type=int, default=200, help="held-out episodes per evaluation (10 tasks)")
    parser.add_argument("--validation", action="store_true", help="seeds from 100, held-out variations 30-49")
    parser.add_argument(
        "--first-seed",
        type=int,
        default=None,
        help="seeds from this one (default 0, 100 with --validation): seeds run side by side as separate "
        "processes with the same run.output_dir, then --report gathers them",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="train nothing: the figures of the seeds whose runs finished (their run folders), the others listed",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parse_args(parser, seeds=1, episodes=10)
    if args.episodes < 10 or args.episodes % 10:
        sys.exit(f"--episodes must be a positive multiple of 10 (every task equally often), got {args.episodes}")
    if args.validation and args.episodes > 10 * (50 - VALIDATION_VARIATION0):
        sys.exit(f"--validation has {10 * (50 - VALIDATION_VARIATION0)} held-out episodes (variations 30-49)")
    eval_seed = EVAL_SEED + (10 * VALIDATION_VARIATION0 if args.validation else 0)
    overrides = [
        f"trainer.eval_seed={eval_seed}",
        f"trainer.eval_episodes={args.episodes}",
        *([*smoke_overrides(args.config), f"run.output_dir={scratch()}"] if args.smoke else []),
        *args.overrides,
    ]
    seed0 = args.first_seed if args.first_seed is not None else VALIDATION_SEED0 if args.validation else 0
    seeds = list(range(seed0, seed0 + args.seeds))
    load = os.getloadavg()[0]
    runs, missing = [], []
    for seed in seeds:
        r = finished_run(args.config, seed, overrides) if args.report else run_config(args.config, seed, overrides)
        if r is None:
            missing.append(seed)
            continue
        r["gain"] = round(100 * (r["rl_success"] - r["sft_success"]), 2)
        runs.append(r)
        print(
            f"seed {seed} per task: "
            + ", ".join(
                f"{t} {r['sft_tasks'][t]['success_rate']:.2f}->{r['rl_tasks'][t]['success_rate']:.2f}"
                for t in sorted(r["sft_tasks"])
            ),
            flush=True,
        )
    if not runs:
        sys.exit(f"--report: no finished run of seeds {seeds} in run.output_dir (run without --report first)")
    base = cached_baselines(args.config, overrides, args.episodes, eval_seed)
    print(
        "held-out baselines (overall): scripted expert {expert:.3f}, the demonstrator {demonstrator:.3f}, "
        "random actions {random:.3f}".format(**{k: v["overall"] for k, v in base.items()}),
        flush=True,
    )
    seeds = [s for s in seeds if s not in missing]
    figures: dict = {
        "split": "validation" if args.validation else "test",
        "config": args.config,
        "overrides": args.overrides,
        **({"seeds_not_finished": missing} if missing else {}),
        **({"wall_s_is_rl_seconds": True} if args.report else {}),
        "seeds": seeds,
        "eval_seed": eval_seed,
        **summary(runs),
    }
    figures["tasks"] = per_task(runs)
    figures["baselines"] = base
    figures["goal"] = goal(figures)
    figures["load_avg_start"], figures["load_avg_end"] = round(load, 2), round(os.getloadavg()[0], 2)
    print(
        f"MT10 held-out success over {len(seeds)} seeds: warm start {figures['sft_success_mean']:.3f} +- "
        f"{figures['sft_success_std']:.3f} -> RL {figures['rl_success_mean']:.3f} +- {figures['rl_success_std']:.3f}; "
        f"goal met: {figures['goal']['met']}",
        flush=True,
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
