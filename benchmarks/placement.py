"""Rollout and training-iteration speed of the placement modes, on two workloads (issue 6; issue 13 item 6).

    python benchmarks/placement.py                        # both workloads (~5 min on 2 cores)
    python benchmarks/placement.py --workload synthetic   # the synthetic busy-work only (~1.5 min)
    python benchmarks/placement.py --workload maniskill   # ManiSkill3 PickCube-v1 rgb only (~3 min)
    python benchmarks/placement.py --envs 16 --rounds 1 --ms-max-steps 8 --ms-rounds 1   # quick check
    python benchmarks/placement.py --load sleep           # synthetic simulator on "another device"
    python benchmarks/placement.py --async-iterations 6   # + the trainer, synchronous vs async rollout
    python benchmarks/placement.py --smoke                # a minute: every mode of the three workloads, no figure
    python benchmarks/placement.py --device cuda --workload synthetic metaworld --sim-ratio 5   # policy on a GPU

The same policy in every mode: the quickstart's flow VLA (built-in encoder, chunk 4, 4 denoising
steps, Flow-SDE train rollouts, random weights). Three workloads (``both``: the first two, the
default; ``all``: the three):

1. ``synthetic``: NOT a real simulator. The embedded ReachSim (about 100x cheaper than the policy)
   wrapped in `simulators.loaded.LoadedSim`, which burns CPU with matmul + tanh busy-work in
   proportion to the env-steps, calibrated here so that one simulator decision (N envs x chunk 4)
   costs what one policy decision costs. A balanced load is the best case for pipelining (hybrid
   can hide at most half of a balanced iteration's collection); ``--load sleep`` makes the simulator
   sleep instead, like one on another device that leaves this CPU to inference.
2. ``maniskill``: a real simulator that is costly here: ManiSkill3 PickCube-v1, rgb camera at
   ``--ms-image-size`` px (software Vulkan renders it), CPU PhysX, ee-delta control, the task's
   50-step limit (a random policy never succeeds: every episode runs the full 13 decisions).
   ManiSkill on CPU runs one env per process in every mode (the adapter's pool; a stage of one env
   runs inside its sim worker), each with one lavapipe render thread (``LP_NUM_THREADS=1``).
   Simulation costs several times the policy here, so overlap can hide only the policy's share.
3. ``metaworld``: a real rendering simulator: Meta-World ``--mw-task`` (default pick-place-v3) from
   pixels (``--mw-image-size`` px, ``corner`` camera) plus its state and instruction, MuJoCo physics
   and rendering on the CPU, the envs of a process stepped one after another (``vectorization:
   sync``), so each mode's processes are the only parallelism; every episode runs the full
   ``--mw-max-steps``. Rendering goes through ``MUJOCO_GL`` (``egl`` with ``--device cuda``, else
   OSMesa where installed, with one llvmpipe thread per process). Skipped, saying why, where
   ``metaworld`` / ``mujoco`` do not import or MuJoCo cannot render.

``--device cuda`` puts the policy (inference and the PPO update) on that device; the simulators stay
CPU processes (the collocated modes run the simulator in this process, the others in sim workers).
With ``--device cpu`` (the default) everything is as before. The synthetic simulator's cost is set by
one of two knobs, both timed at one thread in this process before the rounds:

- ``--sim-ratio R`` (default 1): one simulator decision on the N envs costs R policy decisions on
  them (on the policy's device). 1 is the CPU benchmark's balanced case; with a GPU policy the device
  check (scripts/device_check.py, step ``hybrid``) uses 5, about what ManiSkill3 rgb cost against the
  policy on the 2-core CPU machine (a rendering simulator costing several policy decisions);
- ``--sim-ms-per-step MS``: a fixed CPU cost per env step, whatever the policy (N x 4 x MS per
  simulator decision), to place the simulator at a stated absolute cost instead.

Every round, each mode collects N episodes (one per env, same seeds and generator in every mode)
and then runs one PPO update on its own batch (advantages, ``algorithm.epochs`` epochs of
minibatches of 256, a fresh Adam; the weights are restored afterwards so every mode and round
collects with the same weights). ``collect`` is collection wall time (env steps/s = executed env
steps over it); ``iteration`` = collection + update (train samples/s = decisions over it). The
update is not pipelined: it is what an iteration of the real trainer adds to the collection.

Threads (torch intra-op threads; the trainer's ``run.threads`` and ``placement.torch_threads``):

- ``collocated 1t``: one process, one thread: simulate, then infer, then update;
- ``collocated Tt``: the same with T = all cores (its in-process busy-work, inference and update
  all use them): the fair collocated baseline, since its phases never run at the same time;
- ``disaggregated``: the simulator in one worker process, inference and update here; one thread each;
- ``hybrid S=k``: k sim workers of N/k envs (one thread each) pipelined against inference here (one
  thread: more would spin against the workers on the same cores). Its k workers also simulate in
  parallel on k cores: against a collocated run its gain is that parallelism plus the overlap.

The modes take turns round by round, after one warm-up round each (worker start-up excluded), in
an order rotated every round; a speed-up is the median over rounds of the per-round time ratio
against a collocated baseline (a shared VM's speed drifts by tens of percent within a minute; modes
run back to back see the same speed). Measure on a quiet machine: the load average is printed.
The last line is one JSON object: ``synthetic_busywork``, ``maniskill_pickcube_rgb`` and
``metaworld_pixels`` (each with per-mode figures: ``collect_s``, ``update_s``, ``iter_s``,
``env_sps``, ``train_sps``, and speed-ups ``speedup_collect_vs_collocated_1t`` ...
``speedup_iter_vs_collocated_<T>t``), plus ``async``, ``device`` and ``cpus``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mmrl.placement import PlacementConfig, close_workers, collect_pipelined, start_sim_workers
from mmrl.rollout import collect_episodes, episode_seeds
from simulators.loaded import loaded_reach, time_burn

CHUNK = 4
CORES = os.cpu_count() or 1


def build_policy(
    action_dim: int = 2, state_dim: int | None = 2, num_views: int = 1, device: str = "cpu", image_size: int = 32
):
    """The quickstart flow VLA with random weights (the same one in every mode of a workload), on ``device``."""
    from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy

    torch.manual_seed(0)
    cfg = FlowVLAConfig(
        backbone="tiny",
        chunk_size=CHUNK,
        num_steps=4,
        method="sde",
        stochastic="all",
        critic=True,
        num_views=num_views,
        image_size=image_size,
    )
    return FlowVLAPolicy(cfg, action_dim=action_dim, state_dim=state_dim).to(device).eval()


def device_of(policy) -> torch.device:
    return next(policy.parameters()).device


def generator(policy, seed: int) -> torch.Generator:
    """A generator on the policy's device (its noise is drawn there), seeded."""
    return torch.Generator(device=device_of(policy)).manual_seed(seed)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timings of a CUDA policy end when its kernels do)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decide(policy, obs, gen):
    """One policy decision on ``obs``, finished on the device."""
    out = policy.rollout(obs, generator=gen)
    sync(device_of(policy))
    return out


