"""The one training loop: warm start -> [collect -> scale rewards -> advantages -> update -> sync ->
log / checkpoint / evaluate] x iterations. That is the on-policy mode; in the off-policy mode
(``algorithm.objective: sac``, `mmrl.trainer.off_policy`) the learn stage stores the collected
transitions in a replay buffer and takes gradient steps on batches replayed from it instead.

Collecting is where the environment answers: each decision is the policy's action, the simulator's
step and the reward stage's score of it (`mmrl.trainer.reward_stage`, the one home of reward models),
so that success, videos, dynamic sampling and the non-finite check all see the scored reward. What
follows works on the collected batch: reward scaling, advantages, the objective's update.

Every iteration is a pure function of (parameters, optimizer state, iteration index): its reset
seeds and its sampling / shuffling generator are derived from ``run.seed`` and the iteration
number. That is what makes resume exact: a run killed after checkpoint k and restarted with the
same command reaches the same parameters as one that never stopped.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from mmrl import distributed
from mmrl.algorithms.advantages import group_reward_stats
from mmrl.algorithms.normalization import RewardScaler, explained_variance
from mmrl.batch import Batch, random_indices
from mmrl.errors import TrainingError, UserError
from mmrl.registry import OBJECTIVES
from mmrl.rollout import evaluate_policy, success_by_task, task_logs
from mmrl.trainer import checkpoint as ckpt
from mmrl.trainer.collectors import AsyncCollector, build_collector
from mmrl.trainer.logging import RunLogger, SilentLogger
from mmrl.trainer.objectives import compute_advantages, prepare_advantages, valid_samples
from mmrl.trainer.off_policy import OffPolicy
from mmrl.trainer.train_engine import TrainEngine, build_train_engine, optimizer_step
from mmrl.utils import jsonio
from mmrl.utils.rows import batch_rows

#: collections in a row that may lose every episode (crashed sim workers) before the run stops
MAX_EMPTY_COLLECTIONS = 3


@dataclass
class TrainState:
    """Counters saved in every checkpoint."""

    iteration: int = 0  # RL iterations completed
    warm_started: bool = False
    skipped_steps: int = 0  # optimizer steps skipped for a non-finite loss or gradient
    skipped_in_a_row: int = 0  # of them, the latest consecutive ones (trainer.max_skipped_steps stops the run)
    env_steps: int = 0
    episodes: int = 0
    rl_seconds: float = 0.0  # wall time spent in RL iterations (evaluation and checkpoints excluded)
    lost_episodes: int = 0  # episodes lost with a crashed sim worker (not trained on, not counted)
    nonfinite_episodes: int = 0  # episodes dropped for a non-finite reward (not trained on, not counted)
    results: dict = field(default_factory=dict)  # evaluation results by name
    warm_start_candidate: int = 0  # the initialisation the warm start kept (warm_start.candidates)
    warm_start_scores: list = field(default_factory=list)  # each candidate's score (`candidate_score`)
    lr_scale: float = 1.0  # ``lr_schedule: adaptive``: the learning rate over ``trainer.lr``, as the KL moved it
    #: the initial action std chosen on the first rollouts, with what each showed (`mmrl.trainer.exploration`)
    exploration: dict = field(default_factory=dict)

    def count(self, info: dict) -> None:
        """Add what a collection counted (`mmrl.trainer.collectors.COUNTS`) to the run's counters."""
        self.env_steps += info["env_steps"]
        self.episodes += info["episodes"]
        self.lost_episodes += info["lost_episodes"]
        self.nonfinite_episodes += info["nonfinite_episodes"]


