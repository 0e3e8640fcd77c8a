"""Video QA: SFT, then GRPO with a verifiable reward; held-out accuracy against a single-frame baseline, over seeds.

    python benchmarks/vlm_video.py                     # configs/vlm_video_qa.yaml, seeds 0, 1, 2
    python benchmarks/vlm_video.py --jobs 2            # two seeds' runs side by side
    python benchmarks/vlm_video.py --validation trainer.lr=3e-4   # choosing settings: validation split only
    python benchmarks/vlm_video.py --smoke             # seconds: 2 iterations, no figure

Each seed runs `configs/vlm_video_qa.yaml` (a tiny Qwen2.5-VL answering "which direction does the
shape move?" about 8-frame clips, see the config) twice from scratch with ``run.seed`` = the seed:

- ``video``: as configured (several frames per clip through Qwen's video path), in
  ``runs/bench_vlm_video/video<seed>``;
- ``single_frame``: the same pipeline, SFT and RL alike, given ONE frame of each clip
  (``policy.video_max_frames=1``): the answer is then a guess from where the shape is, the baseline
  the video run must beat, in ``runs/bench_vlm_video/single_frame<seed>``.

Both measure greedy accuracy after the SFT warm start ("SFT") and after the RL iterations ("RL") on
the held-out ``eval`` split of moving_shapes_vqa ((colour, shape, direction) combinations never
trained on; the trainer's own evaluation, ``trainer.eval_episodes`` questions) and on its
``validation`` split (a third disjoint pool of combinations, see its CARD.md). ``--validation``
evaluates on validation only, the trainer's evaluations too: no policy ever answers a held-out
question; that is the mode to choose settings in. The per-question evaluation is
`benchmarks/vlm_grpo.py`'s, as are the baselines: ``gold`` (the gold answers through the same
reward: 1.0, the reward can score every answer) and ``constant`` (the single answer scoring best on
the RL training pool, answered to every question). ``mean_turns`` is the trainer's mean episode
length at the final evaluation (model turns per episode; 1: one answer); ``mean_tool_calls`` is 0
because the QA simulator offers no tools. The gain is RL minus SFT accuracy per seed, its std the
sample std (n - 1). The last line is one JSON object with the per-seed lists and the means.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
CONFIG = ROOT / "configs/vlm_video_qa.yaml"
VAL = "validation"
ARMS = {"video": [], "single_frame": ["policy.video_max_frames=1"]}  # arm -> its overrides
SMOKE = [
    "sim.num_envs=4",
    "sim.eval_num_envs=8",
    "sim.kwargs.dataset_kwargs={num_samples: 16, num_frames: 8, image_size: 32, fps: 4.0}",
    "warm_start.num_episodes=8",
    "warm_start.steps=2",
    "warm_start.warmup_steps=0",
    "warm_start.batch_size=8",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=8",
    "trainer.iterations=2",
    "trainer.eval_episodes=8",
    "trainer.checkpoint_every=2",
    "trainer.eval_every=2",
]  # --smoke


def run_arm(args: tuple) -> dict:
    """One (seed, arm) run (`vlm_grpo.run_seed` on this benchmark's config); a process pool's task."""
    from vlm_grpo import run_seed

    seed, arm, split, out, overrides = args
    r = run_seed(seed, split, Path(out), [*overrides, *ARMS[arm]], config=CONFIG, val_split=VAL, name=arm)
    r["arm"] = arm
    return r


def main(argv: list[str] | None = None) -> None:
    from _smoke import parse_args, scratch
    from vlm_grpo import mean_std

    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, default=3, help="run seeds 0 .. N-1 (default 3)")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side, each in its own process (default 1)")
    p.add_argument(
        "--validation",
        action="store_true",
        help="choose settings: evaluate on the validation split only (the held-out split is never answered)",
    )
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="which runs per seed")
    p.add_argument("--out", default="runs/bench_vlm_video", help="parent folder of the per-seed runs")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. trainer.iterations=20")
    a = parse_args(p, argv, seeds=1, out=scratch)
    if a.smoke:
        a.overrides = [*SMOKE, *a.overrides]
    if a.seeds < 1 or a.jobs < 1:
        p.error("--seeds and --jobs must be >= 1")
    split = VAL if a.validation else "eval"
    t0 = time.time()
    tasks = [(seed, arm, split, a.out, a.overrides) for seed in range(a.seeds) for arm in a.arms]
    if a.jobs == 1:
        done = [run_arm(t) for t in tasks]
    else:
        with ProcessPoolExecutor(a.jobs) as pool:
            done = list(pool.map(run_arm, tasks))
    runs = {arm: [r for r in done if r["arm"] == arm] for arm in a.arms}
    for r in done:
        sft, rl = r["sft"][split]["all"], r["rl"][split]["all"]
        other = f"; {VAL} {r['sft'][VAL]['all']:.3f} -> {r['rl'][VAL]['all']:.3f}" if split != VAL else ""
        print(
            f"[seed {r['seed']} {r['arm']}] {split} accuracy: SFT {sft:.3f} -> RL {rl:.3f} "
            f"({100 * (rl - sft):+.1f} points){other}; {r['wall_s']:.0f} s",
            flush=True,
        )

    def per_seed(arm: str, stage: str, on: str = split) -> list[float]:
        return [round(r[stage][on]["all"], 4) for r in runs.get(arm, [])]

    def ms(values: list[float]) -> list[float] | None:
        return [round(v, 4) for v in mean_std(values)] if values else None

    fig: dict = {"split": split, "seeds": list(range(a.seeds))}
    print(f"\n{split} accuracy over seeds {list(range(a.seeds))} (mean +- std, n - 1):")
    for arm, key in (("video", ""), ("single_frame", "single_frame_")):
        if arm not in runs:
            continue
        sft, rl = per_seed(arm, "sft"), per_seed(arm, "rl")
        gain = [round(y - x, 4) for x, y in zip(sft, rl)]
        (g_mean, g_std) = mean_std(gain)
        print(
            f"  {arm:>12s}: SFT {sft} -> RL {rl}; mean {mean_std(sft)[0]:.3f} -> {mean_std(rl)[0]:.3f}, "
            f"gain {100 * g_mean:+.1f} +- {100 * g_std:.1f} points (gain > 2 std: {g_mean > 2 * g_std})"
        )
        fig.update(
            {
                f"{key}sft_accuracy": sft,
                f"{key}rl_accuracy": rl,
                f"{key}gain": gain,
                f"{key}sft_mean_std": ms(sft),
                f"{key}rl_mean_std": ms(rl),
                f"{key}gain_mean_std": ms(gain),
            }
        )
        if split != VAL:
            fig.update(
                {
                    f"{key}{VAL}_sft_accuracy": per_seed(arm, "sft", VAL),
                    f"{key}{VAL}_rl_accuracy": per_seed(arm, "rl", VAL),
                }
            )
    first = done[0]
    base = first["baselines"]
    rl_turns = [r["turns"]["rl"] for r in runs.get("video", done)]
    if "video" in runs and "single_frame" in runs:
        above = [v > s for v, s in zip(per_seed("video", "rl"), per_seed("single_frame", "rl"))]
        print(f"  video RL above single-frame RL: {sum(above)} of {len(above)} seeds")
        fig["rl_above_single_frame"] = above
    print(
        f"  baselines: gold {base['gold']['all']:.3f}, constant {base['constant']['all']:.3f} "
        f"({base['constant_answers']}); {first['episodes']} questions; mean turns {mean_std(rl_turns)[0]:.2f}, "
        f"tool calls 0 (no tools); {time.time() - t0:.0f} s"
    )
    fig.update(
        {
            "gold": round(base["gold"]["all"], 4),
            "constant_accuracy": round(base["constant"]["all"], 4),
            "constant_answers": base["constant_answers"],
            "eval_questions": first["episodes"],
            "mean_turns": round(mean_std(rl_turns)[0], 4),
            "mean_tool_calls": 0,
            "wall_s": {arm: [round(r["wall_s"], 1) for r in rs] for arm, rs in runs.items()},
            "curves": {arm: [[[it, round(acc, 4)] for it, acc in r["curve"]] for r in rs] for arm, rs in runs.items()},
            "overrides": a.overrides,
        }
    )
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
