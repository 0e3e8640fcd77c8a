"""Semantic shaping benchmark: does a CLIP reward model, trained without success labels, speed up RL
on the quickstart's sparse success reward? Three RL runs per seed from one warm start, side by side.

    python benchmarks/semantic_reward.py                      # seeds 0-2, held-out episodes
    python benchmarks/semantic_reward.py --validation         # seeds 100.., validation episodes (choose settings)
    python benchmarks/semantic_reward.py --shaping-weight 2   # the weight of the shaping term
    python benchmarks/semantic_reward.py --seed 0 --seed 1    # some seeds: a lane (each seed's record is saved)
    python benchmarks/semantic_reward.py --merge --seed 0 --seed 1 --seed 2   # the lanes' seeds as one run
    python benchmarks/semantic_reward.py trainer.lr=1e-4      # dotted overrides go to every RL run
    python benchmarks/semantic_reward.py --smoke              # seconds: 1 seed, tiny runs, no figure

Per seed ``s`` (everything below is a function of ``s``):

1. Pretrain the tiny CLIP (`rewards.train_tiny_clip`) on `reach_clip` (image, caption) pairs of seed
   ``s``: captions say which colour is in which cell of a 3 x 3 grid, where the gripper is, and
   (``--relations``, the default) where the gripper is relative to each disc ("on", "touching",
   "left of", ...: every disc alike); nothing about the instruction, the goal, success or distances.
   Saved in ``<--clip-dir>/reach_clip_s<s>`` and reused while the settings and the data / training
   code are the same (``--retrain-clip`` forces it).
2. Warm-start the quickstart policy once (``configs/quickstart.yaml``); every RL run below starts
   from a copy of it. Roll it out in training mode on validation episodes (reset seeds 2.0e9 + ...)
   and choose the reward setting there (`select_goal_setting`: a zero-shot contrasting goal wording
   of `GOAL_WORDINGS` and the ``t_min`` / ``t_max`` window, by the correlation of the reward of each
   episode's last frame with success). Report, for the chosen setting only, the correlation and ROC
   AUC with success on other training-mode episodes (2.5e9 + ...) and on held-out labelled frames
   (`reach_clip` ``labelled=True``, seed 20000 + s).
3. RL, the same iterations and settings, three rewards:
   - ``sparse``: ``configs/quickstart.yaml``, the simulator's reward: 1 on the success step, else 0;
   - ``shaped``: ``configs/quickstart_clip_shaping.yaml``: the same plus ``--shaping-weight`` x the
     CLIP score's potential-based shaping (each step earns the windowed score's change since the
     episode's previous frame: it sums to last minus first, so lingering near the goal earns nothing);
   - ``dense``: ``configs/quickstart.yaml`` with ``sim.kwargs.dense_reward=true``, the simulator's
     own shaping (the decrease of the distance to the goal each step): the ceiling.
   Each is evaluated every ``--eval-every`` iterations on the held-out episodes (reset seeds 1e9 +
   ...; ``--validation``: 3e9 + ...) by the simulator's own success. Env steps to the level: the env
   steps at the first evaluation whose success reaches ``--level`` (None if none does).

The shaping and sparse configs must differ only in the reward section (`rl_settings_differences`),
the benchmark stops with a one-line error otherwise. Std is the sample std over seeds (0 for one).
The last line is one JSON object: per arm, per-seed env steps to the level, final success and the
held-out success curve; ``shaped_over_sparse_steps`` (the mean over seeds of shaped's env steps
over sparse's; a run that never reaches the level counts the run's total env steps, so the ratio is
a bound, and ``reached`` says which did), ``dense_over_sparse_steps``; the reward model's
correlation and AUC with success; the chosen reward settings, the CLIP's pretraining and wall times.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPARSE_CONFIG = "configs/quickstart.yaml"
SHAPED_CONFIG = "configs/quickstart_clip_shaping.yaml"
ARMS = ("sparse", "shaped", "dense")
VALIDATION_SEED, TEST_SEED = 2_000_000_000, 2_500_000_000  # on-policy episodes for the reward's setting
EVAL_SEEDS = {"held-out": 1_000_000_000, "validation": 3_000_000_000}  # the RL runs' evaluation episodes
FIRST_SEED = {"held-out": 0, "validation": 100}


def rl_settings_differences(
    sparse_path: str | Path = ROOT / SPARSE_CONFIG, shaped_path: str | Path = ROOT / SHAPED_CONFIG, overrides=()
) -> list[str]:
    """Keys where the shaped config's RL run would differ from the sparse config's, besides the
    reward: everything but ``run.name`` and the ``reward`` section must be equal, the simulator included."""
    from mmrl.config import to_dict
    from mmrl.experiment import load_experiment

    a, b = (to_dict(load_experiment(p, list(overrides))) for p in (sparse_path, shaped_path))
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


def summary(values: list, digits: int = 4) -> dict:
    """Per-seed values, their mean and sample std (0 for one value) over the known ones."""
    values = [None if v is None or math.isnan(v) else v for v in values]  # NaN: undefined (e.g. AUC of one class)
    known = [v for v in values if v is not None]
    return {
        "per_seed": [None if v is None else round(v, digits) for v in values],
        "mean": round(statistics.fmean(known), digits) if known else None,
        "std": (round(statistics.stdev(known), digits) if len(known) > 1 else 0.0) if known else None,
    }


def steps_to_level(curve: list[dict], level: float) -> int | None:
    """Env steps at the first evaluation of ``curve`` (points with ``env_steps``, ``success``, in
    order) whose success reaches ``level``; None when none does."""
    for point in curve:
        if point["success"] >= level:
            return point["env_steps"]
    return None


def pretrain_clip(seed: int, args) -> tuple[Path, dict]:
    """Pretrain the tiny CLIP of ``seed`` into ``<--clip-dir>/reach_clip_s<seed>``, or reuse the
    checkpoint there when it was trained with the same settings and the same data / training code."""
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
        "relations": args.relations,
        "config": REACH_CLIP_CONFIG,
        "code": code,
    }
    saved = out / "train_info.json"
    if not args.retrain_clip and saved.exists() and json.loads(saved.read_text()).get("key") == key:
        print(f"[seed {seed}] tiny CLIP: reusing {out} (same settings and code)", flush=True)
        return out, json.loads(saved.read_text())
    pairs = load_dataset("reach_clip", num_samples=args.clip_samples, seed=seed, relations=args.relations)
    print(f"[seed {seed}] reach_clip: {pairs['image'].shape[0]} pairs, e.g. {pairs['captions'][0][-1]!r}", flush=True)
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
    """Last frame, instruction and success of ``episodes`` training-mode (stochastic) episodes of ``policy``."""
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


def choose_reward(policy, cfg, clip_dir: Path, seed: int, args) -> dict:
    """Choose the goal wording and window on validation episodes of the warm-started policy, then
    measure the chosen reward on-policy (other episodes) and off-policy (held-out labelled frames)."""
    import torch

    from mmrl.data import load_dataset
    from mmrl.experiment import build_sim
    from rewards.clip_goal import contrast_goal_reward
    from rewards.train_tiny_clip import GOAL_WORDINGS, goal_contrast, load_model, reward_stats, select_goal_setting

    model, tok = load_model(clip_dir)
    sim = build_sim(cfg, cfg.sim.num_envs, seed)
    with torch.random.fork_rng(devices=[]):  # the RL runs that follow are the same as without this
        val = final_frames(policy, sim, VALIDATION_SEED, args.episodes, seed)
        test = final_frames(policy, sim, TEST_SEED, args.episodes, seed)
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

    frames_test = load_dataset("reach_clip", num_samples=args.frames, seed=20_000 + seed, labelled=True)
    out = {
        "positive": wording[0],
        "negative": wording[1],
        "t_min": round(choice["t_min"], 5),
        "t_max": round(choice["t_max"], 5),
        "validation_on_policy": stats(val),
        "on_policy": stats(test),
        "off_policy": stats(frames_test),
    }
    print(
        f"[seed {seed}] reward chosen on validation episodes: {wording[0]!r} vs {wording[1]!r}, window "
        f"[{out['t_min']:.4f}, {out['t_max']:.4f}]; on-policy corr with success {out['on_policy']['corr_success']:.3f} "
        f"(AUC {out['on_policy']['auc_success']:.3f}), held-out frames corr {out['off_policy']['corr_success']:.3f} "
        f"(AUC {out['off_policy']['auc_success']:.3f})",
        flush=True,
    )
    return out


def arm_config(arm: str, seed: int, common: list[str], reward: dict | None, clip_dir: Path | None, args):
    """The experiment of one arm (see the module doc)."""
    from mmrl.experiment import load_experiment

    name = [f"run.name=bench_semantic_{arm}_s{seed}"]
    if arm == "sparse":
        return load_experiment(ROOT / SPARSE_CONFIG, [*name, *common])
    if arm == "dense":
        return load_experiment(ROOT / SPARSE_CONFIG, [*name, "sim.kwargs.dense_reward=true", *common])
    assert reward is not None and clip_dir is not None
    cfg = load_experiment(ROOT / SHAPED_CONFIG, [*name, *common])
    cfg.reward.kwargs.update(
        model_name=f"local-dir:{clip_dir}", pretrained=None, t_min=reward["t_min"], t_max=reward["t_max"]
    )
    cfg.reward.frames.goal_meta = {"positive_goal": reward["positive"], "negative_goal": reward["negative"]}
    cfg.reward.combine.weights = {"model": args.shaping_weight, "task": 1.0}
    return cfg


def warm_start(trainer, cfg, args) -> dict:
    """The warm-started policy state of ``trainer``'s config: trained here, or loaded from
    ``<--clip-dir>/bench_semantic_warm_<key>.pt`` when a run with the same simulator, policy, warm
    start and seed saved it (every arm starts from it; it does not depend on the reward or RL)."""
    import hashlib

    import torch

    from mmrl.config import to_dict

    d = to_dict(cfg)
    key = hashlib.sha256(
        json.dumps(
            {k: d[k] for k in ("sim", "policy", "warm_start")} | {"seed": d["run"]["seed"]}, sort_keys=True
        ).encode()
    ).hexdigest()[:16]
    saved = Path(args.clip_dir) / f"bench_semantic_warm_{key}.pt"
    if saved.is_file() and not args.smoke:
        print(f"warm start: reusing {saved} (same simulator, policy, warm start and seed)", flush=True)
        warm = torch.load(saved)
        start_from(trainer, warm)
        return warm
    trainer.warm_start()
    warm = copy.deepcopy(trainer.policy.state_dict())
    if not args.smoke:
        torch.save(warm, saved)
    return warm


def start_from(trainer, warm: dict) -> None:
    """``trainer`` as a warm start leaves it: the policy state ``warm`` (copied in), the policy's own
    step after the warm start (a reference copy, fixed statistics), no warm start left to run."""
    trainer.policy.load_state_dict(warm)
    trainer.policy.after_warm_start()
    trainer.state.warm_started = True


def rl_run(cfg, warm: dict, label: str) -> dict:
    """RL from the warm-started policy state ``warm``; the held-out success curve and the final report."""
    from mmrl.experiment import build_trainer, output_dir

    t0 = time.time()
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    trainer = build_trainer(cfg)
    start_from(trainer, warm)
    results = trainer.run()
    curve = [
        {"iteration": r["iteration"], "env_steps": r["env_steps"], "success": round(r["success_rate"], 4)}
        for r in sorted(results.values(), key=lambda r: (r["iteration"], r["env_steps"]))
    ]
    wall = round(time.time() - t0, 1)
    print(
        f"{label}: held-out success by env steps {[(p['env_steps'], p['success']) for p in curve]} ({wall} s)",
        flush=True,
    )
    return {
        "curve": curve,
        "final": results["final"]["success_rate"],
        "env_steps": curve[-1]["env_steps"],
        "wall_s": wall,
    }


def one_seed(seed: int, args) -> dict:
    from mmrl.experiment import build_trainer, load_experiment, output_dir

    common = [
        f"run.seed={seed}",
        f"run.threads={args.threads}",
        "trainer.resume=false",
        f"trainer.eval_every={args.eval_every}",
        f"trainer.eval_seed={EVAL_SEEDS[args.split]}",
        *args.overrides,
    ]
    if args.iterations is not None:
        common.append(f"trainer.iterations={args.iterations}")
    t0 = time.time()
    clip_dir, clip_info = pretrain_clip(seed, args)
    t_clip = time.time() - t0

    t0 = time.time()
    cfg = load_experiment(ROOT / SPARSE_CONFIG, [f"run.name=bench_semantic_warm_s{seed}", *common])
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    trainer = build_trainer(cfg)
    warm = warm_start(trainer, cfg, args)
    t_warm = time.time() - t0
    reward = choose_reward(trainer.policy, cfg, clip_dir, seed, args)
    del trainer
    runs = {}
    for arm in ("sparse", *(a for a in args.arms if a != "sparse")):  # sparse is every ratio's reference
        cfg = arm_config(arm, seed, common, reward, clip_dir, args)
        runs[arm] = rl_run(cfg, warm, f"[seed {seed}] {arm}")
        runs[arm]["steps_to_level"] = steps_to_level(runs[arm]["curve"], args.level)
        if runs[arm]["curve"][0]["success"] != runs["sparse"]["curve"][0]["success"]:
            print(f"warning: seed {seed}: the {arm} run did not start where sparse did: check the warm-start copy")
    return {
        "seed": seed,
        "arms": runs,
        "reward": reward,
        "clip_info": clip_info,
        "wall_s": {
            "clip_pretrain": round(t_clip, 1),
            "warm_start": round(t_warm, 1),
            **{a: r["wall_s"] for a, r in runs.items()},
        },
    }


def settings(args) -> dict:
    """What must be equal for seeds run in separate lanes to be one run."""
    keys = ("level", "shaping_weight", "relations", "eval_every", "iterations", "clip_samples", "clip_steps", "arms")
    return {k: getattr(args, k) for k in keys} | {"overrides": list(args.overrides), "split": args.split}


def ratio(runs: list[dict], arm: str) -> dict:
    """Per seed, the arm's env steps to the level over sparse's (a run that never reaches it counts
    its total env steps: the ratio is then a bound), with which runs reached it."""
    values, reached = [], []
    for r in runs:
        a, s = r["arms"][arm], r["arms"]["sparse"]
        num = a["steps_to_level"] if a["steps_to_level"] is not None else a["env_steps"]
        den = s["steps_to_level"] if s["steps_to_level"] is not None else s["env_steps"]
        values.append(num / den if den else None)
        reached.append({arm: a["steps_to_level"] is not None, "sparse": s["steps_to_level"] is not None})
    return {**summary(values, 3), "reached": reached}


def main() -> None:
    from _smoke import parse_args, scratch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 (100 .. with --validation)")
    parser.add_argument(
        "--seed", type=int, action="append", default=None, help="run these seeds instead (repeat: lanes of one run)"
    )
    parser.add_argument("--validation", action="store_true", help="seeds from 100, evaluated on validation episodes")
    parser.add_argument(
        "--iterations", type=int, default=None, help="RL iterations of each run (default: the configs')"
    )
    parser.add_argument("--eval-every", type=int, default=4, help="iterations between held-out evaluations")
    parser.add_argument(
        "--level", type=float, default=0.85, help="the held-out success level the env steps are counted to"
    )
    parser.add_argument(
        "--shaping-weight", type=float, default=1.0, help="the shaping term's weight (the sparse reward's is 1)"
    )
    parser.add_argument(
        "--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the RL runs (sparse always runs: the reference)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: fastest on a small shared CPU)")
    parser.add_argument("--clip-samples", type=int, default=20000, help="reach_clip (image, caption) pairs")
    parser.add_argument("--clip-steps", type=int, default=1200, help="tiny CLIP optimizer steps")
    parser.add_argument("--clip-time", type=float, default=1800.0, help="tiny CLIP time limit (s; a safety stop)")
    parser.add_argument(
        "--relations", action=argparse.BooleanOptionalAction, default=True, help="the relational captions"
    )
    parser.add_argument(
        "--merge", action="store_true", help="aggregate the saved records of --seed ... (lanes) without running"
    )
    parser.add_argument("--retrain-clip", action="store_true", help="pretrain the CLIPs again even where one matches")
    parser.add_argument("--episodes", type=int, default=256, help="on-policy validation / test episodes")
    parser.add_argument("--frames", type=int, default=2000, help="held-out labelled frames")
    parser.add_argument("--clip-dir", default=str(ROOT / "runs"), help="parent folder of the tiny CLIPs' checkpoints")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every RL run")
    args = parse_args(
        parser,
        seeds=1,
        iterations=2,
        eval_every=1,
        clip_samples=64,
        clip_steps=2,
        episodes=8,
        frames=16,
        clip_dir=scratch,
    )
    if args.smoke:  # the kill-resume harness's tiny quickstart (its sim.kwargs aside), run folders in a temp folder
        from tests.reliability.kill_harness import TINY

        args.overrides = [
            *(o for o in TINY if not o.startswith("sim.kwargs")),
            f"run.output_dir={scratch()}",
            *args.overrides,
        ]
    if args.seeds < 1 or args.eval_every < 1:
        parser.error("--seeds and --eval-every must be >= 1")
    args.split = "validation" if args.validation else "held-out"
    diff = rl_settings_differences(overrides=args.overrides)
    if diff:
        sys.exit(
            f"error: {SHAPED_CONFIG} must have the RL settings of {SPARSE_CONFIG} (only the reward section may "
            f"differ), but {'; '.join(diff)}: copy them over"
        )

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    seeds = args.seed or [FIRST_SEED[args.split] + i for i in range(args.seeds)]
    runs = []
    for seed in seeds:  # each seed's record is saved as it finishes; --merge aggregates saved ones
        saved = Path(args.clip_dir) / f"bench_semantic_seed{seed}_{args.split}.json"
        if args.merge:
            if not saved.is_file():
                sys.exit(f"error: --merge: no saved record {saved}: run that seed first (--seed {seed})")
            runs.append(json.loads(saved.read_text()))
            continue
        runs.append(one_seed(seed, args))
        saved.write_text(json.dumps({**runs[-1], "settings": settings(args)}))
    if args.merge and len({json.dumps(r["settings"]) for r in runs}) > 1:
        sys.exit(
            "error: --merge: the saved seeds ran with different settings: "
            + "; ".join(str(r["settings"]) for r in runs)
        )
    pick = lambda f: [f(r) for r in runs]  # noqa: E731
    arms = [a for a in ARMS if a in runs[0]["arms"]]
    figures = {
        "seeds": seeds,
        "split": args.split,
        "level": args.level,
        "shaping_weight": args.shaping_weight,
        "relations": args.relations,
        "arms": arms,
        "env_steps_to_level": {a: pick(lambda r, a=a: r["arms"][a]["steps_to_level"]) for a in arms},
        **{f"{a}_over_sparse_steps": ratio(runs, a) for a in arms if a != "sparse"},
        "success_start": summary(pick(lambda r: r["arms"]["sparse"]["curve"][0]["success"])),
        **{f"success_{a}": summary(pick(lambda r, a=a: r["arms"][a]["final"])) for a in arms},
        "correlation": {
            k: summary(pick(lambda r, k=k: r["reward"][k]["corr_success"]))
            for k in ("on_policy", "off_policy", "validation_on_policy")
        },
        "auc": {k: summary(pick(lambda r, k=k: r["reward"][k]["auc_success"])) for k in ("on_policy", "off_policy")},
        "reward_setting": pick(lambda r: {k: r["reward"][k] for k in ("positive", "negative", "t_min", "t_max")}),
        "clip": pick(lambda r: {k: r["clip_info"][k] for k in ("steps", "loss", "batch_accuracy", "logit_scale")}),
        "curves": {a: pick(lambda r, a=a: r["arms"][a]["curve"]) for a in arms},
        "wall_s": {
            **{k: pick(lambda r, k=k: r["wall_s"][k]) for k in runs[0]["wall_s"]},
            "total": None if args.merge else round(time.time() - t0, 1),  # lanes: their own lines say
        },
    }
    print(f"env steps to held-out success {args.level} ({args.split} episodes, {len(seeds)} seeds):")
    for arm in arms:
        print(
            f"  {arm:>6}: {figures['env_steps_to_level'][arm]}, final success {figures[f'success_{arm}']['mean']:.3f}"
        )
    for arm in arms[1:]:
        r = figures[f"{arm}_over_sparse_steps"]
        print(f"  {arm} / sparse env steps: {r['mean']} +- {r['std']} (per seed {r['per_seed']})")
    a = figures["auc"]["off_policy"]
    print(f"  the reward model's AUC with success on held-out frames: {a['mean']} +- {a['std']}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
