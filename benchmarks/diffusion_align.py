"""Flow-GRPO vs the likelihood-free AWM and DiffusionNFT on the embedded diffusion demo, same budget, per seed.

    python benchmarks/diffusion_align.py                      # seeds 0-2, 150 iterations each, eval every 25
    python benchmarks/diffusion_align.py --seeds 2 --iterations 4 --eval-every 2 \\
        --set warm_start.steps=20 --set warm_start.num_episodes=512     # a quick check of the script
    python benchmarks/diffusion_align.py --smoke              # seconds: 1 seed, 2 iterations, no figure

For each seed s (``--seeds N``: s = 0..N-1, ``run.seed`` = s: the pretraining images, captions and
order, the initial weights, the rollouts and the RL noise all change with it), one tiny pixel-space
generator is pretrained by flow matching on the synthetic `shapes` images of the TRAIN prompts with
noisy captions (half of them describe another train image of the same kind; the warm start of
configs/diffusion_shapes_flow_grpo.yaml), so it follows its prompt only part of the time. From those
same weights, configs/diffusion_shapes_flow_grpo.yaml (Flow-SDE rollouts, per-step PPO ratios),
configs/diffusion_shapes_awm.yaml (ODE rollouts, advantage-weighted flow matching) and
configs/diffusion_shapes_nft.yaml (ODE rollouts, DiffusionNFT's forward-process loss; ``--methods``
picks some of them, Flow-GRPO always runs) each run the same number of iterations with the same
train prompts per iteration (8 prompts x 8 images), and the mean
`shapes` reward over the 42 held-out prompts, each evaluated ``trainer.eval_episodes / 42`` times
(3 by default; ODE, 16 steps), is measured every ``--eval-every`` iterations. No held-out prompt is
ever trained on, pretrained on, or used to choose a setting. Sample grids are written at every
evaluation (runs/bench_diffusion/seed<s>/<name>/videos/*.png).

Baselines printed beside the result, on the same held-out episodes: the pretrained generator (the
start of both runs), correct images of each prompt drawn by the dataset's renderer (the reward's
ceiling, 1.0 by construction) and the same correct images scored against another held-out prompt
(a perfect painter that ignores its prompt).

Time-to-reward (per seed): the level is ``pretrained + frac * (min over the methods of their best -
pretrained)`` (``--level-frac``, default 0.8), over the methods whose best rose above the pretrained
reward: a level all of those reach (a method that never rose never reaches it). Each run's RL wall time
(evaluation excluded) and training samples to first reach it are interpolated linearly between
evaluations; a method's speedups are Flow-GRPO's divided by its own (null when a run never reaches
the level). Times are wall-clock: the load average is printed; compare them only on an idle machine.

The last line is one JSON object: per-seed lists ``pretrained_reward``, ``<method>_reward`` (final
held-out rewards), ``<method>_gain`` and, for AWM and DiffusionNFT (``nft``),
``<method>_speedup_time`` and ``<method>_speedup_samples``, ``level``, ``pretrain_s``, each with
``_mean`` and ``_std`` (speedups over the seeds where both runs reach the level), the baselines, the
evaluation protocol and the curves.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LABELS = {"flow_grpo": "Flow-GRPO", "awm": "AWM", "nft": "DiffusionNFT"}
VALIDATION_SEED = 100  # --validation's first seed: the reported runs use 0..N-1


@dataclass(frozen=True)
class Demo:
    """An embedded generator demo the benchmark runs: its three configs (the Flow-GRPO one also
    pretrains), the correct samples of given held-out prompts (the ceiling), the defaults of its
    command line and its ``--smoke`` overrides. `benchmarks/video_align.py` runs the video demo."""

    samples: str  # what the generator makes, for messages: "images" / "clips"
    configs: dict[str, str]
    gold: Callable  # (eval simulator, metas of the episodes) -> uint8 correct samples, one per episode
    one_eval: list[str]  # overrides that evaluate each held-out prompt once, in one batch
    smoke: list[str]
    output_dir: str
    iterations: int
    eval_every: int
    # --validation: overrides that evaluate on a validation split carved out of the train prompts
    # (and kept out of pretraining and RL training), so settings are chosen without the held-out ones
    validation: tuple[str, ...] = ()


#: --smoke overrides of every demo (each adds its batch): 1 pretraining step, 4 videos logged, 2 denoising
#: steps (the code path, not the sampler's fidelity, which tests/policies checks)
SMOKE = [
    "warm_start.steps=1",
    "warm_start.num_episodes=64",
    "trainer.video_episodes=4",
    "policy.num_steps=2",
    "policy.eval_num_steps=2",
]


def shapes_gold(sim, meta: list[dict]):
    from mmrl.data import builder_module

    return builder_module("shapes").draw([m["objects"] for m in meta], seed=0, image_size=sim.image_size)


IMAGES = Demo(
    samples="images",
    configs={
        "flow_grpo": "configs/diffusion_shapes_flow_grpo.yaml",
        "awm": "configs/diffusion_shapes_awm.yaml",
        "nft": "configs/diffusion_shapes_nft.yaml",
    },
    gold=shapes_gold,
    one_eval=["sim.eval_num_envs=42", "trainer.eval_episodes=42"],
    smoke=[*SMOKE, "sim.num_envs=16"],
    output_dir="runs/bench_diffusion",
    iterations=150,
    eval_every=25,
    validation=(
        "sim.kwargs.dataset_kwargs.val_fraction=0.2",
        "sim.eval_kwargs.split=validation",
        "warm_start.kwargs.val_fraction=0.2",
    ),
)


def per_seed_keys(methods: list[str]) -> list[str]:
    """The per-seed figures of the JSON line, for ``methods`` (Flow-GRPO first)."""
    keys = ["pretrained_reward", *(f"{m}_reward" for m in methods), *(f"{m}_gain" for m in methods)]
    keys += [f"{m}_speedup_{k}" for m in methods[1:] for k in ("time", "samples")]
    keys += [f"{m}_time_to_level_s" for m in methods]
    keys += [f"{m}_time_to_grpo_final_frac" for m in methods[1:]]
    return [*keys, "level", "pretrain_s"]


def curve(results: dict) -> list[dict]:
    """Evaluation points ordered by iteration: iteration, rl_seconds, train_episodes, reward."""
    points = {r["iteration"]: r for r in results.values()}
    return [
        {
            "iteration": it,
            "rl_seconds": round(points[it]["rl_seconds"], 2),
            "train_episodes": points[it]["train_episodes"],
            "reward": round(points[it]["return"], 4),
        }
        for it in sorted(points)
    ]


def common_level(start: float, bests: list[float], frac: float) -> float:
    """The time-to-reward level: ``start + frac * (min best - start)`` over the methods whose best
    rose above ``start``, so each of those reaches it; a method that never rose never reaches it
    (not 0 s at a level equal to the start). ``inf`` when none rose."""
    risen = [b for b in bests if b > start]
    return start + frac * (min(risen) - start) if risen else float("inf")


def fraction_to_final(points: list[dict], grpo: list[dict]) -> float | None:
    """RL seconds a run needs to reach Flow-GRPO's final reward, over Flow-GRPO's whole RL time
    (None: never reached)."""
    seconds = time_to(points, grpo[-1]["reward"], "rl_seconds")
    return None if seconds is None or not grpo[-1]["rl_seconds"] else round(seconds / grpo[-1]["rl_seconds"], 3)


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


def summary(runs: list[dict], key: str) -> dict:
    """Per-seed values of ``key``, their mean and sample std (over the seeds where it is not None)."""
    values = [r[key] for r in runs]
    known = [v for v in values if v is not None]
    return {
        key: values,
        f"{key}_mean": round(statistics.fmean(known), 4) if known else None,
        f"{key}_std": round(statistics.stdev(known), 4) if len(known) > 1 else (0.0 if known else None),
    }


def eval_protocol(trainer) -> dict:
    """The held-out prompts and how often each is evaluated; fails unless all equally often."""
    sim, episodes = trainer.eval_sim, trainer.cfg.trainer.eval_episodes
    return {"eval_prompts": len(sim.prompts), "per_prompt": sim.evaluation_rounds(episodes), "eval_episodes": episodes}


def baselines(trainer, demo: Demo) -> dict:
    """Mean reward on the trainer's held-out evaluation episodes of correct samples of each prompt
    (the ceiling) and of the same samples scored against the next episode's (another) prompt."""
    sim, t = trainer.eval_sim, trainer.cfg.trainer
    idx = sim.prompt_index([t.eval_seed + e for e in range(t.eval_episodes)]).tolist()
    prompts, meta = [sim.prompts[i] for i in idx], [sim.meta[i] for i in idx]
    gold = demo.gold(sim, meta)
    return {
        "gold_reward": round(trainer.reward_stage.model(gold, prompts, meta).mean().item(), 4),
        "prompt_ignoring_reward": round(trainer.reward_stage.model(gold.roll(1, 0), prompts, meta).mean().item(), 4),
    }


