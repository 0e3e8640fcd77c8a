"""Run a validation sweep of `benchmarks/vs_sb3.py` runs side by side, one process and one torch
thread per (variant, seed), on a machine with many cores (the GPU machine's 16 CPU cores), under
one wall-clock limit; then summarise each run's learning curve from its metrics.jsonl.

    python scripts/parallel_sweep.py --task Ant-v5 --env-steps 1000000 --limit 480 \\
        --variant template= --variant anneal05=policy.noise_level_final=0.5 \\
        --variant gaussian=@gaussian --out $OUT

A variant is ``NAME=OVERRIDES`` (space-separated dotted overrides; ``@gaussian`` as the first word
runs vs_sb3's Gaussian side instead of the flow policy). Seeds are vs_sb3's validation seeds
(``--validation``: from 100, evaluated on the validation episodes), never the reported ones.

A run still going at ``--limit`` seconds is stopped there; its curve up to then is kept (one
metrics row per iteration, an evaluation every ``--eval-every`` iterations). Writes under ``--out``:
``sweep.json`` (per run: env steps reached, the held-out evaluations (env steps, return), the
training episodes' return and length and reward per step over each quarter of the run, the
final result when it finished) and ``sweep.log`` (every run's output, prefixed by its name); prints
one JSON line of per-variant means.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from vs_sb3 import TAG, child_command  # noqa: E402  (the benchmark's own child runs)


def curve(metrics: Path) -> dict:
    """A run's held-out evaluations and its training episodes by quarter of the iterations logged."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    evals = [(int(r["eval/env_steps"]), round(r["eval/return"], 1)) for r in rows if "eval/return" in r]
    train = [r for r in rows if "train/return" in r]
    quarters = []
    for q in range(4):
        part = train[q * len(train) // 4 : (q + 1) * len(train) // 4]
        if part:
            ret = statistics.mean(r["train/return"] for r in part)
            length = statistics.mean(r["train/length"] for r in part)
            quarters.append({"return": round(ret, 1), "length": round(length, 1), "per_step": round(ret / length, 3)})
    last = train[-1] if train else {}
    return {
        "env_steps": int(last.get("train/env_steps", 0)),
        "evals": evals,
        "train_quarters": quarters,
        "noise_level": last.get("train/noise_level"),
        "entropy": last.get("train/entropy"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="Ant-v5")
    p.add_argument("--env-steps", type=int, default=1_000_000)
    p.add_argument("--seeds", default="100,101,102")
    p.add_argument("--variant", action="append", required=True, help="NAME=OVERRIDES (repeatable)")
    p.add_argument("--limit", type=float, default=480.0, help="wall seconds for the whole sweep")
    p.add_argument("--eval-every", type=int, default=100, help="iterations between held-out evaluations")
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--out", default="sweep_out")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = out / "runs"
    jobs = []
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        words = rest.split()
        side = "gaussian" if words[:1] == ["@gaussian"] else "flow"
        overrides = words[1:] if side == "gaussian" else words
        for seed in (int(s) for s in args.seeds.split(",")):
            run = f"{name}_{seed}"
            child = argparse.Namespace(
                eval_episodes=args.eval_episodes,
                validation=True,
                overrides=[
                    f"run.name={run}",
                    f"run.output_dir={runs_dir}",
                    f"trainer.eval_every={args.eval_every}",
                    "trainer.video_episodes=0",
                    *overrides,
                ],
            )
            cmd, env = child_command(side, args.task, seed, args.env_steps, child)
            log = (out / f"{run}.log").open("w")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            jobs.append({"variant": name, "seed": seed, "run": run, "proc": proc, "log": log})
    print(f"parallel_sweep: {len(jobs)} runs started", flush=True)
    t0 = time.time()
    while any(j["proc"].poll() is None for j in jobs) and time.time() - t0 < args.limit:
        time.sleep(5)
    for j in jobs:
        if j["proc"].poll() is None:
            j["proc"].terminate()
            j["stopped"] = True
    for j in jobs:
        try:
            j["proc"].wait(timeout=20)
        except subprocess.TimeoutExpired:
            j["proc"].kill()
        j["log"].close()
    results, merged = [], []
    for j in jobs:
        text = (out / f"{j['run']}.log").read_text(errors="replace")
        merged += [f"[{j['run']}] {line}" for line in text.splitlines()[-40:]]
        final = [json.loads(line[len(TAG) :]) for line in text.splitlines() if line.startswith(TAG)]
        results.append(
            {
                "variant": j["variant"],
                "seed": j["seed"],
                "finished": bool(final),
                "stopped_at_limit": j.get("stopped", False),
                "final": final[-1] if final else None,
                "wall_s": round(time.time() - t0, 1),
                **curve(runs_dir / j["run"] / "metrics.jsonl"),
            }
        )
    (out / "sweep.log").write_text("\n".join(merged) + "\n")
    summary: dict = {"task": args.task, "env_steps": args.env_steps, "limit_s": args.limit, "variants": {}}
    for name in dict.fromkeys(r["variant"] for r in results):
        mine = [r for r in results if r["variant"] == name]
        last_eval = [r["evals"][-1][1] for r in mine if r["evals"]]
        summary["variants"][name] = {
            "env_steps": [r["env_steps"] for r in mine],
            "last_eval_return": last_eval,
            "last_eval_mean": round(statistics.mean(last_eval), 1) if last_eval else None,
            "last_quarter_per_step": [(r["train_quarters"] or [{}])[-1].get("per_step") for r in mine],
        }
    (out / "sweep.json").write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
