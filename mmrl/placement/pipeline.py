"""`collect_pipelined`: `collect_episodes` over sim workers, overlapping simulation and inference.

The N environments are split into S stages (contiguous slices, one `SimWorker` each). The main
process runs the policy stage by stage; as soon as stage s's actions are sent, its worker
simulates them while the main process runs inference on stage s+1::

    main    | P0(t) | P1(t) | P0(t+1) | P1(t+1) | ...
    worker0 |       | S0(t) |         | S0(t+1) |
    worker1 |       |       | S1(t)   |         | S1(t+1)

With S = 1 (disaggregated) nothing overlaps: the same loop, the simulator in another process.

Same seeds, same episodes. The loop keeps `collect_episodes`'s semantics exactly: every stage is
stepped until every episode of the whole batch has ended (finished envs keep stepping with
``valid = False``), and the policy is called stage 0, 1, ..., S-1 within each decision, so a
shared ``generator`` is consumed in the same order as one full-batch call whenever the policy
draws its noise in one batch-sized call per decision (eval / ODE sampling of the flow VLA):

- a stage may start decision t+1 before the last stage has reported decision t; if it turns out
  that every episode had already ended, that speculative work is thrown away and the generator
  (and torch's global CPU RNG) is restored to its state before it;
- torch's CPU normal sampler works in blocks of 16 numbers, so one draw of ``N*k`` numbers equals
  S consecutive draws of ``N/S*k`` exactly when ``N/S*k`` is a multiple of 16 (flow VLA, chunk 4,
  2 action dims: an even number of envs per stage). CUDA generators do not split that way.
- a policy that makes several draws per call (Flow-SDE train rollouts: the start noise, then one
  draw per stochastic denoising step) interleaves them differently for S > 1: the episodes are
  then equal in distribution, not bit for bit. Exact train-mode equality needs per-env noise
  streams in the policy (counter-based, like `simulators.reach.hash_uniform`).
- Only ``valid`` rows are identical: after an episode ends, its env auto-resets from the worker
  simulator's own generator, which is seeded from that worker's slice of the seeds.

Crashes: if a worker dies mid-collection, or stays silent past its call's time limit
(``placement.step_timeout_s``; automatic by default, see `mmrl.placement.worker`) and is killed, it
is restarted (`SimWorker.restart`, which warns why), reset with its stage's seeds, and the episodes
that were in progress in it are lost: their columns are marked ``valid = False`` for the whole
rollout, ``info["lost"]`` flags them and ``info["lost_episodes"]`` counts them (their ``return`` /
``length`` read 0). Episodes that had ended before the crash are kept. A crash while resetting
costs no episode: the worker is restarted and the reset retried.
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Sequence
from typing import cast

import torch

from mmrl.batch import Batch
from mmrl.placement.worker import WorkerBase, WorkerCrashed, close_workers
from mmrl.rollout import (
    episode_breakdown,
    episode_info,
    episode_tasks,
    label_episodes,
    merged_breakdown,
    step_record,
    truncation_values,
)
from mmrl.simulator import StepResult, check_step_result
from mmrl.utils.rows import sub_rows


def stage_torch_seed(seeds: list[int]) -> int:
    """Seed of a worker's global torch RNG for a reset with ``seeds`` (any global-RNG use in it)."""
    return zlib.crc32(repr([int(s) for s in seeds]).encode())


@torch.no_grad()
def collect_pipelined(
    policy,
    sim_workers: Sequence[WorkerBase],
    seeds: list[int],
    generator: torch.Generator | None,
    mode: str = "train",
    reward=None,
) -> tuple[Batch, dict]:
    """Run one episode per env over ``sim_workers`` (stage s = worker s's envs, in order).

    Returns what `mmrl.rollout.collect_episodes` returns, (Batch [T, N, ...], info with
    ``return`` / ``success`` / ``length`` [N]), plus in info ``lost`` bool [N], ``lost_episodes``,
    ``worker_restarts`` (crashes survived in this call), ``policy_s`` / ``sim_wait_s`` (seconds the
    main process spent in inference / waiting for a simulator) and ``sim_s`` (seconds the workers
    spent simulating, summed over workers). No video frames. The reward stage ``reward`` (if any)
    scores each stage's decision in the main process when its simulation comes back.
    """
    workers = list(sim_workers)
    try:
        return _collect(policy, workers, seeds, generator, mode, reward)
    except BaseException:
        for w in workers:  # answers still in flight must not be taken for the next request's
            w.discard_pending()
        raise


