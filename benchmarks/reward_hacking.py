"""Reward hacking on the embedded image demo, with and without mmrl's guards, per seed.

    python benchmarks/reward_hacking.py                       # seeds 0-2, 60 iterations, eval every 10
    python benchmarks/reward_hacking.py --validation          # seeds 100-102 on the validation prompts
    python benchmarks/reward_hacking.py --guard-ref 3 --guard-diversity 0.5      # other guard weights
    python benchmarks/reward_hacking.py --validation --arms guarded --guard-ref 2   # one point of a sweep
    python benchmarks/reward_hacking.py --smoke               # seconds: 1 seed, 2 iterations, no figure

The hackable reward is DDPO's JPEG compressibility (``jpeg_compressibility``: minus the file size in
kB), which the `shapes` demo's generator can raise by drawing flatter, emptier pictures whatever the
prompt asks. The generator of configs/diffusion_shapes_nft.yaml is pretrained for each seed s
(``run.seed`` = s, as benchmarks/diffusion_align.py pretrains it; the same weights for both arms)
and then trained with DiffusionNFT on that reward alone, twice:

- **unguarded**: the trained reward and nothing else;
- **guarded**: the same reward, plus DiffusionNFT's drift term to the pretrained generator
  (``policy.nft_ref_coef``, ``--guard-ref``) and a diversity term that pays each image its distance
  to the other images of its prompt (``reward.combine.weights.diversity``, ``--guard-diversity``).

Both arms are audited by the `shapes` reward, which is never trained on (``reward.audit.heldout``:
the prompt fidelity the demo's own benchmark trains for), and by the diversity of the images of each
prompt (the mean RMS pixel distance between them; each held-out prompt is evaluated
``--eval-episodes`` / 42 times, 6 by default). All
three are measured on the 42 held-out prompts (``--validation``: 42 validation prompts carved from
the train prompts, seeds from 100, for choosing ``--guard-ref`` and ``--guard-diversity``) every
``--eval-every`` iterations, and printed beside the pretrained generator's.

The goal (issue 70): with the guards the held-out reward does not fall below the pretrained
generator's, while the unguarded run's does; the price is the trained reward the guarded run gives up.
Read strictly (any fall) and beyond the evaluations' noise (a fall of more than twice the standard
error of the difference of the two means: `significantly_below`), both reported.

The last line is one JSON object: per arm, per-seed lists of the final ``trained`` reward, ``heldout``
reward and ``diversity``, each with ``_mean`` and ``_std``; the pretrained generator's three; the
``heldout_below_pretrained`` and ``heldout_significantly_below`` counts of each arm, ``goal_met``
and ``goal_met_beyond_noise``; the settings and the curves.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from diffusion_align import IMAGES, VALIDATION_SEED, pretrain  # noqa: E402  (the demo and its pretraining)

CONFIG = "configs/diffusion_shapes_nft.yaml"
TRAINED, HELDOUT = "jpeg_compressibility", "shapes"
ARMS = ("unguarded", "guarded")


def arm_overrides(arm: str, args) -> list[str]:
    """The overrides of one arm: the hackable reward alone, audited by the held-out one; the guards."""
    out = [
        f"reward={{type: {TRAINED}, audit: {{heldout: {HELDOUT}}}}}",
        # the pretrained generator is the reference the drift term pulls towards (the guarded arm)
        f"policy.nft_ref_coef={args.guard_ref if arm == 'guarded' else 0.0}",
    ]
    if arm == "guarded" and args.guard_diversity > 0:
        out.append(f"reward.combine.weights={{model: 1.0, diversity: {args.guard_diversity}}}")
    return out


def curve(results: dict) -> list[dict]:
    """Evaluation points by iteration: the trained reward's mean (raw score), the held-out reward's
    mean and the images' diversity, from each evaluation's reward audit."""
    points = []
    for res in sorted(results.values(), key=lambda r: r["iteration"]):
        audit = res["reward_audit"]
        points.append(
            {
                "iteration": res["iteration"],
                "trained": round(audit["mean"], 4),
                "heldout": round(audit["heldout_mean"], 4),
                "heldout_sem": round(audit["heldout_sem"], 4),
                "diversity": round(audit["diversity"], 4) if "diversity" in audit else None,
            }
        )
    return points


def run_seed(seed: int, args) -> dict:
    from mmrl.experiment import build_trainer, load_experiment

    common = [
        f"run.output_dir={args.output_dir}/seed{seed}",
        f"run.seed={seed}",
        "trainer.resume=false",
        f"trainer.iterations={args.iterations}",
        f"trainer.eval_every={args.eval_every}",
        f"trainer.checkpoint_every={args.eval_every}",
        f"sim.eval_num_envs={args.eval_episodes}",
        f"trainer.eval_episodes={args.eval_episodes}",
        *(IMAGES.validation if args.validation else ()),
        *args.set,
    ]
    pretrained, _, _ = pretrain(
        seed, common, argparse.Namespace(output_dir=args.output_dir, reuse_pretrained=True, resume=False), IMAGES
    )
    out: dict = {}
    for arm in args.arms:
        cfg = load_experiment(ROOT / CONFIG, [*common, f"run.name={arm}", *arm_overrides(arm, args)])
        trainer = build_trainer(cfg)
        trainer.policy.gen.load_state_dict(pretrained)
        trainer.policy.after_warm_start()  # the reference and the old policy: the pretrained generator
        trainer.state.warm_started = True
        out[arm] = curve(trainer.run())
    start = out[args.arms[0]][0]
    print(
        f"\n[seed {seed}] pretrained: trained reward {start['trained']:.3f}, held-out {start['heldout']:.3f}, "
        f"diversity {start['diversity']:.3f}"
    )
    print(f"{'iter':>5} | " + " | ".join(f"{a:>9}: {'trained':>8} {'held-out':>8} {'divers.':>8}" for a in args.arms))
    for points in zip(*(out[a] for a in args.arms)):
        cells = [f"{'':>9}  {p['trained']:8.3f} {p['heldout']:8.3f} {fmt(p['diversity']):>8}" for p in points]
        print(f"{points[0]['iteration']:5d} | " + " | ".join(cells))
    print(f"load {os.getloadavg()[0]:.2f}", flush=True)
    return out


def stats(values: list) -> dict:
    """Per-seed values with their mean and sample std (over the seeds that measured it)."""
    known = [v for v in values if v is not None]
    return {
        "per_seed": values,
        "mean": round(statistics.fmean(known), 4) if known else None,
        "std": round(statistics.stdev(known), 4) if len(known) > 1 else (0.0 if known else None),
    }


def significantly_below(points: list[dict]) -> bool:
    """Whether the last evaluation's held-out mean is below the first's (the pretrained generator's) by
    more than twice the standard error of their difference: a fall larger than the evaluations' noise."""
    first, last = points[0], points[-1]
    noise = (first["heldout_sem"] ** 2 + last["heldout_sem"] ** 2) ** 0.5
    return last["heldout"] < first["heldout"] - 2 * noise


def fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main() -> None:
    from _smoke import parse_args, scratch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="run seeds 0..N-1 (100.. with --validation)")
    parser.add_argument("--validation", action="store_true", help="choose the guards' settings on validation prompts")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument(
        "--eval-episodes", type=int, default=252, help="images per evaluation (a multiple of the 42 prompts)"
    )
    parser.add_argument(
        "--guard-ref", type=float, default=1.5, help="policy.nft_ref_coef of the guarded arm (chosen on validation)"
    )
    parser.add_argument(
        "--guard-diversity", type=float, default=1.0, help="the diversity term's weight in the guarded arm (0: none)"
    )
    parser.add_argument(
        "--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to run (a sweep of the guards: guarded)"
    )
    parser.add_argument("--output-dir", default="runs/bench_reward_hacking")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every run")
    args = parse_args(
        parser,
        seeds=1,
        iterations=2,
        eval_every=1,
        output_dir=scratch,
        eval_episodes=84,  # each prompt twice: a diversity
        set=list(IMAGES.smoke),
    )
    if args.seeds < 1 or args.iterations < 1 or args.eval_every < 1:
        parser.error("--seeds, --iterations and --eval-every must be >= 1")
    first = VALIDATION_SEED if args.validation else 0
    seeds = list(range(first, first + args.seeds))
    runs = {s: run_seed(s, args) for s in seeds}
    result: dict = {
        "seeds": seeds,
        "split": "validation" if args.validation else "held-out",
        "trained_reward": TRAINED,
        "heldout_reward": HELDOUT,
        "guard_ref": args.guard_ref,
        "guard_diversity": args.guard_diversity,
        "iterations": args.iterations,
        "arms": args.arms,
        "pretrained": {
            k: stats([runs[s][args.arms[0]][0][k] for s in seeds]) for k in ("trained", "heldout", "diversity")
        },
    }
    for arm in args.arms:
        result[arm] = {k: stats([runs[s][arm][-1][k] for s in seeds]) for k in ("trained", "heldout", "diversity")}
        result[arm]["heldout_below_pretrained"] = sum(
            runs[s][arm][-1]["heldout"] < runs[s][arm][0]["heldout"] for s in seeds
        )
        result[arm]["heldout_significantly_below"] = sum(significantly_below(runs[s][arm]) for s in seeds)
    if set(args.arms) == set(ARMS):  # the issue's goal, read strictly and beyond the evaluations' noise
        g, u = result["guarded"], result["unguarded"]
        result["goal_met"] = g["heldout_below_pretrained"] == 0 and u["heldout_below_pretrained"] == len(seeds)
        result["goal_met_beyond_noise"] = g["heldout_significantly_below"] == 0 and u[
            "heldout_significantly_below"
        ] == len(seeds)
    result["curves"] = {str(s): runs[s] for s in seeds}
    for arm in args.arms:
        r = result[arm]
        pre = result["pretrained"]["heldout"]["mean"]
        print(
            f"{arm:>9}: trained {r['trained']['mean']:.3f} +- {r['trained']['std']:.3f}, held-out "
            f"{r['heldout']['mean']:.3f} +- {r['heldout']['std']:.3f} (pretrained {pre:.3f}), diversity "
            f"{fmt(r['diversity']['mean'])}; held-out below the pretrained generator's on "
            f"{r['heldout_below_pretrained']} of {len(seeds)} seeds ({r['heldout_significantly_below']} by more than "
            "twice the standard error)"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
