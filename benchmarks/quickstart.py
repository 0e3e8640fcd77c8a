"""Quickstart benchmark: warm start on a few demonstrations, then RL; held-out success of both, per seed.

    python benchmarks/quickstart.py                                  # configs/quickstart.yaml, seeds 0-4
    python benchmarks/quickstart.py --seeds 3 --config configs/quickstart_grpo.yaml
    python benchmarks/quickstart.py --seed-list 0-5,10-14                 # the seeds named (issue 33's eleven)
    python benchmarks/quickstart.py --variants                       # + the Flow-Noise and GRPO configs
    python benchmarks/quickstart.py trainer.iterations=20            # dotted overrides for every run
    python benchmarks/quickstart.py --smoke                          # seconds: the code path, no figure

Each run starts from scratch in ``runs/bench_<config>_s<seed>`` (no resume), with ``run.seed`` =
the seed: the demonstrations, the initial weights, the rollouts and the RL noise all change with
it; the held-out test episodes (``trainer.eval_seed``) are the same for every seed and were never
used to choose a setting (settings were chosen on validation episodes, reset seeds from 2e9).
Baselines printed beside the result: the scripted expert's success on the same held-out episodes
(the ceiling) and a random policy's (uniform actions).

The last line is one JSON object: for the main config, ``seeds`` and per-seed lists ``sft_success``
(the warm start's held-out success, so its spread over seeds shows), ``warm_start_candidate`` (the
initialisation the warm start kept, 0 = the run's own weights: ``warm_start.candidates``),
``rl_success``, ``gain`` (points), ``wall_s`` (whole run: demonstrations, warm start, RL and both
evaluations), their means and stds, ``episodes`` (held-out episodes per evaluation), ``expert``,
``demonstrator`` and ``random`` success; with ``--variants``, the same per variant config under ``"variants"``.
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
sys.path.insert(0, str(ROOT))

VARIANTS = ["configs/quickstart_flow_noise.yaml", "configs/quickstart_grpo.yaml"]


def run_config(path: str, seed: int, overrides: list[str]) -> dict:
    from mmrl.experiment import build_trainer, load_experiment, output_dir

    name = f"bench_{Path(path).stem}_s{seed}"
    cfg = load_experiment(ROOT / path, [f"run.name={name}", f"run.seed={seed}", "trainer.resume=false", *overrides])
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    t0 = time.time()
    trainer = build_trainer(cfg)
    results = trainer.run()
    wall = time.time() - t0
    curve = [json.loads(line) for line in (output_dir(cfg) / "metrics.jsonl").read_text().splitlines()]
    train_success = [round(r["train/success"], 2) for r in curve if "train/success" in r]
    print(f"{path} seed {seed}: train success per iteration {train_success}")
    print(
        f"{path} seed {seed}: warm start {results['start']['success_rate']:.3f} -> RL "
        f"{results['final']['success_rate']:.3f} in {wall:.0f} s",
        flush=True,
    )
    return {
        "sft_success": results["start"]["success_rate"],
        "rl_success": results["final"]["success_rate"],
        "episodes": results["final"]["episodes"],
        "wall_s": round(wall, 1),
        "warm_start_candidate": trainer.state.warm_start_candidate,  # the initialisation kept (warm_start.candidates)
        # a multi-task simulator's success per task, {task: {"success_rate", "episodes"}} (else absent)
        **({"sft_tasks": results["start"]["tasks"]} if "tasks" in results["start"] else {}),
        **({"rl_tasks": results["final"]["tasks"]} if "tasks" in results["final"] else {}),
        # a simulator that labels its episodes: success per label of each dimension (reach: goal colour,
        # goal cell, start distance), after the warm start and after RL
        **({"sft_breakdown": results["start"]["breakdown"]} if "breakdown" in results["start"] else {}),
        **({"rl_breakdown": results["final"]["breakdown"]} if "breakdown" in results["final"] else {}),
    }


def compact_breakdown(breakdown: dict) -> dict:
    """``{dimension: {label: success_rate}}`` (rounded) of an evaluation's ``breakdown``."""
    return {d: {label: round(r["success_rate"], 3) for label, r in rows.items()} for d, rows in breakdown.items()}


def weakest(breakdown: dict, k: int = 3) -> str:
    """The ``k`` labels with the lowest success, over every dimension: where a policy fails."""
    rows = sorted((r["success_rate"], f"{d}={label}") for d, x in breakdown.items() for label, r in x.items())
    return ", ".join(f"{name} {rate:.2f}" for rate, name in rows[:k])


