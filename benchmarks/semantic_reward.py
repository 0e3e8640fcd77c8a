"""Semantic-reward benchmark: the quickstart trained on a zero-shot CLIP reward instead of the
simulator's success reward, over several seeds.

    python benchmarks/semantic_reward.py                       # 3 seeds, the configs' RL iterations
    python benchmarks/semantic_reward.py --seeds 1 --iterations 5 --clip-steps 50   # a smoke run
    python benchmarks/semantic_reward.py trainer.lr=1e-4       # dotted overrides go to both RL runs
    python benchmarks/semantic_reward.py --smoke               # seconds: 1 seed, tiny runs, no figure

Per seed ``s`` (everything below is a function of ``s``):

1. Pretrain the tiny CLIP (`rewards.train_tiny_clip`) on `reach_clip` (image, caption) pairs of seed
   ``s``: captions say which colour is in which cell of a 3 x 3 grid and where the gripper is,
   nothing about the goal, success or distances; CLIP's InfoNCE over the batch. Saved in
   ``runs/reach_clip_s<s>`` and reused from there by later runs while the settings and the data /
   training code are the same (it does not depend on the RL settings; ``--retrain-clip`` forces it).
2. Warm-start the quickstart policy (``configs/quickstart.yaml``, run ``runs/bench_semantic_true_s<s>``).
   Before RL, roll it out in training mode on validation episodes (reset seeds 2.0e9 + ...) and
   choose the reward setting there (`select_goal_setting`: one of the zero-shot contrasting goal
   wordings `GOAL_WORDINGS`, never seen in pretraining, and the ``t_min`` / ``t_max`` window, by
   the correlation of the reward of each episode's last frame with success). Then report, for the
   chosen setting only, the on-policy correlation on other training-mode episodes (2.5e9 + ...) and
   the off-policy correlation on held-out labelled frames (`reach_clip` ``labelled=True``, seed
   20000 + s); validation frames (10000 + s) are reported too.
3. RL with the true reward (``configs/quickstart.yaml``) and with the CLIP reward alone
   (``configs/quickstart_clip_reward.yaml`` with the chosen setting, ``runs/bench_semantic_clip_s<s>``),
   from the same warm start. Both are evaluated on the simulator's held-out episodes (reset seeds
   1e9 + ...) by the simulator's own success; nothing above chose anything on them.

The two configs must differ only in the simulator / reward (`rl_settings_differences`): the
benchmark stops with a one-line error otherwise. Std is the sample std over seeds (0 for one seed).
The last line is one JSON object: per-seed lists, means and stds of ``success_start`` (after the
warm start, the baseline), ``success_true_reward`` (the ceiling), ``success_clip_reward``, the gains
in points (``true_gain_points``, ``clip_gain_points``), the reward's Pearson correlation with
success (``correlation``: ``on_policy`` and ``off_policy`` held-out, ``validation_on_policy`` and
``validation_frames``) and ROC AUC (``auc``), the chosen settings, CLIP pretraining info, iterations,
episodes and wall times.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRUE_CONFIG = "configs/quickstart.yaml"
CLIP_CONFIG = "configs/quickstart_clip_reward.yaml"
VALIDATION_SEED, TEST_SEED = 2_000_000_000, 2_500_000_000  # on-policy episodes; held-out eval is 1e9 + i


def rl_settings_differences(
    true_path: str | Path = ROOT / TRUE_CONFIG, clip_path: str | Path = ROOT / CLIP_CONFIG, overrides: list[str] = ()
) -> list[str]:
    """Keys where the CLIP config's RL run would differ from the true-reward config's, besides the
    reward: everything but ``run.name`` and the ``reward`` section (which only the CLIP config has)
    must be equal, the simulator included."""
    from mmrl.config import to_dict
    from mmrl.experiment import load_experiment

    a, b = (to_dict(load_experiment(p, list(overrides))) for p in (true_path, clip_path))
    diff = []
    for section in sorted(set(a) - {"reward"}):
        if not isinstance(a[section], dict) or not isinstance(b[section], dict):
            if a[section] != b[section]:
                diff.append(f"{section}: {a[section]!r} vs {b[section]!r}")
            continue
        for key in sorted(set(a[section]) | set(b[section])):
            if section == "run" and key == "name":
                continue
            if a[section].get(key) != b[section].get(key):
                diff.append(f"{section}.{key}: {a[section].get(key)!r} vs {b[section].get(key)!r}")
    return diff


def summary(values: list[float], digits: int = 4) -> dict:
    """Per-seed values, their mean and sample std (0 for one value)."""
    return {
        "per_seed": [round(v, digits) for v in values],
        "mean": round(statistics.fmean(values), digits),
        "std": round(statistics.stdev(values), digits) if len(values) > 1 else 0.0,
    }


def pretrain_clip(seed: int, args) -> tuple[Path, dict]:
    """Pretrain the tiny CLIP of ``seed`` into ``<--clip-dir>/reach_clip_s<seed>`` (runs/), or reuse the checkpoint
    there when it was trained with the same settings and the same data / training code."""
    import hashlib

    from mmrl.data import load_dataset
    from rewards.train_tiny_clip import REACH_CLIP_CONFIG, build_model, save_model, train_tiny_clip

    out = Path(args.clip_dir) / f"reach_clip_s{seed}"
    code = hashlib.sha256(
        b"".join((ROOT / f).read_bytes() for f in ("datasets/reach_clip/builder.py", "rewards/train_tiny_clip.py"))
    ).hexdigest()[:16]
    key = {
        "seed": seed,
        "samples": args.clip_samples,
        "steps": args.clip_steps,
        "config": REACH_CLIP_CONFIG,
        "code": code,
    }
    saved = out / "train_info.json"
    if not args.retrain_clip and saved.exists() and json.loads(saved.read_text()).get("key") == key:
        info = json.loads(saved.read_text())
        print(f"[seed {seed}] tiny CLIP: reusing {out} (same settings and code)", flush=True)
        return out, info
    pairs = load_dataset("reach_clip", num_samples=args.clip_samples, seed=seed)
    print(
        f"[seed {seed}] reach_clip: {pairs['image'].shape[0]} (image, caption) pairs, e.g. {pairs['captions'][0][0]!r}",
        flush=True,
    )
    model, info = train_tiny_clip(pairs, None, steps=args.clip_steps, time_limit_s=args.clip_time, seed=seed)
    info["key"] = key
    save_model(model, build_model()[2], out, info)
    print(
        f"[seed {seed}] tiny CLIP: {info['steps']} steps in {info['wall_s']} s, loss {info['loss']}, in-batch "
        f"accuracy {info['batch_accuracy']} -> {out}",
        flush=True,
    )
    return out, info


def final_frames(policy, sim, first_seed: int, episodes: int, seed: int) -> dict:
    """Last frame, instruction and success of ``episodes`` training-mode (stochastic) episodes of
    ``policy``; the last frame is what the CLIP reward of ``episode_mode: final`` scores."""
    import torch

    from mmrl.rollout import collect_episodes

    gen = torch.Generator().manual_seed(first_seed + seed)
    was_training = policy.training
    policy.eval()
    frames, texts, success = [], [], []
    for start in range(0, episodes, sim.num_envs):
        seeds = [first_seed + seed * 100_000 + start + i for i in range(sim.num_envs)]
        with torch.no_grad():
            _, info = collect_episodes(policy, sim, seeds, gen, mode="train", frames_of=sim.num_envs)
        frames.append(info["frames"][-1])
        texts += info["captions"]
        success.append(info["success"].cpu())
    policy.train(was_training)
    return {
        "image": torch.cat(frames)[:episodes],
        "instruction": texts[:episodes],
        "success": torch.cat(success)[:episodes],
    }


def choose_reward(trainer, cfg, clip_dir: Path, seed: int, args) -> dict:
    """Choose the goal wording and window on validation episodes of the warm-started policy, then
    measure the chosen reward on-policy (other episodes) and off-policy (held-out labelled frames)."""
    import torch

    from mmrl.data import load_dataset
    from mmrl.experiment import build_sim
    from rewards.clip_goal import contrast_goal_reward
    from rewards.train_tiny_clip import GOAL_WORDINGS, goal_contrast, load_model, reward_stats, select_goal_setting

    model, tok = load_model(clip_dir)
    sim = build_sim(cfg, cfg.sim.num_envs, seed)  # the true config's simulator, in this process
    with torch.random.fork_rng(devices=[]):  # the RL run that follows is the same as without this
        val = final_frames(trainer.policy, sim, VALIDATION_SEED, args.episodes, seed)
        test = final_frames(trainer.policy, sim, TEST_SEED, args.episodes, seed)
    sim.close()
    d_val = {
        w: goal_contrast(model, tok, val["image"], val["instruction"], wording)
        for w, wording in enumerate(GOAL_WORDINGS)
    }
    choice = select_goal_setting(d_val, val["success"])
    wording = GOAL_WORDINGS[choice["wording"]]

    def stats(data: dict) -> dict:
        d = goal_contrast(model, tok, data["image"], data["instruction"], wording)
        r = contrast_goal_reward(-d, torch.zeros_like(d), choice["t_min"], choice["t_max"])
        return reward_stats(r, data["success"], data.get("goal_distance"))

    frames_val = load_dataset("reach_clip", num_samples=args.frames, seed=10_000 + seed, labelled=True)
    frames_test = load_dataset("reach_clip", num_samples=args.frames, seed=20_000 + seed, labelled=True)
    out = {
        "positive": wording[0],
        "negative": wording[1],
        "t_min": round(choice["t_min"], 5),
        "t_max": round(choice["t_max"], 5),
        "quantiles": choice["quantiles"],
        "validation_on_policy": stats(val),
        "validation_frames": stats(frames_val),
        "on_policy": stats(test),
        "off_policy": stats(frames_test),
        "candidates": [{**c, "wording": GOAL_WORDINGS[c["wording"]][0]} for c in choice["candidates"]],
    }
    print(
        f"[seed {seed}] reward chosen on validation episodes: {wording[0]!r} vs {wording[1]!r}, window "
        f"[{out['t_min']:.4f}, {out['t_max']:.4f}] (corr {choice['corr_success']:.3f}); "
        f"on-policy corr with success {out['on_policy']['corr_success']:.3f} "
        f"(AUC {out['on_policy']['auc_success']:.3f}), "
        f"off-policy held-out frames corr {out['off_policy']['corr_success']:.3f} "
        f"(AUC {out['off_policy']['auc_success']:.3f})",
        flush=True,
    )
    return out


def rl_run(trainer, cfg, label: str, t0: float) -> dict:
    from mmrl.experiment import output_dir

    results = trainer.run()
    curve = [json.loads(line) for line in (output_dir(cfg) / "metrics.jsonl").read_text().splitlines()]
    success = [round(r["train/success"], 3) for r in curve if "train/success" in r]
    print(f"{label}: train success per iteration {success}")
    print(
        f"{label}: held-out success {results['start']['success_rate']:.3f} (warm start) -> "
        f"{results['final']['success_rate']:.3f} after {cfg.trainer.iterations} iterations, "
        f"{time.time() - t0:.0f} s",
        flush=True,
    )
    return {
        "start": results["start"]["success_rate"],
        "final": results["final"]["success_rate"],
        "episodes": results["final"]["episodes"],
        "iterations": cfg.trainer.iterations,
        "wall_s": round(time.time() - t0, 1),
        "train_success": success,
    }


def one_seed(seed: int, args) -> dict:
    from mmrl.experiment import build_trainer, load_experiment, output_dir

    common = [f"run.seed={seed}", f"run.threads={args.threads}", "trainer.resume=false", *args.overrides]
    if args.iterations is not None:
        common.append(f"trainer.iterations={args.iterations}")
    t0 = time.time()
    clip_dir, clip_info = pretrain_clip(seed, args)
    t_clip = time.time() - t0

    t0 = time.time()
    cfg = load_experiment(ROOT / TRUE_CONFIG, [f"run.name=bench_semantic_true_s{seed}", *common])
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    trainer = build_trainer(cfg)
    trainer.warm_start()
    reward = choose_reward(trainer, cfg, clip_dir, seed, args)
    true = rl_run(trainer, cfg, f"[seed {seed}] true reward", t0)

    t0 = time.time()
    cfg = load_experiment(ROOT / CLIP_CONFIG, [f"run.name=bench_semantic_clip_s{seed}", *common])
    cfg.reward.kwargs.update(
        model_name=f"local-dir:{clip_dir}", pretrained=None, t_min=reward["t_min"], t_max=reward["t_max"]
    )
    cfg.reward.frames.goal_meta = {"positive_goal": reward["positive"], "negative_goal": reward["negative"]}
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    clip = rl_run(build_trainer(cfg), cfg, f"[seed {seed}] CLIP reward", t0)
    if abs(true["start"] - clip["start"]) > 1e-9:
        print(f"warning: seed {seed}: the warm starts differ ({true['start']} vs {clip['start']})")
    return {
        "seed": seed,
        "true": true,
        "clip": clip,
        "reward": reward,
        "clip_info": clip_info,
        "wall_s": {"clip_pretrain": round(t_clip, 1), "true_reward": true["wall_s"], "clip_reward": clip["wall_s"]},
    }


def main() -> None:
    from _smoke import parse_args, scratch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1")
    parser.add_argument(
        "--iterations", type=int, default=None, help="RL iterations of each run (default: the configs')"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on a small shared CPU)")
    parser.add_argument("--clip-samples", type=int, default=20000, help="reach_clip (image, caption) pairs")
    parser.add_argument("--clip-steps", type=int, default=1200, help="tiny CLIP optimizer steps")
    parser.add_argument("--clip-time", type=float, default=900.0, help="tiny CLIP time limit (s; a safety stop)")
    parser.add_argument(
        "--retrain-clip",
        action="store_true",
        help="pretrain the CLIPs again even where runs/reach_clip_s<seed> has a matching checkpoint",
    )
    parser.add_argument("--episodes", type=int, default=256, help="on-policy validation / test episodes")
    parser.add_argument("--frames", type=int, default=2000, help="labelled validation / held-out frames")
    parser.add_argument("--clip-dir", default=str(ROOT / "runs"), help="parent folder of the tiny CLIPs' checkpoints")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to both RL runs")
    args = parse_args(
        parser, seeds=1, iterations=2, clip_samples=64, clip_steps=2, episodes=8, frames=16, clip_dir=scratch
    )
    if args.smoke:  # the kill-resume harness's tiny quickstart (its sim.kwargs aside), run folders in a temp folder
        from tests.reliability.kill_harness import TINY

        args.overrides = [
            *(o for o in TINY if not o.startswith("sim.kwargs")),
            f"run.output_dir={scratch()}",
            *args.overrides,
        ]
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    diff = rl_settings_differences(overrides=args.overrides)
    if diff:
        sys.exit(
            f"error: {CLIP_CONFIG} must have the RL settings of {TRUE_CONFIG} (only the reward section may "
            f"differ), but {'; '.join(diff)}: copy them over"
        )

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    runs = [one_seed(s, args) for s in range(args.seeds)]
    pick = lambda f: [f(r) for r in runs]  # noqa: E731
    figures = {
        "seeds": list(range(args.seeds)),
        "success_start": summary(pick(lambda r: r["clip"]["start"])),
        "success_true_reward": summary(pick(lambda r: r["true"]["final"])),
        "success_clip_reward": summary(pick(lambda r: r["clip"]["final"])),
        "true_gain_points": summary(pick(lambda r: 100 * (r["true"]["final"] - r["true"]["start"])), 1),
        "clip_gain_points": summary(pick(lambda r: 100 * (r["clip"]["final"] - r["clip"]["start"])), 1),
        "correlation": {
            k: summary(pick(lambda r, k=k: r["reward"][k]["corr_success"]))
            for k in ("on_policy", "off_policy", "validation_on_policy", "validation_frames")
        },
        "auc": {k: summary(pick(lambda r, k=k: r["reward"][k]["auc_success"])) for k in ("on_policy", "off_policy")},
        "reward_setting": pick(lambda r: {k: r["reward"][k] for k in ("positive", "negative", "t_min", "t_max")}),
        "clip": pick(lambda r: {k: r["clip_info"][k] for k in ("steps", "loss", "batch_accuracy", "logit_scale")}),
        "iterations": runs[0]["clip"]["iterations"],
        "episodes": runs[0]["clip"]["episodes"],
        "curves": {
            "true_reward": pick(lambda r: r["true"]["train_success"]),
            "clip_reward": pick(lambda r: r["clip"]["train_success"]),
        },
        "wall_s": {
            **{k: pick(lambda r, k=k: r["wall_s"][k]) for k in runs[0]["wall_s"]},
            "total": round(time.time() - t0, 1),
        },
    }
    s = figures
    print(
        f"held-out success over {args.seeds} seeds (mean +- std): warm start {s['success_start']['mean']:.3f} "
        f"+- {s['success_start']['std']:.3f}; true reward {s['success_true_reward']['mean']:.3f} +- "
        f"{s['success_true_reward']['std']:.3f} (gain {s['true_gain_points']['mean']:+.1f} +- "
        f"{s['true_gain_points']['std']:.1f} points); CLIP reward {s['success_clip_reward']['mean']:.3f} +- "
        f"{s['success_clip_reward']['std']:.3f} (gain {s['clip_gain_points']['mean']:+.1f} +- "
        f"{s['clip_gain_points']['std']:.1f} points)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