#: policy fields that only choose which steps of an RL rollout are stochastic and trained: a sweep
#: over them reuses the pretrained generator (the warm start is supervised flow matching)
ROLLOUT_ONLY = ("stochastic", "window", "shared_noise", "timestep_fraction")


def pretraining_key(cfg) -> str:
    """A fingerprint of what the pretrained generator depends on: the run's seed and the resolved
    policy, simulator and warm-start sections (not the RL settings, which a sweep varies, nor the
    policy's `ROLLOUT_ONLY` fields: which rollout steps are stochastic never enters pretraining)."""
    import dataclasses
    import hashlib

    parts = {"seed": cfg.run.seed, **{k: dataclasses.asdict(getattr(cfg, k)) for k in ("policy", "sim", "warm_start")}}
    parts["policy"] = {k: v for k, v in parts["policy"].items() if k not in ROLLOUT_ONLY}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def pretrain(seed: int, common: list[str], args, demo: Demo) -> tuple[dict, float, bool]:
    """The seed's pretrained generator weights, the seconds its pretraining took and whether they
    were reused. Each is saved
    as ``<output_dir>/pretrained/seed<s>-<key>.safetensors`` (`pretraining_key`); with
    ``--reuse-pretrained`` a file of the same key is loaded instead of pretraining again (its
    seconds are the ones it took then)."""
    from mmrl.experiment import build_trainer, load_experiment
    from mmrl.utils.weights import load_weights, save_weights

    t0 = time.time()
    cfg = load_experiment(ROOT / demo.configs["flow_grpo"], [*common, "run.name=pretrain"])
    cache = Path(args.output_dir) / "pretrained" / f"seed{seed}-{pretraining_key(cfg)}.safetensors"
    if (args.reuse_pretrained or args.resume) and cache.is_file():
        weights, meta = load_weights(cache)
        print(f"[seed {seed}] reused {cache} (pretrained in {meta['pretrain_s']} s)", flush=True)
        return weights, float(meta["pretrain_s"]), True
    pre = build_trainer(cfg)
    pre.warm_start()
    pretrained = {k: v.detach().clone() for k, v in pre.policy.gen.state_dict().items()}
    pretrain_s = time.time() - t0
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.with_suffix(".partial")
    save_weights(pretrained, partial, {"pretrain_s": f"{pretrain_s:.1f}"})
    partial.replace(cache)  # a kill while writing leaves no file that looks complete
    print(f"[seed {seed}] pretrained the generator in {pretrain_s:.0f} s (saved as {cache})", flush=True)
    return pretrained, pretrain_s, False


