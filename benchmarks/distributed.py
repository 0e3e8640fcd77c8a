"""Several ranks on this machine (issue 29): do N ranks train what one process trains, how fast, and
what does sharding save in memory?

    .venv/bin/python benchmarks/distributed.py            # a few minutes on 2 cores
    .venv/bin/python benchmarks/distributed.py --smoke    # the whole code path, tiny

1. ``max_param_diff_ddp`` / ``max_param_diff_fsdp`` / ``max_param_diff_zero3``: the short quickstart
   (PPO + GAE, dense reward, ``--iterations`` iterations) on 2 ranks x N envs with
   ``trainer.engine.backend`` torch (DDP), fsdp (FSDP2) and deepspeed with ``zero_stage: 3``, against
   1 process x 2N envs: the largest parameter difference over ``--seeds``.
2. ``samples_per_s``: env steps per second of RL (``rl_seconds`` of the run: collection and update,
   no evaluation or checkpoints) on 1, 2 and 4 ranks sharing one global batch of ``--envs`` envs.
   On this 2-core machine 2 ranks have a core each and 4 ranks share them: the figure says what
   the launcher and gathering cost here, not what GPUs would gain.
3. ``param_optim_bytes_per_rank``: the bytes of parameters and Adam state one rank holds after one
   step of the flow VLA with a wide action expert (``--expert-dim``, ``--expert-layers``: 50M
   trainable parameters by default), DDP against FSDP2 on 2 ranks, and their ratio.

Every run is ``torchrun --standalone -m mmrl train`` (or this file under torchrun for 3.), gloo on
the CPU. The last line is one JSON object with those figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests.distributed.launch import env, max_diff, results, torchrun, train_cmd, weights  # noqa: E402


def launch(cmd: list[str]) -> str:
    """Run ``cmd`` as the multi-rank tests do (`tests.distributed.launch`); its stdout."""
    proc = subprocess.run(cmd, cwd=ROOT, env={**env(), "TQDM_DISABLE": "1"}, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def train(out: Path, name: str, ranks: int, envs: int, seed: int, iterations: int, extra=()) -> dict:
    """Train the short quickstart on ``ranks`` ranks of ``envs`` envs each; its results.json."""
    launch(train_cmd(out, name, ranks, envs, extra=[f"run.seed={seed}", f"trainer.iterations={iterations}", *extra]))
    return results(out, name)


def equivalence(out: Path, seeds: list[int], envs: int, iterations: int) -> dict:
    engines = {
        "ddp": ["trainer.engine.backend=torch"],
        "fsdp": ["trainer.engine.backend=fsdp"],
        "zero3": ["trainer.engine.backend=deepspeed", "trainer.engine.zero_stage=3"],
    }
    diffs: dict[str, list[float]] = {engine: [] for engine in engines}
    for seed in seeds:
        train(out, f"one_{seed}", 1, 2 * envs, seed, iterations)
        one = weights(out, f"one_{seed}", iterations)
        for engine, overrides in engines.items():
            name = f"{engine}_{seed}"
            train(out, name, 2, envs, seed, iterations, overrides)
            diffs[engine].append(max_diff(one, weights(out, name, iterations)))
    return {**{f"max_param_diff_{e}": max(d) for e, d in diffs.items()}, "param_diff_per_seed": diffs}


def speed(out: Path, envs: int, iterations: int, ranks: list[int]) -> dict:
    sps = {}
    for n in ranks:
        res = train(out, f"speed_{n}", n, envs // n, 0, iterations)["final"]
        sps[str(n)] = round(res["env_steps"] / res["rl_seconds"], 1)
    return {"samples_per_s": sps, "global_envs": envs, "cpus": os.cpu_count()}


def memory_worker(expert_dim: int, expert_layers: int, backend: str) -> None:
    """Under torchrun: build the policy, one engine step, print this rank's bytes (one JSON line)."""
    import torch

    from mmrl.experiment import build_policy, build_sim, load_experiment
    from mmrl.trainer.train_engine import build_train_engine

    overrides = [
        "run.threads=1",
        f"policy.expert_dim={expert_dim}",
        f"policy.expert_layers={expert_layers}",
        f"trainer.engine.backend={backend}",
    ]
    cfg = load_experiment(str(ROOT / "configs" / "quickstart.yaml"), overrides)
    from mmrl import distributed

    distributed.init("cpu")
    torch.manual_seed(0)
    policy = build_policy(cfg, build_sim(cfg, 2, 0))
    from mmrl.data import declared_kwargs, load_dataset

    ws = cfg.warm_start  # a few demonstrations: one flow-matching step gives every weight of the expert Adam state
    context = declared_kwargs(
        ws.dataset, num_episodes=2, num_samples=2, seed=0, chunk_size=policy.chunk_size, sim_kwargs=dict(cfg.sim.kwargs)
    )
    batch = policy.warm_start_batch(load_dataset(ws.dataset, **{**context, **ws.kwargs})).index(slice(0, 8))
    engine = build_train_engine(cfg.trainer.engine, policy, 1e-4, "cpu")

    def flow_matching(pol, mb, algo):
        return pol.supervised_loss(mb).mean(), {}

    loss, _ = engine.loss(flow_matching, batch, None)
    engine.step(loss, 1.0)

    def nbytes(t) -> int:
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(nbytes(p) for p in policy.parameters())
    optim = sum(nbytes(v) for state in engine.optimizer.state.values() for v in state.values() if v.dim())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    row = {"rank": distributed.current().rank, "param_bytes": params, "optim_bytes": optim, "trainable": trainable}
    sys.stdout.write(json.dumps(row) + "\n")  # one write: the ranks share the launcher's stdout