def summary(runs: list[dict]) -> dict:
    out: dict = {}
    for key in ("sft_success", "rl_success", "gain", "wall_s"):
        values = [r[key] for r in runs]
        out[key] = [round(v, 4) for v in values]
        out[f"{key}_mean"] = round(statistics.mean(values), 4)
        out[f"{key}_std"] = round(statistics.stdev(values), 4) if len(values) > 1 else 0.0
    out["episodes"] = runs[0]["episodes"]
    return out


def parse_seed_list(text: str) -> list[int]:
    """``"0-5,10-14"`` -> [0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14] (ranges inclusive, order kept)."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        try:
            seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
        except ValueError:
            raise SystemExit(f"--seed-list: {part!r} is not a seed or a range such as 10-14") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seed-list: {text!r} names no seed or one seed twice")
    return seeds


def run_seeds(path: str, seeds: list[int], overrides: list[str]) -> dict:
    runs = []
    for seed in seeds:
        r = run_config(path, seed, overrides)
        r["gain"] = round(100 * (r["rl_success"] - r["sft_success"]), 2)
        if "rl_breakdown" in r:
            print(f"{path} seed {seed}: weakest after RL: {weakest(r['rl_breakdown'])}", flush=True)
        runs.append(r)
    s = {"seeds": list(seeds), **summary(runs), "warm_start_candidate": [r["warm_start_candidate"] for r in runs]}
    if all("rl_breakdown" in r for r in runs):  # per seed, where the policy fails after RL
        s["rl_breakdown"] = {str(seed): compact_breakdown(r["rl_breakdown"]) for seed, r in zip(seeds, runs)}
    print(
        f"{path}: held-out success over {len(seeds)} seeds: warm start {s['sft_success_mean']:.3f} +- "
        f"{s['sft_success_std']:.3f} -> RL {s['rl_success_mean']:.3f} +- {s['rl_success_std']:.3f} "
        f"(per seed {s['sft_success']} -> {s['rl_success']})",
        flush=True,
    )
    return s


def baselines(path: str, overrides: list[str]) -> dict:
    """Success on the held-out episodes of the scripted expert at full speed (the ceiling), of the
    demonstrator the warm start imitates (the expert at ``warm_start.kwargs.expert_speed``: what a
    perfect imitator would reach) and of uniform random actions."""
    import torch

    from mmrl.experiment import build_sim, load_experiment

    cfg = load_experiment(ROOT / path, overrides)
    t = cfg.trainer
    sim = build_sim(cfg, t.eval_episodes, cfg.run.seed + 1, evaluation=True)
    gen = torch.Generator().manual_seed(0)
    speed = float(cfg.warm_start.kwargs.get("expert_speed", 1.0))
    out = {}
    for name in ("expert", "demonstrator", "random"):
        sim.reset([t.eval_seed + e for e in range(t.eval_episodes)])
        dev = getattr(sim, "device", "cpu")  # the sim's own device (run.device=cuda puts reach there)
        success = torch.zeros(sim.num_envs, dtype=torch.bool, device=dev)
        alive = torch.ones(sim.num_envs, dtype=torch.bool, device=dev)
        for _ in range(sim.max_episode_steps):
            if name == "random":
                act = (torch.rand(sim.num_envs, sim.action_dim, generator=gen) * 2 - 1).to(dev)
            else:
                act = sim.expert_action(speed=1.0 if name == "expert" else speed)
            res = sim.step(act)
            success |= res.success & alive
            alive &= ~res.done
            if not alive.any():
                break
        out[name] = round(success.float().mean().item(), 4)
    return out


def main() -> None:
    from _smoke import parse_args, scratch
    from tests.reliability.kill_harness import TINY

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument("--seed-list", help="the seeds to run instead, e.g. 0-5,10-14")
    parser.add_argument("--variants", action="store_true", help="also run the Flow-Noise and GRPO configs")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parse_args(parser, seeds=1)
    if args.smoke:  # the kill-resume harness's tiny quickstart, its run folders in a temporary folder
        args.overrides = [*TINY, f"run.output_dir={scratch()}", *args.overrides]
    seeds = parse_seed_list(args.seed_list) if args.seed_list else list(range(args.seeds))
    load = os.getloadavg()[0]
    base = baselines(args.config, args.overrides)
    print(
        f"held-out baselines: scripted expert {base['expert']:.3f}, the demonstrator the warm start imitates "
        f"{base['demonstrator']:.3f}, random actions {base['random']:.3f}",
        flush=True,
    )
    figures = run_seeds(args.config, seeds, args.overrides)
    figures.update(base, load_avg_start=round(load, 2))
    if args.variants:
        figures["variants"] = {Path(v).stem: run_seeds(v, seeds, args.overrides) for v in VARIANTS}
    figures["load_avg_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
