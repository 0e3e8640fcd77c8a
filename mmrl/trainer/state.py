"""What every stage of the trainer's loop shares: its config section (`TrainerConfig`, ``trainer``),
the run's counters (`TrainState`, saved in every checkpoint), its random streams (`run_seed`,
`run_generator`: pure functions of ``run.seed``, which is what makes a resume exact) and the trainer
as a stage sees it (`TrainerView`: the warm start, `mmrl.trainer.warm_start`, and the learners,
`mmrl.trainer.on_policy` / `mmrl.trainer.off_policy`, read the config, the policy and the state
through it and step through its guarded optimizer step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from mmrl.config import ConfigError, check_range
from mmrl.distributed import Ranks
from mmrl.trainer.logging import RunLogger, SilentLogger
from mmrl.trainer.train_engine import TrainEngine, TrainEngineConfig


@dataclass
class TrainerConfig:
    iterations: int = 30  # RL iterations (collect, update); env_steps, when set, decides instead
    lr: float = 3e-4  # Adam's learning rate of the RL update
    # learning rate of the critic (the policy's value head); null = `lr`. A fresh critic beside a
    # pretrained policy fine-tuned at a small lr needs its own, larger one (pi_RL trains it apart)
    value_lr: float | None = None
    checkpoint_every: int = 5  # iterations between checkpoints
    keep_checkpoints: int = 2  # the newest checkpoints kept (older ones are deleted once a newer one is complete)
    resume: bool = True  # restart from the newest checkpoint in the run folder if there is one
    # resume although the config differs from the checkpoint's in keys that change training (the
    # change is recorded in OUT/config_history.jsonl); false: such a resume is refused, naming the keys
    accept_config_change: bool = False
    # the run stops (newest checkpoint kept) when this many optimizer steps in a row were skipped
    # for a non-finite loss or gradient
    max_skipped_steps: int = 20
    # episodes with a non-finite reward are dropped and counted; the run stops when more than this
    # fraction of its episodes so far were dropped
    max_nonfinite_fraction: float = 0.05
    eval_every: int = 0  # 0 = evaluate only after the warm start and at the end
    eval_episodes: int = 256  # held-out episodes per evaluation
    eval_seed: int = 1_000_000_000  # held-out reset seeds: eval_seed + episode index
    video_episodes: int = 8  # episodes shown side by side in each evaluation mp4 (0 = none)
    # async rollout: N > 0 collects batch k+N (with the weights of update k) in the background while
    # batch k trains, so batches are off-policy by at most N versions; 0 = synchronous
    async_staleness: int = 0
    # decisions per env per iteration: 0 = one whole episode per env (every env reset each iteration);
    # T > 0 = fixed-length rollouts of T decisions that continue episodes across iterations (PPO's
    # usual scheme: long episodes still give an update every T decisions), bootstrapped at the cut
    rollout_steps: int = 0
    # train until this many environment steps (overrides `iterations`; null = `iterations` decides)
    env_steps: int | None = None
    # linear: decay to 0 over the run; adaptive: rsl_rl's KL-adaptive rate (PPO): before each minibatch
    # step the rate is divided by 1.5 when the approx KL to the rollout policy exceeds 2 x desired_kl and
    # multiplied by 1.5 below desired_kl / 2, between lr / 100 and 10 x lr (saved in checkpoints)
    lr_schedule: Literal["constant", "linear", "adaptive"] = "constant"
    desired_kl: float = 0.01  # lr_schedule: adaptive's target (rsl_rl / IsaacLab: 0.01)
    engine: TrainEngineConfig = field(default_factory=TrainEngineConfig)  # torch or DeepSpeed ZeRO

    def validate(self) -> None:
        check_range(
            self,
            {
                "iterations": ">=0",
                "lr": ">0",
                "desired_kl": ">0",
                "checkpoint_every": ">=1",
                "keep_checkpoints": ">=1",
                "eval_every": ">=0",
                "eval_episodes": ">=1",
                "video_episodes": ">=0",
                "max_skipped_steps": ">=1",
                "max_nonfinite_fraction": "0..1",
            },
        )
        if self.value_lr is not None and not self.value_lr > 0:
            raise ConfigError(f"'value_lr' = {self.value_lr} must be > 0, or null (the critic learns at `lr`)")
        if self.rollout_steps < 0:
            raise ConfigError(f"'rollout_steps' = {self.rollout_steps} must be >= 0 (0 = one episode per env)")
        if self.env_steps is not None and self.env_steps < 1:
            raise ConfigError(f"'env_steps' = {self.env_steps} must be >= 1 or null")
        if self.async_staleness < 0:
            raise ConfigError(f"'async_staleness' = {self.async_staleness} must be >= 0 (0 = synchronous rollout)")


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


class TrainerView(Protocol):
    """The trainer (`mmrl.trainer.trainer.Trainer`) as its stages see it: what the warm start and the
    learners read and call, and nothing of the loop's order."""

    cfg: Any  # the `mmrl.experiment.ExperimentConfig`
    policy: Any  # the `mmrl.policies.base.Policy` being trained
    eval_sim: Any  # the evaluation simulator (the widths of the simulator's actions and states)
    device: torch.device
    ranks: Ranks  # this process among the run's (`mmrl.distributed`)
    state: TrainState
    out_dir: Path
    logger: RunLogger | SilentLogger
    log_line: Callable[[str], None]  # one line for the user (rank 0 only)
    #: builds the configured policy again (the warm start's candidates); None where nobody passed it
    policy_factory: Callable[[], Any] | None
    #: where the training episodes are collected (`mmrl.trainer.collectors`; ``continuing``: whether a
    #: fixed-length rollout goes on with the episodes across iterations)
    collector: Any

    @property
    def optimizer(self) -> TrainEngine:
        """The RL training engine, built on first use."""
        ...

    def set_lr(self) -> None:
        """Set the engine's learning rates from ``trainer.lr``, its schedule and the KL's scale."""
        ...

    def optimizer_step(self, opt, loss: torch.Tensor, max_norm: float | None = None) -> bool:
        """One guarded step (a non-finite loss or gradient skips it and is counted)."""
        ...

    def generator(self, purpose: str, index: int) -> torch.Generator:
        """`run_generator` of the run's seed on its device."""
        ...
