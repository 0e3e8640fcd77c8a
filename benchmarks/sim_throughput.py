"""Environment steps per second of each simulator adapter, raw and with a policy in the loop.

    python benchmarks/sim_throughput.py                  # every adapter that is installed here
    python benchmarks/sim_throughput.py --only reach --envs 64 256 1024
    python benchmarks/sim_throughput.py --smoke          # seconds: one env per adapter, no figure

raw: random action chunks through ``step_chunk`` (chunk of 4). policy: the quickstart flow VLA
(built-in encoder, 4 denoising steps, Flow-SDE sampling, no gradients) chooses every chunk from the
observation, as in a training rollout. Both count executed environment steps (envs x chunk steps)
per second of wall time, measured back to back in one process. The last line is one JSON object
``{"rows": [{"simulator", "num_envs", "raw_sps", "policy_sps", "policy_ratio"}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHUNK = 4
# simulator label -> (registry name, constructor kwargs, env counts)
SETUPS = {
    "reach": ("reach", {}, [64, 256, 1024]),
    "gym:Pendulum-v1": ("gym", {"env_id": "Pendulum-v1", "image_size": 64}, [4, 8]),
    # what pixels cost on a MuJoCo task: no image, frames drawn at the policy's 64 px, and frames drawn
    # at 480 px then resized to 64 (what the adapter did before it passed width / height to MuJoCo)
    "gym:HalfCheetah-v5/state": ("gym", {"env_id": "HalfCheetah-v5", "render_images": False}, [8]),
    "gym:HalfCheetah-v5/64px": ("gym", {"env_id": "HalfCheetah-v5", "image_size": 64}, [8]),
    "gym:HalfCheetah-v5/480px->64": (
        "gym",
        {"env_id": "HalfCheetah-v5", "image_size": 64, "env_kwargs": {"width": 480, "height": 480}},
        [8],
    ),
    "maniskill:PickCube-v1/state": ("maniskill", {"task": "PickCube-v1", "obs_mode": "state"}, [1, 2]),
    "maniskill:PickCube-v1/rgb": ("maniskill", {"task": "PickCube-v1", "obs_mode": "rgb"}, [1, 2]),
}


def measure(sim, policy, seconds: float) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(0)
    obs = sim.reset(0)

    def loop(act) -> float:
        nonlocal obs
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds or steps == 0:
            res = sim.step_chunk(act(obs))
            obs = res.obs
            steps += sim.num_envs * CHUNK
        return steps / (time.perf_counter() - t0)

    shape = (sim.num_envs, CHUNK, sim.action_dim)
    loop(lambda o: torch.rand(shape, generator=gen) * 2 - 1)  # warm-up
    raw = loop(lambda o: torch.rand(shape, generator=gen) * 2 - 1)
    with torch.no_grad():
        policy_sps = loop(lambda o: policy.rollout(o, generator=gen).actions.to(sim.device))
    return raw, policy_sps


def main() -> None:
    from _smoke import parse_args

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="simulator labels to run (default: all installed)")
    parser.add_argument("--envs", nargs="*", type=int, help="override the env counts")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    args = parse_args(parser, envs=[1], seconds=0.2)

    from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
    from mmrl.registry import SIMULATORS, MissingDependencyError

    rows = []
    for label, (name, kwargs, counts) in SETUPS.items():
        if args.only and label not in args.only and name not in args.only:
            continue
        for n in args.envs or counts:
            try:
                sim = SIMULATORS.build(name, num_envs=n, **kwargs)
            except (MissingDependencyError, FileNotFoundError, RuntimeError, ImportError) as exc:
                print(f"{label:32s} skipped: {str(exc).splitlines()[0][:120]}")
                break
            torch.manual_seed(0)
            policy = FlowVLAPolicy(FlowVLAConfig(chunk_size=CHUNK), sim.action_dim, sim.state_dim).eval()
            raw, pol = measure(sim, policy, args.seconds)
            sim.close()
            rows.append(
                {
                    "simulator": label,
                    "num_envs": n,
                    "raw_sps": round(raw, 1),
                    "policy_sps": round(pol, 1),
                    "policy_ratio": round(pol / raw, 3),
                }
            )
            print(f"{label:32s} envs {n:5d}  raw {raw:10.1f} steps/s  policy {pol:9.1f} steps/s  ratio {pol / raw:.3f}")
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