def _collect(policy, workers: list[WorkerBase], seeds: list[int], generator, mode: str, reward):
    sizes = [w.num_envs for w in workers]
    n = sum(sizes)
    if len(seeds) != n:
        raise ValueError(f"got {len(seeds)} seeds for {n} envs ({len(workers)} workers of {sizes})")
    if len({w.max_episode_steps for w in workers}) != 1:
        raise ValueError(f"sim workers disagree on max_episode_steps: {[w.max_episode_steps for w in workers]}")
    bounds = [0]
    for k in sizes:
        bounds.append(bounds[-1] + k)
    stage_seeds = [[int(x) for x in seeds[bounds[s] : bounds[s + 1]]] for s in range(len(workers))]
    S = len(workers)
    horizon = math.ceil(workers[0].max_episode_steps / policy.chunk_size)
    timing = {"policy_s": 0.0, "sim_wait_s": 0.0, "sim_s": 0.0}
    lost = [torch.zeros(k, dtype=torch.bool) for k in sizes]
    crashes = 0

    def restart_and_reset(s: int):
        nonlocal crashes
        while True:  # a crash during the reset itself: restart again (bounded by max_restarts)
            crashes += 1
            workers[s].restart()
            try:
                return workers[s].reset(stage_seeds[s], stage_torch_seed(stage_seeds[s]))
            except WorkerCrashed:
                continue

    # ---- reset every stage (in parallel) ---------------------------------------------------------
    for s, w in enumerate(workers):
        w.submit("reset", stage_seeds[s], stage_torch_seed(stage_seeds[s]))
    obs = []
    t0 = time.perf_counter()
    for s, w in enumerate(workers):
        try:
            obs.append(w.result())
        except WorkerCrashed:
            obs.append(restart_and_reset(s))
    timing["sim_wait_s"] += time.perf_counter() - t0
    stage_tasks = [episode_tasks(o) for o in obs]
    tasks = None if any(t is None for t in stage_tasks) else [t for st in stage_tasks if st is not None for t in st]
    breakdown = merged_breakdown([episode_breakdown(o) for o in obs])
    alive = [torch.ones(k, dtype=torch.bool) for k in sizes]
    episodes = [reward.episode_scores(k) if reward is not None else None for k in sizes]  # the reward's state

    # ---- the pipeline --------------------------------------------------------------------------
    steps: list[list[Batch | None]] = []  # per decision, per stage (None until its simulation is back)
    waiting: list[tuple | None] = [None] * S  # (batch, actions, obs) of a decision whose simulation is in flight
    for t in range(horizon + 1):
        last = t == horizon
        finished = False
        rng_before: tuple | None = None  # RNG states before a decision t started speculatively
        for s in range(S):
            if t > 0:  # stage s's result of decision t-1
                t0 = time.perf_counter()
                try:
                    res = workers[s].result()
                    check_step_result(
                        workers[s], res, f"{(workers[s].meta or {}).get('class')} (worker {workers[s].name!r})"
                    )
                except WorkerCrashed:
                    lost[s] |= alive[s]  # its episodes in progress are gone
                    alive[s] &= ~lost[s]
                    res = _nothing_happened(restart_and_reset(s))
                timing["sim_wait_s"] += time.perf_counter() - t0
                timing["sim_s"] += float(res.info.get("worker_s", 0.0))
                in_flight = waiting[s]
                assert in_flight is not None, "stage s ran decision t-1"
                out, actions, acted_on = in_flight
                if reward is not None:
                    res = reward(res, acted_on, actions, alive[s], episodes[s])
                boot = truncation_values(policy, res, alive[s]) if mode == "train" else None
                steps[t - 1][s] = step_record(out, res, alive[s], boot).to("cpu")
                alive[s] &= ~res.done.cpu()
                obs[s] = res.obs
                if s == S - 1 and not any(bool(a.any()) for a in alive):
                    finished = True  # every episode has ended: decision t never happens
                    if rng_before is not None:  # stages 0..S-2 already ran decision t: undo
                        for w in workers[: S - 1]:
                            w.discard_pending()
                        _set_rng(generator, rng_before)
                        steps.pop()
                    break
            if last:
                continue
            if s == 0:
                steps.append([None] * S)
                rng_before = _get_rng(generator) if S > 1 else None
            t0 = time.perf_counter()
            with sub_rows(bounds[s], sizes[s]):  # with N ranks: the stage's rows of the global noise
                out, actions = policy.rollout(obs[s], generator=generator, mode=mode)
            # the copy to the host waits for a GPU's queued kernels: timed as the policy's (before, a
            # CUDA policy's time landed in the untimed copy)
            sent = actions.detach().cpu() if isinstance(actions, torch.Tensor) else actions
            timing["policy_s"] += time.perf_counter() - t0
            # the last observation of an episode the time limit cuts is needed in train mode only
            # (the critic's bootstrap value there); evaluation saves the traffic
            workers[s].submit("step_chunk", sent, mode == "train", reward is not None and reward.traced)
            waiting[s] = (out, actions, obs[s])
        if finished or last:
            break
    # every stage of every decision kept is back (an unfinished last decision was popped)
    batch = Batch.stack([Batch.cat(cast("list[Batch]", row), dim=0) for row in steps])  # [T, N, ...]
    lost_all = torch.cat(lost)
    if lost_all.any():
        batch["valid"][:, lost_all] = False
    info = {
        **episode_info(batch),
        "lost": lost_all,
        "lost_episodes": int(lost_all.sum()),
        "worker_restarts": crashes,
        **timing,
    }
    label_episodes(batch, info, tasks, breakdown)  # as collect_episodes labels them
    return batch, info


