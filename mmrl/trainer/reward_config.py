"""The ``reward`` section of an experiment, beside the stage it configures
(`mmrl.trainer.reward_stage.RewardStage`, built from it by `mmrl.experiment.build_reward`): which
reward model scores what the policy produced (`RewardConfig`), how a robot simulator's rendered
frames are scored (`FrameRewardConfig`) and how the model's score and the simulator's own terms make
the trained reward (`CombineConfig`). Everything is checked when the config loads: a reward that is
neither registered nor an importable function, unknown terms, a bad regex, all fail there in one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from mmrl.config import ConfigError, check_range
from mmrl.registry import REWARDS


@dataclass
class FrameRewardConfig:
    """``reward.frames``: how an image reward scores the frames a robot simulator renders
    (`mmrl.trainer.reward_stage.FrameScoring`); only for simulators of action chunks."""

    # "step": every step's frame is scored (a dense reward); "episode_end": once, when the episode ends
    timing: Literal["episode_end", "step"] = "episode_end"
    episode_mode: Literal["final", "mean"] = "final"  # episode_end: the last frame, or the mean over its frames
    view: int = 0  # the camera scored when the simulator renders several
    # step: "potential" pays each step the change of the score since the episode's previous frame
    # (potential-based shaping, Ng et al. 1999: it sums to last minus first, so nothing pays loitering)
    shaping: Literal["none", "potential"] = "none"
    # per-sample reward meta from the instruction, e.g. {positive_goal: "the gripper is on the {color} disc"}:
    # formatted with {instruction} and the named groups of instruction_pattern
    goal_meta: dict[str, Any] = field(default_factory=dict)
    instruction_pattern: str | None = None  # a regex with named groups, e.g. "(?P<color>red|green|blue)"

    def validate(self) -> None:
        check_range(self, {"view": ">=0"})
        if self.shaping == "potential" and self.timing != "step":
            raise ConfigError("'shaping' = 'potential' pays each step's change of the score: set timing: step")
        if self.instruction_pattern is not None:
            import re

            try:
                re.compile(self.instruction_pattern)
            except re.error as exc:
                raise ConfigError(
                    f"'instruction_pattern' = {self.instruction_pattern!r} is not a regex: {exc}"
                ) from None
        for key, template in self.goal_meta.items():
            if not isinstance(template, str):
                raise ConfigError(f"'goal_meta.{key}' must be a string template, got {template!r}")

    def scoring(self):
        from mmrl.trainer.reward_stage import FrameScoring

        return FrameScoring(
            self.timing, self.episode_mode, self.view, dict(self.goal_meta), self.instruction_pattern, self.shaping
        )


@dataclass
class CombineConfig:
    """``reward.combine``: the trained reward of each step from the model's score (``model``) and the
    simulator's terms ``task`` (its own reward), ``success``, ``terminated``, ``truncated`` and
    ``step_cost`` (-1 per step): `mmrl.algorithms.reward_synthesis.RewardSynthesis`."""

    # weighted: a weighted sum of terms; gated: score x gate x factors; hierarchical: VLM-RL's speed synthesis
    mode: Literal["weighted", "gated", "hierarchical"] = "weighted"
    # weighted: sum of weight * term; the default adds the score to the task reward ({model: 1.0} alone
    # replaces the task reward, as VLM-RL's semantic reward does)
    weights: dict[str, float] = field(default_factory=lambda: {"model": 1.0, "task": 1.0})
    gate: str | None = None  # gated: score * gate * prod(factors)
    factors: list[str] = field(default_factory=list)  # gated / hierarchical: terms in [0, 1] the score is multiplied by
    speed: str = "speed"  # hierarchical (VLM-RL): the speed term and its target
    # hierarchical: v_target (the score in [0, 1] sets the desired speed score x v_target); required there
    target_speed: float | None = None
    failure_term: str | None = None  # a term whose steps get failure_penalty instead (e.g. terminated)
    failure_penalty: float = -10.0  # the reward of a failure_term step, whatever the other terms say (VLM-RL: -10)

    def validate(self) -> None:
        from mmrl.trainer.reward_stage import TERMS, unknown_terms

        unknown = unknown_terms(self.synthesis(), self.failure_term)  # (a bad mode or target_speed: named there)
        if unknown:
            raise ConfigError(f"names unknown term(s) {unknown}; terms: model, {', '.join(TERMS)}")

    def synthesis(self):
        from mmrl.algorithms.reward_synthesis import RewardSynthesis

        try:
            return RewardSynthesis(
                self.mode,
                dict(self.weights),
                self.gate,
                list(self.factors),
                self.speed,
                self.target_speed,
                self.failure_penalty,
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


@dataclass
class AuditConfig:
    """``reward.audit``: at every evaluation (the first before RL), how the trained reward tracks the
    labels beside it on the evaluation's samples: the simulator's success and own reward, and a
    held-out reward model never trained on (`mmrl.algorithms.reward_audit`; logged as
    ``eval/reward_audit/...``, kept in ``results.json``). A run whose trained reward rises while the
    held-out measure (the held-out reward, else success) falls over ``patience`` evaluations in a
    row warns in one line naming both numbers."""

    enabled: bool = True  # audit every evaluation (false: no audit, no warning)
    # a reward that is never trained on (a registered reward or a function reference, as `type`),
    # scored beside the trained one on the evaluation's samples: null = none (success is the measure)
    heldout: str | None = None
    heldout_kwargs: dict[str, Any] = field(default_factory=dict)  # its constructor arguments
    patience: int = 3  # evaluations in a row of the two parting before the warning
    tolerance: float = 0.0  # how far each must move between two evaluations to count as parting

    def validate(self) -> None:
        check_range(self, {"patience": ">=1", "tolerance": ">=0"})
        if self.heldout is not None:
            check_reward_name(self.heldout, "heldout")


@dataclass
class RewardConfig:
    """The trainer's reward stage (`mmrl.trainer.reward_stage`): a reward model (``rewards/``, `mmrl
    list`, or any Python function) that scores what the policy produced: a VLM's answers or a
    generator's images against the prompt and its ground truth, or, in a robot simulator, the frames it
    renders (``frames``). ``combine`` says how its score and the simulator's reward make the trained
    reward. None (no section) = the simulator's own task reward alone."""

    # a registered reward (`mmrl list`), or any Python function, TRL style (fn(completions | images,
    # prompts=..., **dataset columns) -> list[float]), as 'module.path:function' or 'path/file.py:function';
    # or a list of them, TRL's reward_funcs (summed, with `weights` a list as TRL's reward_weights)
    type: str | list[str] | None = None
    # its constructor arguments (a function: keyword arguments bound to it); with `weights`, one
    # mapping per part: {part: {arg: value}}
    kwargs: dict[str, Any] = field(default_factory=dict)
    success_threshold: float | None = None  # success = score >= this (None: the task's success only)
    # several rewards summed with weights, {registered name or reference: weight}, each part logged
    # (rewards/<part>/mean); `type` is then weighted_sum (or left out). With `type` a list: a list of
    # weights, one per function (TRL's reward_weights; none = 1 each)
    weights: dict[str, float] | list[float] = field(default_factory=dict)
    # robot simulators: when the frames are scored (null = the defaults: each episode's last frame)
    frames: FrameRewardConfig | None = None
    combine: CombineConfig = field(default_factory=CombineConfig)
    # how long one call of a reward function (a Python function given as the reward, user code) may
    # take before the run stops with an error naming it: null (default) = automatic, max(120 s, 20 x
    # its slowest call so far), as placement.step_timeout_s (`mmrl.utils.deadline`); a number = a
    # fixed limit in seconds; .inf = wait forever (the function then runs in the caller's thread, as
    # code that needs the main thread, e.g. signal.alarm, must). Registered rewards are not limited.
    timeout_s: float | None = None
    # a weighted sum's parts each standardised over the batch they score (mean 0, std 1) before the
    # weights, so no reward's scale swamps the others (GDPO-style decoupled normalisation; the audit
    # and the logs keep the raw scores); needs several rewards in `weights`
    normalize_parts: bool = False
    audit: AuditConfig = field(default_factory=AuditConfig)

    def validate(self) -> None:
        from mmrl.utils.deadline import timeout_problem

        problem = timeout_problem("reward.timeout_s", self.timeout_s)
        if problem:
            raise ConfigError(problem)
        if isinstance(self.type, list) or isinstance(self.weights, list):
            self._from_lists()
        assert isinstance(self.weights, dict) and not isinstance(self.type, list)  # the lists became this
        if self.normalize_parts and len(self.weights) < 2:
            raise ConfigError(
                "'normalize_parts' standardises each part of a weighted sum: name two or more rewards in "
                "'weights' (or 'type' as a list), or drop it"
            )
        if self.weights:
            check_weights(self.weights)
            if self.type not in (None, "weighted_sum"):
                raise ConfigError(
                    f"'weights' sums several rewards: drop 'type' ({self.type!r}) or set it to "
                    "weighted_sum, and name each part in 'weights'"
                )
            for part in self.weights:
                check_reward_name(part, "weights")
            unknown = [k for k in self.kwargs if k not in self.weights]
            if unknown:
                raise ConfigError(
                    f"'kwargs' of a weighted reward are per part ({{part: {{arg: value}}}}); "
                    f"{unknown} name no part of 'weights': {list(self.weights)}"
                )
            return
        if self.type is None:
            raise ConfigError(
                "'type' is required: a registered reward (`mmrl list`), a function "
                "('module.path:function' or 'path/file.py:function'), or 'weights' for several"
            )
        assert isinstance(self.type, str)  # a list became weights above
        check_reward_name(self.type, "type")

    def _from_lists(self) -> None:
        """TRL's form, ``type: [f, g]`` (reward_funcs) with ``weights: [1.0, 0.5]`` (reward_weights),
        as the mapping form ``weights: {f: 1.0, g: 0.5}`` (a list of one is that reward alone)."""
        if not isinstance(self.type, list):
            raise ConfigError(
                f"'weights' = {self.weights} is a list, TRL's reward_weights: give 'type' the list of reward "
                "functions they weigh (reward_funcs), or make 'weights' a mapping {reward: weight}"
            )
        funcs = self.type
        if not funcs:
            raise ConfigError("'type' is an empty list: name at least one reward")
        weights = [1.0] * len(funcs) if isinstance(self.weights, dict) and not self.weights else self.weights
        if isinstance(weights, dict):  # the mapping form, {reward: weight}, over the rewards 'type' lists
            extra, missing = [k for k in weights if k not in funcs], [f for f in funcs if f not in weights]
            if extra or missing:
                raise ConfigError(
                    f"'weights' {weights} must give one weight to each reward 'type' lists ({', '.join(funcs)}): "
                    + "; ".join([f"{extra} not in 'type'"] * bool(extra) + [f"no weight for {missing}"] * bool(missing))
                )
            weights = [weights[f] for f in funcs]
        if not isinstance(weights, list) or len(weights) != len(funcs):
            raise ConfigError(
                f"'weights' must be a list of {len(funcs)} numbers, one per reward in 'type' (TRL's reward_weights), "
                f"got {weights!r}"
            )
        repeated = sorted({f for f in funcs if funcs.count(f) > 1})
        if repeated:
            raise ConfigError(f"'type' names {repeated} twice: each reward once (add the weights instead)")
        for name in funcs:  # checked here, so that a wrong name is blamed on 'type', not on 'weights'
            check_reward_name(name, "type")
        if len(funcs) == 1 and weights == [1.0]:
            self.type, self.weights = funcs[0], {}
        else:
            self.type, self.weights = None, dict(zip(funcs, (float(w) for w in weights)))


def check_weights(weights: dict) -> None:
    """Every weight a finite number, and not all of them 0 (the trained reward would be 0): a NaN
    weight trained on the other rewards alone, all zeros on a reward of 0, both without a word."""
    bad = {k: w for k, w in weights.items() if not isinstance(w, (int, float)) or not math.isfinite(w)}
    if bad:
        raise ConfigError(f"'weights' must be finite numbers, got {bad}: give each reward a number (0 leaves it out)")
    if not any(weights.values()):
        raise ConfigError(
            f"'weights' are all 0 ({weights}): the trained reward would be 0 everywhere; give at least one reward "
            "a weight other than 0"
        )


def check_reward_name(name: str, key: str) -> None:
    """A registered reward, or a reference to a Python function that imports (checked at load time)."""
    if ":" in name:
        from mmrl.reward import import_reference

        try:
            fn = import_reference(name)
        except ValueError as exc:
            raise ConfigError(f"'{key}': {exc}") from None
        if not callable(fn):
            raise ConfigError(f"'{key}' = {name!r} is not callable")
    elif name not in REWARDS:
        raise ConfigError(
            f"'{key}' = {name!r} is not a registered reward ({', '.join(REWARDS.names())}) nor a "
            "function reference ('module.path:function' or 'path/file.py:function')"
        )
