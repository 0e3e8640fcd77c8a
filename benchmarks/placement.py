"""Rollout throughput of the placement modes on a balanced CPU workload (issue 6).

    python benchmarks/placement.py                # 64 envs, 6 measured rounds per mode (~1 min)
    python benchmarks/placement.py --envs 32 --rounds 2
    python benchmarks/placement.py --load sleep   # simulator on "another device": no CPU contention
    python benchmarks/placement.py --async-iterations 6   # + the trainer, synchronous vs async rollout

The same run in every mode: the quickstart flow VLA (built-in encoder, 4 denoising steps, Flow-SDE
train rollouts, random weights, no gradients) collects R rounds of N episodes on ReachSim wrapped
in `mmrl.placement.workload.LoadedSim`, whose per-step compute is calibrated here so one decision
of the simulator (N envs x chunk 4) costs what one decision of the policy costs (``--load sleep``:
the simulator sleeps instead, as one on another device would, leaving the CPU to inference). Every
process uses one torch thread. Modes:

- collocated: `collect_episodes` in this process (simulate, then infer);
- disaggregated: the simulator in one worker process, inference here, no overlap (S = 1);
- hybrid S=2 / S=4: S sim workers of N/S envs, `collect_pipelined` overlaps stage s's simulation
  with stage s+1's inference.

Env steps/s counts executed decisions x chunk (the trainer's ``env_steps``) over collection wall
time, after one warm-up round (worker start-up excluded). The modes take turns round by round and
the speedup over collocated is the median over rounds of the per-round time ratio (a shared VM's
speed can drift by tens of percent within a minute; modes run back to back see the same speed).
Measure on a quiet machine (the load average is printed). Training samples/s adds one measured
PPO update (2 epochs, minibatches of 256, the same for every mode: the update is not pipelined):
samples / (collection + update) per round. Per round, the table also shows the main process's
inference seconds and seconds waiting for a worker, and the workers' own simulation seconds (more
than the collocated simulator's when inference and simulation share a busy machine). The last line
is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
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


def calibrate(policy, n: int, sim_kwargs: dict, load: str) -> tuple[dict, float, float]:
    """Busy-work rounds (``load`` compute) or sleep per env-step (``load`` sleep) so that one
    simulator decision on n envs costs one policy decision; returns the LoadedSim arguments.
    Policy and simulator are timed in alternation and matched on the median of their per-pair
    ratio, so a drift of the machine's speed during calibration does not unbalance them."""
    sim = loaded_reach(n, **sim_kwargs)
    obs = sim.reset(0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        policy.rollout(obs, generator=gen)
        acts = policy.rollout(obs, generator=gen)["actions"]
        t_policy = median_time(lambda: policy.rollout(obs, generator=gen), 5)
    t_bare = median_time(lambda: sim.step_chunk(acts), 7)
    if load == "sleep":
        kwargs = {"delay_s": max(0.0, t_policy - t_bare) / (n * CHUNK)}
    else:
        per_round = time_burn(200, n * CHUNK) / 200
        kwargs = {"work": max(1, round((t_policy - t_bare) / per_round))}
    for attempt in range(4):
        loaded = loaded_reach(n, **kwargs, **sim_kwargs)
        loaded.reset(0)
        pairs = []
        with torch.no_grad():
            for _ in range(5):
                tp = median_time(lambda: policy.rollout(obs, generator=gen), 1)
                ts = median_time(lambda: loaded.step_chunk(acts), 1)
                pairs.append((tp, ts))
        ratio = statistics.median((tp - t_bare) / max(ts - t_bare, 1e-6) for tp, ts in pairs)
        t_policy = statistics.median(tp for tp, _ in pairs)
        t_sim = statistics.median(ts for _, ts in pairs)
        if abs(ratio - 1) < 0.03 or attempt == 3:
            break
        kwargs = {k: (max(1, round(v * ratio)) if k == "work" else v * ratio) for k, v in kwargs.items()}
    return kwargs, t_policy, t_sim


def contention(policy, worker, n: int) -> tuple[float, float]:
    """Policy decision time alone and while ``worker`` simulates at the same time (this
    machine's ability to run the two roles in parallel: equal times = two free cores)."""
    obs = worker.reset(list(range(n)))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        acts = policy.rollout(obs, generator=gen)["actions"]
        alone = median_time(lambda: policy.rollout(obs, generator=gen), 5)

        def together():
            worker.submit("step_chunk", acts, False)
            t0 = time.perf_counter()
            policy.rollout(obs, generator=gen)
            dt = time.perf_counter() - t0
            worker.result()
            return dt

        both = sorted(together() for _ in range(5))[2]
    return alone, both


def run_rounds(policy, rounds: int, n: int, collectors: dict) -> tuple[dict, list]:
    """One warm-up round per mode, then ``rounds`` rounds in which the modes take turns, in an
    order rotated every round (so a drift of this machine's speed hits every mode alike); seeds
    and generator are fixed per round, the same for every mode."""
    from mmrl.trainer.rollout import episode_seeds

    names = list(collectors)
    stats = {name: {"times": [], "decisions": 0, "policy_s": 0.0, "sim_wait_s": 0.0, "sim_s": 0.0,
                    "returns": []}
             for name in names}
    loads = []
    for r in range(rounds + 1):
        seeds = episode_seeds(1000 + r * n, n)
        for name in names[r % len(names):] + names[: r % len(names)]:
            gen = torch.Generator().manual_seed(r)
            t0 = time.perf_counter()
            batch, info = collectors[name](seeds, gen)
            dt = time.perf_counter() - t0
            out = stats[name]
            out["batch"] = batch
            if r == 0:
                continue
            out["times"].append(dt)
            out["decisions"] += int(batch["valid"].sum())
            out["policy_s"] += info.get("policy_s", float("nan"))
            out["sim_wait_s"] += info.get("sim_wait_s", float("nan"))
            out["sim_s"] += info.get("sim_s", float("nan"))
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

    t = median_time(update, 1)
    policy.load_state_dict(state)  # every mode collects with the same weights
    return t


def trainer_seconds(iterations: int, n: int, extra: list[str]) -> float:
    """RL seconds per iteration of the real trainer on the quickstart (random weights, no warm
    start, no checkpoints or videos) with config overrides ``extra``."""
    import tempfile

    from mmrl.experiment import build_trainer, load_experiment

    with tempfile.TemporaryDirectory() as out:
        cfg = load_experiment(Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml", [
            f"run.output_dir={out}", "run.threads=1", f"sim.num_envs={n}", "sim.eval_num_envs=8",
            "warm_start.dataset=null", "trainer.eval_episodes=8", "trainer.video_episodes=0",
            f"trainer.iterations={iterations}", f"trainer.checkpoint_every={iterations}", *extra])
        trainer = build_trainer(cfg)
        trainer.run()
        return trainer.state.rl_seconds / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=64, help="envs per round (N)")
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds per mode")
    parser.add_argument("--max-steps", type=int, default=40, help="ReachSim max_episode_steps")
    parser.add_argument("--stages", type=int, nargs="*", default=[2, 4], help="hybrid stage counts")
    parser.add_argument("--load", choices=["compute", "sleep"], default="compute",
                        help="simulator cost: CPU busy-work (default; competes with inference for the "
                             "cores) or sleep (a simulator on another device: no CPU contention)")
    parser.add_argument("--async-iterations", type=int, default=0,
                        help="also time K iterations of the real trainer on the quickstart, synchronous "
                             "vs trainer.async_staleness=1 (0 = skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.envs
    sim_kwargs = {"max_episode_steps": args.max_steps}
    policy = build_policy()
    load = os.getloadavg()[0]
    load_kwargs, t_policy, t_sim = calibrate(policy, n, sim_kwargs, args.load)
    print(f"load average (1 min) at start: {load:.2f}; CPUs: {os.cpu_count()}; torch threads per process: 1")
    print(f"balanced workload: N={n} envs, chunk {CHUNK}, max {args.max_steps} steps; one decision costs "
          f"policy {t_policy * 1e3:.1f} ms, simulator {t_sim * 1e3:.1f} ms ({args.load} load {load_kwargs})")
    factory = functools.partial(loaded_reach, **load_kwargs, **sim_kwargs)
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
        alone, both = contention(policy, pools["disaggregated"][0], n)
        results, loads = run_rounds(policy, args.rounds, n, collectors)
    finally:
        for workers in pools.values():
            close_workers(workers)
    t_update = update_seconds(policy, results["collocated"]["batch"])
    load_end = os.getloadavg()[0]

    print(f"CPU contention: a policy decision takes {alone * 1e3:.1f} ms alone, {both * 1e3:.1f} ms while a "
          f"sim worker steps at the same time ({(both / alone - 1) * 100:+.0f}%)")
    print(f"\nPPO update on one round's samples: {t_update:.3f} s (same for every mode)")
    header = f"{'mode':<16}{'env steps/s':>12}{'train samples/s':>17}{'speedup':>9}{'collect s/round':>17}" \
             f"{'policy s':>10}{'sim wait s':>12}{'worker sim s':>14}{'mean return':>13}"
    print(header)
    print("-" * len(header))
    base_times = results["collocated"]["times"]
    for name, r in results.items():
        collect_s = sum(r["times"])
        r["sps"] = r["decisions"] * CHUNK / collect_s
        per_round = collect_s / args.rounds
        r["train_sps"] = (r["decisions"] / args.rounds) / (per_round + t_update)
        ratios = sorted(b / t for b, t in zip(base_times, r["times"]))
        r["speedup"] = statistics.median(ratios)
        pol, wait, simt = (r[k] / args.rounds for k in ("policy_s", "sim_wait_s", "sim_s"))
        print(f"{name:<16}{r['sps']:>12.0f}{r['train_sps']:>17.0f}{r['speedup']:>8.2f}x{per_round:>17.3f}"
              f"{pol:>10.3f}{wait:>12.3f}{simt:>14.3f}{statistics.mean(r['returns']):>13.3f}")
    print(f"load average (1 min) after each round: {', '.join(f'{x:.2f}' for x in loads)}; at end: {load_end:.2f}")
    key = {"collocated": "collocated", "disaggregated": "disaggregated"}
    key.update({f"hybrid S={s}": f"hybrid_s{s}" for s in args.stages})
    line = {f"{key[k]}_sps": round(v["sps"], 1) for k, v in results.items()}
    line.update({f"{key[k]}_train_sps": round(v["train_sps"], 1) for k, v in results.items()})
    line.update({f"speedup_{key[k]}": round(v["speedup"], 3) for k, v in results.items() if k != "collocated"})
    line.update(num_envs=n, sim_load=args.load, policy_ms=round(t_policy * 1e3, 2), sim_ms=round(t_sim * 1e3, 2),
                policy_ms_with_sim=round(both * 1e3, 2), update_s=round(t_update, 3),
                load_avg_start=round(load, 2), load_avg_max=round(max(loads), 2), load_avg_end=round(load_end, 2))
    if args.async_iterations:
        k = args.async_iterations
        sync_s = trainer_seconds(k, n, [])
        async_s = trainer_seconds(k, n, ["trainer.async_staleness=1"])
        print(f"\ntrainer on the quickstart ({n} envs, {k} iterations): synchronous {sync_s:.3f} s/iteration, "
              f"async (staleness 1) {async_s:.3f} s/iteration -> {sync_s / async_s:.2f}x")
        line.update(trainer_sync_s_per_iter=round(sync_s, 3), trainer_async_s_per_iter=round(async_s, 3),
                    async_speedup=round(sync_s / async_s, 3))
    print(json.dumps(line))


if __name__ == "__main__":
    main()