def run_seed(seed: int, args, demo: Demo) -> tuple[dict, dict]:
    """Pretrain, then each of ``args.methods`` from the same weights; the seed's figures and protocol."""
    from mmrl.experiment import build_trainer, load_experiment

    common = [
        f"run.output_dir={args.output_dir}/seed{seed}",
        f"run.seed={seed}",
        f"trainer.resume={str(args.resume).lower()}",
        f"trainer.iterations={args.iterations}",
        f"trainer.eval_every={args.eval_every}",
        # a checkpoint at every evaluation: a killed benchmark goes on from there under --resume
        f"trainer.checkpoint_every={args.eval_every}",
        *args.set,
    ]
    pretrained, pretrain_s, reused = pretrain(seed, common, args, demo)
    curves, finals, protocol = {}, {}, {}
    methods = args.methods
    for name in methods:
        own = [o.partition(":")[2] for o in args.method_set if o.partition(":")[0] == name]
        trainer = build_trainer(load_experiment(ROOT / demo.configs[name], [*common, f"run.name={name}", *own]))
        protocol[name] = eval_protocol(trainer)
        if name == "flow_grpo":
            protocol["baselines"] = baselines(trainer, demo)
        trainer.policy.gen.load_state_dict(pretrained)
        trainer.policy.after_warm_start()
        trainer.state.warm_started = True
        results = trainer.run()
        curves[name] = curve(results)
        finals[name] = results["final"]["return"]
    for name in methods[1:]:
        if protocol[name] != protocol["flow_grpo"]:
            raise ValueError(
                f"{name} evaluates differently from flow_grpo: {protocol[name]} vs {protocol['flow_grpo']}"
            )
    start = curves["flow_grpo"][0]["reward"]
    level = common_level(start, [max(p["reward"] for p in curves[n]) for n in methods], args.level_frac)
    risen = level != float("inf")
    print(f"\n[seed {seed}] mean {args.split} reward (pretrained {start:.3f}); level for time-to-reward {level:.3f}")
    print(f"{'iter':>5} | " + " | ".join(f"{LABELS[m]:>12} {'s':>7} {'samples':>8}" for m in methods))
    for points in zip(*(curves[m] for m in methods)):
        cells = [f"{p['reward']:12.3f} {p['rl_seconds']:7.1f} {p['train_episodes']:8d}" for p in points]
        print(f"{points[0]['iteration']:5d} | " + " | ".join(cells))
    run: dict = {"pretrained_reward": round(start, 4)}
    # when each run first reached the level, in RL seconds and in training samples (None: never)
    reach = {m: {key: time_to(curves[m], level, key) for key in ("rl_seconds", "train_episodes")} for m in methods}
    for m in methods:
        run[f"{m}_reward"] = round(finals[m], 4)
        run[f"{m}_gain"] = round(finals[m] - start, 4) + 0.0
        seconds = reach[m]["rl_seconds"]
        run[f"{m}_time_to_level_s"] = None if seconds is None else round(seconds, 1)
    for m in methods[1:]:  # the goal: Flow-GRPO's final reward in at most half its wall time
        run[f"{m}_time_to_grpo_final_frac"] = fraction_to_final(curves[m], curves["flow_grpo"])
    for m in methods[1:]:
        for key, label in (("rl_seconds", "time"), ("train_episodes", "samples")):
            g, a = reach["flow_grpo"][key], reach[m][key]
            run[f"{m}_speedup_{label}"] = round(g / a, 3) if g is not None and a not in (None, 0) else None
            speedup = run[f"{m}_speedup_{label}"]
            print(f"to reach {level:.3f}: Flow-GRPO {g} {key}, {LABELS[m]} {a} {key} -> speedup {speedup}")
    gains = ", ".join(f"{LABELS[m]} {finals[m] - start:+.3f}" for m in methods)
    print(
        f"[seed {seed}] reward gain over the pretrained generator: {gains}; load {os.getloadavg()[0]:.2f}\n", flush=True
    )
    run.update(level=round(level, 4) if risen else None, pretrain_s=round(pretrain_s, 1), pretrain_reused=reused)
    run.update(curves=curves)
    return run, {**protocol["flow_grpo"], **protocol["baselines"]}