@contextlib.contextmanager
def threads(n: int):
    """torch intra-op threads ``n`` inside the block (the mode's main-process setting)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def calibrate(
    policy, n: int, sim_kwargs: dict, load: str, ratio: float = 1.0, ms_per_step: float | None = None
) -> tuple[dict, float, float]:
    """Busy-work rounds (``load`` compute) or sleep per env-step (``load`` sleep) so that one
    simulator decision on n envs costs ``ratio`` policy decisions (or, with ``ms_per_step``, n x
    chunk x that many milliseconds); returns the LoadedSim arguments and the policy's and the
    loaded simulator's seconds per decision. Policy and simulator are timed in alternation and
    matched on the median of their per-pair ratio, so a drift of the machine's speed during
    calibration does not unbalance them."""

    def target(t_policy: float) -> float:  # seconds one simulator decision should take
        return n * CHUNK * ms_per_step / 1e3 if ms_per_step is not None else ratio * t_policy

    sim = loaded_reach(n, **sim_kwargs)
    obs = sim.reset(0)
    gen = generator(policy, 0)
    with torch.no_grad():
        policy.rollout(obs, generator=gen)
        acts = policy.rollout(obs, generator=gen).actions.cpu()
        t_policy = median_time(lambda: decide(policy, obs, gen), 5)
    t_bare = median_time(lambda: sim.step_chunk(acts), 7)
    if load == "sleep":
        kwargs = {"delay_s": max(0.0, target(t_policy) - t_bare) / (n * CHUNK)}
    else:
        per_round = time_burn(200, n * CHUNK) / 200
        kwargs = {"work": max(1, round((target(t_policy) - t_bare) / per_round))}
    for attempt in range(4):
        loaded = loaded_reach(n, **kwargs, **sim_kwargs)
        loaded.reset(0)
        pairs = []
        with torch.no_grad():
            for _ in range(5):
                tp = median_time(lambda: decide(policy, obs, gen), 1)
                ts = median_time(lambda loaded=loaded: loaded.step_chunk(acts), 1)
                pairs.append((tp, ts))
        scale = statistics.median((target(tp) - t_bare) / max(ts - t_bare, 1e-6) for tp, ts in pairs)
        t_policy = statistics.median(tp for tp, _ in pairs)
        t_sim = statistics.median(ts for _, ts in pairs)
        if abs(scale - 1) < 0.03 or attempt == 3:
            break
        kwargs = {k: (max(1, round(v * scale)) if k == "work" else v * scale) for k, v in kwargs.items()}
    return kwargs, t_policy, t_sim


def decision_costs(policy, sim, n: int, repeats: int = 3) -> tuple[float, float]:
    """Median seconds of one policy decision and one simulator decision (chunk) on ``sim``'s n envs."""
    obs = sim.reset(list(range(n)))
    gen = generator(policy, 0)
    with torch.no_grad():
        acts = policy.rollout(obs, generator=gen).actions.cpu()
        t_policy = median_time(lambda: decide(policy, obs, gen), repeats)
    return t_policy, median_time(lambda: sim.step_chunk(acts), repeats)


