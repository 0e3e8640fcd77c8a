"""VLM quickstart: SFT warm start, then GRPO with a verifiable reward, held-out accuracy before/after.

    python benchmarks/vlm_grpo.py                    # configs/vlm_quickstart.yaml as it is
    python benchmarks/vlm_grpo.py trainer.iterations=20

Runs `configs/vlm_quickstart.yaml` (a tiny SmolVLM learning to count shapes, see the config) from
scratch in its own folder and measures greedy accuracy on the held-out questions after the SFT warm
start and after every ``trainer.eval_every`` RL iterations. ``wall_s`` is the whole run (model
build, SFT, RL and evaluations). The last line is one JSON object
``{"sft_accuracy", "rl_accuracy", "wall_s"}`` plus the curve and the SFT / RL split of the time.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(overrides: list[str]) -> None:
    from mmrl.experiment import build_trainer, load_experiment

    t0 = time.time()
    cfg = load_experiment(ROOT / "configs/vlm_quickstart.yaml",
                          ["run.output_dir=runs/bench_vlm", "trainer.resume=false", *overrides])
    trainer = build_trainer(cfg)
    results = trainer.run()
    wall = time.time() - t0
    points = sorted((r["iteration"], r["success_rate"], r["rl_seconds"]) for r in results.values())
    print(f"\n{'iter':>5} {'held-out acc':>13} {'rl s':>7}")
    for it, acc, s in points:
        print(f"{it:5d} {acc:13.3f} {s:7.1f}")
    sft, rl = results["start"]["success_rate"], results["final"]["success_rate"]
    print(f"held-out accuracy: SFT {sft:.3f} -> GRPO {rl:.3f} ({100 * (rl - sft):+.1f} points) in {wall:.0f} s")
    print(json.dumps({"sft_accuracy": round(sft, 4), "rl_accuracy": round(rl, 4), "wall_s": round(wall, 1),
                      "rl_s": round(results["final"]["rl_seconds"], 1), "eval_questions": results["final"]["episodes"],
                      "curve": [{"iteration": it, "accuracy": round(a, 4)} for it, a, _ in points]}))


if __name__ == "__main__":
    main(sys.argv[1:])
