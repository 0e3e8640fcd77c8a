"""Quickstart benchmark: warm start on a few demonstrations, then RL; held-out success of both.

    python benchmarks/quickstart.py                                  # configs/quickstart.yaml
    python benchmarks/quickstart.py --config configs/quickstart_grpo.yaml
    python benchmarks/quickstart.py --variants                       # + Flow-Noise and GRPO configs

Each run starts from scratch in ``runs/bench_<config>`` (no resume). The last line is one JSON
object: ``{"sft_success", "rl_success", "episodes", "wall_s"}`` for the main config (success rates
in 0-1 over ``episodes`` held-out episodes each; wall time of the whole run, data generation and
both evaluations included), plus ``"variants"`` with the same figures per variant config.
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

VARIANTS = ["configs/quickstart_flow_noise.yaml", "configs/quickstart_grpo.yaml"]


def run_config(path: str, overrides: list[str]) -> dict:
    from mmrl.experiment import build_trainer, load_experiment, output_dir

    name = f"bench_{Path(path).stem}"
    cfg = load_experiment(ROOT / path, [f"run.name={name}", "trainer.resume=false", *overrides])
    shutil.rmtree(output_dir(cfg), ignore_errors=True)
    t0 = time.time()
    results = build_trainer(cfg).run()
    wall = time.time() - t0
    curve = [json.loads(line) for line in (output_dir(cfg) / "metrics.jsonl").read_text().splitlines()]
    train_success = [round(r["train/success"], 3) for r in curve if "train/success" in r]
    print(f"{path}: train success per iteration {train_success}")
    print(f"{path}: warm start {results['start']['success_rate']:.3f} -> RL {results['final']['success_rate']:.3f} "
          f"in {wall:.0f} s")
    return {
        "sft_success": results["start"]["success_rate"],
        "rl_success": results["final"]["success_rate"],
        "episodes": results["final"]["episodes"],
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--variants", action="store_true", help="also run the Flow-Noise and GRPO configs")
    parser.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    args = parser.parse_args()
    figures = run_config(args.config, args.overrides)
    if args.variants:
        figures["variants"] = {Path(v).stem: run_config(v, args.overrides) for v in VARIANTS}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
