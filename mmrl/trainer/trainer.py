"""The one training loop: warm start -> [collect -> learn -> sync -> log / checkpoint / evaluate] x
iterations. The stages live beside it: the warm start in `mmrl.trainer.warm_start`, the learn stage
in the run's learner (`mmrl.trainer.learner.Learner`): `mmrl.trainer.on_policy.OnPolicy` (scale
rewards -> advantages -> minibatch epochs of the objective) or, for an objective that replays
transitions (``algorithm.objective: sac``), `mmrl.trainer.off_policy.OffPolicy` (the transitions
into a replay buffer, gradient steps on batches replayed from it). The loop holds one learner and
never asks which mode it runs: who acts in a rollout, what follows the warm start and what a
checkpoint keeps of the mode are the learner's.

Collecting is where the environment answers: each decision is the policy's action, the simulator's
step and the reward stage's score of it (`mmrl.trainer.reward_stage`, the one home of reward models),
so that success, videos, dynamic sampling and the non-finite check all see the scored reward. What
follows (the learner) works on the collected batch.

Every iteration is a pure function of (parameters, optimizer state, iteration index): its reset
seeds and its sampling / shuffling generator are derived from ``run.seed`` and the iteration
number. That is what makes resume exact: a run killed after checkpoint k and restarted with the
same command reaches the same parameters as one that never stopped.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from mmrl import distributed
from mmrl.batch import Batch
from mmrl.errors import TrainingError, UserError
from mmrl.rollout import breakdown_logs, evaluate_policy, success_by_task, task_logs
from mmrl.trainer import audit
from mmrl.trainer import checkpoint as ckpt
from mmrl.trainer.collectors import AsyncCollector, build_collector
from mmrl.trainer.learner import Learner
from mmrl.trainer.logging import RunLogger, SilentLogger
from mmrl.trainer.off_policy import OffPolicy
from mmrl.trainer.on_policy import OnPolicy, kl_adaptive_scale
from mmrl.trainer.state import TrainState, run_generator, run_seed
from mmrl.trainer.train_engine import TrainEngine, build_train_engine, optimizer_step
from mmrl.trainer.warm_start import WarmStart, candidate_score, warm_start_lr_factor
from mmrl.utils import jsonio
from mmrl.utils.durable import disk_full
from mmrl.utils.threads import slow_bf16

#: collections in a row that may lose every episode (crashed sim workers) before the run stops
MAX_EMPTY_COLLECTIONS = 3


class Trainer:
    """One run's loop (see the module docstring): its stages, its state (`TrainState`), its engine,
    its checkpoints and evaluations. Built by `mmrl.experiment.build_trainer`; `run` trains."""

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
        #: one line for the user, above the progress bars (rank 0 speaks for the run)
        self.log_line: Callable[[str], None] = tqdm.write if main else _quiet
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
        #: the learn stage and what it keeps: `OffPolicy` (replay buffer, critics, their optimizer) for
        #: an objective that replays transitions, else `OnPolicy` (the reward scaler)
        self.learner: Learner = (OffPolicy.for_trainer if algo.off_policy else OnPolicy)(self)

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
        from mmrl.errors import SimulatorError
        from mmrl.reward import RewardFunctionError

        try:
            return self._run()
        except (RewardFunctionError, SimulatorError) as exc:  # user code failed (or hung): the run was not wrong
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
        if slow := slow_bf16(str(self.device), self.policy, self.cfg.trainer.engine.precision):
            self.log_line(slow)  # before any work: bf16 on a CPU without native bf16 products is slow
        self.resume()
        if self.state.iteration and self.done():
            self.log_line(self.finished_notice())
        if not self.state.warm_started:
            self.warm_start()
        if not self.policy.caps.acts:  # a model the warm start alone trains (a world model): no evaluation
            self.save()
            self.logger.close()
            self.log_line(f"{self.cfg.policy.type} trained by its warm start; run folder: {self.out_dir}")
            return self.state.results
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

    def finished_notice(self) -> str:
        """The line for a resume whose checkpoint has already trained as long as the config asks."""
        t, state = self.cfg.trainer, self.state
        asked = f"trainer.iterations={t.iterations}" if t.env_steps is None else f"trainer.env_steps={t.env_steps}"
        at = f"iteration {state.iteration}" + (f", {state.env_steps} env steps" if t.env_steps is not None else "")
        past = (
            "past"
            if (state.iteration > t.iterations if t.env_steps is None else state.env_steps > t.env_steps)
            else "at"
        )
        return (
            f"notice: the checkpoint resumed is at {at}, {past} {asked}: nothing is trained and the results are "
            f"the checkpoint's; to train again, start a new run (run.name=NEW_NAME or trainer.resume=false)"
        )

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
        grouped = audit.group_stats(self.cfg.algorithm.group_size, batch)  # the rewards as scored, unscaled
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
        """The initial action std chosen on the first iteration's rollout, and the rollout RL trains
        on (`mmrl.trainer.exploration.probe`)."""
        from mmrl.trainer import exploration

        return exploration.probe(self, it, batch, info, gen)

    def warm_start(self) -> None:
        """The warm-start stage (`mmrl.trainer.warm_start.WarmStart`: supervised training on
        ``warm_start.dataset``, skipped without one), then the learner's step after it (RLPD's
        demonstrations); the run's first checkpoint follows."""
        stage = WarmStart(self)
        stage.run()
        self.learner.after_warm_start(stage.load_records, self.log_line)
        self.state.warm_started = True
        self.save()

    def collect(self, it: int, gen: torch.Generator) -> tuple[Batch, dict]:
        """Round ``it`` of the collector, by who the learner says acts (`Learner.behaviour`: the
        trained policy, or the off-policy mode's uniform actions until learning starts), the policy in
        eval mode (sampling stays stochastic in train rollouts), under the engine's precision."""
        self.policy.eval()
        acting = self.learner.behaviour(self.policy, self.state.env_steps)
        with self.acting():
            return self.collector.collect(acting, it, gen)

    def learn(self, it: int, batch: Batch, info: dict, gen: torch.Generator) -> dict:
        """The learner's stage on iteration ``it``'s batch (`Learner.learn`); ``gen`` continues the
        rollout's random stream."""
        return self.learner.learn(it, batch, info, gen, self.state.env_steps)

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
        audit.start(self)  # the reward stage keeps each scored sample with its labels
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
            {
                **{f"eval/{k}": v for k, v in res.items() if k not in ("tasks", "breakdown", audit.KEY)},
                **task_logs("eval", res.get("tasks", {})),
                **breakdown_logs("eval", res.get("breakdown", {})),
                **audit.record(self, name, res),  # res[audit.KEY]; a hacking warning said here
            },
        )
        if video is not None and video.exists():
            self.logger.media(self.state.iteration, f"eval/{name}", video)
        key, metric = self.headline()
        self.log_line(f"[eval {name}] {metric} {res[key]:.3f} over {res['episodes']} episodes")
        if self.ranks.main:
            jsonio.write_json(self.out_dir / "results.json", self.state.results)
        return res

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
        learned = self.learner.state_dict()  # the reward scaler; or replay buffer, critics, their optimizer
        if learned is not None:
            extra[self.learner.checkpoint_key] = learned
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
        if self.learner.checkpoint_key in extra:
            self.learner.load_state_dict(extra[self.learner.checkpoint_key])
        self.log_line(f"resumed from checkpoint {path.name} (iteration {self.state.iteration}) in {self.out_dir}")


def _quiet(line: str) -> None:
    """Where a rank other than 0 writes its lines for the user: nowhere (rank 0 speaks for the run)."""


#: what this module gave before its stages moved out (kept importable from here)
__all__ = [
    "Trainer",
    "TrainState",
    "candidate_score",
    "disk_full",
    "kl_adaptive_scale",
    "run_generator",
    "run_seed",
    "warm_start_lr_factor",
]
