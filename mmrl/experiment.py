"""The experiment schema (what a file in ``configs/`` may contain) and how it becomes objects.

Sections: ``run``, ``sim``, ``reward`` (a reward model scoring a single-turn policy's answers or
images: `mmrl.trainer.reward_stage.RewardStage`), ``policy`` (its ``type`` picks the family's config),
``warm_start``, ``algorithm``, ``trainer``, ``placement`` (where simulation runs: `mmrl.placement`). Everything is
validated at load time, before any work: unknown keys, bad values, unregistered simulator /
advantage names and simulator keyword arguments the simulator does not take all fail with the key
path and the valid choices.

Each section's class lives beside the code it configures and is imported here, where the schema is
put together (every name stays importable from ``mmrl.experiment``): `RewardConfig` in
`mmrl.trainer.reward_config`, `WarmStartConfig` in `mmrl.trainer.warm_start`, `AlgorithmConfig` in
`mmrl.trainer.objectives` (its ``sac`` part, `SACConfig`, in `mmrl.trainer.off_policy`),
`TrainerConfig` in `mmrl.trainer.state`, `PlacementConfig` in `mmrl.placement.config`, a policy's in
its family's module. ``run`` and ``sim`` are this module's own: it builds the simulators.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mmrl.capabilities import NEEDS, ROLES, missing_needs, missing_role
from mmrl.config import ConfigError, check_range, load_config
from mmrl.data import check_dataset_choice as check_dataset_choice
from mmrl.errors import UserError
from mmrl.placement.config import PlacementConfig
from mmrl.policies.base import PolicyConfig
from mmrl.policies.flow_vla import FlowVLAConfig  # the default policy section
from mmrl.registry import ADVANTAGES, OBJECTIVES, POLICIES, SIMULATORS
from mmrl.registry import REWARDS as REWARDS
from mmrl.trainer.objectives import AlgorithmConfig
from mmrl.trainer.off_policy import SACConfig as SACConfig
from mmrl.trainer.off_policy import check_off_policy
from mmrl.trainer.reward_config import CombineConfig as CombineConfig
from mmrl.trainer.reward_config import FrameRewardConfig as FrameRewardConfig
from mmrl.trainer.reward_config import RewardConfig
from mmrl.trainer.reward_config import check_reward_name as check_reward_name
from mmrl.trainer.state import TrainerConfig
from mmrl.trainer.train_engine import TrainEngineConfig as TrainEngineConfig
from mmrl.trainer.warm_start import WarmStartConfig, check_warm_start_only


@dataclass
class RunConfig:
    name: str = "run"  # the run's name: its folder is output_dir/name (a plain folder name)
    output_dir: str = "runs"  # where run folders go
    seed: int = 0  # every random draw of the run derives from it (reset seeds, sampling, warm-start batches)
    device: str = "cpu"  # where the policy lives and trains: cpu, cuda, cuda:<index> or mps
    threads: int = 0  # torch intra-op threads: 0 = automatic (CPUs - 1), -1 = torch's default, N (mmrl.utils.threads)
    wandb: bool = False  # also log to Weights & Biases (needs the wandb extra and a login)
    wandb_project: str = "mmrl"  # the Weights & Biases project of the run
    # memory per device the run's plan must fit (`mmrl estimate`), checked at load before any work:
    # a size (80GiB, 24GB) checks on any device; null checks a CUDA run against its GPU's memory; off: never
    gpu_memory: str | bool | None = None

    def validate(self) -> None:
        from mmrl.placement.config import _valid_device

        if self.threads < -1:
            raise ConfigError(
                f"'threads' = {self.threads}: use 0 (automatic), -1 (torch's default) or a positive thread count"
            )
        if self.gpu_memory is True or (isinstance(self.gpu_memory, str) and self.gpu_memory != "off"):
            from mmrl.planning.memory import parse_bytes

            try:
                parse_bytes(str(self.gpu_memory))
            except ValueError as exc:
                raise ConfigError(f"'gpu_memory': {exc}, null (a CUDA run's own GPU) or off") from None
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
        (engine := self.trainer.engine).validate(self.run.device)
        self.policy.check_engine(engine)  # e.g. a diffusers pipeline's dtype against the precision
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
            check_off_policy(self)
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
        if not caps.acts:  # trained by its warm start alone: nothing of the RL sections applies
            return check_warm_start_only(self, caps)
        self.check_capabilities(caps)
        old_decay = getattr(self.policy, "nft_old_decay", None)  # DiffusionNFT's old policy samples the rollouts
        if old_decay is not None and self.algorithm.objective != "nft":
            raise ConfigError(
                f"'policy.nft_old_decay' = {old_decay} keeps DiffusionNFT's old policy, which samples the rollouts, "
                f"but 'algorithm.objective' is {self.algorithm.objective!r}: set policy.nft_old_decay=null "
                "(or algorithm.objective=nft)"
            )

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
    with constructor_errors(f"'sim.kwargs' of simulator '{cfg.sim.type}'"):
        return SIMULATORS.build(cfg.sim.type, num_envs=num_envs, seed=seed, device=cfg.run.device, **kwargs)


@contextlib.contextmanager
def constructor_errors(where: str):
    """A component built from a config section (a simulator from ``sim.kwargs``, the reward stage):
    the ValueError its constructor raises for a value it refuses, or the TypeError of an argument
    its signature lacks, is a `ConfigError` (one line naming ``where``), not a traceback."""
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, (ConfigError, UserError)):
            raise
        raise ConfigError(f"{where}: {exc}") from None
    except TypeError as exc:
        if "unexpected keyword argument" not in str(exc) and "required" not in str(exc):
            raise
        raise ConfigError(f"{where}: {exc}") from None


def eval_tasks(cfg: ExperimentConfig) -> list:
    """The tasks `mmrl eval` evaluates (see `SimConfig.eval_tasks`); ``[None]`` = as configured."""
    cls, chosen = SIMULATORS.get(cfg.sim.type), cfg.sim.eval_tasks
    return [None] if chosen is None else cls.suite_tasks(**cfg.sim.kwargs) if chosen == "all" else list(chosen)


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

    path = resolve_checkpoint(given, Path(given), key="policy.base_checkpoint")
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
    with constructor_errors("'reward'"):
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
            (r.audit.heldout, dict(r.audit.heldout_kwargs)) if r.audit.enabled and r.audit.heldout else None,
            r.normalize_parts,
        )


def build_trainer(cfg: ExperimentConfig):
    """Simulators, policy and trainer for an experiment (seeded, on ``run.device``). Before any
    work: the devices exist, the run folder is writable and not in use (it stays locked while the
    trainer lives), and a resume's config matches its checkpoint's (`mmrl.trainer.run_folder`)."""
    from mmrl import distributed
    from mmrl.planning.estimate import check_plan
    from mmrl.trainer import checkpoint
    from mmrl.trainer.run_folder import check_ranks_agree, check_resume_config, open_run_folder, record_config_change
    from mmrl.trainer.trainer import Trainer

    launched = distributed.launched()
    check_plan(cfg, launched.world if launched.distributed else cfg.placement.train_ranks)  # fits, before any work
    for key, device in (("run.device", cfg.run.device), ("placement.render_device", cfg.placement.render_device)):
        check_device_available(key, device)
    check_ranks(cfg, launched)  # before the process group: one line, every rank
    ranks = distributed.init(cfg.run.device)
    check_ranks_agree(cfg)  # every rank, before any work: one config for the job
    if ranks.distributed and cfg.run.device.startswith("cuda"):
        cfg.run.device = f"cuda:{ranks.local_rank}"  # one GPU per rank
    out = output_dir(cfg)
    # writable, and ours alone while we run (rank 0 holds it for the ranks of the run)
    folder = open_run_folder(out) if ranks.main else None
    try:
        resumed_from = checkpoint.latest_path(out) if cfg.trainer.resume else None
        changes = check_resume_config(cfg, resumed_from, ranks.world)  # refused (one line) before any work
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