def cost_table(args, demo: Demo) -> dict:
    """Seconds of RL per training sample (rollout, reward and update; evaluation excluded) of each
    method with ``K`` denoising steps per training rollout, for each K of ``--cost-steps``: the same
    prompts, groups and epochs, untrained weights (the cost does not depend on them), one torch thread."""
    from mmrl.experiment import build_trainer, load_experiment

    table: dict = {}
    for name in args.methods:
        for k in args.cost_steps:
            overrides = [
                f"run.output_dir={args.output_dir}/cost",
                f"run.name={name}_K{k}",
                "run.threads=1",
                "trainer.resume=false",
                "warm_start.dataset=null",
                f"policy.num_steps={k}",
                "policy.eval_num_steps=1",
                f"trainer.iterations={args.cost_iterations}",
                f"trainer.checkpoint_every={args.cost_iterations}",
                *demo.one_eval,
                "trainer.video_episodes=0",
                *args.set,
            ]
            final = build_trainer(load_experiment(ROOT / demo.configs[name], overrides)).run()["final"]
            table.setdefault(name, {})[str(k)] = round(final["rl_seconds"] / max(final["train_episodes"], 1), 5)
    print(f"\nseconds of RL per training sample at K denoising steps ({args.cost_iterations} iterations each):")
    print(f"{'K':>4} | " + " | ".join(f"{LABELS[m]:>12}" for m in args.methods))
    for k in args.cost_steps:
        print(f"{k:4d} | " + " | ".join(f"{table[m][str(k)]:12.4f}" for m in args.methods))
    return table