def _nothing_happened(obs) -> StepResult:
    """Stand-in result of a decision whose simulation was lost with its worker."""
    k = obs.image.shape[0]
    zeros = torch.zeros(k, dtype=torch.bool)
    return StepResult(
        obs, torch.zeros(k), zeros, zeros.clone(), zeros.clone(), None, {"num_steps": torch.zeros(k, dtype=torch.long)}
    )


def _get_rng(generator: torch.Generator | None) -> tuple:
    return (None if generator is None else generator.get_state(), torch.random.get_rng_state())


def _set_rng(generator: torch.Generator | None, state: tuple) -> None:
    if generator is not None:
        generator.set_state(state[0])
    torch.random.set_rng_state(state[1])


class SimGroup:
    """The sim workers of a non-collocated placement seen as one batched simulator of
    ``sum(num_envs)`` envs: the shape attributes the trainer and policy builders read, and
    `collect` (stage s = worker s's contiguous slice of the envs). Results arrive on CPU."""

    device = torch.device("cpu")

    def __init__(self, workers: Sequence[WorkerBase]):
        if not workers:
            raise ValueError("SimGroup needs at least one sim worker")
        self.workers = list(workers)
        first = self.workers[0]
        self.num_envs = sum(w.num_envs for w in self.workers)
        self.action_dim, self.max_episode_steps = first.action_dim, first.max_episode_steps
        self.action_type = first.action_type
        self.image_shape, self.state_dim = first.image_shape, first.state_dim
        self.has_images, self.has_success = first.has_images, first.has_success

    def close(self) -> None:
        close_workers(self.workers)


class LazySim:
    """An in-process simulator built on first attribute access by ``make`` (e.g. a one-env copy of
    a `SimGroup`'s simulator, for a policy check that reads the simulator's data); ``close``
    closes it if it was built."""

    def __init__(self, make):
        self._make, self._sim = make, None

    def __getattr__(self, name: str):
        if self._sim is None:
            self._sim = self._make()
        return getattr(self._sim, name)

    def close(self) -> None:
        if self._sim is not None:
            self._sim.close()


def collect(
    policy, sim, seeds: list[int], generator: torch.Generator | None, mode: str = "train", reward=None
) -> tuple[Batch, dict]:
    """`collect_pipelined` when ``sim`` is a `SimGroup`, else `collect_episodes` in this process."""
    if isinstance(sim, SimGroup):
        return collect_pipelined(policy, sim.workers, seeds, generator, mode, reward)
    from mmrl.rollout import collect_episodes

    return collect_episodes(policy, sim, seeds, generator, mode, reward=reward)
