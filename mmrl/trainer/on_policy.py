"""The on-policy learner: the learn stage of the trainer's loop for every objective that trains on the
rollout it just collected (PPO, GRPO and its family, AWM, DiffusionNFT), beside `OffPolicy`
(`mmrl.trainer.off_policy`), which replays transitions from a buffer (SAC). Both implement the
`mmrl.trainer.learner.Learner` interface the trainer holds one of.

On each iteration's batch it runs, in order:

- reward scaling (``algorithm.reward_norm``): the collected rewards, already scored by the reward
  stage, divided by the running std of the discounted return (`RewardScaler`, saved in checkpoints
  under the key ``reward_scaler``);
- advantages (`mmrl.trainer.objectives.compute_advantages`: the registered estimator
  ``algorithm.advantage``), then their whitening, PSR/NSR weights and clip over the rollout or per
  minibatch (``algorithm.advantage_norm_scope``);
- `OnPolicy.update`: ``algorithm.epochs`` passes of minibatch steps of the objective through the
  trainer's engine (with N ranks, each rank takes its share of every minibatch), stopping after the
  epoch whose mean approx KL exceeds ``algorithm.target_kl``; with ``trainer.lr_schedule: adaptive``
  the learning rate follows the KL before every step (`kl_adaptive_scale`, rsl_rl's rule).

The batch is then discarded: nothing of it outlives the iteration.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mmrl import distributed
from mmrl.algorithms.normalization import RewardScaler, explained_variance
from mmrl.batch import Batch
from mmrl.config import ConfigError
from mmrl.registry import OBJECTIVES
from mmrl.trainer.objectives import compute_advantages, prepare_advantages, valid_samples
from mmrl.trainer.state import TrainerView
from mmrl.utils.rows import batch_rows

#: ``lr_schedule: adaptive``: the factor a step multiplies or divides the learning rate by, the margin
#: around ``desired_kl`` inside which it is left alone, and the learning rate's bounds as multiples of
#: ``trainer.lr`` (rsl_rl's and rl_games' values; at lr 1e-3 the bounds are rsl_rl's 1e-5 and 1e-2)
KL_LR_FACTOR, KL_MARGIN, KL_LR_BOUNDS = 1.5, 2.0, (0.01, 10.0)


def kl_adaptive_scale(scale: float, kl: float, desired: float) -> float:
    """The KL-adaptive learning rate (rsl_rl / rl_games / IsaacLab's ``schedule="adaptive"``), as a
    multiple of ``trainer.lr``: divided by `KL_LR_FACTOR` when the minibatch's approx KL to the
    rollout policy exceeds ``KL_MARGIN * desired``, multiplied by it when the KL is positive and
    below ``desired / KL_MARGIN``, else kept; always inside `KL_LR_BOUNDS`."""
    if kl > KL_MARGIN * desired:
        scale /= KL_LR_FACTOR
    elif 0.0 < kl < desired / KL_MARGIN:
        scale *= KL_LR_FACTOR
    return min(max(scale, KL_LR_BOUNDS[0]), KL_LR_BOUNDS[1])


class OnPolicy:
    """The on-policy learn stage of ``trainer`` (see the module docstring): its own state is the
    reward scaler (None without ``algorithm.reward_norm``); the weights, the engine, the learning
    rate and the counters are the trainer's."""

    #: the key of its state in a checkpoint (`mmrl.trainer.checkpoint`'s extra), as checkpoints name it
    checkpoint_key = "reward_scaler"

    def __init__(self, trainer: TrainerView):
        self.trainer = trainer
        algo = trainer.cfg.algorithm
        per_task = algo.reward_norm_by == "task"
        self.reward_scaler = RewardScaler(algo.gamma, per_key=per_task) if algo.reward_norm else None

    def behaviour(self, policy, env_steps: int):
        """Who acts in the rollout: the trained policy itself, always."""
        return policy

    def after_warm_start(self, records: Callable[..., dict], log: Callable[[str], None]) -> None:
        """Nothing to prepare after the warm start: the first rollout is the first data."""

    def learn(self, it: int, batch: Batch, info: dict, gen: torch.Generator, env_steps: int) -> dict:
        """Scale rewards -> advantages (bootstrapped from ``info["last_values"]`` where a rollout was
        cut) -> `update`, on iteration ``it``'s batch; ``gen`` shuffles the minibatches."""
        batch = self.scale_rewards(batch)
        batch = compute_advantages(batch, self.trainer.cfg.algorithm, info.get("last_values"))
        per_task = self.task_logs(batch, info.get("task_names", {}))
        return {**self.update(batch, gen), **per_task}

    def scale_rewards(self, batch: Batch) -> Batch:
        """The collected rewards (already scored by the reward stage) scaled by the running std of the
        discounted return when ``algorithm.reward_norm`` is on (one std per task with
        ``reward_norm_by: task``, the batch's ``task`` ids)."""
        scaler = self.reward_scaler
        if scaler is None:
            return batch
        if scaler.per_key and "task" not in batch:
            raise ConfigError(
                "algorithm.reward_norm_by=task keeps one reward scale per task, but the simulator names no "
                "task for its episodes (Observation.meta[i]['task']): set algorithm.reward_norm_by=all"
            )
        batch["rewards"] = scaler.scale(
            batch["rewards"],
            batch["dones"],
            batch["valid"],
            continuing=self.trainer.collector.continuing,
            keys=batch.get("task") if scaler.per_key else None,
        )
        return batch

    def task_logs(self, batch: Batch, names: dict[int, str]) -> dict[str, float]:
        """Per task named in ``names`` (the batch's ``task`` ids): ``train/adv_abs/<task>``, the mean
        absolute advantage before any whitening (how much each task moves the update), and with
        per-task reward scaling ``train/reward_std/<task>``, the std its rewards were divided by."""
        if "task" not in batch or len(names) < 2 or "advantages" not in batch:
            return {}
        valid, adv = batch["valid"].bool(), batch["advantages"]
        adv = adv.reshape(*valid.shape, -1).abs().mean(-1)  # per decision, over any log-prob levels
        out = {}
        for key, name in sorted(names.items(), key=lambda kv: kv[1]):
            rows = (batch["task"] == key) & valid
            if rows.any():
                out[f"train/adv_abs/{name}"] = float(adv[rows].mean())
        stds = self.reward_scaler.stds() if self.reward_scaler is not None else {}
        out.update({f"train/reward_std/{names[k]}": v for k, v in stds.items() if k in names})
        return out

    def update(self, batch: Batch, gen: torch.Generator) -> dict:
        """``algorithm.epochs`` passes of minibatch steps of the objective over the valid samples;
        with ``target_kl`` the update stops after the epoch whose mean approx KL exceeds it."""
        t = self.trainer
        algo, ranks = t.cfg.algorithm, t.ranks
        per_minibatch = algo.advantage_norm_scope == "minibatch"
        samples = valid_samples(batch)
        if not per_minibatch:
            samples = prepare_advantages(samples, algo, algo.normalize_advantages)
        objective = OBJECTIVES.get(algo.objective)
        t.set_lr()
        engine = t.optimizer
        t.policy.train()
        sums: dict[str, float] = {}
        n = epochs = 0
        for _ in range(algo.epochs):
            epochs += 1
            kl, steps = 0.0, 0
            for mb in samples.minibatches(algo.minibatch_size, gen):
                if per_minibatch:  # the whole minibatch, before it is shared among the ranks
                    mb = prepare_advantages(mb, algo, algo.normalize_advantages)
                # with N ranks: this rank's rows of the minibatch, its loss weighted by its share
                # (DDP averages the gradients), drawing its rows of the minibatch's noise
                start, count = distributed.share(mb.size, ranks)
                part = mb.index(slice(start, start + count) if count else slice(0, 1))  # none: a row at weight 0
                with batch_rows(start, count, mb.size), engine.autocast():
                    loss, metrics = engine.loss(objective, part.to(t.device), algo)
                if ranks.distributed:
                    loss = loss * (count * ranks.world / mb.size)
                if t.cfg.trainer.lr_schedule == "adaptive":  # this step's lr from the KL before it
                    kl_now = distributed.mean(float(metrics["approx_kl"]))  # every rank adapts alike
                    t.state.lr_scale = kl_adaptive_scale(t.state.lr_scale, kl_now, t.cfg.trainer.desired_kl)
                    t.set_lr()
                if t.optimizer_step(engine, loss, algo.max_grad_norm):
                    t.policy.after_step()
                    n, steps = n + 1, steps + 1
                    kl += float(metrics.get("approx_kl", 0.0))
                    for k, v in metrics.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
            if algo.target_kl is not None and steps and distributed.mean(kl / steps) > algo.target_kl:
                break
        out = {f"train/{k}": v / max(n, 1) for k, v in distributed.reduce_metrics(sums).items()}
        out["train/skipped_steps"] = t.state.skipped_steps
        out["train/epochs"] = epochs
        out["train/lr"] = engine.param_groups[0]["lr"]  # what the optimizer used
        if "old_values" in samples:
            out["train/explained_variance"] = explained_variance(samples["old_values"], samples["returns"])
        return out

    def state_dict(self) -> dict | None:
        """The reward scaler's running statistics; None without ``algorithm.reward_norm`` (nothing saved)."""
        return None if self.reward_scaler is None else self.reward_scaler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore the reward scaler's statistics (a checkpoint's, when reward scaling is on)."""
        if self.reward_scaler is not None:
            self.reward_scaler.load_state_dict(state)
