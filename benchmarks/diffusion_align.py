"""Flow-GRPO vs advantage-weighted matching (AWM) on the embedded diffusion demo, same budget.

    python benchmarks/diffusion_align.py                      # 150 iterations each, eval every 25
    python benchmarks/diffusion_align.py --iterations 10 --eval-every 5

One tiny pixel-space generator is pretrained once by flow matching on the synthetic `shapes`
images with noisy captions (half of them describe another image of the same kind; the warm start
of configs/diffusion_shapes_flow_grpo.yaml), so it follows its prompt only part of the time. From those same weights,
configs/diffusion_shapes_flow_grpo.yaml (Flow-SDE rollouts, per-step PPO ratios) and
configs/diffusion_shapes_awm.yaml (ODE rollouts, advantage-weighted flow matching) each run the
same number of iterations with the same prompts per iteration (8 prompts x 8 images), and the mean
`shapes` reward of 128 held-out prompts (ODE, 16 steps) is measured every ``--eval-every``
iterations. Sample grids are written at every evaluation (runs/<name>/videos/*.png).

Time-to-reward: the level is ``pretrained + frac * (min(best Flow-GRPO, best AWM) - pretrained)``
(``--level-frac``, default 0.8): a level both reach. Each run's RL wall time (evaluation excluded)
and training samples to first reach it are interpolated linearly between evaluations; the
speedups are Flow-GRPO's divided by AWM's. The last line is one JSON object
``{"pretrained_reward", "flow_grpo_reward", "awm_reward", "awm_speedup_time", "awm_speedup_samples"}``
(final rewards; speedups null when a run never reaches the level) plus the curves and the level.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = {"flow_grpo": "configs/diffusion_shapes_flow_grpo.yaml", "awm": "configs/diffusion_shapes_awm.yaml"}


def curve(results: dict) -> list[dict]:
    """Evaluation points ordered by iteration: iteration, rl_seconds, train_episodes, reward."""
    points = {r["iteration"]: r for r in results.values()}
    return [{"iteration": it, "rl_seconds": round(points[it]["rl_seconds"], 2),
             "train_episodes": points[it]["train_episodes"], "reward": round(points[it]["return"], 4)}
            for it in sorted(points)]


def time_to(points: list[dict], level: float, key: str) -> float | None:
    """``key`` (rl_seconds / train_episodes) at which the reward first reaches ``level``, linearly
    interpolated between evaluation points; None if it never does."""
    for prev, cur in zip(points, points[1:]):
        if cur["reward"] >= level > prev["reward"]:
            w = (level - prev["reward"]) / (cur["reward"] - prev["reward"])
            return prev[key] + w * (cur[key] - prev[key])
        if prev["reward"] >= level:
            return prev[key]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--level-frac", type=float, default=0.8)
    parser.add_argument("--output-dir", default="runs/bench_diffusion")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for both runs and the pretraining (repeatable)")
    args = parser.parse_args()

    from mmrl.experiment import build_trainer, load_experiment

    common = [f"run.output_dir={args.output_dir}", f"run.seed={args.seed}", "trainer.resume=false",
              f"trainer.iterations={args.iterations}", f"trainer.eval_every={args.eval_every}",
              f"trainer.checkpoint_every={args.iterations}", *args.set]
    t0 = time.time()
    pre = build_trainer(load_experiment(ROOT / CONFIGS["flow_grpo"], [*common, "run.name=pretrain"]))
    pre.warm_start()
    pretrained = {k: v.clone() for k, v in pre.policy.gen.state_dict().items()}
    pretrain_s = time.time() - t0
    print(f"pretrained the generator in {pretrain_s:.0f} s")
    curves, finals = {}, {}
    for name, path in CONFIGS.items():
        trainer = build_trainer(load_experiment(ROOT / path, [*common, f"run.name={name}"]))
        trainer.policy.gen.load_state_dict(pretrained)
        trainer.policy.after_warm_start()
        trainer.state.warm_started = True
        results = trainer.run()
        curves[name] = curve(results)
        finals[name] = results["final"]["return"]
    start = curves["flow_grpo"][0]["reward"]
    best = min(max(p["reward"] for p in curves[n]) for n in CONFIGS)
    level = start + args.level_frac * (best - start)
    print(f"\nmean held-out reward (pretrained {start:.3f}); level for time-to-reward {level:.3f}")
    print(f"{'iter':>5} | {'Flow-GRPO':>10} {'s':>7} {'samples':>8} | {'AWM':>10} {'s':>7} {'samples':>8}")
    for g, a in zip(curves["flow_grpo"], curves["awm"]):
        print(f"{g['iteration']:5d} | {g['reward']:10.3f} {g['rl_seconds']:7.1f} {g['train_episodes']:8d} | "
              f"{a['reward']:10.3f} {a['rl_seconds']:7.1f} {a['train_episodes']:8d}")
    speed = {}
    for key, label in (("rl_seconds", "time"), ("train_episodes", "samples")):
        g, a = time_to(curves["flow_grpo"], level, key), time_to(curves["awm"], level, key)
        speed[label] = round(g / a, 3) if g is not None and a not in (None, 0) else None
        print(f"to reach {level:.3f}: Flow-GRPO {g} {key}, AWM {a} {key} -> AWM speedup {speed[label]}")
    print(f"reward gain over the pretrained generator: Flow-GRPO {finals['flow_grpo'] - start:+.3f}, "
          f"AWM {finals['awm'] - start:+.3f}")
    print(json.dumps({
        "pretrained_reward": round(start, 4), "flow_grpo_reward": round(finals["flow_grpo"], 4),
        "awm_reward": round(finals["awm"], 4), "awm_speedup_time": speed["time"],
        "awm_speedup_samples": speed["samples"], "level": round(level, 4), "iterations": args.iterations,
        "pretrain_s": round(pretrain_s, 1), "curves": curves,
    }))


if __name__ == "__main__":
    main()
