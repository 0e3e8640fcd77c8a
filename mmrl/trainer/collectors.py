"""How the trainer gets an iteration's batch: one collector object, chosen from the config.

- `EpisodeCollector`: one episode per env per round, every env reset with the round's seeds (a
  GRPO group of G consecutive envs shares one), wherever the simulator runs: in this process or
  in the placement's sim workers (`mmrl.placement.collect` picks the pipeline);
- `FixedLengthCollector` (``trainer.rollout_steps = T``): T decisions per env per round, the
  episodes going on across rounds (and across a checkpoint);
- `DynamicSamplingCollector` (``algorithm.dynamic_sampling``): rounds of an `EpisodeCollector`
  until enough groups with differing rewards are kept (DAPO);
- `AsyncCollector` (``trainer.async_staleness = N``): any of them run in a background thread by a
  behaviour copy of the policy, N weight versions behind at most.

``collect(policy, round, generator) -> (Batch [T, N, ...], info)``. info counts what was collected
(``env_steps``, ``episodes``, ``lost_episodes``, ``nonfinite_episodes``, which the trainer adds to
its counters) and holds the episodes' ``return`` / ``success`` / ``length``; the trainer sets the
policy to eval mode and the precision context around the call. Episodes with a non-finite reward
(a NaN from a simulator or a reward model) are dropped where they enter, like lost ones, and
counted (`drop_nonfinite`): nothing trains on them or averages them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from mmrl import distributed
from mmrl.batch import Batch
from mmrl.distributed import Ranks, broadcast_generator
from mmrl.placement.pipeline import SimGroup, collect
from mmrl.rollout import StepCollector, episode_seeds
from mmrl.utils.rows import batch_rows

TRAIN_SEED_STRIDE = 1_000_003  # train reset seeds stay far below the evaluation seeds
# what a collection adds to the run's TrainState
COUNTS = ("env_steps", "episodes", "lost_episodes", "nonfinite_episodes")


def pad_time(batch: Batch, horizon: int) -> Batch:
    """[T, N, ...] -> [horizon, N, ...], the added decisions zero (so ``valid`` False)."""
    t = batch["valid"].shape[0]
    if t == horizon:
        return batch
    return Batch({k: torch.cat([v, v.new_zeros(horizon - t, *v.shape[1:])]) for k, v in batch.items()})


def nonfinite_steps(batch: Batch) -> torch.Tensor:
    """[T, N] bool: the valid decisions of the batch whose reward is NaN or infinite."""
    return ~torch.isfinite(batch["rewards"]) & batch["valid"].bool()


def nonfinite_episodes(batch: Batch) -> torch.Tensor:
    """[N] bool: the envs of the [T, N] batch with a NaN or infinite reward at a valid decision."""
    return nonfinite_steps(batch).any(0)


def drop_nonfinite(batch: Batch, info: dict) -> tuple[Batch, dict]:
    """Whole-episode batches: drop the episodes with a non-finite reward (`drop_episodes`) and count
    them in ``info["nonfinite_episodes"]``."""
    bad = nonfinite_episodes(batch)
    if bad.any():
        batch, info = drop_episodes(batch, info, bad)
    info["nonfinite_episodes"] = int(bad.sum())
    return batch, info


def drop_lost(batch: Batch, info: dict) -> tuple[Batch, dict]:
    """Remove the episodes a crashed sim worker lost (``info["lost"]`` [N]) from the [T, N] batch
    and the per-episode info, so that they count nowhere: not in a group's baseline, not in the
    logged success rate."""
    return drop_episodes(batch, info, info["lost"])


def drop_episodes(batch: Batch, info: dict, drop: torch.Tensor) -> tuple[Batch, dict]:
    """The [T, N] batch and per-episode info without the envs where ``drop`` [N] is True."""
    keep = ~drop
    batch = Batch({k: v[:, keep] for k, v in batch.items()})

    def kept(v):
        if isinstance(v, torch.Tensor) and v.shape[:1] == keep.shape:
            return v[keep]
        if isinstance(v, list) and len(v) == len(keep):  # per-episode labels (``task``)
            return [x for x, k in zip(v, keep.tolist()) if k]
        if isinstance(v, dict):  # per-episode counters
            return {name: kept(x) for name, x in v.items()}
        return v

    return batch, {k: kept(v) for k, v in info.items()}


class Collector:
    """The simulator a collector drives: an in-process `Simulator` or a `SimGroup` of sim workers."""

    #: whether episodes go on across rounds (the reward scaler then keeps its running return)
    continuing = False

    def __init__(self, sim, reward=None):
        self.sim, self.reward = sim, reward  # reward: the trainer's `mmrl.trainer.reward_stage.RewardStage`, or None

    @property
    def num_envs(self) -> int:
        return self.sim.num_envs

    @property
    def max_episode_steps(self) -> int:
        return self.sim.max_episode_steps

    @property
    def remote(self) -> bool:
        """Whether the simulator runs in sim workers (which can crash and lose episodes)."""
        return isinstance(self.sim, SimGroup)

    def collect(self, policy, round: int, generator: torch.Generator) -> tuple[Batch, dict]:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """What a checkpoint must keep to resume collection exactly (nothing for fresh rounds)."""
        return {}

    def load_state_dict(self, state: dict) -> str | None:
        """Restore `state_dict`; returns a warning when the resume cannot be exact."""
        return None

    def close(self) -> None:
        """Stop the sim workers of a non-collocated placement (an in-process simulator stays)."""
        if self.remote:
            self.sim.close()


class EpisodeCollector(Collector):
    """One episode per env with round ``r``'s seeds: ``seed * TRAIN_SEED_STRIDE + r * (N / G)`` +
    the env's group index. With ``ranks``, N is the global batch (``world * num_envs``) and this
    rank's envs are its ``num_envs`` of them (whole groups), seeds and group ids as in one process."""

    def __init__(self, sim, seed: int, group_size: int, reward=None, ranks: Ranks | None = None):
        super().__init__(sim, reward)
        self.seed, self.group_size, self.ranks = seed, group_size, ranks or Ranks()

    def collect(self, policy, round: int, generator: torch.Generator) -> tuple[Batch, dict]:
        groups = self.num_envs // self.group_size  # this rank's
        base = self.seed * TRAIN_SEED_STRIDE + round * groups * self.ranks.world
        torch.manual_seed(base)  # auto-reset draws and any global-RNG use inside the simulator
        first = self.ranks.rank * groups  # this rank's first group of the global batch
        seeds = episode_seeds(base + first, self.num_envs, self.group_size)
        batch, info = collect(policy, self.sim, seeds, generator, mode="train", reward=self.reward)
        group = first + torch.unique(torch.tensor(seeds), return_inverse=True)[1]
        batch["group"] = group[None].expand(batch["valid"].shape[0], -1)
        if info.get("lost_episodes"):  # a sim worker crashed: its episodes in progress are dropped
            batch, info = drop_lost(batch, info)
        batch, info = drop_nonfinite(batch, info)
        info.update(
            env_steps=int((batch["env_steps"] * batch["valid"]).sum()),
            episodes=batch["valid"].shape[1],
            lost_episodes=info.get("lost_episodes", 0),
        )
        return batch, info


