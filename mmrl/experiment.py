"""The experiment schema (what a file in ``configs/`` may contain) and how it becomes objects.

Sections: ``run``, ``sim``, ``reward`` (a reward model scoring a single-turn policy's answers or
images: `mmrl.trainer.reward_stage.RewardStage`), ``policy`` (its ``type`` picks the family's config),
``warm_start``, ``algorithm``, ``trainer``, ``placement`` (where simulation runs: `mmrl.placement`). Everything is
validated at load time, before any work: unknown keys, bad values, unregistered simulator /
advantage names and simulator keyword arguments the simulator does not take all fail with the key
path and the valid choices.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mmrl.capabilities import NEEDS, ROLES, missing_needs, missing_role
from mmrl.config import ConfigError, check_range, load_config
from mmrl.placement.config import PlacementConfig
from mmrl.policies.base import PolicyConfig
from mmrl.policies.flow_vla import FlowVLAConfig  # the default policy section
from mmrl.registry import ADVANTAGES, OBJECTIVES, POLICIES, REWARDS, SIMULATORS
from mmrl.trainer.train_engine import TrainEngineConfig


@dataclass
class RunConfig:
    name: str = "run"
    output_dir: str = "runs"
    seed: int = 0
    device: str = "cpu"
    threads: int = 0  # torch intra-op threads: 0 = automatic (CPUs - 1), -1 = torch's default, N (mmrl.utils.threads)
    wandb: bool = False
    wandb_project: str = "mmrl"

    def validate(self) -> None:
        from mmrl.placement.config import _valid_device

        if self.threads < -1:
            raise ConfigError(
                f"'threads' = {self.threads}: use 0 (automatic), -1 (torch's default) or a positive thread count"
            )
        if not _valid_device(self.device):
            raise ConfigError(f"'device' = {self.device!r} is not a device; valid: cpu, cuda, cuda:<index>, mps")
        # the run folder is output_dir/name: a name that is a path would write elsewhere
        if not self.name or "/" in self.name or "\\" in self.name or self.name in (".", ".."):
            raise ConfigError(
                f"'name' = {self.name!r} is not a folder name (the run folder is run.output_dir/run.name): use a "
                "plain name such as run.name=my_run, and run.output_dir=PATH for where runs go"
            )


@dataclass
class SimConfig:
    type: str = "reach"  # a registered simulator (`mmrl list`)
    num_envs: int = 128  # training envs (one episode each per iteration)
    eval_num_envs: int = 256  # evaluation batch size (evaluation runs in batches of this)
    kwargs: dict[str, Any] = field(default_factory=dict)  # simulator constructor arguments
    # tasks `mmrl eval` goes through: None = the configured task, "all" = the whole suite (e.g. the
    # 10 tasks of libero_spatial), or a list of values of the simulator's task argument
    eval_tasks: list[Any] | Literal["all"] | None = None
    # constructor arguments of the evaluation simulators only, over `kwargs` and the simulator's own
    # `eval_kwargs` (e.g. LIBERO's published protocol evaluates all 50 init states: {split: all})
    eval_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        check_range(self, {"num_envs": ">=1", "eval_num_envs": ">=1"})
        if self.type not in SIMULATORS:
            raise ConfigError(f"'type' = {self.type!r} is not a registered simulator: {', '.join(SIMULATORS.names())}")
        cls = SIMULATORS.get(self.type)
        if self.eval_tasks is not None and cls.task_arg is None:
            raise ConfigError(
                f"'eval_tasks' is set but simulator '{self.type}' has a single task: remove sim.eval_tasks"
            )
        allowed = constructor_arguments(cls, exclude=("num_envs", "seed", "device"))
        if allowed is not None:
            for section, key in [
                *(("kwargs", k) for k in self.kwargs),
                *(("eval_kwargs", k) for k in self.eval_kwargs),
            ]:
                if key not in allowed:
                    moved = ""
                    if cls.passthrough_arg:
                        value = (self.kwargs if section == "kwargs" else self.eval_kwargs)[key]
                        moved = (
                            f"; arguments of what it wraps go under {section}.{cls.passthrough_arg}: "
                            f"{{{key}: {value!r}}}"
                        )
                    raise ConfigError(
                        f"'{section}.{key}' is not an argument of simulator "
                        f"'{self.type}'{moved}. Valid: {', '.join(allowed)}"
                    )
            params = inspect.signature(cls).parameters
            for given in (self.kwargs, self.eval_kwargs):  # a VLM question sim's dataset arguments
                if "dataset" in params and given.get("dataset_kwargs"):
                    from mmrl.data import check_dataset_arguments

                    name = given.get("dataset", self.kwargs.get("dataset", params["dataset"].default))
                    if isinstance(name, str):
                        check_dataset_arguments(name, given["dataset_kwargs"])


def constructor_arguments(cls, exclude: Sequence[str] = ()) -> list[str] | None:
    """The keyword arguments ``cls(...)`` takes (sorted, without ``exclude``), or None when it takes
    any (``**kwargs``)."""
    params = inspect.signature(cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return sorted(set(params) - {"self", *exclude})


@dataclass
class FrameRewardConfig:
    """``reward.frames``: how an image reward scores the frames a robot simulator renders
    (`mmrl.trainer.reward_stage.FrameScoring`); only for simulators of action chunks."""

    # "step": every step's frame is scored (a dense reward); "episode_end": once, when the episode ends
    timing: Literal["episode_end", "step"] = "episode_end"
    episode_mode: Literal["final", "mean"] = "final"  # episode_end: the last frame, or the mean over its frames
    view: int = 0  # the camera scored when the simulator renders several
    # per-sample reward meta from the instruction, e.g. {positive_goal: "the gripper is on the {color} disc"}:
    # formatted with {instruction} and the named groups of instruction_pattern
    goal_meta: dict[str, Any] = field(default_factory=dict)
    instruction_pattern: str | None = None  # a regex with named groups, e.g. "(?P<color>red|green|blue)"

    def validate(self) -> None:
        check_range(self, {"view": ">=0"})
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

        return FrameScoring(self.timing, self.episode_mode, self.view, dict(self.goal_meta), self.instruction_pattern)


@dataclass
class CombineConfig:
    """``reward.combine``: the trained reward of each step from the model's score (``model``) and the
    simulator's terms ``task`` (its own reward), ``success``, ``terminated``, ``truncated`` and
    ``step_cost`` (-1 per step): `mmrl.algorithms.reward_synthesis.RewardSynthesis`."""

    mode: Literal["weighted", "gated", "hierarchical"] = "weighted"
    # weighted: sum of weight * term; the default adds the score to the task reward ({model: 1.0} alone
    # replaces the task reward, as VLM-RL's semantic reward does)
    weights: dict[str, float] = field(default_factory=lambda: {"model": 1.0, "task": 1.0})
    gate: str | None = None  # gated: score * gate * prod(factors)
    factors: list[str] = field(default_factory=list)
    speed: str = "speed"  # hierarchical (VLM-RL): the speed term and its target
    target_speed: float | None = None
    failure_term: str | None = None  # a term whose steps get failure_penalty instead (e.g. terminated)
    failure_penalty: float = -10.0

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

    def validate(self) -> None:
        from mmrl.utils.deadline import timeout_problem

        problem = timeout_problem("reward.timeout_s", self.timeout_s)
        if problem:
            raise ConfigError(problem)
        if isinstance(self.type, list) or isinstance(self.weights, list):
            self._from_lists()
        assert isinstance(self.weights, dict) and not isinstance(self.type, list)  # the lists became this
        if self.weights:
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
        weights = [1.0] * len(funcs) if isinstance(self.weights, dict) and not self.weights else self.weights
        if not funcs:
            raise ConfigError("'type' is an empty list: name at least one reward")
        if not isinstance(weights, list) or len(weights) != len(funcs):
            raise ConfigError(
                f"'weights' must be a list of {len(funcs)} numbers, one per reward in 'type' (TRL's reward_weights), "
                f"got {weights!r}"
            )
        repeated = sorted({f for f in funcs if funcs.count(f) > 1})
        if repeated:
            raise ConfigError(f"'type' names {repeated} twice: each reward once (add the weights instead)")
        if len(funcs) == 1 and weights == [1.0]:
            self.type, self.weights = funcs[0], {}
        else:
            self.type, self.weights = None, dict(zip(funcs, (float(w) for w in weights)))


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


def check_dataset_choice(key: str, name: str, kwargs: dict) -> None:
    """A config's dataset ``name`` (under ``key``) is registered and ``kwargs`` are arguments its
    builder declares: a misspelt one fails here, before any work."""
    from mmrl.data import check_dataset_arguments
    from mmrl.registry import DATASETS

    if name not in DATASETS:
        raise ConfigError(f"'{key}' = {name!r} is not a registered dataset: {', '.join(DATASETS.names())}")
    check_dataset_arguments(name, kwargs)


@dataclass
class WarmStartConfig:
    dataset: str | None = None  # None = no supervised warm start
    num_episodes: int = 20  # demonstrations to generate / load
    steps: int = 300
    batch_size: int = 64
    lr: float = 1e-3
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


@dataclass
class SACConfig:
    """The off-policy mode's options (``algorithm.sac``, read when ``algorithm.objective: sac``):
    SAC (Haarnoja et al. 2018) with SB3's defaults, and RLPD's additions (Ball et al. 2023: layer
    norm in the critics, a high update-to-data ratio, half of each batch from demonstrations). The
    actor learns at ``trainer.lr``, the critics at ``trainer.value_lr`` (null: ``trainer.lr``)."""

    buffer_size: int = 1_000_000  # transitions the replay buffer keeps (the newest)
    # whether checkpoints hold the replay buffer (then a resume is exact). false: they leave it out
    # (a million wide transitions are gigabytes per checkpoint); a resume then restores everything
    # else and refills an empty buffer with the restored policy's transitions before its next
    # gradient step (as many rows as learning started with, at least batch_size): not bit-identical
    checkpoint_buffer: bool = True
    batch_size: int = 256  # transitions per gradient step
    learning_starts: int = 100  # env steps of uniform random actions before the first gradient step
    utd_ratio: float = 1.0  # gradient steps per transition collected (RLPD: 10-20 with layer norm)
    tau: float = 0.005  # Polyak rate of the target critics
    temperature_lr: float | None = None  # learning rate of log(alpha); null = trainer.lr
    init_temperature: float = 1.0  # alpha at the start (SB3: 1.0)
    target_entropy: float | None = None  # null = -(the replayed action width: chunk_size * action_dim; DSRL: the noise)
    # the entropy bonus in the critics' target (SAC's soft backup). false: y = r + gamma min Q' (RLPD's
    # and DrQ's `backup_entropy` switch): with a positive entropy and time limits bootstrapped, the
    # bonus pays for staying in an episode, which works against tasks that end on success
    backup_entropy: bool = True
    n_step: int = 1  # n-step returns (stopping at a rollout's end: needs trainer.rollout_steps >= n_step)
    critic_hidden: int = 256  # width of each of the twin Q MLPs (SB3: 256)
    critic_layers: int = 2  # their hidden layers (SB3: 2)
    critic_layer_norm: bool = False  # RLPD: LayerNorm after every hidden layer of the critics
    # RLPD: a torch file of demonstration transitions (`mmrl.trainer.off_policy.load_demos`: state,
    # actions, rewards, next_state, terminated); `demo_fraction` of every batch is drawn from them
    demos: str | None = None
    demo_fraction: float = 0.5
    # RLPD from a registered dataset of recorded episodes (one that records rewards and episode ends,
    # e.g. reach_demos), read after the warm start through the policy (`record_transitions`): its
    # features as the states, `Policy.replay_actions` of the recorded chunks as the actions
    demo_dataset: str | None = None
    demo_episodes: int = 1000  # episodes of demo_dataset (its num_episodes)
    demo_kwargs: dict = field(default_factory=dict)  # more arguments of its builder (checked strictly)

    def validate(self) -> None:
        check_range(
            self,
            {
                "buffer_size": ">=1",
                "batch_size": ">=1",
                "learning_starts": ">=0",
                "utd_ratio": ">0",
                "temperature_lr": ">0",
                "init_temperature": ">0",
                "n_step": ">=1",
                "critic_hidden": ">=1",
                "critic_layers": ">=1",
                "demo_fraction": "0..1",
                "demo_episodes": ">=1",
            },
        )
        if not 0 < self.tau <= 1:
            raise ConfigError(f"'tau' = {self.tau!r} must be in (0, 1] (the Polyak rate; 1 copies the critics)")
        if self.demos is not None and not Path(self.demos).is_file():
            raise ConfigError(
                f"'demos' = {self.demos!r} is not a file: give a torch file of demonstration transitions "
                "(mmrl.trainer.off_policy.load_demos), or demos: null"
            )
        if self.demo_dataset is not None:
            check_dataset_choice("demo_dataset", self.demo_dataset, self.demo_kwargs)


@dataclass
class AlgorithmConfig:
    objective: str = "ppo"  # a registered objective (`mmrl list`): ppo (clipped ratio), awm, nft (likelihood-free)
    advantage: str = "gae"  # a registered estimator: gae (critic) or a group estimator: grpo, dr_grpo, rloo, ...
    group_size: int = 1  # episodes sharing an initial state (GRPO family)
    gamma: float = 0.99
    lam: float = 0.95
    normalize_advantages: bool = True
    # over which samples advantages are whitened (and then PSR-weighted and clipped): the whole
    # rollout once (default), or each minibatch as it is drawn (SB3's and CleanRL's PPO)
    advantage_norm_scope: Literal["rollout", "minibatch"] = "rollout"
    adv_clip: float | None = None  # clamp advantages to [-adv_clip, adv_clip] (Flow-GRPO: 5)
    # PSR/NSR: scale positive / negative advantages after normalisation (W-REINFORCE: 0.1 / 1.0)
    pos_weight: float = 1.0
    neg_weight: float = 1.0
    ratio: Literal["token", "sequence"] = "token"  # sequence: GSPO's length-normalised sequence ratio
    dynamic_sampling: bool = False  # DAPO: drop groups whose rewards are all equal, collect more
    max_sampling_rounds: int = 4  # dynamic sampling: rollout rounds per iteration at most
    clip_low: float = 0.2
    clip_high: float | None = None  # None = clip_low (symmetric); larger = DAPO clip-higher
    dual_clip: float | None = None  # c > 1 bounds the loss of negative-advantage samples
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    vf_coef: float = 0.5
    value_clip: float | None = None
    ent_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    epochs: int = 2
    minibatch_size: int = 256
    max_grad_norm: float = 1.0
    # scale rewards by the running std of the discounted return (SB3 VecNormalize / CleanRL
    # NormalizeReward); the critic then learns returns in those units. State saved in checkpoints.
    reward_norm: bool = False
    # stop an iteration's update early once the mean approx KL of an epoch exceeds this (None = never)
    target_kl: float | None = None
    # the off-policy mode's options (objective: sac): replay buffer, update-to-data ratio, SAC, RLPD
    sac: SACConfig = field(default_factory=SACConfig)

    def validate(self) -> None:
        check_range(
            self,
            {
                "group_size": ">=1",
                "gamma": "0..1",
                "lam": "0..1",
                "clip_low": ">0",
                "clip_high": ">0",
                "dual_clip": ">1",
                "epochs": ">=1",
                "minibatch_size": ">=1",
                "max_grad_norm": ">0",
                "vf_coef": ">=0",
                "ent_coef": ">=0",
                "kl_coef": ">=0",
                "adv_clip": ">0",
                "value_clip": ">0",
            },
        )
        if self.target_kl is not None and not self.target_kl > 0:
            raise ConfigError(f"'target_kl' must be > 0 or null, got {self.target_kl}")
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"'advantage' = {self.advantage!r} is not one of: {', '.join(ADVANTAGES.names())}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"'objective' = {self.objective!r} is not one of: {', '.join(OBJECTIVES.names())}")
        if self.max_sampling_rounds < 1:
            raise ConfigError(f"'max_sampling_rounds' must be >= 1, got {self.max_sampling_rounds}")
        if self.dynamic_sampling and not self.grouped:
            raise ConfigError("'dynamic_sampling' filters groups: use a group estimator (grpo, dr_grpo, rloo, ...)")
        if self.pos_weight < 0 or self.neg_weight < 0:
            raise ConfigError(f"'pos_weight' / 'neg_weight' must be >= 0, got {self.pos_weight} / {self.neg_weight}")
        if self.grouped and self.group_size < 2:
            raise ConfigError(f"'advantage' = {self.advantage!r} compares episodes within a group: set group_size >= 2")

    @property
    def off_policy(self) -> bool:
        """Whether the objective learns from replayed transitions (SAC): the trainer's off-policy
        mode (`mmrl.trainer.off_policy`); its objective declares that it needs ``replay``."""
        return "replay" in OBJECTIVES.get(self.objective).needs

    @property
    def grouped(self) -> bool:
        """Whether the advantage estimator compares episodes within groups (GRPO family): it
        declares that it needs ``groups`` (`mmrl.capabilities`)."""
        return "groups" in ADVANTAGES.get(self.advantage).needs


@dataclass
class TrainerConfig:
    iterations: int = 30
    lr: float = 3e-4
    # learning rate of the critic (the policy's value head); null = `lr`. A fresh critic beside a
    # pretrained policy fine-tuned at a small lr needs its own, larger one (pi_RL trains it apart)
    value_lr: float | None = None
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
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
    eval_episodes: int = 256
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
class ExperimentConfig:
    #: what TRL's GRPOConfig, accelerate and LeRobot's train command call keys of ours: an unknown key
    #: of that name is answered with ours (`mmrl.config`), never silently mapped
    FOREIGN_NAMES = {
        "learning_rate": "trainer.lr",
        "lr": "trainer.lr",
        "num_generations": "algorithm.group_size",
        "max_completion_length": "policy.max_new_tokens",
        "max_prompt_length": "policy.max_prompt_tokens",
        "temperature": "policy.temperature",
        "top_p": "policy.top_p",
        "top_k": "policy.top_k",
        "beta": "algorithm.kl_coef",
        "epsilon": "algorithm.clip_low",
        "epsilon_high": "algorithm.clip_high",
        "loss_type": "algorithm.loss_agg",
        "num_iterations": "algorithm.epochs",
        "per_device_train_batch_size": "algorithm.minibatch_size (per rank)",
        "max_grad_norm": "algorithm.max_grad_norm",
        "max_steps": "trainer.iterations",
        "steps": "trainer.iterations",
        "num_train_epochs": "trainer.iterations",
        "save_steps": "trainer.checkpoint_every",
        "save_freq": "trainer.checkpoint_every",
        "eval_steps": "trainer.eval_every",
        "eval_freq": "trainer.eval_every",
        "save_total_limit": "trainer.keep_checkpoints",
        "resume_from_checkpoint": "trainer.resume",
        "gradient_checkpointing": "trainer.engine.gradient_checkpointing",
        "bf16": "trainer.engine.precision=bf16",
        "deepspeed": "trainer.engine.backend=deepspeed",
        "use_vllm": "policy.engine=vllm",
        "model_name_or_path": "policy.model",
        "output_dir": "run.output_dir",
        "run_name": "run.name",
        "job_name": "run.name",
        "seed": "run.seed",
        "report_to": "run.wandb=true",
        "reward_funcs": "reward.type (a list)",
        "reward_weights": "reward.weights (a list)",
        "dataset_name": "sim.kwargs.dataset_kwargs.path (sim.kwargs.dataset=vlm_records)",
        "env": "sim",
        "dataset": "warm_start.dataset (demonstrations) or sim.kwargs.dataset (questions)",
        "batch_size": "algorithm.minibatch_size",
    }

    run: RunConfig = field(default_factory=RunConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    reward: RewardConfig | None = None
    policy: PolicyConfig = field(default_factory=FlowVLAConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)

    def validate(self) -> None:
        self.placement.stage_slices(self.sim.num_envs)  # the stages must divide the envs
        self.trainer.engine.validate(self.run.device)
        engine = self.trainer.engine
        if self.trainer.async_staleness and (
            engine.backend == "fsdp" or (engine.backend == "deepspeed" and engine.zero_stage == 3)
        ):
            sharded = "FSDP2's" if engine.backend == "fsdp" else "ZeRO-3's"
            raise ConfigError(
                "'trainer.async_staleness' > 0 copies the policy for background rollout, "
                f"which {sharded} partitioned parameters do not allow: use "
                + ("backend torch" if engine.backend == "fsdp" else "zero_stage <= 2")
                + " or async_staleness: 0"
            )
        if self.trainer.rollout_steps:
            why = (
                "a group estimator needs groups of episodes sharing an initial state"
                if self.algorithm.grouped
                else "placement.mode must be collocated"
                if self.placement.mode != "collocated"
                else "trainer.async_staleness must be 0"
                if self.trainer.async_staleness
                else None
            )
            if why:
                raise ConfigError(
                    f"'trainer.rollout_steps' > 0 (fixed-length rollouts) is not supported "
                    f"here: {why}. Set trainer.rollout_steps=0 (one episode per env) or fix it"
                )
        if self.algorithm.off_policy:
            self.check_off_policy()
        elif self.trainer.lr_schedule == "adaptive" and self.algorithm.objective != "ppo":
            raise ConfigError(
                f"'trainer.lr_schedule' = 'adaptive' follows PPO's approx KL, which "
                f"algorithm.objective={self.algorithm.objective!r} does not measure: use lr_schedule constant "
                "or linear, or objective ppo"
            )
        if self.sim.num_envs % self.algorithm.group_size:
            raise ConfigError(
                f"'sim.num_envs' ({self.sim.num_envs}) must be a multiple of "
                f"'algorithm.group_size' ({self.algorithm.group_size})"
            )
        if self.policy.type not in POLICIES:
            raise ConfigError(f"'policy.type' = {self.policy.type!r} is not a registered policy")
        caps = POLICIES.get(self.policy.type).capabilities(self.policy)
        sim_actions = SIMULATORS.get(self.sim.type).action_type
        if sim_actions != caps.action_type:
            raise ConfigError(
                f"policy '{self.policy.type}' produces {caps.action_type} actions but simulator "
                f"'{self.sim.type}' takes {sim_actions}: pick a {caps.action_type} simulator or "
                f"a {sim_actions} policy"
            )
        self.check_reward(sim_actions)
        self.check_capabilities(caps)
        old_decay = getattr(self.policy, "nft_old_decay", None)  # DiffusionNFT's old policy samples the rollouts
        if old_decay is not None and self.algorithm.objective != "nft":
            raise ConfigError(
                f"'policy.nft_old_decay' = {old_decay} keeps DiffusionNFT's old policy, which samples the rollouts, "
                f"but 'algorithm.objective' is {self.algorithm.objective!r}: set policy.nft_old_decay=null "
                "(or algorithm.objective=nft)"
            )

    def check_off_policy(self) -> None:
        """The off-policy mode (``algorithm.objective: sac``) collects fixed-length rollouts that
        continue episodes into a replay buffer: what it cannot combine with fails here in one line."""
        a, t, sac = self.algorithm, self.trainer, self.algorithm.sac
        why = (
            "set trainer.rollout_steps >= 1 (decisions per env per iteration, e.g. 1 as SB3's SAC)"
            if not t.rollout_steps
            else f"set trainer.rollout_steps >= algorithm.sac.n_step ({sac.n_step}): n-step returns stop at a "
            "rollout's end"
            if t.rollout_steps < sac.n_step
            else "set algorithm.reward_norm=false (it scales on-policy rollouts)"
            if a.reward_norm
            else "set trainer.lr_schedule=constant"
            if t.lr_schedule != "constant"
            else "set trainer.engine.backend=torch"
            if t.engine.backend != "torch"
            else None
        )
        if why:
            raise ConfigError(f"'algorithm.objective' = {a.objective!r} (the off-policy mode): {why}")

    def check_reward(self, sim_actions: str) -> None:
        """The reward section fits the simulator: a single-turn simulator needs one; frame options
        only for robot simulators, a success threshold only for single-turn ones."""
        if self.reward is None:
            if sim_actions != "chunk":
                raise ConfigError(
                    f"simulator '{self.sim.type}' has no task reward of its own: add a `reward:` "
                    "section naming the reward model that scores the policy's answers / images"
                )
            return
        if sim_actions == "chunk" and self.reward.success_threshold is not None:
            raise ConfigError(
                f"'reward.success_threshold' applies to single-turn rewards (answers, images); "
                f"simulator '{self.sim.type}' judges success itself: remove it"
            )
        if sim_actions != "chunk" and self.reward.frames is not None:
            raise ConfigError(
                f"'reward.frames' says how a robot simulator's rendered frames are scored; simulator "
                f"'{self.sim.type}' takes {sim_actions} actions, scored as they are: remove it"
            )

    def check_capabilities(self, caps) -> None:
        """What the algorithm and the trainer ask of the policy (its `mmrl.capabilities.Capabilities`
        as configured) is there: each fails here, naming the capability and the fix, not after the
        warm start."""
        policy = f"policy '{self.policy.type}'"
        defaults = {
            "critic": "set policy.critic=true, or use a group estimator (grpo, rloo, ...)",
            "likelihood": "use an objective that needs no likelihood (algorithm.objective=awm)",
            "likelihood_free": "use algorithm.objective=ppo",
            "forward_process": "DiffusionNFT is for flow-matching generators (policy.type: diffusion): "
            "use algorithm.objective=awm or ppo",
            "reparameterized": "SAC needs a policy with reparameterised actions (policy.type=gaussian with "
            "policy.squash=true), or use algorithm.objective=ppo",
        }
        checked = [("objective", self.algorithm.objective, OBJECTIVES)]
        if not self.algorithm.off_policy:  # the off-policy mode computes no advantages
            checked.insert(0, ("advantage", self.algorithm.advantage, ADVANTAGES))
        cls = POLICIES.get(self.policy.type)
        for key, name, registry in checked:
            role = missing_role(cls, registry.get(name).needs)  # its hooks are a role the class lacks
            if role:
                raise ConfigError(
                    f"'algorithm.{key}' = {name!r} needs {NEEDS[role]}, which only a policy that is an "
                    f"{ROLES[role]} (mmrl.policies.off_policy) has, and {policy} ({cls.__name__}) is not: use "
                    "policy.type=gaussian with policy.squash=true, or dsrl / residual over this policy as their "
                    "base, or an on-policy objective (algorithm.objective=ppo)"
                )
            # groups and replay come from the collection and the trainer's mode (checked above)
            lacking = missing_needs(registry.get(name).needs, caps.as_needs() | {"groups", "replay"})
            if lacking:
                need = lacking[0]
                raise ConfigError(
                    f"'algorithm.{key}' = {name!r} needs {NEEDS[need]}, which {policy} does not have "
                    f"as configured: {caps.fix(need, defaults[need])}"
                )
        if self.algorithm.kl_coef and caps.kl_reference is None:
            raise ConfigError(
                f"'algorithm.kl_coef' > 0 needs a reference model, which {policy} does not provide "
                f"as configured: {caps.fix('kl_reference', 'set algorithm.kl_coef=0')}"
            )
        if self.algorithm.off_policy and self.algorithm.sac.demo_dataset and not caps.demonstrations:
            raise ConfigError(
                f"'algorithm.sac.demo_dataset' replays recorded action chunks, which {policy} cannot map to its "
                f"replayed actions: {caps.fix('demonstrations', 'set algorithm.sac.demo_dataset=null')}"
            )
        if self.trainer.async_staleness and not caps.asynchronous:
            raise ConfigError(
                f"'trainer.async_staleness' = {self.trainer.async_staleness} rolls out with a background "
                f"copy of the policy, which {policy} cannot do: "
                + caps.fix("asynchronous", "set trainer.async_staleness=0")
            )


def load_experiment(path: str | Path | dict | None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    return load_config(ExperimentConfig, path, overrides)


def output_dir(cfg: ExperimentConfig) -> Path:
    return Path(cfg.run.output_dir) / cfg.run.name


def build_sim(cfg: ExperimentConfig, num_envs: int, seed: int, evaluation: bool = False, task: Any = None):
    """A simulator of the experiment. ``evaluation`` adds the simulator's ``eval_kwargs`` (held-out
    initial states); ``task`` overrides its task argument (one task of the suite)."""
    cls = SIMULATORS.get(cfg.sim.type)
    kwargs = {**cfg.sim.kwargs, **({**cls.eval_kwargs, **cfg.sim.eval_kwargs} if evaluation else {})}
    if task is not None:
        kwargs[cls.task_arg] = task
    return SIMULATORS.build(cfg.sim.type, num_envs=num_envs, seed=seed, device=cfg.run.device, **kwargs)


def eval_tasks(cfg: ExperimentConfig) -> list:
    """The tasks `mmrl eval` evaluates (see `SimConfig.eval_tasks`); ``[None]`` = as configured."""
    cls, chosen = SIMULATORS.get(cfg.sim.type), cfg.sim.eval_tasks
    if chosen is None:
        return [None]
    return cls.suite_tasks(**cfg.sim.kwargs) if chosen == "all" else list(chosen)


def base_from_checkpoint(section: PolicyConfig, sim) -> tuple[PolicyConfig, Path | None]:
    """A policy section with ``base_checkpoint`` set (DSRL's frozen base from an earlier run): the
    section with ``base`` replaced by the one that run's newest complete checkpoint recorded (read
    from the weights' metadata, checked against ``sim``'s widths and for a noise -> action map), and
    the checkpoint folder; else ``(section, None)``."""
    import dataclasses
    import json

    given = getattr(section, "base_checkpoint", None)
    if given is None:
        return section, None
    from mmrl.trainer.checkpoint import WEIGHTS
    from mmrl.trainer.evaluation import resolve_checkpoint
    from mmrl.utils.weights import SPEC, read_metadata

    path = resolve_checkpoint(given, Path(given))
    meta = read_metadata(path / WEIGHTS)
    if SPEC not in meta:
        raise ConfigError(f"'policy.base_checkpoint' = {given!r}: checkpoint {path} records no policy spec")
    spec = json.loads(meta[SPEC])
    if (spec["action_dim"], spec["state_dim"]) != (sim.action_dim, sim.state_dim):
        raise ConfigError(
            f"'policy.base_checkpoint' = {given!r} acts with action_dim {spec['action_dim']} and state_dim "
            f"{spec['state_dim']}; this simulator has {sim.action_dim} and {sim.state_dim}"
        )
    base = load_config(PolicyConfig, spec["config"])
    if not POLICIES.get(base.type).capabilities(base).latent_noise:
        raise ConfigError(
            f"'policy.base_checkpoint' = {given!r} holds a '{base.type}' policy, which has no deterministic "
            "noise -> action map (Capabilities.latent_noise): give a flow_vla run's checkpoint"
        )
    return dataclasses.replace(section, base=base, base_checkpoint=str(path)), path  # type: ignore[call-arg]


def build_policy(cfg: ExperimentConfig, sim):
    """The configured policy, its config completed from ``sim`` (`Policy.configure`), on ``run.device``;
    with ``policy.base_checkpoint`` its base loaded from that checkpoint and frozen."""
    from mmrl.config import to_dict
    from mmrl.trainer import checkpoint

    cls = POLICIES.get(cfg.policy.type)
    section, base_path = base_from_checkpoint(cfg.policy, sim)
    configured = cls.configure(section, sim)
    policy = cls(configured, action_dim=sim.action_dim, state_dim=sim.state_dim)
    if base_path is not None:  # the trained base's weights (safetensors: nothing unpickled), then frozen
        weights, _ = checkpoint.read_weights(base_path)
        checkpoint.load_into(policy.base, weights, checkpoint.source_of(base_path), where=f"checkpoint {base_path}")
        policy.freeze_base()
    # what rebuilds it without a simulator (`mmrl.load_policy`); checkpoints keep it
    policy.build_spec = {
        "type": configured.type,
        "config": to_dict(configured),
        "action_dim": sim.action_dim,
        "state_dim": sim.state_dim,
    }
    policy = policy.to(cfg.run.device)
    checkpoint.mark_source(policy)  # its frozen pretrained weights: checkpoints leave them to the source
    return policy


def build_reward(cfg: ExperimentConfig):
    """The trainer's reward stage (`mmrl.trainer.reward_stage.RewardStage`) of the ``reward``
    section, or None; its model is built without moving the global torch RNG."""
    from mmrl.trainer.reward_stage import build_reward_stage

    r = cfg.reward
    if r is None:
        return None
    frames = r.frames.scoring() if r.frames is not None else None
    assert isinstance(r.weights, dict) and not isinstance(r.type, list)  # RewardConfig.validate made them so
    return build_reward_stage(
        r.type,
        dict(r.kwargs),
        dict(r.weights),
        SIMULATORS.get(cfg.sim.type).action_type,
        r.success_threshold,
        r.combine.synthesis(),
        r.combine.failure_term,
        frames,
        r.timeout_s,
    )


def build_trainer(cfg: ExperimentConfig):
    """Simulators, policy and trainer for an experiment (seeded, on ``run.device``). Before any
    work: the devices exist, the run folder is writable and not in use (it stays locked while the
    trainer lives), and a resume's config matches its checkpoint's (`mmrl.trainer.run_folder`)."""
    from mmrl import distributed
    from mmrl.trainer import checkpoint
    from mmrl.trainer.run_folder import check_resume_config, open_run_folder, record_config_change
    from mmrl.trainer.trainer import Trainer

    for key, device in (("run.device", cfg.run.device), ("placement.render_device", cfg.placement.render_device)):
        check_device_available(key, device)
    check_ranks(cfg, distributed.launched())  # before the process group: one line, every rank
    ranks = distributed.init(cfg.run.device)
    if ranks.distributed and cfg.run.device.startswith("cuda"):
        cfg.run.device = f"cuda:{ranks.local_rank}"  # one GPU per rank
    out = output_dir(cfg)
    # writable, and ours alone while we run (rank 0 holds it for the ranks of the run)
    folder = open_run_folder(out) if ranks.main else None
    try:
        resumed_from = checkpoint.latest_path(out) if cfg.trainer.resume else None
        changes = check_resume_config(cfg, resumed_from)  # refused (one line) before any work
        trainer = _build_trainer(cfg, Trainer, folder)
    except BaseException:
        if folder is not None:
            folder.close()
        raise
    trainer.verified_checkpoint = resumed_from
    if changes and ranks.main:
        assert resumed_from is not None  # changes are found only against a checkpoint
        record_config_change(out, resumed_from, changes)
        trainer.log_line(
            f"warning: resuming {resumed_from.name} under a changed config "
            "(trainer.accept_config_change): " + ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changes)
        )
    return trainer


def check_ranks(cfg: ExperimentConfig, ranks) -> None:
    """A `ConfigError` for what N ranks (`mmrl.distributed`) cannot run yet; nothing for one process."""
    if not ranks.distributed:
        return
    w = ranks.world
    refused = {
        "trainer.rollout_steps": (cfg.trainer.rollout_steps, "fixed-length rollouts run in one process: unset it"),
        "trainer.async_staleness": (cfg.trainer.async_staleness, "asynchronous rollout runs in one process: set 0"),
    }
    for key, (value, fix) in refused.items():
        if value:
            raise ConfigError(f"'{key}' is not supported with {w} ranks yet ({fix}, or launch one process)")


def check_device_available(key: str, device: str) -> None:
    """A `UserError` naming ``key`` when ``device`` (a valid name) does not exist on this machine."""
    import torch

    from mmrl.errors import UserError

    kind = device.split(":")[0]
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= count:
            have = (
                f"{count} CUDA device(s)"
                if count
                else f"no CUDA device (torch {torch.__version__}{'' if torch.version.cuda else ', built without CUDA'})"
            )
            raise UserError(
                f"{key} = {device!r} but this machine has {have}: use {key}=cpu"
                + (f" or cuda:0..cuda:{count - 1}" if count else "")
            )
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"{key} = 'mps' but MPS is not available here: use {key}=cpu")


def _build_trainer(cfg: ExperimentConfig, Trainer, folder):
    import torch

    from mmrl.placement import LazySim, SimGroup
    from mmrl.utils.threads import configure_threads

    configure_threads(cfg.run.threads)
    torch.manual_seed(cfg.run.seed)
    reward = build_reward(cfg)
    eval_sim = build_sim(cfg, cfg.sim.eval_num_envs, cfg.run.seed + 1, evaluation=True)
    if reward is not None:
        reward.check_simulator(eval_sim)  # the same simulator type trains: checked before any work
    sim = build_train_sim(cfg)
    remote = isinstance(sim, SimGroup)
    try:
        policy = build_policy(cfg, sim)
        if sim.action_type == "chunk" and policy.chunk_size > sim.max_episode_steps:
            raise ConfigError(
                f"policy.chunk_size = {policy.chunk_size} is longer than an episode of simulator "
                f"'{cfg.sim.type}' ({sim.max_episode_steps} steps): set policy.chunk_size <= "
                f"{sim.max_episode_steps} or lengthen the episodes"
            )
        # the training simulator runs in workers: a one-env copy here, built only if the check reads it
        local = LazySim(lambda: build_sim(cfg, 1, cfg.run.seed)) if remote else sim
        try:
            policy.check_simulator(local)
            policy.check_simulator(eval_sim)
        except ValueError as exc:  # the policy cannot act in the simulator as configured: one line, the fix
            raise exc if isinstance(exc, ConfigError) else ConfigError(str(exc)) from exc
        finally:
            if remote:
                local.close()
    except BaseException:
        if remote:
            sim.close()
        raise
    return Trainer(
        cfg,
        policy,
        sim,
        eval_sim,
        output_dir(cfg),
        reward=reward,
        run_folder=folder,
        policy_factory=lambda: build_policy(cfg, sim),
    )


def build_train_sim(cfg: ExperimentConfig):
    """The training simulator where ``placement`` puts it: in this process (collocated) or as a
    `SimGroup` of sim worker processes / Ray actors (disaggregated: one, hybrid: one per stage)."""
    if cfg.placement.mode == "collocated":
        return build_sim(cfg, cfg.sim.num_envs, cfg.run.seed)
    from mmrl.placement import SimGroup, registered_sim, start_sim_workers

    factory = registered_sim(cfg.sim.type, **cfg.sim.kwargs)
    return SimGroup(start_sim_workers(factory, cfg.sim.num_envs, cfg.placement, seed=cfg.run.seed))
