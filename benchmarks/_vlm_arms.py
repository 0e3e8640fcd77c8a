"""A VLM benchmark of one config run as two arms per seed: the task as configured, and a baseline
arm that lacks what the task needs (one video frame, no tool), SFT then RL in both (a helper, not a
benchmark: `vlm_video.py` and `vlm_tools.py` are its commands).

Each (seed, arm) runs `vlm_grpo.run_seed` on the benchmark's config with the arm's overrides, in
``<out>/<arm><seed>``, and measures greedy accuracy after SFT and after RL on the held-out ``eval``
split (the trainer's evaluation) and on the ``validation`` split; ``--validation`` evaluates on
validation only (no policy ever answers a held-out question: the mode to choose settings in). The
baselines are `vlm_grpo`'s (``gold``: the gold answers through the reward; ``constant``: the best
single answer of the training pool). ``mean_turns`` and ``mean_tool_calls`` are the trainer's
per-episode means at the final evaluation of the main arm. The gain is RL minus SFT accuracy per seed,
its std the sample std (n - 1). The last line is one JSON object: the main arm's per-seed lists
unprefixed (``sft_accuracy``, ``rl_accuracy``, ``gain``, ...), the baseline arm's prefixed with its name.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

VAL = "validation"


@dataclass(frozen=True)
class ArmBenchmark:
    """What one benchmark of this kind fixes: its ``config``, its ``arms`` (name -> overrides; the
    first is the main arm, the second the baseline), its ``smoke`` overrides and run folder parent."""

    doc: str
    config: Path
    arms: dict[str, list[str]]
    smoke: list[str]
    out: str


def run_arm(args: tuple) -> dict:
    """One (seed, arm) run (`vlm_grpo.run_seed`); a process pool's task."""
    from vlm_grpo import run_seed

    seed, arm, split, out, overrides, bench = args
    r = run_seed(seed, split, Path(out), [*overrides, *bench.arms[arm]], config=bench.config, val_split=VAL, name=arm)
    r["arm"] = arm
    return r


def main(bench: ArmBenchmark, argv: list[str] | None = None) -> dict:
    """Parse the command line, run the seeds' arms, print a summary and the JSON line (returned)."""
    from _smoke import parse_args, scratch
    from mmrl.utils.processes import side_by_side
    from vlm_grpo import mean_std

    names = list(bench.arms)
    main_arm, base_arm = names[0], names[1]
    p = argparse.ArgumentParser(
        description=bench.doc.split("\n")[0], epilog=bench.doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, default=3, help="run seeds 0 .. N-1 (default 3)")
    p.add_argument("--jobs", type=int, default=1, help="runs side by side, each in its own process (default 1)")
    p.add_argument(
        "--validation",
        action="store_true",
        help="choose settings: evaluate on the validation split only (the held-out split is never answered)",
    )
    p.add_argument("--arms", nargs="+", choices=names, default=names, help="which runs per seed")
    p.add_argument("--out", default=bench.out, help="parent folder of the per-seed runs")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. trainer.iterations=20")
    a = parse_args(p, argv, seeds=1, out=scratch)
    if a.smoke:
        a.overrides = [*bench.smoke, *a.overrides]
    if a.seeds < 1 or a.jobs < 1:
        p.error("--seeds and --jobs must be >= 1")
    split = VAL if a.validation else "eval"
    t0 = time.time()
    tasks = [(seed, arm, split, a.out, a.overrides, bench) for seed in range(a.seeds) for arm in a.arms]
    done = side_by_side(run_arm, tasks, jobs=a.jobs, context=None)  # --jobs > 1: each arm in its own process
    runs = {arm: [r for r in done if r["arm"] == arm] for arm in a.arms}
    for r in done:
        sft, rl = r["sft"][split]["all"], r["rl"][split]["all"]
        other = f"; {VAL} {r['sft'][VAL]['all']:.3f} -> {r['rl'][VAL]['all']:.3f}" if split != VAL else ""
        print(
            f"[seed {r['seed']} {r['arm']}] {split} accuracy: SFT {sft:.3f} -> RL {rl:.3f} "
            f"({100 * (rl - sft):+.1f} points){other}; tool calls per episode {r['tool_calls']['rl']:.2f}; "
            f"{r['wall_s']:.0f} s",
            flush=True,
        )

    def per_seed(arm: str, stage: str, on: str = split) -> list[float]:
        return [round(r[stage][on]["all"], 4) for r in runs.get(arm, [])]

    def ms(values: list[float]) -> list[float] | None:
        return [round(v, 4) for v in mean_std(values)] if values else None

    fig: dict = {"split": split, "seeds": list(range(a.seeds))}
    print(f"\n{split} accuracy over seeds {list(range(a.seeds))} (mean +- std, n - 1):")
    for arm in names:
        if arm not in runs:
            continue
        key = "" if arm == main_arm else f"{arm}_"
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
    main_runs = runs.get(main_arm, done)
    turns = mean_std([r["turns"]["rl"] for r in main_runs])[0]
    calls = mean_std([r["tool_calls"]["rl"] for r in main_runs])[0]
    if main_arm in runs and base_arm in runs:
        above = [v > s for v, s in zip(per_seed(main_arm, "rl"), per_seed(base_arm, "rl"))]
        print(f"  {main_arm} RL above {base_arm} RL: {sum(above)} of {len(above)} seeds")
        fig[f"rl_above_{base_arm}"] = above
    print(
        f"  baselines: gold {base['gold']['all']:.3f}, constant {base['constant']['all']:.3f} "
        f"({base['constant_answers']}); {first['episodes']} questions; {main_arm}: mean turns {turns:.2f}, "
        f"tool calls {calls:.2f} per episode; {time.time() - t0:.0f} s"
    )
    fig.update(
        {
            "gold": round(base["gold"]["all"], 4),
            "constant_accuracy": round(base["constant"]["all"], 4),
            "constant_answers": base["constant_answers"],
            "eval_questions": first["episodes"],
            "mean_turns": round(turns, 4),
            "mean_tool_calls": round(calls, 4),
            "wall_s": {arm: [round(r["wall_s"], 1) for r in rs] for arm, rs in runs.items()},
            "curves": {arm: [[[it, round(acc, 4)] for it, acc in r["curve"]] for r in rs] for arm, rs in runs.items()},
            "overrides": a.overrides,
        }
    )
    print(json.dumps(fig))
    return fig
