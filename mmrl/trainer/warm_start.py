"""The warm start: the trainer's first stage, supervised training of the policy on a dataset
(``warm_start``: demonstrations for a VLA, image-caption pairs for a generator, labelled questions
for a VLM) before any RL, then the policy's own step after it (`Policy.after_warm_start`).

`WarmStart.run` is the stage the trainer calls once (`mmrl.trainer.trainer.Trainer.warm_start`); in
order it:

- builds the dataset's examples (`WarmStart.load_records`: recorded in the simulator the RL runs in,
  configured as it is, when the dataset records there) and, with ``held_in``, fresh examples of it
  under a derived seed (`WarmStart.held_in_records`) on which the final loss is logged;
- with ``candidates`` > 1, trains each initialisation a few steps and keeps the best
  (`WarmStart.choose_initialisation`, scored by `candidate_score` or the held-in loss), since whether
  a warm start from random weights succeeds is a lottery of its initial weights;
- trains to ``steps`` with its own Adam and schedule (`warm_start_optimizer`,
  `warm_start_lr_factor`), its batches and noise drawn from the run's seeded streams
  (`mmrl.trainer.state.run_generator`), so a killed warm start is redone identically.

Where it stands between steps (optimizer, schedule, streams) is a `SupervisedRun`. Its section of the
config, `WarmStartConfig`, is defined here beside it.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from tqdm import tqdm

from mmrl import distributed
from mmrl.batch import Batch, random_indices
from mmrl.config import ConfigError, check_range
from mmrl.data import check_dataset_choice
from mmrl.errors import UserError
from mmrl.trainer.state import TrainerView, run_seed


@dataclass
class WarmStartConfig:
    dataset: str | None = None  # None = no supervised warm start
    num_episodes: int = 20  # demonstrations to generate / load
    steps: int = 300  # supervised optimizer steps
    batch_size: int = 64  # examples per step
    lr: float = 1e-3  # Adam's learning rate of the warm start
    schedule: Literal["constant", "cosine"] = "constant"  # cosine decays the lr to 0 over the steps
    warmup_steps: int = 0  # linear warm-up from 0 over the first steps, then the schedule (LeRobot's presets warm up)
    # initialisations tried (a policy trained from random weights): each is trained `candidate_steps`
    # (on its own batches and noise); the one with the lowest mean loss over the last third of them
    # finishes the `steps` (the run's own weights are candidate 0, the others are built under derived seeds)
    candidates: int = 1
    candidate_steps: int | None = None  # None: 3/8 of `steps` (300 of 800), at least 1
    # fresh examples of `dataset` (built as the training ones, under a derived seed: never trained on)
    # on which the warm start's mean loss is logged and, with candidates > 1, the candidates are scored
    # (lowest kept) instead of by their own training loss. A pretrained policy's candidates, which
    # start from the same weights, differ in the order of their batches: they need held_in > 0
    held_in: int = 0
    # builder arguments of the held-in examples over `kwargs` (e.g. the demonstrator you want where
    # the training one is sloppy: the candidates are then scored on the behaviour RL is to reach)
    held_in_kwargs: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)  # dataset builder arguments

    def steps_per_candidate(self) -> int:
        """``candidate_steps``, or 3/8 of ``steps`` (at least 1) when it is unset."""
        return self.candidate_steps if self.candidate_steps is not None else max(1, self.steps * 3 // 8)

    def validate(self) -> None:
        ranges = {"num_episodes": ">=1", "steps": ">=0", "batch_size": ">=1", "lr": ">0", "candidates": ">=1"}
        check_range(self, {**ranges, "held_in": ">=0"})
        if not 0 <= self.warmup_steps < max(self.steps, 1):
            raise ConfigError(f"'warmup_steps' = {self.warmup_steps} must be >= 0 and below 'steps' ({self.steps})")
        if self.candidate_steps is not None and not 1 <= self.candidate_steps <= max(self.steps, 1):
            raise ConfigError(
                f"'candidate_steps' = {self.candidate_steps}: each candidate trains that many of the {self.steps} "
                "steps before the best is kept, so set 1 <= candidate_steps <= steps, or leave it unset (3/8 of steps)"
            )
        if self.dataset is not None:
            check_dataset_choice("dataset", self.dataset, self.kwargs)
        if self.held_in and self.dataset is not None:  # no dataset: no warm start, nothing to hold in
            self.check_held_in(self.dataset)
        elif self.held_in_kwargs and not self.held_in:
            raise ConfigError("'held_in_kwargs' builds the held-in examples, but held_in = 0: set held_in (e.g. 32)")

    def check_held_in(self, dataset: str) -> None:
        """``held_in`` draws fresh examples of ``dataset`` through its builder's seed: refuse a dataset
        without one (it would give the training examples again) or a seed fixed in ``kwargs``."""
        from mmrl.data import dataset_arguments

        if "seed" in self.kwargs or "seed" in self.held_in_kwargs:
            raise ConfigError(
                f"'held_in' = {self.held_in} draws fresh examples of '{dataset}' under a seed derived from "
                "run.seed, but warm_start.kwargs fixes 'seed': remove it (the run's seed is passed), or set held_in=0"
            )
        valid = dataset_arguments(dataset)
        if valid is not None and "seed" not in valid:
            raise ConfigError(
                f"'held_in' = {self.held_in}: dataset '{dataset}' takes no seed, so it cannot draw examples "
                "the warm start has not seen: set held_in=0 (or hold out part of your data yourself)"
            )
        check_dataset_choice("held_in_kwargs", dataset, {**self.kwargs, **self.held_in_kwargs})


def warm_start_records(cfg, name: str, num: int, kwargs: dict, chunk_size: int, seed: int | None = None) -> dict:
    """``num`` examples of the registered dataset ``name``, built with ``kwargs`` and the context
    its builder declares: demonstrations recorded in the simulator the experiment ``cfg`` runs in,
    configured as it is (image size, time limit, ...), when the dataset records in that simulator,
    in chunks of ``chunk_size``; ``kwargs`` (checked strictly) win."""
    from mmrl.data import declared_kwargs, load_dataset, recorded_in

    same_sim = recorded_in(name) == cfg.sim.type
    context = declared_kwargs(
        name,
        num_episodes=num,
        num_samples=num,
        seed=cfg.run.seed if seed is None else seed,
        chunk_size=chunk_size,
        **({"sim_kwargs": dict(cfg.sim.kwargs)} if same_sim else {}),
    )
    return load_dataset(name, **{**context, **kwargs})


def check_warm_start_only(cfg, caps) -> None:
    """A policy that does not act (``caps.acts`` False: a world model) is trained by its warm start
    alone: ConfigError naming the fix unless ``cfg`` runs no RL and has a warm-start dataset."""
    t = cfg.trainer
    if t.iterations or t.env_steps is not None or not cfg.warm_start.dataset:
        raise ConfigError(
            f"policy '{cfg.policy.type}' does not act ({caps.fix('acts', 'it is trained by its warm start')}): "
            "set trainer.iterations=0, trainer.env_steps=null and a warm_start.dataset of recorded episodes"
        )


def warm_start_lr_factor(step: int, steps: int, schedule: str, warmup: int = 0) -> float:
    """The warm start's learning rate at ``step`` (0-based) of ``steps``, as a fraction of ``lr``:
    ``(step + 1) / (warmup + 1)`` during the first ``warmup`` steps, then 1 (``constant``) or a cosine
    from 1 down to 0 over the remaining steps (``cosine``)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule != "cosine":
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