class FixedLengthCollector(Collector):
    """``steps`` decisions per env per round, continuing the episodes in progress (`StepCollector`;
    ``next_state``: each decision records the state it led to, for the off-policy mode's replay)."""

    continuing = True

    def __init__(self, sim, seed: int, steps: int, reward=None, next_state: bool = False):
        super().__init__(sim, reward)
        seeds = episode_seeds(seed * TRAIN_SEED_STRIDE, sim.num_envs)
        self.rollout = StepCollector(sim, steps, seeds, reward, next_state=next_state)

    def collect(self, policy, round: int, generator: torch.Generator) -> tuple[Batch, dict]:
        batch, info = self.rollout.collect(policy, generator)
        # episodes go on across rounds, so a non-finite reward cannot drop its episode: its
        # decisions are masked out (reward 0, not valid) and the env counted once per round
        bad_steps = nonfinite_steps(batch)
        nonfinite = int(bad_steps.any(0).sum())
        if nonfinite:
            batch["rewards"] = torch.where(bad_steps, torch.zeros_like(batch["rewards"]), batch["rewards"])
            batch["valid"] = batch["valid"] & ~bad_steps
            ended = torch.isfinite(info["return"])  # ended episodes whose return saw the NaN
            for key in ("return", "success", "length"):
                info[key] = info[key][ended]
            if "task" in info:
                info["task"] = [t for t, keep in zip(info["task"], ended.tolist()) if keep]
        info.update(episodes=len(info["return"]), lost_episodes=0, nonfinite_episodes=nonfinite)
        return batch, info

    def state_dict(self) -> dict:
        return self.rollout.state_dict()

    def load_state_dict(self, state: dict) -> str | None:
        return self.rollout.load_state_dict(state)