def contention(policy, worker, n: int) -> tuple[float, float]:
    """Policy decision time alone and while ``worker`` simulates at the same time (this
    machine's ability to run the two roles in parallel: equal times = two free cores)."""
    obs = worker.reset(list(range(n)))
    gen = generator(policy, 0)
    with torch.no_grad():
        acts = policy.rollout(obs, generator=gen).actions.cpu()
        alone = median_time(lambda: decide(policy, obs, gen), 5)

        def together():
            worker.submit("step_chunk", acts, False, False)  # no final obs, no trace
            t0 = time.perf_counter()
            decide(policy, obs, gen)
            dt = time.perf_counter() - t0
            worker.result()
            return dt

        both = sorted(together() for _ in range(5))[2]
    return alone, both


def ppo_update(policy, batch) -> float:
    """Seconds of one PPO update (advantages + ``epochs`` epochs of minibatches) on ``batch``; the
    weights are restored afterwards, so every mode collects with the same ones. The minibatches
    go to the policy's device, as the trainer sends them."""
    from mmrl.experiment import AlgorithmConfig
    from mmrl.registry import OBJECTIVES
    from mmrl.trainer.objectives import compute_advantages, prepare_advantages, valid_samples

    algo = AlgorithmConfig()
    device = device_of(policy)
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    opt = torch.optim.Adam(policy.parameters(), lr=1e-5)
    t0 = time.perf_counter()
    b = compute_advantages(type(batch)(dict(batch)), algo)
    samples = prepare_advantages(valid_samples(b), algo, algo.normalize_advantages)
    policy.train()
    for _ in range(algo.epochs):
        for mb in samples.minibatches(algo.minibatch_size, torch.Generator().manual_seed(0)):
            loss, _ = OBJECTIVES.get("ppo")(policy, mb.to(device), algo)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    sync(device)
    dt = time.perf_counter() - t0
    policy.eval()
    policy.load_state_dict(state)
    return dt