def warm_start_optimizer(policy, ws) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """A fresh Adam over ``policy``'s trainable parameters at ``ws.lr`` and its schedule
    (`warm_start_lr_factor`)."""
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=ws.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: warm_start_lr_factor(s, ws.steps, ws.schedule, ws.warmup_steps)
    )
    return opt, sched


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


class WarmStart:
    """The warm-start stage of ``trainer``'s run (see the module docstring); its records, batches and
    candidates are methods, so that each part is testable and replaceable on its own."""

    def __init__(self, trainer: TrainerView):
        self.trainer = trainer
        self.cfg, self.policy, self.device = trainer.cfg, trainer.policy, trainer.device

    def run(self) -> None:
        """Supervised training on the warm-start dataset (skipped if no dataset is set), then the
        policy's own step after it (`Policy.after_warm_start`: e.g. a reference copy, DSRL's freeze)."""
        ws = self.cfg.warm_start
        if ws.dataset:
            rl_data = self.cfg.sim.kwargs.get("dataset")
            if rl_data is not None and rl_data != ws.dataset:  # say it: the user's data is not this
                self.trainer.log_line(
                    f"warm start: supervised on {ws.num_episodes} examples of '{ws.dataset}' (warm_start.dataset), "
                    f"not of the RL data '{rl_data}' (sim.kwargs.dataset); set warm_start.dataset=null to skip "
                    "it, or point warm_start at your own data"
                )
            self.supervised(self.load_records(ws.dataset, ws.num_episodes, ws.kwargs), ws)
        self.policy.after_warm_start()

    def held_in_records(self, ws) -> dict:
        """``ws.held_in`` fresh examples of the warm-start dataset: built as the training ones
        (`load_records`, ``ws.held_in_kwargs`` over ``ws.kwargs``), under the seed
        `run_seed`(seed, "held_in") instead of the run's."""
        kwargs = {**ws.kwargs, **ws.held_in_kwargs}
        return self.load_records(ws.dataset, ws.held_in, kwargs, seed=run_seed(self.cfg.run.seed, "held_in"))

    def load_records(self, name: str, num: int, kwargs: dict, seed: int | None = None) -> dict:
        """`warm_start_records` of this run, for its policy's chunk size."""
        return warm_start_records(self.cfg, name, num, kwargs, self.policy.chunk_size, seed)

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
            self.trainer.log_line(
                f"warm start: held-in loss {loss:.4f} on {held.size} rows of {ws.held_in} fresh examples"
            )
            self.trainer.logger.log(0, {"warm_start/held_in_loss": loss}, phase="warm_start", phase_step=ws.steps)

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
        far more often where they land: docs/notes/2026-11-27-warm-start-lottery.md)."""
        self.policy.update_statistics(batch)  # e.g. observation normalisation starts from the demos
        opt, sched = warm_start_optimizer(self.policy, ws)
        seed = self.cfg.run.seed
        torch.manual_seed(seed if candidate == 0 else run_seed(seed, "warm_start", candidate))
        return SupervisedRun(opt, sched, self.trainer.generator("warm_start", candidate))

    def supervised_steps(self, batch: Batch, ws, run: SupervisedRun, end: int, phase: str, phase_offset: int) -> list:
        """Train from ``run.step`` up to step ``end``; returns the losses (read once at the end: no
        device sync per step). Rows go to the log under ``phase`` every 25 steps (and at the last),
        before the RL iterations."""
        self.policy.train()
        losses: list[torch.Tensor] = []
        desc = phase.replace("warm_start", "warm start").replace("_candidate_", ", candidate ")
        bar = tqdm(range(run.step, end), desc=desc, dynamic_ncols=True, disable=not self.trainer.ranks.main)
        for step in bar:
            idx = random_indices(batch.size, min(ws.batch_size, batch.size), run.gen)
            loss = self.policy.supervised_loss(batch.index(idx).to(self.device)).mean()
            self.trainer.optimizer_step(run.opt, loss)
            run.sched.step()
            losses.append(loss.detach())
            if step % 25 == 0 or step == end - 1:
                value = loss.item()
                bar.set_postfix(loss=f"{value:.4f}")
                row = {"warm_start/loss": value}
                self.trainer.logger.log(step - ws.steps - phase_offset, row, phase=phase, phase_step=step)
        run.step = end
        return torch.stack(losses).tolist() if losses else []

    def choose_initialisation(self, batch: Batch, ws, held: Batch | None = None) -> SupervisedRun:
        """Train ``ws.candidates`` initialisations for ``ws.steps_per_candidate()`` steps each, and
        go on from the one with the lowest `candidate_score`: whether the warm start succeeds is a
        lottery of its initial weights (docs/notes/2026-11-27-warm-start-lottery.md), and the loss
        tells the failing ones early. Candidate 0 is the policy as built, on the run's own streams (keeping it gives the
        run without candidates exactly); candidate k > 0 is built again under the derived seed
        `run_seed`(seed, "init", k) and draws its own batches and noise (`start_supervised`). With
        ``held`` (rows of ``ws.held_in`` fresh examples) the score is the loss on them instead
        (`held_in_loss`), and a pretrained policy's candidates, whose weights are the same, differ in
        their batches and noise alone. The choice is in the state (``warm_start_candidate``,
        ``warm_start_scores``) and the log."""
        if self.trainer.policy_factory is None:
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
        self.trainer.state.warm_start_candidate, self.trainer.state.warm_start_scores = chosen, scores
        shown = " / ".join(f"{s:.4f}" for s in scores)
        scored = (
            f"held-in loss on {ws.held_in} fresh examples after {ws.steps_per_candidate()} steps"
            if held is not None
            else f"mean loss over the last third of {ws.steps_per_candidate()} steps"
        )
        self.trainer.log_line(
            f"warm start: kept {'candidate' if same else 'initialisation'} {chosen} of {ws.candidates} "
            f"({scored}: {shown}); it trains on to step {ws.steps}"
        )
        self.trainer.logger.log(
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
        factory = self.trainer.policy_factory
        assert factory is not None, "choose_initialisation refuses candidates without it"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(run_seed(self.cfg.run.seed, "init", k))
            fresh = factory()
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