def memory(expert_dim: int, expert_layers: int) -> dict:
    out: dict = {}
    for engine, backend in (("ddp", "torch"), ("fsdp", "fsdp")):
        cmd = torchrun("--standalone", "--nproc_per_node=2", __file__, "--memory-worker", backend)
        cmd += [f"--expert-dim={expert_dim}", f"--expert-layers={expert_layers}"]
        rows = [json.loads(line) for line in launch(cmd).splitlines() if line.startswith('{"rank"')]
        out[engine] = max(r["param_bytes"] + r["optim_bytes"] for r in rows)
        out["trainable_params"] = rows[0]["trainable"]
    return {
        "param_optim_bytes_per_rank": {"ddp": out["ddp"], "fsdp": out["fsdp"]},
        "fsdp_over_ddp": round(out["fsdp"] / out["ddp"], 4),
        "trainable_params": out["trainable_params"],
    }


def main() -> None:
    from _smoke import parse_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--envs", type=int, default=4, help="envs per rank of the 2-rank runs (1 process: twice)")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--speed-envs", type=int, default=16, help="the global batch of the speed runs")
    p.add_argument("--speed-iterations", type=int, default=4)
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--expert-dim", type=int, default=1024)
    p.add_argument("--expert-layers", type=int, default=4)
    p.add_argument("--memory-worker", metavar="BACKEND", help=argparse.SUPPRESS)
    a = parse_args(
        p, seeds="0", iterations=1, speed_envs=4, speed_iterations=1, ranks="1,2", expert_dim=64, expert_layers=1
    )
    if a.memory_worker:
        return memory_worker(a.expert_dim, a.expert_layers, a.memory_worker)
    with tempfile.TemporaryDirectory(prefix="mmrl_distributed_") as tmp:
        out = Path(tmp)
        figures = {
            **equivalence(out, [int(s) for s in a.seeds.split(",")], a.envs, a.iterations),
            **speed(out, a.speed_envs, a.speed_iterations, [int(n) for n in a.ranks.split(",")]),
            **memory(a.expert_dim, a.expert_layers),
            "backend": "gloo, CPU, ranks on one machine",
        }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
