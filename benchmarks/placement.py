"""Rollout throughput of the placement modes on a balanced CPU workload (issue 6).

    python benchmarks/placement.py                # 64 envs, 3 measured rounds per mode
    python benchmarks/placement.py --envs 32 --rounds 2

The same run in every mode: the quickstart flow VLA (built-in encoder, 4 denoising steps, Flow-SDE
train rollouts, random weights, no gradients) collects R rounds of N episodes on ReachSim wrapped
in `mmrl.placement.workload.LoadedSim`, whose per-step compute is calibrated here so one decision
of the simulator (N envs x chunk 4) costs what one decision of the policy costs. Every process
uses one torch thread. Modes:

- collocated: `collect_episodes` in this process (simulate, then infer);
- disaggregated: the simulator in one worker process, inference here, no overlap (S = 1);
- hybrid S=2 / S=4: S sim workers of N/S envs, `collect_pipelined` overlaps stage s's simulation
  with stage s+1's inference.

Env steps/s counts executed decisions x chunk (the trainer's ``env_steps``) over collection wall
time, after one warm-up round (worker start-up excluded); the modes take turns round by round. Training samples/s adds one measured
PPO update (2 epochs, minibatches of 256, the same for every mode: the update is not pipelined):
samples / (collection + update) per round. The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mmrl.placement import PlacementConfig, close_workers, collect_pipelined, start_sim_workers  # noqa: E402
from mmrl.placement.workload import loaded_reach, time_burn  # noqa: E402

CHUNK = 4


def build_policy():
    from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy

    torch.manual_seed(0)
    cfg = FlowVLAConfig(chunk_size=CHUNK, num_steps=4, method="sde", stochastic="all", critic=True)
    return FlowVLAPolicy(cfg, action_dim=2, state_dim=2).eval()


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def calibrate(policy, n: int, sim_kwargs: dict) -> tuple[int, float, float]:
    """Busy-work rounds so that one simulator decision on n envs costs one policy decision."""
    sim = loaded_reach(n, **sim_kwargs)
    obs = sim.reset(0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        policy.rollout(obs, generator=gen)
        t_policy = median_time(lambda: policy.rollout(obs, generator=gen), 7)
        acts = policy.rollout(obs, generator=gen)["actions"]
    t_bare = median_time(lambda: sim.step_chunk(acts), 7)
    probe = 100
    per_round = time_burn(probe, n * CHUNK) / probe
    work = max(0, round((t_policy - t_bare) / per_round))
    loaded = loaded_reach(n, work=work, **sim_kwargs)
    loaded.reset(0)
    t_sim = median_time(lambda: loaded.step_chunk(acts), 5)
    return work, t_policy, t_sim


def run_rounds(policy, rounds: int, n: int, collectors: dict) -> dict:
    """One warm-up round per mode, then ``rounds`` rounds in which the modes take turns (so a
    change of background load hits every mode alike); seeds and generator fixed per round."""
    from mmrl.trainer.rollout import episode_seeds

    stats = {name: {"collect_s": 0.0, "decisions": 0, "policy_s": 0.0, "sim_wait_s": 0.0, "returns": []}
             for name in collectors}
    loads = []
    for r in range(rounds + 1):
        seeds = episode_seeds(1000 + r * n, n)
        for name, collect in collectors.items():
            gen = torch.Generator().manual_seed(r)
            t0 = time.perf_counter()
            batch, info = collect(seeds, gen)
            dt = time.perf_counter() - t0
            out = stats[name]
            out["batch"] = batch
            if r == 0:
                continue
            out["collect_s"] += dt
            out["decisions"] += int(batch["valid"].sum())
            out["policy_s"] += info.get("policy_s", float("nan"))
            out["sim_wait_s"] += info.get("sim_wait_s", float("nan"))
            out["returns"].append(info["return"].mean().item())
        loads.append(os.getloadavg()[0])
    return stats, loads


def update_seconds(policy, batch) -> float:
    """Wall time of one PPO update (advantages + 2 epochs of minibatches of 256) on ``batch``."""
    from mmrl.experiment import AlgorithmConfig
    from mmrl.trainer.objectives import OBJECTIVES, clip_advantages, compute_advantages, valid_samples

    algo = AlgorithmConfig()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-5)
    state = {k: v.clone() for k, v in policy.state_dict().items()}

    def update():
        b = compute_advantages(type(batch)(dict(batch)), algo)
        samples = clip_advantages(valid_samples(b, algo.normalize_advantages), algo.adv_clip)
        policy.train()
        for _ in range(algo.epochs):
            for mb in samples.minibatches(algo.minibatch_size, torch.Generator().manual_seed(0)):
                loss, _ = OBJECTIVES["ppo"](policy, mb, algo)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        policy.eval()

    update()  # warm-up
    t = median_time(update, 1)
    policy.load_state_dict(state)  # every mode collects with the same weights
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=64, help="envs per round (N)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per mode")
    parser.add_argument("--max-steps", type=int, default=40, help="ReachSim max_episode_steps")
    parser.add_argument("--stages", type=int, nargs="*", default=[2, 4], help="hybrid stage counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.envs
    sim_kwargs = {"max_episode_steps": args.max_steps}
    policy = build_policy()
    load = os.getloadavg()[0]
    work, t_policy, t_sim = calibrate(policy, n, sim_kwargs)
    print(f"load average (1 min) at start: {load:.2f}; CPUs: {os.cpu_count()}; torch threads per process: 1")
    print(f"balanced workload: N={n} envs, chunk {CHUNK}, max {args.max_steps} steps; one decision costs "
          f"policy {t_policy * 1e3:.1f} ms, simulator {t_sim * 1e3:.1f} ms (busy-work rounds {work})")
    factory = functools.partial(loaded_reach, work=work, **sim_kwargs)
    from mmrl.trainer.rollout import collect_episodes

    sim = factory(num_envs=n, seed=0)
    layouts = {"disaggregated": PlacementConfig(mode="disaggregated")}
    layouts.update({f"hybrid S={s}": PlacementConfig(mode="hybrid", stages=s) for s in args.stages})
    pools: dict[str, list] = {}
    try:
        for name, placement in layouts.items():  # idle workers block on their pipe: no CPU
            pools[name] = start_sim_workers(factory, n, placement)
        collectors = {"collocated": lambda seeds, gen: collect_episodes(policy, sim, seeds, gen, "train")}
        for name, workers in pools.items():
            collectors[name] = functools.partial(
                lambda w, seeds, gen: collect_pipelined(policy, w, seeds, gen, "train"), workers)
        results, loads = run_rounds(policy, args.rounds, n, collectors)
    finally:
        for workers in pools.values():
            close_workers(workers)
    t_update = update_seconds(policy, results["collocated"]["batch"])
    load_end = os.getloadavg()[0]

    base = None
    print(f"\nPPO update on one round's samples: {t_update:.3f} s (same for every mode)")
    header = f"{'mode':<16}{'env steps/s':>12}{'train samples/s':>17}{'speedup':>9}{'collect s/round':>17}" \
             f"{'policy s':>10}{'sim wait s':>12}{'mean return':>13}"
    print(header)
    print("-" * len(header))
    figures = {}
    for name, r in results.items():
        sps = r["decisions"] * CHUNK / r["collect_s"]
        per_round = r["collect_s"] / args.rounds
        train_sps = (r["decisions"] / args.rounds) / (per_round + t_update)
        base = base or sps
        r.update(sps=sps, train_sps=train_sps, speedup=sps / base)
        pol = r["policy_s"] / args.rounds
        wait = r["sim_wait_s"] / args.rounds
        print(f"{name:<16}{sps:>12.0f}{train_sps:>17.0f}{sps / base:>8.2f}x{per_round:>17.3f}"
              f"{pol:>10.3f}{wait:>12.3f}{sum(r['returns']) / len(r['returns']):>13.3f}")
        figures[name] = r
    print(f"load average (1 min) after each round: {', '.join(f'{x:.2f}' for x in loads)}; at end: {load_end:.2f}")
    key = {"collocated": "collocated", "disaggregated": "disaggregated"}
    key.update({f"hybrid S={s}": f"hybrid_s{s}" for s in args.stages})
    line = {f"{key[k]}_sps": round(v["sps"], 1) for k, v in figures.items()}
    line.update({f"{key[k]}_train_sps": round(v["train_sps"], 1) for k, v in figures.items()})
    line.update({f"speedup_{key[k]}": round(v["speedup"], 3) for k, v in figures.items() if k != "collocated"})
    line.update(num_envs=n, policy_ms=round(t_policy * 1e3, 2), sim_ms=round(t_sim * 1e3, 2),
                update_s=round(t_update, 3), load_avg_start=round(load, 2), load_avg_max=round(max(loads), 2),
                load_avg_end=round(load_end, 2))
    print(json.dumps(line))


if __name__ == "__main__":
    main()