class DynamicSamplingCollector(Collector):
    """Up to ``max_rounds`` rounds of ``inner`` per iteration, keeping only groups whose rewards
    differ, until N / G groups are kept (metrics of the first round, so the logged return is not
    biased by the filter)."""

    def __init__(self, inner: EpisodeCollector | GatheringCollector, max_rounds: int):
        super().__init__(inner.sim, inner.reward)
        self.inner, self.max_rounds = inner, max_rounds

    def collect(self, policy, round: int, generator: torch.Generator) -> tuple[Batch, dict]:
        from mmrl.algorithms.dynamic_sampling import DynamicSamplingBuffer

        rounds, group_size = self.max_rounds, self.inner.group_size
        horizon = math.ceil(self.max_episode_steps / policy.chunk_size)  # longest episode
        buf = DynamicSamplingBuffer(self.num_envs // group_size, reward_key="episode_return")
        first: dict | None = None
        for r in range(rounds):
            batch, info = self.inner.collect(policy, round * rounds + r, generator)
            if first is None:
                first = info
            else:  # every round's episodes count as collected
                for key in COUNTS:
                    first[key] += info[key]
            envs_first = {k: v.transpose(0, 1) for k, v in pad_time(batch, horizon).items() if k != "group"}
            buf.add(envs_first, info["return"], batch["group"][0])
            if buf.ready:
                break
        assert first is not None, "max_rounds >= 1 (algorithm.max_sampling_rounds is checked)"
        first.update(kept_groups=min(buf.num_groups, buf.target_groups), sampling_rounds=r + 1)
        if not buf.num_groups:  # every group constant: zero advantages, train on the last round as it is
            return batch, first
        kept = buf.pop(partial=True)
        group = kept.pop("group")
        del kept["episode_return"]
        out = Batch({k: v.transpose(0, 1) for k, v in kept.items()})
        out["group"] = group[None].expand(horizon, -1)
        return out, first


class GatheringCollector(Collector):
    """One rank's share of the global batch (``inner``, collected drawing this rank's rows of the
    global noise, `mmrl.utils.rows`), gathered from every rank: each rank returns the global batch
    [T, world * N, ...] (envs in rank order; T the longest rank's, the others padded with invalid
    decisions) and the global info (`gather_info`), so that what follows is the one-process
    computation on the global batch (`mmrl.distributed`)."""

    def __init__(self, inner: EpisodeCollector, ranks: Ranks):
        super().__init__(inner.sim, inner.reward)
        self.inner, self.ranks, self.group_size = inner, ranks, inner.group_size

    @property
    def num_envs(self) -> int:
        """The global batch's envs (every rank's)."""
        return self.ranks.world * self.inner.num_envs

    def collect(self, policy, round: int, generator: torch.Generator) -> tuple[Batch, dict]:
        n, r = self.inner.num_envs, self.ranks
        with batch_rows(r.rank * n, n, r.world * n):
            batch, info = self.inner.collect(policy, round, generator)
        parts = distributed.gather_objects((batch.to("cpu"), info))
        broadcast_generator(generator)  # the update's shuffling is the same on every rank
        horizon = max(b["valid"].shape[0] for b, _ in parts)
        return Batch.cat([pad_time(b, horizon) for b, _ in parts], dim=1), gather_info([i for _, i in parts])


def gather_info(infos: list[dict]) -> dict:
    """The ranks' collection infos as one: per-episode tensors and lists concatenated in rank order,
    counts (ints) summed, timings (floats) the slowest rank's."""
    out: dict = {}
    for key, value in infos[0].items():
        values = [i[key] for i in infos]
        if isinstance(value, torch.Tensor) and value.dim():
            out[key] = torch.cat(values)
        elif isinstance(value, list):
            out[key] = [x for v in values for x in v]
        elif isinstance(value, bool) or not isinstance(value, int | float):
            out[key] = value
        else:
            out[key] = sum(values) if isinstance(value, int) else max(values)
    return out


def build_collector(cfg, sim, reward=None, ranks: Ranks | None = None) -> Collector:
    """The collector the experiment's ``trainer`` and ``algorithm`` sections ask for, scoring with
    the reward stage ``reward`` (the background `AsyncCollector` wraps it in the trainer, which
    owns the weight versions); with N ``ranks``, this rank's share gathered into the global batch."""
    ranks = ranks or Ranks()
    if cfg.trainer.rollout_steps:
        return FixedLengthCollector(
            sim, cfg.run.seed, cfg.trainer.rollout_steps, reward, next_state=cfg.algorithm.off_policy
        )
    own = EpisodeCollector(sim, cfg.run.seed, cfg.algorithm.group_size, reward, ranks)
    # with N ranks, gathered inside dynamic sampling: its rounds keep groups of the global batch
    episodes = GatheringCollector(own, ranks) if ranks.distributed else own
    if cfg.algorithm.dynamic_sampling:
        return DynamicSamplingCollector(episodes, cfg.algorithm.max_sampling_rounds)
    return episodes


class AsyncCollector:
    """Asynchronous rollout with bounded staleness: batch j is collected in a background thread by
    a behaviour copy of the policy holding the weights of version max(0, j - N) (version v = the
    weights after v updates), so that collecting batch k+N overlaps training on batch k.

    The mapping batch -> weight version is fixed, not timing-dependent: at the start of iteration
    k the trainer submits batch k+N with the current weights (version k) and then waits for batch
    k. PPO's ratio is taken against the log-probs stored at rollout, i.e. against the behaviour
    policy that produced the batch, and its clip bounds the step from it. After a resume at
    iteration k, batches k .. k+N-1 are collected with version k (fresher than in the run that was
    interrupted; their seeds are the same, so no episode is repeated or skipped).

    ``generator(j)`` is batch j's sampling generator; ``context()`` the precision context entered
    in the collecting thread (autocast is thread-local).
    """

    def __init__(
        self,
        inner: Collector,
        policy,
        staleness: int,
        generator: Callable[[int], torch.Generator],
        context: Callable[[], AbstractContextManager],
    ):
        import copy
        from concurrent.futures import ThreadPoolExecutor

        if not policy.caps.asynchronous:  # the config check says so first (mmrl.experiment)
            raise ValueError(
                f"trainer.async_staleness = {staleness} is not supported by policy '{policy.cfg.type}': "
                + policy.caps.fix("asynchronous", "set trainer.async_staleness=0")
            )
        self.inner, self.policy, self.staleness = inner, policy, staleness
        self.generator, self.context = generator, context
        self.behaviour = copy.deepcopy(policy).eval()
        for p in self.behaviour.parameters():
            p.requires_grad_(False)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mmrl-rollout")
        self.futures: dict = {}

    def submit_up_to(self, it: int, total: int, version: int) -> None:
        """Submit every batch up to ``it + N`` (below ``total``) not submitted yet, with the
        current weights (version ``version``)."""
        weights = None
        for j in range(it, min(it + self.staleness + 1, total)):
            if j not in self.futures:
                weights = weights or {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
                self.futures[j] = self.pool.submit(self._collect, j, weights, version)

    def _collect(self, j: int, weights: dict, version: int) -> tuple[Batch, dict]:
        self.behaviour.load_state_dict(weights)
        with self.context():
            batch, info = self.inner.collect(self.behaviour, j, self.generator(j))
        info.update(policy_version=version, staleness=j - version)
        return batch, info

    def result(self, it: int) -> tuple[Batch, dict]:
        return self.futures.pop(it).result()

    def close(self) -> None:
        for f in self.futures.values():
            f.cancel()
        self.pool.shutdown(wait=True)
        self.futures.clear()