def warm_start_lr_factor(step: int, steps: int, schedule: str, warmup: int = 0) -> float:
    """The warm start's learning rate at ``step`` (0-based) of ``steps``, as a fraction of ``lr``:
    ``(step + 1) / (warmup + 1)`` during the first ``warmup`` steps, then 1 (``constant``) or a cosine
    from 1 down to 0 over the remaining steps (``cosine``)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule != "cosine":
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


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


def warm_start_optimizer(policy, ws) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """A fresh Adam over ``policy``'s trainable parameters at ``ws.lr`` and its schedule
    (`warm_start_lr_factor`)."""
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=ws.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warm_start_lr_factor(s, ws.steps, ws.schedule, ws.warmup_steps)
    )
    return opt, sched


class Trainer:
    def __init__(
        self,
        cfg,
        policy,
        sim,
        eval_sim,
        out_dir: Path,
        logger: RunLogger | None = None,
        reward=None,
        run_folder=None,
        policy_factory=None,
    ):
        self.cfg, self.policy, self.sim, self.eval_sim = cfg, policy, sim, eval_sim
        #: builds the configured policy again (its initial weights are drawn from the global torch
        #: RNG): the warm start's other candidates (`warm_start.candidates`)
        self.policy_factory = policy_factory
        #: the reward stage (`mmrl.trainer.reward_stage.RewardStage`): the reward model scoring each
        #: decision, in training and evaluation rollouts alike; None = the task reward alone
        self.reward_stage = reward
        #: whether the task is judged by success (the simulator's, or the reward stage's threshold)
        self.has_success = eval_sim.has_success or bool(reward is not None and reward.defines_success)
        self.out_dir = Path(out_dir)
        #: this process's rank among the run's (`mmrl.distributed`): rank 0 writes logs and checkpoints
        self.ranks = distributed.current()
        self.run_folder = run_folder  # `mmrl.trainer.run_folder.RunFolder`: the lock, held until close()
        #: the checkpoint folder `mmrl.experiment.build_trainer` already verified (the lock held since),
        #: which resume then does not hash a second time (seconds for a VLA's weights)
        self.verified_checkpoint: Path | None = None
        main = self.ranks.main
        self.log_line = tqdm.write if main else _quiet  # one line for the user, above the progress bars
        from mmrl.config import to_dict

        self.logger = logger or (
            RunLogger(self.out_dir, cfg.run.wandb, cfg.run.wandb_project, config=to_dict(cfg), name=cfg.run.name)
            if main
            else SilentLogger()
        )
        self.device = torch.device(cfg.run.device)
        self._engine: TrainEngine | None = None
        self.state = TrainState()
        algo = cfg.algorithm
        # where and how the training episodes are collected (with N ranks: this rank's share, gathered)
        self.collector = build_collector(cfg, sim, reward, self.ranks)
        self.reward_scaler = RewardScaler(algo.gamma) if algo.reward_norm else None
        #: the off-policy mode's replay buffer, critics and optimizer (None: on-policy)
        self.off_policy = (
            OffPolicy(algo, cfg.trainer, policy, eval_sim.action_dim, self.device, self.optimizer_step)
            if algo.off_policy
            else None
        )

    @property
    def optimizer(self) -> TrainEngine:
        """The RL training engine (torch Adam or DeepSpeed ZeRO, `trainer.engine`). Built on first
        use, i.e. after the warm start or a checkpoint's weights are loaded: ZeRO copies (and with
        stage 3 partitions) the weights when it starts."""
        if self._engine is None:
            self._engine = build_train_engine(
                self.cfg.trainer.engine,
                self.policy,
                self.cfg.trainer.lr,
                self.device,
                value_lr=self.cfg.trainer.value_lr,
            )
        return self._engine

    def autocast(self):
        """The engine's precision context (bf16 / fp16 autocast; nothing for fp32 or before the
        engine is built, when the weights are still fp32)."""
        return self._engine.autocast() if self._engine is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def acting(self):
        """The context of a rollout or an evaluation: the engine's precision, on whole weights
        (`TrainEngine.rollout_weights`: FSDP2 gathers its shards once for it)."""
        with self.autocast():
            if self._engine is None:
                yield
            else:
                with self._engine.rollout_weights():
                    yield

    # ---- the loop, top to bottom ------------------------------------------------------------
    def run(self) -> dict:
        from mmrl.reward import RewardFunctionError

        try:
            return self._run()
        except RewardFunctionError as exc:  # user code failed (or hung): nothing of the run was wrong
            raise TrainingError(
                f"{exc}; newest complete checkpoint: {self.newest_checkpoint()}; run the same command to resume"
            ) from exc
        except UserError:
            raise
        except Exception as exc:  # a full disk while writing the log, the results, a video: one line
            if not disk_full(exc, self.out_dir):
                raise
            raise self.disk_full_error(str(getattr(exc, "filename", None) or "the run's logs and results")) from None
        finally:
            self.close()

    def close(self) -> None:
        """Stop the sim workers of a non-collocated placement (an in-process simulator stays) and
        release the run folder."""
        try:
            self.collector.close()
        finally:
            if self.run_folder is not None:
                self.run_folder.close()

    def newest_checkpoint(self) -> str:
        """The name of the newest complete checkpoint (for messages), or 'none'."""
        path = ckpt.latest_path(self.out_dir)
        return path.name if path is not None else "none"

    def _run(self) -> dict:
        self.resume()
        if not self.state.warm_started:
            self.warm_start()
        if "start" not in self.state.results:
            self.evaluate("start")
            self.save()
        total = self.planned_iterations()
        bar = tqdm(
            initial=self.state.iteration, total=total, desc="rl", dynamic_ncols=True, disable=not self.ranks.main
        )
        staleness = self.cfg.trainer.async_staleness
        collector = (
            AsyncCollector(self.collector, self.policy, staleness, lambda j: self.generator("rl", j), self.autocast)
            if staleness
            else None
        )
        try:
            while not self.done():
                self.iteration(self.state.iteration, collector, bar)
                bar.update()
        finally:
            bar.close()
            if collector:
                collector.close()
        if self.state.results.get("final", {}).get("iteration") != self.state.iteration:
            self.evaluate("final")
        self.save()
        self.logger.close()
        self.summary()
        return self.state.results

    def planned_iterations(self) -> int:
        """``trainer.iterations``, or with an env-step budget the iterations it should take."""
        t = self.cfg.trainer
        if t.env_steps is None:
            return t.iterations
        c = self.collector
        per_iteration = (
            c.num_envs
            * self.policy.chunk_size
            * (t.rollout_steps or math.ceil(c.max_episode_steps / self.policy.chunk_size))
        )
        return max(self.state.iteration, math.ceil(t.env_steps / per_iteration))

    def done(self) -> bool:
        """Whether the run has trained enough: its iterations, or its environment-step budget."""
        t = self.cfg.trainer
        return self.state.iteration >= t.iterations if t.env_steps is None else self.state.env_steps >= t.env_steps

    def summary(self) -> None:
        """One line with the run's headline metric (success where the task defines it, else the
        episode return) before and after RL, its environment steps and its folder."""
        key, name = self.headline()
        res = self.state.results
        label = "warm start" if self.cfg.warm_start.dataset else "before RL"
        before = f"{res['start'][key]:.3f} ({label}) -> " if self.state.iteration and "start" in res else ""
        self.log_line(
            f"held-out {name}: {before}{res['final'][key]:.3f} after {self.state.iteration} RL iterations, "
            f"{self.state.env_steps} env steps; run folder: {self.out_dir}"
        )

    def headline(self) -> tuple[str, str]:
        """(results key, name) of the metric this task is judged by: success where the task defines
        it, else the episode return (a single-turn generator's or VLM's: its mean reward)."""
        if self.has_success:
            return "success_rate", "success"
        return "return", "return" if self.eval_sim.action_type == "chunk" else "mean reward"

    def iteration(self, it: int, collector: AsyncCollector | None, bar) -> None:
        """Collect (or take the batch collected in the background) -> advantages -> update -> log."""
        total = self.planned_iterations()
        t0 = time.time()
        self.policy.set_progress(self.state.iteration / max(total, 1))  # before this iteration's rollout
        if self.reward_stage is not None and collector is None:
            self.reward_stage.drain()  # forget scores of evaluations: the iteration logs its own
        for _attempt in range(MAX_EMPTY_COLLECTIONS):
            gen = self.generator("rl", it)
            if collector is None:
                batch, info = self.collect(it, gen)
            else:  # batch it was collected by the behaviour weights of `info["policy_version"]`
                collector.submit_up_to(it, total, self.state.iteration)
                batch, info = collector.result(it)
                gen = self.generator("update", it)  # the rollout's generator stayed with the collector
            self.state.count(info)
            self.check_rewards(it, info)
            if batch["valid"].any():
                break
            # every episode lost (crashed sim workers): nothing to train on; collect the round again
            self.log_line(
                f"warning: iteration {it + 1} lost every episode ({info['lost_episodes']} to crashed sim "
                f"workers, {info['nonfinite_episodes']} to non-finite rewards); collecting it again"
            )
        else:
            raise TrainingError(
                f"iteration {it + 1} lost every episode {MAX_EMPTY_COLLECTIONS} times in a row "
                "(see the warnings above: crashed sim workers or non-finite rewards); nothing was "
                f"trained on them. Newest complete checkpoint: {self.newest_checkpoint()}; fix the "
                "simulator and run the same command to resume"
            )
        probed = it == 0 and self.policy.caps.exploration_probe and not self.state.exploration
        if probed:  # a fresh run: the first rollouts choose the initial action std
            batch, info, gen = self.choose_exploration(it, batch, info, gen)
        grouped = self.group_stats(batch)  # of the rewards as scored, before any scaling
        metrics = self.learn(it, batch, info, gen)
        if probed:
            metrics["train/action_std_init"] = self.state.exploration["chosen_std"]
        self.policy.update_statistics(batch)
        self.sync()
        self.state.iteration = it + 1
        self.state.rl_seconds += time.time() - t0
        metrics.update(self.rollout_metrics(info), **grouped, iter_s=time.time() - t0)
        if self.reward_stage is not None:  # TRL's rewards/<name>/mean, one per part of a weighted sum
            metrics.update({f"train/{k}": v for k, v in self.reward_stage.drain().items()})
        self.logger.log(self.state.iteration, metrics)
        key = "train/success" if self.has_success else "train/return"
        if key in metrics:
            bar.set_postfix({key[6:]: f"{metrics[key]:.3g}", "skipped": self.state.skipped_steps})
        every = self.cfg.trainer.eval_every
        if every and self.state.iteration % every == 0 and not self.done():
            self.evaluate(f"iter_{self.state.iteration}")
        if self.state.iteration % self.cfg.trainer.checkpoint_every == 0:
            self.save()

    # ---- stages ------------------------------------------------------------------------------
    def choose_exploration(
        self, it: int, batch: Batch, info: dict, gen: torch.Generator
    ) -> tuple[Batch, dict, torch.Generator]:
        """`mmrl.trainer.exploration.choose_initial_std` on the first iteration's rollout (``batch``,
        collected at the policy's first std): each quieter std it asks for is one more rollout, counted
        in the run's environment steps, and RL trains on the rollout of the std it keeps. Where it
        keeps the first std after probing quieter ones, the episodes in progress go back to where the
        first rollout left them (the collector's snapshot, as a checkpoint keeps it), so the run goes
        on as the fixed-std run does, short only of the probe's environment steps; a simulator that
        cannot snapshot itself goes on from the probe's last rollout (said in the log)."""
        from mmrl.trainer import exploration

        stds = self.policy.exploration_stds()
        first = (exploration.measure(batch, stds[0]), (batch, info, gen))
        # the episodes in progress as the first rollout left them (fresh rounds of episodes keep none)
        snapshot = self.collector.state_dict() if exploration.ending_pays(first[0]) else {}

        def roll_out(k: int) -> tuple[exploration.NoiseMeasurement, tuple]:
            self.policy.set_exploration_std(stds[k])
            g = self.generator("probe", k)
            b, i = self.collect(it, g)
            self.state.count(i)
            self.check_rewards(it, i)
            return exploration.measure(b, stds[k]), (b, i, g)

        chosen, measured, kept = exploration.choose_initial_std(stds, first, roll_out)
        self.policy.set_exploration_std(stds[chosen])
        self.state.exploration = exploration.record(chosen, measured)
        line = exploration.describe(chosen, measured)
        if chosen == 0 and len(measured) > 1 and snapshot:  # back to the envs the kept rollout left
            if snapshot.get("sim") is not None:
                self.collector.load_state_dict(snapshot)
            else:
                line += "; the simulator cannot snapshot its state, so the episodes go on from the probe's last rollout"
        self.log_line(line)
        return kept

    def warm_start(self) -> None:
        """Supervised flow matching on scripted demonstrations (skipped if no dataset is set)."""
        ws = self.cfg.warm_start
        if ws.dataset:
            rl_data = self.cfg.sim.kwargs.get("dataset")
            if rl_data is not None and rl_data != ws.dataset:  # say it: the user's data is not this
                self.log_line(
                    f"warm start: supervised on {ws.num_episodes} examples of '{ws.dataset}' (warm_start.dataset), "
                    f"not of the RL data '{rl_data}' (sim.kwargs.dataset); set warm_start.dataset=null to skip "
                    "it, or point warm_start at your own data"
                )
            self.supervised(self.load_records(ws.dataset, ws.num_episodes, ws.kwargs), ws)
        self.policy.after_warm_start()
        sac = self.cfg.algorithm.sac
        if self.off_policy is not None and sac.demo_dataset:  # RLPD's demonstrations, through the trained policy
            from mmrl.trainer.off_policy import record_transitions

            data = self.load_records(sac.demo_dataset, sac.demo_episodes, sac.demo_kwargs)
            self.off_policy.add_demos(record_transitions(data, self.policy, self.device))
            self.log_line(
                f"RLPD: {len(self.off_policy.demos or [])} demonstration transitions of {sac.demo_episodes} "
                f"'{sac.demo_dataset}' episodes, {sac.demo_fraction:g} of every batch"
            )
        self.state.warm_started = True
        self.save()

    def held_in_records(self, ws) -> dict:
        """``ws.held_in`` fresh examples of the warm-start dataset: built as the training ones
        (`load_records`, ``ws.held_in_kwargs`` over ``ws.kwargs``), under the seed
        `run_seed`(seed, "held_in") instead of the run's."""
        kwargs = {**ws.kwargs, **ws.held_in_kwargs}
        return self.load_records(ws.dataset, ws.held_in, kwargs, seed=run_seed(self.cfg.run.seed, "held_in"))

    def load_records(self, name: str, num: int, kwargs: dict, seed: int | None = None) -> dict:
        """``num`` examples of the registered dataset ``name``, built with ``kwargs`` and the context
        its builder declares: demonstrations recorded in the simulator the RL runs in, configured as
        it is (image size, time limit, ...), when the dataset records in that simulator; ``kwargs``
        (checked strictly) win."""
        from mmrl.data import declared_kwargs, load_dataset, recorded_in

        same_sim = recorded_in(name) == self.cfg.sim.type
        context = declared_kwargs(
            name,
            num_episodes=num,
            num_samples=num,
            seed=self.cfg.run.seed if seed is None else seed,
            chunk_size=self.policy.chunk_size,
            **({"sim_kwargs": dict(self.cfg.sim.kwargs)} if same_sim else {}),
        )
        return load_dataset(name, **{**context, **kwargs})

    def supervised(self, data: dict, ws) -> None:
        """``ws.steps`` of supervised training on ``data``; with ``ws.candidates`` > 1 the first
        ``ws.steps_per_candidate()`` of them are run from each initialisation, and the one whose loss
        is lowest (`candidate_score`, or the held-in loss with ``ws.held_in``) finishes them. With
        ``ws.held_in`` the final held-in loss is logged (``warm_start/held_in_loss``)."""
        batch, held = self.warm_start_batches(data, ws)
        if ws.candidates > 1 and ws.steps:
            run = self.choose_initialisation(batch, ws, held)
        else:
            run = self.start_supervised(batch, ws)
        self.supervised_steps(batch, ws, run, ws.steps, "warm_start", phase_offset=0)
        run.opt.zero_grad(set_to_none=True)  # no warm-start gradient may reach the RL engine's first step
        if held is not None:
            loss = self.held_in_loss(held, ws)
            self.log_line(f"warm start: held-in loss {loss:.4f} on {held.size} rows of {ws.held_in} fresh examples")
            self.logger.log(0, {"warm_start/held_in_loss": loss}, phase="warm_start", phase_step=ws.steps)

    def warm_start_batches(self, data: dict, ws) -> tuple[Batch, Batch | None]:
        """The training rows of ``data`` and, with ``ws.held_in``, the rows of the held-in examples
        (`held_in_records`). Both come from one `warm_start_batch` call on the joined datasets (a
        policy may keep the dataset its rows index, as the VLM policy does), the training rows first."""
        if not ws.held_in:
            return self.policy.warm_start_batch(data), None
        from mmrl.data import concat_records

        held = self.held_in_records(ws)
        m = self.policy.warm_start_batch(held).size  # rows of the (small) held-in set alone
        both = self.policy.warm_start_batch(concat_records(data, held))
        return both.index(slice(0, both.size - m)), both.index(slice(both.size - m, None))

    @torch.no_grad()
    def held_in_loss(self, held: Batch, ws) -> float:
        """The policy's mean supervised loss over the held-in rows (in eval mode, in batches of
        ``ws.batch_size``), the same on every rank."""
        self.policy.eval()
        total = 0.0
        for start in range(0, held.size, ws.batch_size):
            rows = held.index(slice(start, start + ws.batch_size)).to(self.device)
            total += self.policy.supervised_loss(rows).sum().item()
        return distributed.mean(total / held.size)

    def start_supervised(self, batch: Batch, ws, candidate: int = 0) -> SupervisedRun:
        """The supervised run at step 0 from the policy's current weights: statistics from the
        demonstrations, a fresh Adam and schedule, and sampling streams (batches, flow-matching
        noise) from their start: the run's own for candidate 0, derived ones for the others of
        `choose_initialisation`, so that the candidates share no path (their initial weights decide
        far more often where they land: README, issue 33)."""
        self.policy.update_statistics(batch)  # e.g. observation normalisation starts from the demos
        opt, sched = warm_start_optimizer(self.policy, ws)
        seed = self.cfg.run.seed
        torch.manual_seed(seed if candidate == 0 else run_seed(seed, "warm_start", candidate))
        return SupervisedRun(opt, sched, self.generator("warm_start", candidate))

    def supervised_steps(self, batch: Batch, ws, run: SupervisedRun, end: int, phase: str, phase_offset: int) -> list:
        """Train from ``run.step`` up to step ``end``; returns the losses (read once at the end: no
        device sync per step). Rows go to the log under ``phase`` every 25 steps (and at the last),
        before the RL iterations."""
        self.policy.train()
        losses: list[torch.Tensor] = []
        desc = phase.replace("warm_start", "warm start").replace("_candidate_", ", candidate ")
        bar = tqdm(range(run.step, end), desc=desc, dynamic_ncols=True, disable=not self.ranks.main)
        for step in bar:
            idx = random_indices(batch.size, min(ws.batch_size, batch.size), run.gen)
            loss = self.policy.supervised_loss(batch.index(idx).to(self.device)).mean()
            self.optimizer_step(run.opt, loss)
            run.sched.step()
            losses.append(loss.detach())
            if step % 25 == 0 or step == end - 1:
                value = loss.item()
                bar.set_postfix(loss=f"{value:.4f}")
                row = {"warm_start/loss": value}
                self.logger.log(step - ws.steps - phase_offset, row, phase=phase, phase_step=step)
        run.step = end
        return torch.stack(losses).tolist() if losses else []

    def choose_initialisation(self, batch: Batch, ws, held: Batch | None = None) -> SupervisedRun:
        """Train ``ws.candidates`` initialisations for ``ws.steps_per_candidate()`` steps each, and
        go on from the one with the lowest `candidate_score`: whether the warm start succeeds is a
        lottery of its initial weights (README, issue 33), and the loss tells the failing ones
        early. Candidate 0 is the policy as built, on the run's own streams (keeping it gives the
        run without candidates exactly); candidate k > 0 is built again under the derived seed
        `run_seed`(seed, "init", k) and draws its own batches and noise (`start_supervised`). With
        ``held`` (rows of ``ws.held_in`` fresh examples) the score is the loss on them instead
        (`held_in_loss`), and a pretrained policy's candidates, whose weights are the same, differ in
        their batches and noise alone. The choice is in the state (``warm_start_candidate``,
        ``warm_start_scores``) and the log."""
        if self.policy_factory is None:
            raise UserError(
                f"warm_start.candidates = {ws.candidates} needs the trainer to build the policy again "
                "(mmrl.experiment.build_trainer passes it): set warm_start.candidates=1"
            )
        own = {k: v.detach().clone() for k, v in self.policy.state_dict().items()}
        best: tuple | None = None  # (score, k, snapshot of the policy, optimizer, schedule and streams)
        scores = []
        second = self.candidate_weights(1, own, held is not None)  # before any step: may refuse a pretrained policy
        same = second is own  # a pretrained policy scored held-in: every candidate starts from its weights
        for k in range(ws.candidates):
            weights = own if k == 0 or same else second if k == 1 else self.candidate_weights(k, own)
            self.policy.load_state_dict(weights)
            run = self.start_supervised(batch, ws, candidate=k)
            losses = self.supervised_steps(
                batch,
                ws,
                run,
                ws.steps_per_candidate(),
                f"warm_start_candidate_{k}",
                phase_offset=(ws.candidates - k) * ws.steps,
            )
            # every rank keeps the same one
            score = self.held_in_loss(held, ws) if held is not None else distributed.mean(candidate_score(losses))
            scores.append(score)
            if best is None or score < best[0]:
                best = (score, k, run.snapshot(self.policy))
        assert best is not None
        _, chosen, snap = best
        self.state.warm_start_candidate, self.state.warm_start_scores = chosen, scores
        shown = " / ".join(f"{s:.4f}" for s in scores)
        scored = (
            f"held-in loss on {ws.held_in} fresh examples after {ws.steps_per_candidate()} steps"
            if held is not None
            else f"mean loss over the last third of {ws.steps_per_candidate()} steps"
        )
        self.log_line(
            f"warm start: kept {'candidate' if same else 'initialisation'} {chosen} of {ws.candidates} "
            f"({scored}: {shown}); it trains on to step {ws.steps}"
        )
        self.logger.log(
            -ws.steps - 1,
            {"warm_start/candidate": chosen, **{f"warm_start/candidate_{k}_score": s for k, s in enumerate(scores)}},
            phase="warm_start",
            phase_step=ws.steps_per_candidate(),
        )
        return SupervisedRun.restore(self.policy, ws, snap)

    def candidate_weights(self, k: int, own: dict, held_in: bool = False) -> dict:
        """Initial weights of candidate ``k`` > 0: the policy built again under a seed derived from
        the run's, without moving the global RNG. Where they equal the run's own (a policy loaded
        from pretrained weights), ``own`` when candidates are scored held-in (they then differ in
        their batches), else an error: their training losses would choose by noise."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(run_seed(self.cfg.run.seed, "init", k))
            fresh = self.policy_factory()
        weights = {name: v.detach().to(own[name].device) for name, v in fresh.state_dict().items()}
        del fresh
        trained = [n for n, p in self.policy.named_parameters() if p.requires_grad]
        if all(torch.equal(weights[n], own[n]) for n in trained if n in weights):
            if held_in:
                return own
            raise UserError(
                f"warm_start.candidates = {self.cfg.warm_start.candidates}, but policy '{self.cfg.policy.type}' "
                "builds the same trainable weights under every seed (pretrained): set warm_start.held_in (e.g. 32) to "
                "score candidates that differ in their batches on fresh examples, or warm_start.candidates=1"
            )
        return weights

    def collect(self, it: int, gen: torch.Generator) -> tuple[Batch, dict]:
        """Round ``it`` of the collector, by the trained policy in eval mode (sampling stays
        stochastic in train rollouts) under the engine's precision; in the off-policy mode by
        uniform random actions until learning starts (`OffPolicy.behaviour`)."""
        self.policy.eval()
        acting = (
            self.policy if self.off_policy is None else self.off_policy.behaviour(self.policy, self.state.env_steps)
        )
        with self.acting():
            return self.collector.collect(acting, it, gen)

    def learn(self, it: int, batch: Batch, info: dict, gen: torch.Generator) -> dict:
        """The mode's learn stage on iteration ``it``'s batch. On-policy: scale rewards -> advantages
        -> `update` (the batch is then discarded). Off-policy: the transitions into the replay buffer
        and the gradient steps on replayed batches (`OffPolicy.learn`; the actor's noise continues
        ``gen``, the batches' rows are drawn from the run's "update" generator of ``it``)."""
        if self.off_policy is not None:
            indices = run_generator(self.cfg.run.seed, "update", it)  # CPU: the buffer's row indices
            return self.off_policy.learn(batch, self.state.env_steps, gen, indices)
        batch = self.scale_rewards(batch)
        batch = compute_advantages(batch, self.cfg.algorithm, info.get("last_values"))
        return self.update(batch, gen)

    def scale_rewards(self, batch: Batch) -> Batch:
        """The collected rewards (already scored: see the module docstring) scaled by the running
        std of the discounted return when ``algorithm.reward_norm`` is on."""
        if self.reward_scaler is not None:
            batch["rewards"] = self.reward_scaler.scale(
                batch["rewards"], batch["dones"], batch["valid"], continuing=self.collector.continuing
            )
        return batch

    def update(self, batch: Batch, gen: torch.Generator) -> dict:
        """``algorithm.epochs`` passes of minibatch steps of the objective over the valid samples;
        with ``target_kl`` the update stops after the epoch whose mean approx KL exceeds it."""
        algo = self.cfg.algorithm
        per_minibatch = algo.advantage_norm_scope == "minibatch"
        samples = valid_samples(batch)
        if not per_minibatch:
            samples = prepare_advantages(samples, algo, algo.normalize_advantages)
        objective = OBJECTIVES.get(algo.objective)
        self.set_lr()
        self.policy.train()
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
                start, count = distributed.share(mb.size, self.ranks)
                part = mb.index(slice(start, start + count) if count else slice(0, 1))  # none: a row at weight 0
                with batch_rows(start, count, mb.size), self.optimizer.autocast():
                    loss, metrics = self.optimizer.loss(objective, part.to(self.device), algo)
                if self.ranks.distributed:
                    loss = loss * (count * self.ranks.world / mb.size)
                if self.cfg.trainer.lr_schedule == "adaptive":  # this step's lr from the KL before it
                    kl_now = distributed.mean(float(metrics["approx_kl"]))  # every rank adapts alike
                    self.state.lr_scale = kl_adaptive_scale(self.state.lr_scale, kl_now, self.cfg.trainer.desired_kl)
                    self.set_lr()
                if self.optimizer_step(self.optimizer, loss, algo.max_grad_norm):
                    self.policy.after_step()
                    n, steps = n + 1, steps + 1
                    kl += float(metrics.get("approx_kl", 0.0))
                    for k, v in metrics.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
            if algo.target_kl is not None and steps and distributed.mean(kl / steps) > algo.target_kl:
                break
        out = {f"train/{k}": v / max(n, 1) for k, v in distributed.reduce_metrics(sums).items()}
        out["train/skipped_steps"] = self.state.skipped_steps
        out["train/epochs"] = epochs
        out["train/lr"] = self.optimizer.param_groups[0]["lr"]  # what the optimizer used
        if "old_values" in samples:
            out["train/explained_variance"] = explained_variance(samples["old_values"], samples["returns"])
        return out

    def current_lr(self) -> float:
        """``trainer.lr``; with ``lr_schedule: linear`` decayed linearly to 0 over the run; with
        ``adaptive`` times the scale the update's KL set (`kl_adaptive_scale`, kept in the state)."""
        t = self.cfg.trainer
        if t.lr_schedule == "constant":
            return t.lr
        if t.lr_schedule == "adaptive":
            return t.lr * self.state.lr_scale
        progress = self.state.iteration / max(self.planned_iterations(), 1)  # iterations done before this one
        return t.lr * max(0.0, 1.0 - min(progress, 1.0))

    def set_lr(self) -> None:
        for group, scale in zip(self.optimizer.param_groups, self.optimizer.lr_scales, strict=True):
            group["lr"] = self.current_lr() * scale

    def optimizer_step(self, opt, loss: torch.Tensor, max_norm: float | None = None) -> bool:
        """One step of a `TrainEngine` or torch optimizer; a non-finite loss or gradient skips the
        step and is counted; ``trainer.max_skipped_steps`` skipped in a row stop the run."""
        result = opt.step(loss, max_norm) if isinstance(opt, TrainEngine) else optimizer_step(opt, loss, max_norm)
        if result:
            self.state.skipped_in_a_row = 0
            return True
        self.state.skipped_steps += 1
        self.state.skipped_in_a_row += 1
        limit = self.cfg.trainer.max_skipped_steps
        if self.state.skipped_in_a_row >= limit:
            raise TrainingError(
                f"{self.state.skipped_in_a_row} optimizer steps in a row were skipped for a non-finite loss or "
                f"gradient (trainer.max_skipped_steps = {limit}): the weights stopped training. Lower trainer.lr / "
                f"warm_start.lr, check the rewards and inputs for NaN; newest complete checkpoint: "
                f"{self.newest_checkpoint()}"
            )
        return False

    def check_rewards(self, it: int, info: dict) -> None:
        """Warn about the episodes of this collection dropped for a non-finite reward, naming where
        rewards come from; stop the run when more than ``trainer.max_nonfinite_fraction`` of its
        episodes so far were dropped."""
        n = info.get("nonfinite_episodes", 0)
        if not n:
            return
        source = f"simulator '{self.cfg.sim.type}'" + (
            f" or reward '{self.reward_stage.name}'" if self.reward_stage is not None else ""
        )
        total = self.state.nonfinite_episodes
        seen = total + self.state.episodes
        self.log_line(
            f"warning: iteration {it + 1}: {n} episode(s) with a NaN or infinite reward from the {source} "
            f"dropped (not trained on, not counted); {total} of {seen} so far"
        )
        limit = self.cfg.trainer.max_nonfinite_fraction
        if total / max(seen, 1) > limit:
            raise TrainingError(
                f"{total} of {seen} episodes had a NaN or infinite reward from the {source}, more than "
                f"trainer.max_nonfinite_fraction = {limit}: fix the reward (or raise the limit); newest complete "
                f"checkpoint: {self.newest_checkpoint()}"
            )

    def sync(self) -> None:
        """Weight sync to the rollout engine and release of per-iteration caches (the policy's job)."""
        self.policy.sync_rollout()

    def evaluate(self, name: str) -> dict:
        t = self.cfg.trainer
        video = self.out_dir / "videos" / f"{name}.mp4" if t.video_episodes and self.ranks.main else None
        with self.acting():
            res = evaluate_policy(
                self.policy,
                self.eval_sim,
                t.eval_episodes,
                t.eval_seed,
                self.generator("eval", 0),
                video,
                t.video_episodes,
                reward=self.reward_stage,
                ranks=self.ranks,
            )
        res.update(
            iteration=self.state.iteration,
            rl_seconds=self.state.rl_seconds,
            train_episodes=self.state.episodes,
            env_steps=self.state.env_steps,
        )
        self.state.results[name] = res
        self.logger.log(
            self.state.iteration,
            {**{f"eval/{k}": v for k, v in res.items() if k != "tasks"}, **task_logs("eval", res.get("tasks", {}))},
        )
        if video is not None and video.exists():
            self.logger.media(self.state.iteration, f"eval/{name}", video)
        key, metric = self.headline()
        self.log_line(f"[eval {name}] {metric} {res[key]:.3f} over {res['episodes']} episodes")
        if self.ranks.main:
            jsonio.write_json(self.out_dir / "results.json", self.state.results)
        return res

    def group_stats(self, batch: Batch) -> dict:
        """GRPO groups' reward statistics as TRL logs them (`group_reward_stats`): ``train/reward_std``
        and ``train/frac_reward_zero_std``; nothing without groups."""
        if self.cfg.algorithm.group_size <= 1 or "group" not in batch:
            return {}
        returns = (batch["rewards"] * batch["valid"]).sum(0)
        return {f"train/{k}": v for k, v in group_reward_stats(returns, batch["group"][0]).items()}

    def rollout_metrics(self, info: dict) -> dict:
        """What the iteration's rollout showed: episode statistics (of the episodes that ended in
        it; none of them for a fixed-length rollout in the middle of long episodes), counters."""
        ended = len(info["return"]) > 0
        return {
            **{f"train/{k}": v for k, v in self.policy.rollout_stats().items()},
            **(
                {
                    "train/return": info["return"].float().mean().item(),
                    "train/length": info["length"].float().mean().item(),
                }
                if ended
                else {}
            ),
            **({"train/success": info["success"].float().mean().item()} if ended and self.has_success else {}),
            **(
                task_logs("train", success_by_task(info["task"], info["success"]))
                if ended and self.has_success and info.get("task")
                else {}
            ),
            **({f"train/{k}": v.float().mean().item() for k, v in info.get("counters", {}).items()} if ended else {}),
            "train/env_steps": self.state.env_steps,
            "train/episodes": self.state.episodes,
            **{
                f"train/{k}": info[k]
                for k in (
                    "kept_groups",
                    "sampling_rounds",
                    "policy_s",
                    "sim_wait_s",
                    "sim_s",
                    "worker_restarts",
                    "staleness",
                )
                if k in info
            },
            **({"train/lost_episodes": self.state.lost_episodes} if self.collector.remote else {}),
            **({"train/nonfinite_episodes": self.state.nonfinite_episodes} if self.state.nonfinite_episodes else {}),
        }

    def generator(self, purpose: str, index: int) -> torch.Generator:
        return run_generator(self.cfg.run.seed, purpose, index, self.device)

    # ---- checkpoints -------------------------------------------------------------------------
    def save(self) -> None:
        extra = {}
        rollout = self.collector.state_dict()  # fixed-length rollouts: the episodes in progress
        if rollout:
            extra["rollout"] = rollout
        if self.reward_scaler is not None:
            extra["reward_scaler"] = self.reward_scaler.state_dict()
        if self.off_policy is not None:  # replay buffer, critics and targets, temperature, optimizer
            extra["off_policy"] = self.off_policy.state_dict()
        if self.policy.build_spec:  # rebuilds the policy without a simulator
            extra["policy_spec"] = self.policy.build_spec
        engine = self.optimizer  # built on every rank at the same point (DDP's start is collective)
        with engine.checkpoint_state():  # every rank: FSDP2 / ZeRO-3 gather the whole model to rank 0
            own = None
            if engine.writes_own_state:  # FSDP2, ZeRO on N ranks: each rank writes its optimizer part
                if self.ranks.main:
                    ckpt.begin(self.out_dir, self.state.iteration)
                distributed.barrier()  # the folder exists before any rank writes into it
                own = engine.write_own_state(ckpt.staging(self.out_dir, self.state.iteration))
                distributed.barrier()  # every rank's files are durable before rank 0 writes COMPLETE
            if self.ranks.main:  # rank 0 writes the checkpoint; the others wait for it
                self.write_checkpoint(engine, extra, own=own)
        distributed.barrier()

    def write_checkpoint(self, engine: TrainEngine, extra: dict, own: list | None = None) -> None:
        try:
            ckpt.save(
                self.out_dir,
                self.cfg,
                self.policy,
                engine,
                self.state,
                keep=self.cfg.trainer.keep_checkpoints,
                extra=extra,
                own=own,
            )
        except Exception as exc:  # OSError, torch's RuntimeError, safetensors' SafetensorError, ...
            if not disk_full(exc, self.out_dir):
                raise
            raise self.disk_full_error(f"checkpoint iter_{self.state.iteration:06d}") from None

    def disk_full_error(self, writing: str) -> UserError:
        """The one line for a full disk: what was being written, and that nothing is lost."""
        newest = self.newest_checkpoint()
        kept = (
            f"nothing is lost: the newest complete checkpoint, {newest}, is whole"
            if newest != "none"
            else "no checkpoint was complete yet (resuming starts the run over)"
        )
        return UserError(
            f"no space left on the device of {self.out_dir} while writing {writing}; {kept}: free some space "
            "and run the same command to resume"
        )

    def resume(self) -> None:
        """Restore the newest complete checkpoint of the run folder (``trainer.resume``), or start
        fresh: with ``resume=false`` a previous run there moves to ``previous_<n>/`` first. The log
        is rewound to the checkpoint (to nothing for a fresh start), so no row appears twice."""
        if not self.cfg.trainer.resume:
            moved = ckpt.move_aside(self.out_dir) if self.ranks.main else None
            if moved is not None:
                self.log_line(f"trainer.resume=false: the previous run in {self.out_dir} moved to {moved}")
            self.logger.rewind(-(2**62))
            return
        loaded = ckpt.load_latest(
            self.out_dir,
            self.policy,
            lambda: self.optimizer,
            log=self.log_line,
            verified=self.verified_checkpoint,
            writer=self.ranks.main,
        )
        if loaded is None:  # nothing to resume (a kill during the warm start logged what is redone)
            self.logger.rewind(-(2**62))
            return
        counters, extra, path = loaded
        self.state = TrainState(**counters)
        self.logger.rewind(self.state.iteration)
        self.set_lr()  # the config's lr (and schedule) wins over the saved one
        if "rollout" in extra:
            warning = self.collector.load_state_dict(extra["rollout"])
            if warning:
                self.log_line(f"warning: {warning}")
        if self.reward_scaler is not None and "reward_scaler" in extra:
            self.reward_scaler.load_state_dict(extra["reward_scaler"])
        if self.off_policy is not None and "off_policy" in extra:
            self.off_policy.load_state_dict(extra["off_policy"])
        self.log_line(f"resumed from checkpoint {path.name} (iteration {self.state.iteration}) in {self.out_dir}")


def _quiet(line: str) -> None:
    """Where a rank other than 0 writes its lines for the user: nowhere (rank 0 speaks for the run)."""


def run_seed(seed: int, purpose: str, index: int = 0) -> int:
    """The seed of a run's ``purpose`` ("rl", "warm_start", "eval", "update", "init", "held_in", "probe") at ``index``:
    a pure function of ``run.seed``."""
    offset = {"rl": 0, "warm_start": 1, "eval": 2, "update": 3, "init": 4, "held_in": 5, "probe": 6}[purpose]
    return seed * 7919 + offset * 104729 + index


def run_generator(seed: int, purpose: str, index: int = 0, device="cpu") -> torch.Generator:
    """The sampling generator of a run's ``purpose`` at ``index`` (`run_seed`), so that a resumed
    run, and ``mmrl eval`` of its checkpoint (purpose "eval"), draw exactly what the original run drew."""
    g = torch.Generator(device=device)
    g.manual_seed(run_seed(seed, purpose, index))
    return g


def candidate_score(losses: list[float]) -> float:
    """How well a warm-start candidate trained: the mean of the last third of its losses (the
    early ones say more about the initial weights than about where they are heading)."""
    tail = losses[len(losses) - max(len(losses) // 3, 1) :]
    return sum(tail) / len(tail)


@dataclass
class SupervisedRun:
    """Where a supervised warm start stands: its optimizer, schedule, index generator and next step
    (the global torch RNG, which draws the flow-matching noise, goes with it in a snapshot)."""

    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    gen: torch.Generator
    step: int = 0

    def snapshot(self, policy) -> dict:
        return {
            "policy": {k: v.detach().clone() for k, v in policy.state_dict().items()},
            "opt": copy.deepcopy(self.opt.state_dict()),
            "sched": self.sched.state_dict(),
            "gen": (self.gen.device, self.gen.get_state()),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            "step": self.step,
        }

    @classmethod
    def restore(cls, policy, ws, snap: dict) -> SupervisedRun:
        """The run of ``snap`` on ``policy``, with its own fresh optimizer over the policy's
        parameters loaded from the snapshot."""
        policy.load_state_dict(snap["policy"])
        opt, sched = warm_start_optimizer(policy, ws)
        opt.load_state_dict(snap["opt"])
        sched.load_state_dict(snap["sched"])
        device, state = snap["gen"]
        gen = torch.Generator(device=device)
        gen.set_state(state)
        torch.set_rng_state(snap["rng"])
        if snap["cuda_rng"] is not None:
            torch.cuda.set_rng_state_all(snap["cuda_rng"])
        return cls(opt, sched, gen, snap["step"])


def disk_full(exc: BaseException, folder: Path, min_free: int = 64 << 20) -> bool:
    """Whether ``exc`` (raised while writing in ``folder``) means the disk is full: ENOSPC or EDQUOT
    (safetensors' writer gives it as "(os error 28)"), or a write error of torch's serialiser ("file
    write failed", "iostream error", "unexpected pos"), which loses the errno, with less than
    ``min_free`` bytes left."""
    codes = (errno.ENOSPC, errno.EDQUOT)
    text = str(exc)
    if (isinstance(exc, OSError) and exc.errno in codes) or any(f"(os error {c})" in text for c in codes):
        return True
    if not any(s in text for s in ("write failed", "iostream", "No space left", "unexpected pos")):
        return False
    try:
        return shutil.disk_usage(folder).free < min_free
    except OSError:
        return False