def run_rounds(policy, rounds: int, n: int, modes: dict, seed_base: int = 1000) -> tuple[dict, list]:
    """One warm-up round per mode, then ``rounds`` rounds in which the modes take turns, in an order
    rotated every round. ``modes``: name -> (collect(seeds, gen), main-process threads). Per mode
    and round: collection, then one PPO update on its batch, both under the mode's threads."""
    names = list(modes)
    stats = {
        name: {
            "collect": [],
            "update": [],
            "decisions": 0,
            "env_steps": 0,
            "policy_s": 0.0,
            "sim_wait_s": 0.0,
            "sim_s": 0.0,
            "returns": [],
        }
        for name in names
    }
    loads = []
    for r in range(rounds + 1):
        seeds = episode_seeds(seed_base + r * n, n)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            collect, n_threads = modes[name]
            gen = generator(policy, r)
            with threads(n_threads):
                t0 = time.perf_counter()
                batch, info = collect(seeds, gen)
                dt = time.perf_counter() - t0
                t_update = ppo_update(policy, batch)
            if r == 0:
                continue
            out = stats[name]
            out["collect"].append(dt)
            out["update"].append(t_update)
            valid = batch["valid"]
            out["decisions"] += int(valid.sum())
            out["env_steps"] += (
                int((batch["env_steps"] * valid).sum()) if "env_steps" in batch else int(valid.sum()) * CHUNK
            )
            for key in ("policy_s", "sim_wait_s", "sim_s"):
                out[key] += info.get(key, float("nan"))
            out["returns"].append(info["return"].float().mean().item())
        loads.append(os.getloadavg()[0])
    return stats, loads


def summarize(stats: dict, rounds: int, modes: dict) -> dict:
    """Per-mode figures (means per round) and speed-ups against every collocated baseline."""
    baselines = [k for k in stats if k.startswith("collocated")]
    out = {}
    for name, r in stats.items():
        iters = [c + u for c, u in zip(r["collect"], r["update"])]
        fig = {
            "threads": modes[name][1],
            "collect_s": statistics.mean(r["collect"]),
            "update_s": statistics.mean(r["update"]),
            "iter_s": statistics.mean(iters),
            "env_sps": r["env_steps"] / sum(r["collect"]),
            "train_sps": r["decisions"] / sum(iters),
            "policy_s": r["policy_s"] / rounds,
            "sim_wait_s": r["sim_wait_s"] / rounds,
            "worker_sim_s": r["sim_s"] / rounds,
            "mean_return": statistics.mean(r["returns"]),
        }
        for base in baselines:
            b = stats[base]
            b_iters = [c + u for c, u in zip(b["collect"], b["update"])]
            fig[f"speedup_collect_vs_{key_of(base)}"] = statistics.median(
                x / y for x, y in zip(b["collect"], r["collect"])
            )
            fig[f"speedup_iter_vs_{key_of(base)}"] = statistics.median(x / y for x, y in zip(b_iters, iters))
        out[name] = fig
    return out


def key_of(name: str) -> str:
    """JSON key of a mode: "hybrid S=2" -> hybrid_s2, "collocated 2t" -> collocated_2t."""
    return name.replace(" S=", "_s").replace(" ", "_")


