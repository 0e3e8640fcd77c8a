"""What every stage of the trainer's loop shares: the run's counters (`TrainState`, saved in every
checkpoint), its random streams (`run_seed`, `run_generator`: pure functions of ``run.seed``, which
is what makes a resume exact) and the trainer as a stage sees it (`TrainerView`: the warm start,
`mmrl.trainer.warm_start`, and the learners, `mmrl.trainer.on_policy` / `mmrl.trainer.off_policy`,
read the config, the policy and the state through it and step through its guarded optimizer step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from mmrl.distributed import Ranks
from mmrl.trainer.logging import RunLogger, SilentLogger
from mmrl.trainer.train_engine import TrainEngine


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
