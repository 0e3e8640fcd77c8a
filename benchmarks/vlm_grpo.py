"""VLM quickstart: few-shot SFT, then GRPO with a verifiable reward; held-out accuracy before and after, over seeds.

    python benchmarks/vlm_grpo.py                       # configs/vlm_quickstart.yaml, seeds 0, 1, 2
    python benchmarks/vlm_grpo.py --seeds 5
    python benchmarks/vlm_grpo.py --split val trainer.lr=3e-4     # tuning: validation split only
    python benchmarks/vlm_grpo.py --smoke                         # seconds: 2 iterations, no figure

Each seed runs `configs/vlm_quickstart.yaml` (a tiny SmolVLM answering count and colour questions
about 32 px shapes, see the config) from scratch with ``run.seed`` = the seed, in
``runs/bench_vlm/s<seed>``, and measures greedy accuracy after the SFT warm start ("SFT") and after
the RL iterations ("RL"), overall and per task, on

- the held-out ``eval`` split: the trainer's own evaluation (``trainer.eval_episodes`` questions,
  reset seed ``trainer.eval_seed + e``); the per-task figures split exactly those episodes by the
  task of their question (and must average back to the trainer's number, which is checked);
- the ``val`` split (shapes_vqa scenes disjoint from train and eval): the same number of
  questions, for choosing settings. ``--split val`` evaluates on val only (the trainer's evaluations
  too), no policy ever answers a held-out question: that is the mode to tune in.

Baselines, printed beside the result (seed-independent: the pool and the evaluation questions do not
depend on ``run.seed``): ``gold_accuracy``, the gold answers of the evaluated questions through the
same reward (must be 1.0: the reward can score every answer); ``constant_accuracy``, per task the
single answer scoring best on the RL training pool (through the reward), answered to every
evaluated question of that task. The gain is RL minus SFT accuracy per seed; its std is the sample
std (n - 1). The last line is one JSON object with the per-seed lists and the means.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CONFIG = ROOT / "configs/vlm_quickstart.yaml"
SMOKE = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs.dataset_kwargs={num_samples: 64, tasks: [count, color]}",
    "warm_start.num_episodes=8",
    "warm_start.steps=2",
    "warm_start.batch_size=8",
    "algorithm.minibatch_size=8",
    "trainer.iterations=2",
    "trainer.eval_episodes=8",
    "trainer.checkpoint_every=2",
]  # --smoke


def mean_std(values: list[float]) -> tuple[float, float]:
    """(mean, sample std with n - 1; 0 for one value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def episode_tasks(sim, seeds: list[int]) -> list[str]:
    """The task of the question each reset seed deals (QASim data order), "all" without one."""
    return [str(sim.meta[q].get("task", "all")) for q in sim.question_index(seeds).tolist()]


def by_task(correct: list[bool], tasks: list[str]) -> dict[str, float]:
    """Accuracy per task and overall ("all") of per-episode results."""
    out = {t: statistics.fmean(c for c, k in zip(correct, tasks) if k == t) for t in sorted(set(tasks))}
    out["all"] = statistics.fmean(correct)
    return out


def accuracy_by_task(policy, sim, reward, episodes: int, seed: int, generator) -> dict[str, float]:
    """Greedy accuracy over ``episodes`` questions, episode e reset with seed ``seed + e`` in batches
    of ``sim.num_envs`` (the episodes `mmrl.rollout.evaluate_policy` runs) scored by the reward stage
    ``reward``, per task."""
    from mmrl.rollout import collect_episodes

    was_training = policy.training
    policy.eval()
    correct, tasks = [], []
    while len(correct) < episodes:
        seeds = [seed + len(correct) + i for i in range(sim.num_envs)]
        _, info = collect_episodes(policy, sim, seeds, generator, mode="eval", reward=reward)
        take = min(sim.num_envs, episodes - len(correct))
        correct += info["success"][:take].tolist()
        tasks += episode_tasks(sim, seeds[:take])
    policy.train(was_training)
    return by_task(correct, tasks)


def baselines(train_sim, sim, reward, episodes: int, seed: int) -> dict:
    """Gold and best-constant accuracy on the evaluated questions, scored by the reward model
    ``reward``; the constant of a task is chosen on the training pool (``train_sim``'s questions)."""
    qs = sim.question_index([seed + e for e in range(episodes)]).tolist()
    tasks = [str(sim.meta[q].get("task", "all")) for q in qs]

    def score(answers: list[str], questions: list[int], s) -> list[bool]:
        return (reward(answers, [s.prompts[q] for q in questions], [s.meta[q] for q in questions]) >= 1.0).tolist()

    gold = score([sim.solutions[q] for q in qs], qs, sim)
    constants = {}
    for task in sorted(set(tasks)):
        pool = [i for i, m in enumerate(train_sim.meta) if str(m.get("task", "all")) == task]
        candidates = sorted(Counter(train_sim.solutions[i] for i in pool))
        constants[task] = max(candidates, key=lambda a: (sum(score([a] * len(pool), pool, train_sim)), a))
    constant = score([constants[t] for t in tasks], qs, sim)
    return {
        "gold": by_task(gold, tasks),
        "constant": by_task(constant, tasks),
        "constant_answers": constants,
        "questions": dict(Counter(tasks)),
    }


def run_seed(
    seed: int,
    split: str,
    out: Path,
    overrides: list[str],
    config: Path = CONFIG,
    val_split: str = "val",
    name: str = "s",
) -> dict:
    """One seed of ``config`` in ``out/<name><seed>``: accuracy per task after SFT and after RL on
    ``split`` (and on ``val_split`` unless ``split`` is it; then the held-out split is never built)."""
    from mmrl.experiment import build_trainer, load_experiment, output_dir
    from mmrl.registry import SIMULATORS

    t0 = time.time()
    cfg = load_experiment(
        config,
        [f"run.output_dir={out}", f"run.name={name}{seed}", f"run.seed={seed}", "trainer.resume=false", *overrides],
    )
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    trainer = build_trainer(cfg)
    val_sim = SIMULATORS.build(
        cfg.sim.type,
        num_envs=cfg.sim.eval_num_envs,
        seed=seed + 2,
        device=cfg.run.device,
        **{**cfg.sim.kwargs, "split": val_split},
    )
    if split == val_split:  # tuning: the trainer's own evaluations run on val, the held-out split is never built
        trainer.eval_sim = val_sim
    t = cfg.trainer
    found: dict[str, dict] = {}
    evaluate = trainer.evaluate

    def evaluate_with_tasks(name: str) -> dict:
        res = evaluate(name)
        if name in ("start", "final"):
            row = {
                split: accuracy_by_task(
                    trainer.policy,
                    trainer.eval_sim,
                    trainer.reward_stage,
                    t.eval_episodes,
                    t.eval_seed,
                    trainer.generator("eval", 0),
                )
            }
            # the trainer's rate is a float32 mean (5e-9 off at 22 of 96); one episode moves it by >= 1 / episodes
            if abs(row[split]["all"] - res["success_rate"]) > 1e-6:
                raise RuntimeError(
                    f"per-task evaluation ({row[split]['all']}) disagrees with the trainer's "
                    f"({res['success_rate']}): not the same episodes"
                )
            if split != val_split:
                row[val_split] = accuracy_by_task(
                    trainer.policy,
                    val_sim,
                    trainer.reward_stage,
                    t.eval_episodes,
                    t.eval_seed,
                    trainer.generator("eval", 0),
                )
            found[name] = row
        return res

    trainer.evaluate = evaluate_with_tasks
    results = trainer.run()
    curve = sorted((r["iteration"], r["success_rate"]) for r in results.values())
    base = baselines(trainer.sim, trainer.eval_sim, trainer.reward_stage.model, t.eval_episodes, t.eval_seed)
    return {
        "seed": seed,
        "sft": found["start"],
        "rl": found["final"],
        "curve": curve,
        "baselines": base,
        "wall_s": time.time() - t0,
        "rl_s": results["final"]["rl_seconds"],
        "episodes": results["final"]["episodes"],
        "turns": {"sft": results["start"]["length"], "rl": results["final"]["length"]},  # per episode
        "tool_calls": {k: results[e].get("tool_calls", 0.0) for k, e in (("sft", "start"), ("rl", "final"))},
    }


def main(argv: list[str] | None = None) -> None:
    from _smoke import parse_args, scratch

    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, default=3, help="run seeds 0 .. N-1 (default 3)")
    p.add_argument(
        "--split",
        choices=["eval", "val"],
        default="eval",
        help="eval: report on the held-out split (and val); val: tune on val only",
    )
    p.add_argument("--out", default="runs/bench_vlm", help="parent folder of the per-seed runs")
    p.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. trainer.iterations=20")
    a = parse_args(p, argv, seeds=1, out=scratch)
    if a.smoke:
        a.overrides = [*SMOKE, *a.overrides]
    if a.seeds < 1:
        p.error("--seeds must be >= 1")
    runs = []
    for seed in range(a.seeds):
        r = run_seed(seed, a.split, Path(a.out), a.overrides)
        runs.append(r)
        sft, rl = r["sft"][a.split], r["rl"][a.split]
        print(
            f"[seed {seed}] {a.split} accuracy: SFT {sft['all']:.3f} -> RL {rl['all']:.3f} "
            f"({100 * (rl['all'] - sft['all']):+.1f} points); per task "
            + ", ".join(f"{k} {sft[k]:.3f} -> {rl[k]:.3f}" for k in sft if k != "all")
            + (f"; val {r['sft']['val']['all']:.3f} -> {r['rl']['val']['all']:.3f}" if a.split != "val" else "")
            + f"; {r['wall_s']:.0f} s",
            flush=True,
        )

    split, base = a.split, runs[0]["baselines"]
    tasks = [k for k in runs[0]["sft"][split] if k != "all"]

    def per_seed(stage: str, on: str, task: str = "all") -> list[float]:
        return [round(r[stage][on][task], 4) for r in runs]

    gains = [round(r["rl"][split]["all"] - r["sft"][split]["all"], 4) for r in runs]
    g_mean, g_std = mean_std(gains)
    print(f"\n{'seed':>6} " + " ".join(f"{f'SFT {k}':>10} {f'RL {k}':>10}" for k in ["all", *tasks]) + f" {'gain':>7}")
    for r, g in zip(runs, gains):
        print(
            f"{r['seed']:6d} "
            + " ".join(f"{r['sft'][split][k]:10.3f} {r['rl'][split][k]:10.3f}" for k in ["all", *tasks])
            + f" {g:+7.3f}"
        )
    for name in ("gold", "constant"):
        print(f"{name:>8s} " + " ".join(f"{base[name][k]:10.3f} {'':10s}" for k in ["all", *tasks]))
    print(
        f"questions per task ({split}): {base['questions']}; constant answers (chosen on the training pool): "
        f"{base['constant_answers']}"
    )
    print(
        f"{split} accuracy over {len(runs)} seeds: SFT {mean_std(per_seed('sft', split))[0]:.3f} -> RL "
        f"{mean_std(per_seed('rl', split))[0]:.3f}; gain {100 * g_mean:+.1f} +- {100 * g_std:.1f} points "
        f"(std over seeds; gain > 2 std: {g_mean > 2 * g_std})"
    )
    fig = {
        "split": split,
        "seeds": [r["seed"] for r in runs],
        "eval_questions": runs[0]["episodes"],
        "sft_accuracy": per_seed("sft", split),
        "rl_accuracy": per_seed("rl", split),
        "gain": gains,
        "mean_sft_accuracy": round(mean_std(per_seed("sft", split))[0], 4),
        "mean_rl_accuracy": round(mean_std(per_seed("rl", split))[0], 4),
        "mean_gain": round(g_mean, 4),
        "std_gain": round(g_std, 4),
        "sft_by_task": {k: per_seed("sft", split, k) for k in tasks},
        "rl_by_task": {k: per_seed("rl", split, k) for k in tasks},
        "gold_accuracy": round(base["gold"]["all"], 4),
        "constant_accuracy": round(base["constant"]["all"], 4),
        "constant_by_task": {k: round(base["constant"][k], 4) for k in tasks},
        "constant_answers": base["constant_answers"],
    }
    if split != "val":
        fig.update({"val_sft_accuracy": per_seed("sft", "val"), "val_rl_accuracy": per_seed("rl", "val")})
    fig.update(
        {
            "wall_s": [round(r["wall_s"], 1) for r in runs],
            "rl_s": [round(r["rl_s"], 1) for r in runs],
            "curves": [[[it, round(acc, 4)] for it, acc in r["curve"]] for r in runs],
            "overrides": a.overrides,
        }
    )
    print(json.dumps(fig))


if __name__ == "__main__":
    main()