def print_table(figures: dict) -> None:
    bases = [k for k in figures if k.startswith("collocated")]
    vs = "".join(f"{'vs ' + b.split()[1]:>9}" for b in bases)
    width = 9 * len(bases)
    print(f"{'':<74}{'collect speed-up':>{width}}  {'iter speed-up':>{width - 2}}")
    header = (
        f"{'mode':<16}{'threads':>8}{'collect s':>10}{'update s':>9}{'iter s':>9}{'env st/s':>11}"
        f"{'samples/s':>11}{vs}{vs}{'policy s':>10}{'sim wait s':>12}{'worker sim s':>14}{'return':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, f in figures.items():
        sp = "".join(f"{f[f'speedup_collect_vs_{key_of(b)}']:>8.2f}x" for b in bases)
        si = "".join(f"{f[f'speedup_iter_vs_{key_of(b)}']:>8.2f}x" for b in bases)
        print(
            f"{name:<16}{f['threads']:>8}{f['collect_s']:>10.3f}{f['update_s']:>9.3f}{f['iter_s']:>9.3f}"
            f"{f['env_sps']:>11.1f}{f['train_sps']:>11.1f}{sp}{si}{f['policy_s']:>10.3f}"
            f"{f['sim_wait_s']:>12.3f}{f['worker_sim_s']:>14.3f}{f['mean_return']:>9.3f}"
        )


def compact(figures: dict) -> dict:
    """The JSON form: per mode key, its figures rounded."""

    def num(v):
        return (None if v != v else round(v, 4)) if isinstance(v, float) else v  # NaN: not measured

    return {key_of(name): {k: num(v) for k, v in f.items()} for name, f in figures.items()}


def measure(
    policy, n: int, rounds: int, sim, factory, stages: list[int], seed_base: int = 1000, probe: bool = False
) -> tuple[dict, list, tuple]:
    """Start the workers of every non-collocated mode, run the rounds, close them. ``sim`` is the
    collocated simulator (in this process), ``factory`` the sim workers' (picklable). With ``probe``
    also `contention` on the disaggregated worker first (else NaNs)."""
    layouts = {"disaggregated": PlacementConfig(mode="disaggregated")}
    layouts.update({f"hybrid S={s}": PlacementConfig(mode="hybrid", stages=s) for s in stages})
    pools: dict[str, list] = {}
    try:
        for name, placement in layouts.items():  # idle workers block on their pipe: no CPU
            pools[name] = start_sim_workers(factory, n, placement)
        contended = contention(policy, pools["disaggregated"][0], n) if probe else (float("nan"),) * 2
        modes = {"collocated 1t": (lambda seeds, gen: collect_episodes(policy, sim, seeds, gen, "train"), 1)}
        if CORES > 1:
            modes[f"collocated {CORES}t"] = (modes["collocated 1t"][0], CORES)
        for name, workers in pools.items():
            modes[name] = (
                functools.partial(lambda w, seeds, gen: collect_pipelined(policy, w, seeds, gen, "train"), workers),
                1,
            )
        stats, loads = run_rounds(policy, rounds, n, modes, seed_base)
        return summarize(stats, rounds, modes), loads, contended
    finally:
        for workers in pools.values():
            close_workers(workers)


def calibration_goal(args) -> str:
    """What the synthetic simulator's cost is calibrated to, in words."""
    if args.sim_ms_per_step is not None:
        return f"{args.sim_ms_per_step:g} ms per env step"
    return "the policy" if args.sim_ratio == 1 else f"{args.sim_ratio:g}x the policy"


def synthetic(args) -> dict:
    n = args.envs
    sim_kwargs = {"max_episode_steps": args.max_steps}
    policy = build_policy(device=args.device)
    load_kwargs, t_policy, t_sim = calibrate(policy, n, sim_kwargs, args.load, args.sim_ratio, args.sim_ms_per_step)
    print(
        f"\n== synthetic busy-work (not a real simulator): ReachSim + LoadedSim, N={n} envs, chunk {CHUNK}, "
        f"max {args.max_steps} steps; policy on {args.device}, simulators on the CPU"
    )
    print(
        f"calibrated to {calibration_goal(args)}: one decision costs policy {t_policy * 1e3:.1f} ms, simulator "
        f"{t_sim * 1e3:.1f} ms ({t_sim / t_policy:.2f}x; {t_sim / (n * CHUNK) * 1e3:.3f} ms per env step; "
        f"{args.load} load {load_kwargs}; calibrated at 1 thread)"
    )
    factory = functools.partial(loaded_reach, **load_kwargs, **sim_kwargs)
    sim = factory(num_envs=n, seed=0)
    figures, loads, (alone, both) = measure(policy, n, args.rounds, sim, factory, args.stages, probe=True)
    print(
        f"CPU contention: a policy decision takes {alone * 1e3:.1f} ms alone, {both * 1e3:.1f} ms while a "
        f"sim worker steps at the same time ({(both / alone - 1) * 100:+.0f}%)"
    )
    print_table(figures)
    print(f"load average (1 min) after each round: {', '.join(f'{x:.2f}' for x in loads)}")
    return {
        "workload": f"ReachSim + LoadedSim {args.load} busy-work calibrated to {calibration_goal(args)} (synthetic)",
        "num_envs": n,
        "sim_load": args.load,
        "policy_ms": round(t_policy * 1e3, 2),
        "sim_ms": round(t_sim * 1e3, 2),
        "sim_over_policy": round(t_sim / t_policy, 3),
        "sim_ms_per_env_step": round(t_sim / (n * CHUNK) * 1e3, 4),
        "policy_ms_with_sim": round(both * 1e3, 2),
        "load_avg_max": round(max(loads), 2),
        "modes": compact(figures),
    }


def maniskill(args) -> dict:
    """ManiSkill3 PickCube-v1 rgb through CPU sim workers; ``{"skipped": why}`` if it cannot run here."""
    os.environ.setdefault("LP_NUM_THREADS", "1")  # every env process renders with one lavapipe thread
    n = args.ms_envs
    sim_kwargs = dict(
        task="PickCube-v1",
        obs_mode="rgb",
        image_size=args.ms_image_size,
        control_mode="pd_ee_delta_pos",
        max_episode_steps=args.ms_max_steps,
    )
    try:
        from mmrl.placement import registered_sim

        factory = registered_sim("maniskill", **sim_kwargs)
        t0 = time.perf_counter()
        sim = factory(num_envs=n, seed=0)
    except Exception as exc:  # no mani_skill, no Vulkan driver, ...
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(
            f"\n== maniskill: skipped ({why}); install with `bash scripts/install_sim_deps.sh && "
            f"bash scripts/setup.sh sim`"
        )
        return {"skipped": why}
    try:
        print(
            f"\n== maniskill (real simulator): PickCube-v1 rgb {args.ms_image_size} px, CPU PhysX + software "
            f"Vulkan, N={n} envs (one process each), chunk {CHUNK}, max {sim.max_episode_steps} steps "
            f"(collocated simulator built in {time.perf_counter() - t0:.0f} s)"
        )
        policy = build_policy(sim.action_dim, sim.state_dim, device=args.device)
        out = real_workload(policy, sim, factory, n, args.ms_rounds, args.ms_stages, seed_base=5000)
    finally:
        sim.close()
    return {"workload": f"ManiSkill3 PickCube-v1 rgb {args.ms_image_size} px, CPU sim (real)", **out}


def real_workload(policy, sim, factory, n: int, rounds: int, stages: list[int], seed_base: int) -> dict:
    """A real simulator's rounds (maniskill, metaworld): one decision's cost of each side, then every
    mode measured, its table printed; the figures (the caller closes ``sim``)."""
    t_policy, t_sim = decision_costs(policy, sim, n)
    print(
        f"one decision costs policy {t_policy * 1e3:.1f} ms, simulator {t_sim * 1e3:.1f} ms "
        f"({t_sim / t_policy:.1f}x the policy; {t_sim / (n * CHUNK) * 1e3:.2f} ms per env step)"
    )
    figures, loads, _ = measure(policy, n, rounds, sim, factory, stages, seed_base=seed_base)
    print_table(figures)
    print(f"load average (1 min) after each round: {', '.join(f'{x:.2f}' for x in loads)}")
    return {
        "num_envs": n,
        "max_episode_steps": sim.max_episode_steps,
        "policy_ms": round(t_policy * 1e3, 2),
        "sim_ms": round(t_sim * 1e3, 2),
        "sim_over_policy": round(t_sim / t_policy, 3),
        "sim_ms_per_env_step": round(t_sim / (n * CHUNK) * 1e3, 4),
        "load_avg_max": round(max(loads), 2),
        "modes": compact(figures),
    }


def metaworld(args) -> dict:
    """Meta-World from pixels through CPU sim workers; ``{"skipped": why}`` if it cannot run here."""
    os.environ.setdefault("LP_NUM_THREADS", "1")  # OSMesa (llvmpipe): one render thread per process
    if args.device.startswith("cuda"):
        os.environ.setdefault("MUJOCO_GL", "egl")  # before MuJoCo loads: the GPU's EGL (the workers inherit it)
    n, size = args.mw_envs, args.mw_image_size
    sim_kwargs = dict(
        task=args.mw_task,
        render_images=True,
        image_size=size,
        camera="corner",
        vectorization="sync",  # a process steps its envs in turn: the placement's processes are the parallelism
        max_episode_steps=args.mw_max_steps,
    )
    missing = [m for m in ("metaworld", "mujoco", "gymnasium", "scipy") if importlib.util.find_spec(m) is None]
    try:
        if missing:
            raise ImportError(f"no module named {missing[0]!r}")
        from mmrl.placement import registered_sim

        factory = registered_sim("metaworld", **sim_kwargs)
        t0 = time.perf_counter()
        sim = factory(num_envs=n, seed=0)
    except Exception as exc:  # not installed, no OpenGL to render with, ...
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"\n== metaworld: skipped ({why}); install with `pip install -e '.[metaworld]'`")
        return {"skipped": why}
    gl = os.environ.get("MUJOCO_GL", "")
    try:
        print(
            f"\n== metaworld (real simulator): {args.mw_task} from {size} px pixels (MUJOCO_GL={gl}) + state, "
            f"MuJoCo on the CPU, N={n} envs stepped in turn per process, chunk {CHUNK}, max {sim.max_episode_steps} "
            f"steps; policy on {args.device} (collocated simulator built in {time.perf_counter() - t0:.0f} s)"
        )
        policy = build_policy(sim.action_dim, sim.state_dim, device=args.device, image_size=size)
        out = real_workload(policy, sim, factory, n, args.mw_rounds, args.mw_stages, seed_base=9000)
    finally:
        sim.close()
    workload = f"Meta-World {args.mw_task} from {size} px pixels, MuJoCo on the CPU, MUJOCO_GL={gl} (real)"
    return {"workload": workload, **out}