def main(demo: Demo = IMAGES, doc: str | None = __doc__) -> None:
    from _smoke import parse_args, scratch

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="run seeds 0..N-1 (100..100+N-1 with --validation)")
    parser.add_argument(
        "--validation",
        action="store_true",
        help="choose settings: seeds from 100, evaluated on a validation split of the train prompts "
        "(42 prompts kept out of pretraining and RL), never on the held-out ones",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="seeds run at the same time, each in its own process (2 on a 2-core machine, with --set run.threads=1)",
    )
    parser.add_argument("--iterations", type=int, default=demo.iterations)
    parser.add_argument("--eval-every", type=int, default=demo.eval_every)
    parser.add_argument("--level-frac", type=float, default=0.8)
    parser.add_argument(
        "--methods", default="awm,nft", help="likelihood-free methods run beside Flow-GRPO (awm, nft; default both)"
    )
    parser.add_argument("--output-dir", default=demo.output_dir)
    parser.add_argument(
        "--reuse-pretrained",
        action="store_true",
        help="load each seed's pretrained generator saved by an earlier run with the same pretraining settings "
        "(<output-dir>/pretrained/, named by a fingerprint of them) instead of pretraining again (RL sweeps)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with the runs a killed benchmark left in --output-dir (same command otherwise): each seed's "
        "pretrained generator is reused, each run resumes from its newest checkpoint (one per evaluation), "
        "a finished run is read back; without it, earlier runs there move aside to previous_<n>/",
    )
    parser.add_argument(
        "--cost-steps",
        default="",
        help="also measure seconds per training sample at these denoising steps, e.g. 8,16,32 (--seeds 0: only that)",
    )
    parser.add_argument("--cost-iterations", type=int, default=4, help="RL iterations per cost measurement")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for both runs and the pretraining (repeatable)",
    )
    parser.add_argument(
        "--method-set",
        action="append",
        default=[],
        metavar="METHOD:KEY=VALUE",
        help="a config override for one method's runs only, e.g. nft:policy.nft_old_decay=0 (repeatable)",
    )
    args = parse_args(
        parser,
        seeds=1,
        iterations=2,
        eval_every=1,
        output_dir=scratch,
        set=[*demo.smoke, *demo.one_eval],  # --smoke: each held-out prompt once
        cost_steps="2",
        cost_iterations=1,
    )
    try:
        args.cost_steps = [int(k) for k in args.cost_steps.split(",") if k.strip()]
    except ValueError:
        parser.error(f"--cost-steps: a comma-separated list of integers, got {args.cost_steps!r}")
    if args.seeds < (0 if args.cost_steps else 1):
        parser.error("--seeds must be >= 1 (0 only with --cost-steps)")
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    if args.validation and not demo.validation:
        parser.error(f"--validation: this demo ({demo.samples}) has no validation split of its prompts yet")
    args.split = "validation" if args.validation else "held-out"
    first = VALIDATION_SEED if args.validation else 0
    args.seed_list = list(range(first, first + args.seeds))
    if args.validation:
        args.set = [*demo.validation, *args.set]
    bad = [o for o in args.method_set if o.partition(":")[0] not in demo.configs or "=" not in o]
    if bad:
        parser.error(f"--method-set: {bad}: write METHOD:KEY=VALUE with METHOD one of {', '.join(demo.configs)}")
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(demo.configs) - {"flow_grpo"})
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from awm, nft")
    args.methods = ["flow_grpo", *[m for m in demo.configs if m in chosen and m != "flow_grpo"]]

    load_start = os.getloadavg()[0]
    out = seed_figures(args, demo) if args.seeds else {}
    if args.cost_steps:
        out["cost_s_per_sample"] = cost_table(args, demo)
        out.update(cost_iterations=args.cost_iterations)
    out.update(load_avg_start=round(load_start, 2), load_avg_end=round(os.getloadavg()[0], 2))
    print(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(json.dumps(out))


def seed_figures(args, demo: Demo) -> dict:
    """Every seed's runs; their per-seed figures with mean and std, the protocol and the curves."""
    from mmrl.utils.processes import side_by_side

    # seeds side by side, each in a fresh process (--jobs > 1); results in seed order
    done = side_by_side(run_seed, args.seed_list, [args] * args.seeds, [demo] * args.seeds, jobs=args.jobs)
    runs, protocols = [r for r, _ in done], [p for _, p in done]
    protocol = protocols[0]  # the held-out episodes do not depend on the seed
    out = {"seeds": args.seed_list, "split": args.split}
    for key in per_seed_keys(args.methods):
        out.update(summary(runs, key))
    out["pretrain_reused"] = [r["pretrain_reused"] for r in runs]  # then pretrain_s is the saved figure
    print(
        f"{out['split']} reward over {args.seeds} seeds ({protocol['eval_prompts']} {out['split']} prompts x "
        f"{protocol['per_prompt']} = {protocol['eval_episodes']} {demo.samples} per evaluation, "
        f"{args.iterations} iterations):"
    )
    print(
        f"  ceiling (correct {demo.samples} of each prompt) {protocol['gold_reward']:.3f}; "
        f"correct {demo.samples} of another prompt {protocol['prompt_ignoring_reward']:.3f}"
    )
    rows = [("pretrained_reward", "pretrained (start)")]
    rows += [(f"{m}_reward", LABELS[m]) for m in args.methods] + [
        (f"{m}_gain", f"{LABELS[m]} gain") for m in args.methods
    ]
    rows += [(f"{m}_speedup_{k}", f"{LABELS[m]} speedup ({k})") for m in args.methods[1:] for k in ("time", "samples")]
    rows += [(f"{m}_time_to_level_s", f"{LABELS[m]} s to the level") for m in args.methods]
    rows += [(f"{m}_time_to_grpo_final_frac", f"{LABELS[m]} to GRPO's final") for m in args.methods[1:]]
    for key, label in rows:
        mean, std = out[f"{key}_mean"], out[f"{key}_std"]
        shown = "n/a" if mean is None else f"{mean:.3f} +- {std:.3f}"
        print(f"  {label:30s} {shown:>16}   per seed {out[key]}")
    out.update(
        protocol,
        iterations=args.iterations,
        eval_every=args.eval_every,
        level_frac=args.level_frac,
        curves=[r["curves"] for r in runs],
    )
    return out


if __name__ == "__main__":
    main()
