"""The PPO gradient on the flow template's action log-std over a run's first iterations, per task
(issue 33's diagnostic): per iteration, the mean over its minibatch steps (the signal, per action
dimension, then averaged), the std over those steps (the noise) and their ratio.

    python scripts/log_std_grad.py --tasks Ant-v5,Hopper-v5 --seed 100 --iterations 3

Adam moves the log-std by about the learning rate per step whenever the gradient's sign holds,
whatever its size; an update proportional to the gradient would move each task's noise at the rate
its mean gradient says. One JSON line per task.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def measure(task: str, seed: int, iterations: int, output_dir: str) -> dict:
    import torch

    from mmrl.experiment import build_trainer, load_experiment
    from vs_sb3 import task_config

    cfg = load_experiment(
        task_config(task),
        [
            f"run.name=log_std_grad_{task}_{seed}",
            f"run.output_dir={output_dir}",
            "trainer.resume=false",
            f"run.seed={seed}",
            "run.threads=1",
            "trainer.checkpoint_every=1000000",
            "trainer.eval_episodes=1",
            "trainer.eval_every=1000000",
        ],
    )
    cfg.trainer.env_steps = iterations * cfg.sim.num_envs * cfg.trainer.rollout_steps  # whole iterations
    trainer = build_trainer(cfg)
    param = trainer.policy.action_log_std
    if param is None:
        raise SystemExit(f"{task}: the template's policy has no learned action std (policy.action_noise)")
    grads: list = []
    param.register_hook(lambda g: grads.append(g.detach().clone()))
    trainer.run()
    steps = torch.stack(grads)  # [minibatch steps, action_dim]
    per = len(grads) // iterations
    rows = []
    for i in range(iterations):
        block = steps[i * per : (i + 1) * per]
        mean, std = block.mean(0), block.std(0)
        rows.append(
            {
                "iteration": i,
                "mean_grad": round(mean.mean().item(), 5),  # > 0: the descent lowers the std
                "std_grad": round(std.mean().item(), 5),
                "snr": round((mean.abs() / (std + 1e-12)).mean().item(), 3),
            }
        )
    return {"task": task, "seed": seed, "log_std_end": [round(v, 3) for v in param.detach().tolist()], "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="Ant-v5,Hopper-v5,HalfCheetah-v5,Walker2d-v5,Swimmer-v5")
    p.add_argument("--seed", type=int, default=100, help="a validation seed (vs_sb3's start at 100)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--output-dir", default="runs/log_std_grad")
    args = p.parse_args()
    for task in args.tasks.split(","):
        print(json.dumps(measure(task.strip(), args.seed, args.iterations, args.output_dir)), flush=True)


if __name__ == "__main__":
    main()