def trainer_seconds(iterations: int, n: int, extra: list[str]) -> float:
    """RL seconds per iteration of the real trainer on the quickstart (random weights, no warm
    start, no checkpoints or videos) with config overrides ``extra``."""
    import tempfile

    from mmrl.experiment import build_trainer, load_experiment

    with tempfile.TemporaryDirectory() as out:
        cfg = load_experiment(
            Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml",
            [
                f"run.output_dir={out}",
                "run.threads=1",
                f"sim.num_envs={n}",
                "sim.eval_num_envs=8",
                "warm_start.dataset=null",
                "trainer.eval_episodes=8",
                "trainer.video_episodes=0",
                f"trainer.iterations={iterations}",
                f"trainer.checkpoint_every={iterations}",
                *extra,
            ],
        )
        trainer = build_trainer(cfg)
        trainer.run()
        return trainer.state.rl_seconds / iterations


WORKLOADS = {
    "synthetic": ["synthetic"],
    "maniskill": ["maniskill"],
    "metaworld": ["metaworld"],
    "both": ["synthetic", "maniskill"],
    "all": ["synthetic", "maniskill", "metaworld"],
}


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark with command line ``argv`` (default: sys.argv); returns the JSON line's object."""
    from _smoke import parse_args

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--workload",
        nargs="+",
        choices=list(WORKLOADS),
        default=["both"],
        help="one or more: synthetic, maniskill, metaworld; both = synthetic maniskill; all = the three",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the policy infers and updates (cpu, cuda, cuda:1); simulators stay CPU processes",
    )
    parser.add_argument("--envs", type=int, default=64, help="synthetic: envs per round (N)")
    parser.add_argument("--rounds", type=int, default=6, help="synthetic: measured rounds per mode")
    parser.add_argument("--max-steps", type=int, default=40, help="synthetic: ReachSim max_episode_steps")
    parser.add_argument("--stages", type=int, nargs="*", default=[2, 4], help="synthetic: hybrid stage counts")
    cost = parser.add_mutually_exclusive_group()
    cost.add_argument(
        "--sim-ratio",
        type=float,
        default=1.0,
        help="synthetic: one simulator decision on the N envs costs this many policy decisions (default 1)",
    )
    cost.add_argument(
        "--sim-ms-per-step",
        type=float,
        help="synthetic: the simulator's cost per env step in ms (one thread), instead of --sim-ratio",
    )
    parser.add_argument(
        "--load",
        choices=["compute", "sleep"],
        default="compute",
        help="synthetic simulator cost: CPU busy-work (default; competes with inference for "
        "the cores) or sleep (a simulator on another device: no CPU contention)",
    )
    parser.add_argument("--ms-envs", type=int, default=2, help="maniskill: envs (one process each, ~0.8 GB)")
    parser.add_argument("--ms-rounds", type=int, default=3, help="maniskill: measured rounds per mode")
    parser.add_argument("--ms-max-steps", type=int, default=50, help="maniskill: episode limit (task: 50)")
    parser.add_argument("--ms-image-size", type=int, default=128, help="maniskill: camera resolution (px)")
    parser.add_argument("--ms-stages", type=int, nargs="*", default=[2], help="maniskill: hybrid stage counts")
    parser.add_argument("--mw-task", default="pick-place-v3", help="metaworld: the task")
    parser.add_argument("--mw-envs", type=int, default=8, help="metaworld: envs per round")
    parser.add_argument("--mw-rounds", type=int, default=3, help="metaworld: measured rounds per mode")
    parser.add_argument("--mw-max-steps", type=int, default=40, help="metaworld: episode limit (task: 500)")
    parser.add_argument("--mw-image-size", type=int, default=64, help="metaworld: camera resolution (px)")
    parser.add_argument("--mw-stages", type=int, nargs="*", default=[2, 4], help="metaworld: hybrid stage counts")
    parser.add_argument(
        "--async-iterations",
        type=int,
        default=0,
        help="also time K iterations of the real trainer on the quickstart, synchronous "
        "vs trainer.async_staleness=1 (0 = skip)",
    )
    args = parse_args(
        parser,
        argv,
        workload=["all"],
        envs=8,
        rounds=1,
        max_steps=8,
        stages=[2],
        ms_rounds=1,
        ms_max_steps=4,
        ms_image_size=32,
        mw_envs=2,
        mw_rounds=1,
        mw_max_steps=4,
        mw_image_size=32,
        mw_stages=[2],
    )
    device = torch.device(args.device)  # a bad name fails here, before any work
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here")
    workloads = {w for name in args.workload for w in WORKLOADS[name]}
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    print(
        f"load average (1 min) at start: {load:.2f}; CPUs: {CORES}; main-process torch threads: "
        f"1 (collocated {CORES}t: {CORES}); sim workers: 1 each; policy on {args.device}"
    )
    line: dict = {}
    if "synthetic" in workloads:
        line["synthetic_busywork"] = synthetic(args)
    if "maniskill" in workloads:
        line["maniskill_pickcube_rgb"] = maniskill(args)
    if "metaworld" in workloads:
        line["metaworld_pixels"] = metaworld(args)
    if args.async_iterations:
        k, n = args.async_iterations, args.envs
        on = [] if args.device == "cpu" else [f"run.device={args.device}"]
        sync_s = trainer_seconds(k, n, on)
        async_s = trainer_seconds(k, n, [*on, "trainer.async_staleness=1"])
        print(
            f"\ntrainer on the quickstart ({n} envs, {k} iterations): synchronous {sync_s:.3f} s/iteration, "
            f"async (staleness 1) {async_s:.3f} s/iteration -> {sync_s / async_s:.2f}x"
        )
        line["async"] = {
            "trainer_sync_s_per_iter": round(sync_s, 3),
            "trainer_async_s_per_iter": round(async_s, 3),
            "async_speedup": round(sync_s / async_s, 3),
        }
    line.update(
        device=args.device, cpus=CORES, load_avg_start=round(load, 2), load_avg_end=round(os.getloadavg()[0], 2)
    )
    print(json.dumps(line))
    return line


if __name__ == "__main__":
    main()
