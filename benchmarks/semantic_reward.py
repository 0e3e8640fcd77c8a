"""Semantic-reward benchmark: the quickstart trained on a CLIP reward instead of the simulator's reward.

    python benchmarks/semantic_reward.py                       # 35 RL iterations per run, ~12 min on 2 busy cores
    python benchmarks/semantic_reward.py --iterations 60       # the quickstart's full length
    python benchmarks/semantic_reward.py --skip-true           # only the CLIP-reward run

Steps:

1. Data + CLIP: render `reach_clip` frames (ReachSim placements, noisy-expert and random episodes) and
   train the tiny open_clip model on them (`rewards.train_tiny_clip`, < 1 min on CPU); it is saved in
   ``runs/reach_clip`` (the checkpoint `configs/quickstart_clip_reward.yaml` loads). Before any RL the
   contrasting-goal reward is checked on held-out frames (another seed): its correlation with being at
   the instructed target (success) and with minus the distance to it, and its ROC AUC.
2. Two runs from the same warm start and seed (``runs/bench_semantic_true``, ``runs/bench_semantic_clip``):
   ``configs/quickstart.yaml`` (the true, sparse success reward) and
   ``configs/quickstart_clip_reward.yaml`` (sim `semantic` over `reach`: the CLIP score of each
   episode's last frame is the only reward). Both are evaluated on the same held-out episodes by the
   simulator's own success. The CLIP run also reports the on-policy correlation of its reward with
   success over 256 training-mode episodes of the warm-started policy, before RL.

The last line is one JSON object: ``success_true_reward``, ``success_clip_reward``, ``success_start``
(held-out success after the warm start, 0-1), ``clip_gain_points`` (100 * (clip - start)),
``correlation`` (held-out frames and on-policy), ``clip`` (training info), ``iterations``, ``episodes``,
``wall_s`` (per stage) and the success curves (train success per iteration).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLIP_DIR = ROOT / "runs" / "reach_clip"


def train_clip(args) -> tuple[dict, dict, dict]:
    """Build the frames, train the tiny CLIP, check its reward on held-out frames."""
    from mmrl.data import load_dataset
    from rewards.clip_goal import CLIPContrastGoal
    from rewards.train_tiny_clip import goal_reward_stats, load_model, train_tiny_clip

    t0 = time.time()
    data = load_dataset("reach_clip", num_samples=args.clip_samples, seed=args.seed)
    held = load_dataset("reach_clip", num_samples=4000, seed=args.seed + 12345)
    t_data = time.time() - t0
    print(f"reach_clip: {len(data['instruction'])} training frames ({data['success'].float().mean():.2f} at the "
          f"target), {len(held['instruction'])} held-out frames, {t_data:.1f} s", flush=True)
    _, info = train_tiny_clip(data, CLIP_DIR, steps=args.clip_steps, time_limit_s=args.clip_time, seed=args.seed)
    print(f"tiny CLIP: {info['steps']} steps in {info['wall_s']} s, loss {info['loss']:.4f} -> {CLIP_DIR}", flush=True)
    model, tokenizer = load_model(CLIP_DIR)
    reward = CLIPContrastGoal(model=model, tokenizer=tokenizer, positive=None, negative=None,
                              t_min=info["t_min"], t_max=info["t_max"])
    stats = goal_reward_stats(reward, held)
    print(f"CLIP goal reward on held-out frames: corr(reward, success) = {stats['corr_success']:.3f}, "
          f"corr(reward, -distance) = {stats['corr_neg_distance']:.3f}, AUC = {stats['auc_success']:.3f}, "
          f"mean reward at / away from the target {stats['mean_success']:.3f} / {stats['mean_failure']:.3f}",
          flush=True)
    return info, stats, {"clip_data": round(t_data, 1), "clip_train": info["wall_s"]}


def on_policy_correlation(trainer, episodes: int = 256) -> dict:
    """Correlation of the semantic episode return with success over training-mode episodes."""
    import torch

    from mmrl.trainer.rollout import collect_episodes
    from rewards.train_tiny_clip import _auc, _pearson

    sim, was_training = trainer.sim, trainer.policy.training
    trainer.policy.eval()
    rets, succ = [], []
    gen = torch.Generator().manual_seed(4242)
    for start in range(0, episodes, sim.num_envs):
        seeds = [2_000_000_000 + start + i for i in range(sim.num_envs)]
        _, info = collect_episodes(trainer.policy, sim, seeds, gen, mode="train")
        rets.append(info["return"].cpu())
        succ.append(info["success"].cpu())
    trainer.policy.train(was_training)
    r, s = torch.cat(rets)[:episodes].float(), torch.cat(succ)[:episodes].bool()
    return {"corr_success": round(_pearson(r, s.float()), 4), "auc_success": round(_auc(r, s), 4),
            "mean_return_success": round(r[s].mean().item(), 4) if s.any() else None,
            "mean_return_failure": round(r[~s].mean().item(), 4) if (~s).any() else None,
            "success": round(s.float().mean().item(), 4), "episodes": int(r.numel())}


def run(config: str, name: str, overrides: list[str], clip_info: dict | None = None) -> dict:
    import torch

    from mmrl.experiment import build_trainer, load_experiment, output_dir

    cfg = load_experiment(ROOT / config, [f"run.name={name}", "trainer.resume=false", *overrides])
    if clip_info is not None:  # the checkpoint just trained, and its reward window
        rk = cfg.sim.kwargs["reward_kwargs"]
        rk.update(model_name=f"local-dir:{CLIP_DIR}", t_min=clip_info["t_min"], t_max=clip_info["t_max"])
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    t0 = time.time()
    trainer = build_trainer(cfg)
    extra = {}
    if clip_info is not None:  # warm start first, so the reward can be checked on the policy's own episodes
        trainer.warm_start()
        with torch.random.fork_rng(devices=[]):  # the RL run that follows is the same as without this check
            extra["on_policy_start"] = on_policy_correlation(trainer)
        print(f"{name}: on-policy (warm start) corr(semantic return, success) = "
              f"{extra['on_policy_start']['corr_success']:.3f}, AUC = {extra['on_policy_start']['auc_success']:.3f}",
              flush=True)
    results = trainer.run()
    wall = time.time() - t0
    curve = [json.loads(line) for line in (output_dir(cfg) / "metrics.jsonl").read_text().splitlines()]
    success = [round(r["train/success"], 3) for r in curve if "train/success" in r]
    returns = [round(r["train/return"], 3) for r in curve if "train/return" in r]
    print(f"{name}: train success per iteration {success}")
    print(f"{name}: train return per iteration {returns}")
    print(f"{name}: held-out success {results['start']['success_rate']:.3f} (warm start) -> "
          f"{results['final']['success_rate']:.3f} after {cfg.trainer.iterations} iterations, {wall:.0f} s", flush=True)
    return {"start": results["start"]["success_rate"], "final": results["final"]["success_rate"],
            "episodes": results["final"]["episodes"], "wall_s": round(wall, 1), "train_success": success,
            "train_return": returns, **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=35, help="RL iterations of each run")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: fastest on a small shared CPU; 0 keeps torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clip-samples", type=int, default=20000, help="reach_clip training frames")
    parser.add_argument("--clip-steps", type=int, default=400, help="tiny CLIP optimizer steps")
    parser.add_argument("--clip-time", type=float, default=90.0,
                        help="tiny CLIP training time limit (s; a safety stop, not reached on 2 busy cores)")
    parser.add_argument("--skip-true", action="store_true", help="skip the true-reward run")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to both runs")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    clip_info, stats, walls = train_clip(args)
    common = [f"trainer.iterations={args.iterations}", f"run.seed={args.seed}", f"run.threads={args.threads}",
              *args.overrides]
    true = None if args.skip_true else run("configs/quickstart.yaml", "bench_semantic_true", common)
    clip = run("configs/quickstart_clip_reward.yaml", "bench_semantic_clip", common, clip_info)
    if true is not None and abs(true["start"] - clip["start"]) > 1e-9:
        print(f"warning: the warm starts differ ({true['start']} vs {clip['start']})")
    figures = {
        "success_true_reward": None if true is None else true["final"],
        "success_clip_reward": clip["final"],
        "success_start": clip["start"],
        "clip_gain_points": round(100 * (clip["final"] - clip["start"]), 1),
        "true_gain_points": None if true is None else round(100 * (true["final"] - true["start"]), 1),
        "correlation": {"held_out_frames": stats, "on_policy_start": clip["on_policy_start"]},
        "clip": {k: clip_info[k] for k in ("steps", "loss", "logit_scale", "soft_radius", "t_min", "t_max")},
        "iterations": args.iterations,
        "episodes": clip["episodes"],
        "wall_s": {**walls, "true_reward": None if true is None else true["wall_s"], "clip_reward": clip["wall_s"],
                   "total": round(time.time() - t0, 1)},
        "curves": {"true_reward": None if true is None else true["train_success"],
                   "clip_reward": clip["train_success"]},
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
