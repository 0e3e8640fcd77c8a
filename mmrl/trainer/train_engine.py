"""Training engines: what the trainer needs from an optimizer, with plain torch (DDP on several ranks),
FSDP2 or DeepSpeed ZeRO behind it.

    engine = build_train_engine(cfg, policy, lr, device, value_lr=None)
    with engine.autocast():
        loss = objective(policy, batch)          # policy methods on the module itself
    result = engine.step(loss, max_norm)          # StepResult; truthy when a step was taken

Both engines zero the gradients, skip a non-finite loss before backward, clip the gradient norm to
``max_norm``, skip a non-finite gradient norm and take an Adam step (eps 1e-6). ``state_dict`` /
``load_state_dict`` hold the optimizer state (the module's weights are the caller's, as today);
``param_groups`` exposes the learning rates: one group, or with ``value_lr`` a second one holding
the policy's critic (`Policy.critic_parameters`) at its own rate; ``lr_scales`` is each group's rate
relative to ``lr`` (a schedule scales them all).

``torch``: `torch.optim.Adam` over the trainable parameters; bf16 means autocast with fp32 weights.

``deepspeed``: ZeRO stage 0-3 with DeepSpeed's torch Adam (no compiled ops needed). Without a
launcher the engine starts a one-process group itself (gloo on CPU, ``DS_ACCELERATOR=cpu``); under
``deepspeed`` / ``torchrun`` it uses their environment. The loss is computed by calling policy
methods on the module, never the DeepSpeed engine's ``forward``:

* ZeRO-0/1/2 keep every parameter whole on every rank and hook the gradients, so this just works.
* ZeRO-3 gathers a parameter in the pre-forward hook of the module that owns it, so it works when
  each parameter is used inside its own module's ``forward``. `nn.MultiheadAttention` uses its
  ``out_proj`` weights from its own forward; the engine registers them as external parameters.
  A parameter read directly by a policy method (outside its module's forward) is not gathered.
  ``module.state_dict()`` then returns empty partitions: use `TrainEngine.module_state_dict` /
  `TrainEngine.load_module_state_dict` (or `full_params`) for checkpoints and weight sync.
* bf16 / fp16 cast the module's weights to that dtype: run every forward (rollouts too) inside
  ``engine.autocast()``. fp16 needs a GPU.
* After ``deepspeed.initialize`` ZeRO keeps its own fp32 master weights: load weights with
  `load_module_state_dict` (which refreshes them), not ``module.load_state_dict`` alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from mmrl.config import ConfigError
from mmrl.distributed import all_true, current, solo_environment, start_group

if TYPE_CHECKING:
    from mmrl.policies.base import Policy

ADAM_EPS = 1e-6  # the default of ``engine.adam_eps``
PRECISIONS = ("fp32", "bf16", "fp16")
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
ZERO_RANKS = "zero_partitions"  # a DeepSpeed checkpoint's number of per-rank optimizer files
SHARDED = "sharded_optimizer"  # a checkpoint's optimizer in torch.distributed.checkpoint files: their folder
SHARDED_FOLDER = "optimizer"


def autocast(device_type: str, precision: str):
    """The context the policy runs in at ``precision`` (fp32 / bf16 / fp16) on a device of type
    ``device_type``: torch's autocast, nothing for fp32. On the CPU also without torch's attention
    fast path: `nn.MultiheadAttention` / `nn.Transformer` stand it down under CUDA autocast only (they
    ask ``torch.is_autocast_enabled()``, CUDA's), so an eval-mode rollout took it in fp32 while the
    train-mode log-probs ran in bf16: a PPO ratio about 1% off 1 before any update."""
    if precision == "fp32":
        return contextlib.nullcontext()
    cast = torch.autocast(device_type, dtype=HALF[precision])
    if device_type != "cpu":
        return cast
    stack = contextlib.ExitStack()
    stack.enter_context(cast)
    stack.enter_context(_without_mha_fastpath())
    return stack


@contextlib.contextmanager
def _without_mha_fastpath():
    """torch's attention fast path off inside (restored after): the slow path autocasts like the
    rest of the model."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


@dataclass
class TrainEngineConfig:
    """How the policy is optimized (the trainer's ``engine`` section)."""

    backend: Literal["torch", "deepspeed", "fsdp"] = "torch"  # torch: DDP when launched on several ranks
    zero_stage: int = 2  # 0-3, deepspeed only
    offload_optimizer: bool = False  # optimizer state and step on the CPU (ZeRO 1-3)
    offload_params: bool = False  # parameters on the CPU between uses (ZeRO-3; fsdp: CPUOffloadPolicy)
    # fp32; bf16 / fp16 weights and autocast (fp16: DeepSpeed only, for its loss scaling)
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    gradient_checkpointing: bool = False  # recompute activations in backward (transformers / diffusers models)
    #: where the engine splits the optimizer state over the ranks, each rank writes its own part to a
    #: checkpoint (FSDP2: torch.distributed.checkpoint files, which resume at any world size; DeepSpeed
    #: ZeRO: its partition); ``full`` (FSDP2 only) gathers the whole state to rank 0 instead
    optimizer_checkpoint: Literal["sharded", "full"] = "sharded"
    #: Adam's epsilon (torch's default 1e-8, SB3's PPO 1e-5); it bounds the step of a parameter whose
    #: gradients are tiny, so a larger one damps updates of rarely-driven weights
    adam_eps: float = ADAM_EPS

    def validate(self, device: str | torch.device | None = None) -> None:
        if self.backend not in ("torch", "deepspeed", "fsdp"):
            raise ConfigError(f"'backend' = {self.backend!r} is not one of: torch, deepspeed, fsdp")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"'precision' = {self.precision!r} is not one of: {', '.join(PRECISIONS)}")
        if not self.adam_eps > 0:
            raise ConfigError(f"'adam_eps' = {self.adam_eps} must be > 0 (default {ADAM_EPS})")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"'zero_stage' = {self.zero_stage!r} is not one of: 0, 1, 2, 3")
        if self.optimizer_checkpoint not in ("sharded", "full"):
            raise ConfigError(f"'optimizer_checkpoint' = {self.optimizer_checkpoint!r} is not one of: sharded, full")
        if self.backend == "deepspeed" and self.optimizer_checkpoint == "full":
            raise ConfigError(
                "'optimizer_checkpoint' = 'full' needs backend: fsdp (DeepSpeed ZeRO writes each rank's partition: "
                "use sharded)"
            )
        if self.backend == "fsdp":
            if self.offload_optimizer:
                raise ConfigError(
                    "'offload_optimizer' = true needs backend: deepspeed (fsdp offloads parameters, gradients "
                    "and optimizer state together: offload_params)"
                )
            if self.precision == "fp16":
                raise ConfigError("'precision' = 'fp16' needs backend: deepspeed; with backend 'fsdp' use: fp32, bf16")
            return
        if self.backend == "torch":
            for key in ("offload_optimizer", "offload_params"):
                if getattr(self, key):
                    raise ConfigError(f"'{key}' = true needs backend: deepspeed (backend is 'torch')")
            if self.precision == "fp16":
                raise ConfigError(
                    "'precision' = 'fp16' needs backend: deepspeed (loss scaling); with backend 'torch' use: fp32, bf16"
                )
            return
        if self.offload_optimizer and self.zero_stage == 0:
            raise ConfigError("'offload_optimizer' = true needs zero_stage 1, 2 or 3 (zero_stage is 0)")
        if self.offload_params and self.zero_stage != 3:
            raise ConfigError(f"'offload_params' = true needs zero_stage 3 (zero_stage is {self.zero_stage})")
        if self.precision == "fp16" and device is not None and torch.device(device).type == "cpu":
            raise ConfigError("'precision' = 'fp16' needs a GPU (run.device is 'cpu'); on CPU use: fp32, bf16")
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("'backend' = 'deepspeed' but DeepSpeed is not installed: pip install 'mmrl[deepspeed]'")


@dataclass
class StepResult:
    """Whether an optimizer step was taken, and the gradient norm before clipping (nan for a
    non-finite loss, when no backward ran). Truthy when the step was taken."""

    taken: bool
    grad_norm: float

    def __bool__(self) -> bool:
        return self.taken


def trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def param_groups(module: Policy, lr: float, value_lr: float | None) -> tuple[list[dict], list[float]]:
    """Optimizer groups of ``module``'s trainable parameters and each group's lr relative to ``lr``:
    one group at ``lr``, or with ``value_lr`` the critic (``module.critic_parameters()``) apart."""
    params = trainable(module)
    if value_lr is None:
        return [{"params": params, "lr": lr}], [1.0]
    critic = {id(p) for p in module.critic_parameters() if p.requires_grad}
    if not critic:
        raise ConfigError(f"'trainer.value_lr' = {value_lr} but the policy has no trainable critic: remove value_lr")
    return (
        [
            {"params": [p for p in params if id(p) not in critic], "lr": lr},
            {"params": [p for p in params if id(p) in critic], "lr": value_lr},
        ],
        [1.0, value_lr / lr],
    )


def optimizer_step(opt: torch.optim.Optimizer, loss: torch.Tensor, max_norm: float | None = None) -> StepResult:
    """One guarded step of a torch optimizer: a non-finite loss or gradient norm skips it."""
    opt.zero_grad(set_to_none=True)
    if not torch.isfinite(loss).all():
        return StepResult(False, math.nan)
    loss.backward()
    params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
    total = torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf"))
    norm = float(_whole(total))
    if not math.isfinite(norm):
        opt.zero_grad(set_to_none=True)
        return StepResult(False, norm)
    opt.step()
    return StepResult(True, norm)


def finite_on_every_rank(loss: torch.Tensor) -> bool:
    """Whether ``loss`` is finite on every rank (so that all skip a step together, or none does)."""
    return all_true(bool(torch.isfinite(loss.detach()).all()))


def collective_step(opt: torch.optim.Optimizer, loss: torch.Tensor, max_norm: float | None = None) -> StepResult:
    """`optimizer_step` on N ranks whose backward is collective (DDP, FSDP2): a loss that is not
    finite on one rank skips the step on every rank, after the backward the others wait for (of a
    zero loss, its gradients dropped), so all stay in step."""
    if finite_on_every_rank(loss):
        return optimizer_step(opt, loss, max_norm)
    opt.zero_grad(set_to_none=True)
    (loss * 0).sum().backward()
    opt.zero_grad(set_to_none=True)
    return StepResult(False, math.nan)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """``t``, or for a `DTensor` (FSDP2's gradient norm) its value over every shard."""
    if "torch.distributed.tensor" not in sys.modules:  # nothing made a DTensor: do not import it
        return t
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


class TrainEngine:
    """The optimizer of one module. Subclasses: `TorchEngine`, `DeepSpeedTrainEngine`."""

    lr_scales: list[float] = [1.0]  # each param group's lr relative to the base lr
    #: a torch optimizer; under DeepSpeed, the optimizer its engine wraps (a ZeRO optimizer at stages >= 1)
    optimizer: Any

    @property
    def partitions_params(self) -> bool:
        """Whether the module's parameters are split across processes (ZeRO-3, FSDP2): their tensors
        are then not the weights, and checkpoints write every weight (gathered)."""
        return self.cfg.backend == "fsdp" or (self.cfg.zero_stage == 3 and self.cfg.backend == "deepspeed")

    def __init__(self, cfg: TrainEngineConfig, module: nn.Module, device):
        self.cfg, self.module, self.device = cfg, module, torch.device(device)

    def loss(self, objective, mb, algo) -> tuple[torch.Tensor, dict]:
        """``objective(module, mb, algo)``: the loss whose gradients `step` takes (DDP runs it in
        its forward, where it learns which gradients to average)."""
        return objective(self.module, mb, algo)

    def step(self, loss: torch.Tensor, max_norm: float | None = None) -> StepResult:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.optimizer.load_state_dict(sd)

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def autocast(self):
        """bf16 / fp16 autocast on the engine's device; nothing for fp32 (`autocast`)."""
        return autocast(self.device.type, self.cfg.precision)

    def full_params(self):
        """Context in which every parameter is whole (ZeRO-3 gathers them; changes are kept)."""
        return contextlib.nullcontext()

    def rollout_weights(self):
        """Context in which the policy's methods run on whole weights with no other rank taking
        part (FSDP2 gathers every unit once for a rollout or an evaluation, whose number of policy
        calls differs from rank to rank); nothing for the engines whose weights are whole."""
        return contextlib.nullcontext()

    def checkpoint_state(self):
        """Context, entered by every rank, in which `module_state_dict` and `state_dict` are the
        whole model's and optimizer's on rank 0 (FSDP2 gathers them there); nothing for the others."""
        return contextlib.nullcontext()

    @property
    def writes_own_state(self) -> bool:
        """Whether every rank writes its own part of the optimizer state into a checkpoint
        (`write_own_state`); False where `state_dict` on rank 0 is the whole state."""
        return False

    def write_own_state(self, folder: Path) -> list[str]:
        """Every rank, inside `checkpoint_state`, when `writes_own_state`: write this rank's part of
        the optimizer state into the checkpoint's temporary ``folder``, durably (it may be collective).
        Returns, on rank 0, the names (relative to ``folder``) of the files every rank wrote, which
        the checkpoint's ``COMPLETE`` marker then lists."""
        raise NotImplementedError(f"{type(self).__name__} writes no optimizer state of its own")

    def sharded_model(self) -> nn.Module:
        """The module whose parameter names key the optimizer state of a sharded checkpoint
        (``policy.<name>``, as FSDP2's root unit names them), for `get_optimizer_state_dict`."""
        return _Objective(self.module)

    def load_optimizer(self, sd: dict, folder) -> None:
        """Restore the optimizer from what checkpoint ``folder`` holds: ``sd`` (its `state_dict`)
        and, where the ranks wrote them, their own files (`write_own_state`). FSDP2's sharded
        files load at any world size and into any engine but DeepSpeed's (resharded by
        `torch.distributed.checkpoint`)."""
        from mmrl.trainer.checkpoint import CheckpointError

        if ZERO_RANKS in sd:
            raise CheckpointError(
                f"checkpoint {folder} holds the optimizer partitions of a DeepSpeed ZeRO run on {sd[ZERO_RANKS]} "
                f"rank(s): resume it with trainer.engine.backend=deepspeed on {sd[ZERO_RANKS]} rank(s) (its weights "
                "alone load anywhere: mmrl eval, mmrl export)"
            )
        if not sd:  # saved before the first step (FSDP2): no state yet, in any engine
            return
        if SHARDED in sd:
            load_sharded_optimizer(self.sharded_model(), self.optimizer, Path(folder) / sd[SHARDED])
        elif named(sd):  # FSDP2's whole state, keyed by parameter name
            load_named_optimizer(self.sharded_model(), self.optimizer, sd)
        else:
            self.load_state_dict(sd)

    def module_state_dict(self, exclude=()) -> dict:
        """A copy of the module's whole state dict (ZeRO-3: gathered), but the keys in ``exclude``."""
        with self.full_params():
            return {k: v.detach().clone() for k, v in self.module.state_dict().items() if k not in exclude}

    def load_module_state_dict(self, sd: dict) -> None:
        with self.full_params():
            self.module.load_state_dict(sd)


class TorchEngine(TrainEngine):
    """`torch.optim.Adam` over the module's trainable parameters (multi-tensor ``foreach`` kernels on
    every device: torch picks them only on CUDA, and on CPU they halve the per-step cost of the many
    small parameters of a policy)."""

    def __init__(self, cfg: TrainEngineConfig, module: Policy, lr: float, device, value_lr: float | None = None):
        super().__init__(cfg, module, device)
        groups, self.lr_scales = param_groups(module, lr, value_lr)
        self.optimizer = torch.optim.Adam(groups, lr=lr, eps=cfg.adam_eps, foreach=True)

    def step(self, loss: torch.Tensor, max_norm: float | None = None) -> StepResult:
        return optimizer_step(self.optimizer, loss, max_norm)


class _Objective(nn.Module):
    """The policy with an objective as its forward: DDP averages the gradients of what its
    wrapped module's forward computed (the trainer calls policy methods, never ``forward``)."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, loss_of):
        return loss_of(self.policy)


class DDPEngine(TorchEngine):
    """`TorchEngine` on N ranks: `torch.nn.parallel.DistributedDataParallel` averages the gradients
    (every rank holds the whole model and optimizer; ranks start from rank 0's weights). A step is
    skipped on every rank when the loss is not finite on one of them, so all stay in step."""

    def __init__(self, cfg: TrainEngineConfig, module: Policy, lr: float, device, value_lr: float | None = None):
        from torch.nn.parallel import DistributedDataParallel

        super().__init__(cfg, module, lr, device, value_lr)
        self.ddp = DistributedDataParallel(
            _Objective(module),
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            broadcast_buffers=False,  # buffers (normalisation statistics) follow the same global batch on every rank
            find_unused_parameters=True,  # an objective may leave a part of the policy out (the critic, say)
        )

    def loss(self, objective, mb, algo) -> tuple[torch.Tensor, dict]:
        return self.ddp(lambda policy: objective(policy, mb, algo))

    def sharded_model(self) -> nn.Module:
        return self.ddp.module

    def step(self, loss: torch.Tensor, max_norm: float | None = None) -> StepResult:
        return collective_step(self.optimizer, loss, max_norm)


class FSDPEngine(TrainEngine):
    """FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and Adam state sharded
    over the ranks. Each block the policy names (`Capabilities.sharding_units`, e.g. a transformer
    layer class) or its transformers / diffusers models name (`framework_units`: a decoder layer,
    a transformer block) is a unit gathered for its own forward; the rest of the policy is one root unit,
    gathered when the objective runs (the objective is the root's forward, as in `DDPEngine`).
    ``precision: bf16`` computes in bf16 with fp32 gradient reduction (`MixedPrecisionPolicy`);
    ``offload_params`` keeps the shards and the optimizer step on the CPU (`CPUOffloadPolicy`).
    Checkpoints hold the whole model (gathered to rank 0), so they export like any other, and the
    optimizer state as each rank's shards in `torch.distributed.checkpoint` files (``optimizer/``:
    no rank ever holds the whole Adam state; they load at any world size, resharded), or with
    ``optimizer_checkpoint: full`` gathered whole to rank 0. Without a launcher it starts a
    one-process group itself."""

    def __init__(self, cfg: TrainEngineConfig, module: Policy, lr: float, device, value_lr: float | None = None):
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

        super().__init__(cfg, module, device)
        start_group(self.device)
        kw: dict[str, Any] = {}
        if cfg.precision == "bf16":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cfg.offload_params:
            kw["offload_policy"] = CPUOffloadPolicy()
        units = set(module.caps.sharding_units) | framework_units(module)
        for _, m in reversed(list(module.named_modules())):  # the innermost blocks first
            if type(m).__name__ in units:
                fully_shard(m, **kw)
        self.root = _Objective(module)
        fully_shard(self.root, **kw)
        self.units: list[Any] = [m for m in self.root.modules() if isinstance(m, FSDPModule)]
        with torch.no_grad():  # FSDP2 sets its units up at the root's first forward, before any unit's own
            self.root(lambda policy: None)
        for m in self.units:  # the root stays gathered after its forward: its shards are the parameters
            m.reshard()
        groups, self.lr_scales = param_groups(module, lr, value_lr)
        self.optimizer = torch.optim.Adam(groups, lr=lr, eps=cfg.adam_eps, foreach=True)
        self._gathered: tuple[dict, dict] | None = None

    def loss(self, objective, mb, algo) -> tuple[torch.Tensor, dict]:
        return self.root(lambda policy: objective(policy, mb, algo))

    def step(self, loss: torch.Tensor, max_norm: float | None = None) -> StepResult:
        return collective_step(self.optimizer, loss, max_norm)

    @contextlib.contextmanager
    def rollout_weights(self):
        for m in self.units:
            m.set_reshard_after_forward(False)  # gathered once here, kept through every call
            m.unshard()
        try:
            yield
        finally:
            for m in self.units:
                m.reshard()
                m.set_reshard_after_forward(True)

    @contextlib.contextmanager
    def checkpoint_state(self):
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model = get_model_state_dict(self.root, options=whole)
        # before the first step there is no state; torch would create it by a step (Adam's count 1)
        gather = self.optimizer.state and not self.writes_own_state
        optim = get_optimizer_state_dict(self.root, self.optimizer, options=whole) if gather else {}
        self._gathered = ({_unprefixed(k): v for k, v in model.items()}, optim)
        try:
            yield
        finally:
            self._gathered = None

    def module_state_dict(self, exclude=()) -> dict:
        if self._gathered is None:
            raise RuntimeError("FSDPEngine.module_state_dict runs inside checkpoint_state() (entered by every rank)")
        return {k: v for k, v in self._gathered[0].items() if k not in exclude}

    def state_dict(self) -> dict:
        if self._gathered is None:
            raise RuntimeError("FSDPEngine.state_dict runs inside checkpoint_state() (entered by every rank)")
        if self.writes_own_state:  # the ranks' files hold it (none before the first step)
            return {SHARDED: SHARDED_FOLDER} if self.optimizer.state else {}
        return self._gathered[1]

    @property
    def writes_own_state(self) -> bool:
        return self.cfg.optimizer_checkpoint == "sharded"

    def write_own_state(self, folder: Path) -> list[str]:
        from torch.distributed.checkpoint import FileSystemWriter, save
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        from mmrl.utils.faults import fault_point

        if not self.optimizer.state:  # saved before the first step (on every rank alike)
            return []
        where = Path(folder) / SHARDED_FOLDER
        # each rank writes its shards and fsyncs them; rank 0 writes .metadata once every rank has
        save({"optimizer": get_optimizer_state_dict(self.root, self.optimizer)}, storage_writer=FileSystemWriter(where))
        for own in sorted(where.glob(f"__{current().rank}_*.distcp")):
            fault_point("ckpt.mid_shard", own)
        return sorted(str(f.relative_to(folder)) for f in where.rglob("*") if f.is_file()) if current().main else []

    def sharded_model(self) -> nn.Module:
        return self.root

    def load_module_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        whole = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.root, {f"policy.{k}": v for k, v in sd.items()}, options=whole)

    def load_state_dict(self, sd: dict) -> None:
        """The whole optimizer state every rank read from a checkpoint, each keeping its shards."""
        if sd:  # (empty: saved before the first step)
            load_named_optimizer(self.root, self.optimizer, sd)


def load_sharded_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load ``optimizer``'s state from the `torch.distributed.checkpoint` files in ``folder`` (FSDP2's
    sharded checkpoint), whatever world size wrote them: each rank reads the parts of the saved
    shards its own parameters (FSDP2 shards, or whole tensors) cover. ``model`` names the parameters
    (`TrainEngine.sharded_model`). Collective on N ranks; one process needs no process group."""
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from mmrl.trainer.checkpoint import CheckpointError

    if not (folder / ".metadata").exists():
        raise CheckpointError(f"{folder} has no .metadata: not a torch.distributed.checkpoint folder")
    reader = FileSystemReader(folder)
    saved = {k.split(".", 2)[2] for k in reader.read_metadata().state_dict_metadata if k.startswith("optimizer.state.")}
    # the template of this world's layout (an optimizer without state gets it from a zero-lr step),
    # less the parameters that had no state when saved (no gradient yet: a critic a warm start skips)
    template: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer))
    state: dict[str, dict] = template["state"]
    template["state"] = {
        fqn: {k: v for k, v in entry.items() if f"{fqn}.{k}" in saved}
        for fqn, entry in state.items()
        if any(f"{fqn}.{k}" in saved for k in entry)
    }
    wanted = {"optimizer": template}
    load(wanted, storage_reader=reader)
    # not strict: a parameter without saved state starts without state, as it was
    set_optimizer_state_dict(model, optimizer, template, options=StateDictOptions(strict=False))


def named(sd: dict) -> bool:
    """Whether optimizer state dict ``sd`` keys its parameters by name (`get_optimizer_state_dict`'s
    format: FSDP2's whole state), not by position (``torch.optim.Optimizer.state_dict``'s)."""
    return any(isinstance(p, str) for g in sd.get("param_groups", ()) for p in g["params"])


def load_named_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, sd: dict) -> None:
    """Load the whole, name-keyed optimizer state ``sd`` (FSDP2's, gathered) into ``optimizer``,
    whose parameters ``model`` names: every rank keeps its own shards of it under FSDP2."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(full_state_dict=True, strict=False))


def framework_units(module: nn.Module) -> set[str]:
    """The block classes the transformers / diffusers models inside ``module`` name as never to be
    split (their ``_no_split_modules``: a decoder layer, a transformer block), which is what
    accelerate's and TRL's FSDP recipes wrap one by one by default."""
    bases: list[type] = []
    if "transformers" in sys.modules:  # a policy built on them imported them
        from transformers import PreTrainedModel

        bases.append(PreTrainedModel)
    if "diffusers" in sys.modules:
        from diffusers import ModelMixin

        bases.append(ModelMixin)
    names: set[str] = set()
    for m in module.modules():
        if bases and isinstance(m, tuple(bases)):
            names.update(m._no_split_modules or ())  # type: ignore[arg-type]  # a list of class names
    return names


def _unprefixed(key: str) -> str:
    return key[len("policy.") :] if key.startswith("policy.") else key


def init_process_group(device: torch.device):
    """Import DeepSpeed and join (or, with no launcher, start) the process group."""
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read once, at DeepSpeed's first accelerator use
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        solo_environment()  # no launcher: a group of one
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    return deepspeed


def deepspeed_config(cfg: TrainEngineConfig, lr: float) -> dict:
    zero: dict = {"stage": cfg.zero_stage}
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if cfg.offload_params:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": 1,  # the trainer makes the batches: one backward per step
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # set from max_norm at every step
        "optimizer": {
            "type": "Adam",
            "params": {"lr": lr, "eps": cfg.adam_eps, "weight_decay": 0.0, "adam_w_mode": False, "torch_adam": True},
        },
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.precision == "bf16", "check_grad_overflow": True},
        "fp16": {"enabled": cfg.precision == "fp16"},
        "steps_per_print": 2**62,
    }


class DeepSpeedTrainEngine(TrainEngine):
    """``deepspeed.initialize`` over the module's trainable parameters (see the module docstring).

    On N ranks DeepSpeed averages the gradients over them (as DDP does) and ZeRO 1-3 split the
    optimizer state (ZeRO-3 the parameters too). A checkpoint then holds the whole model (gathered
    to rank 0) and, in one file per rank, that rank's optimizer partition (`write_own_state`): it resumes
    on the same number of ranks, and exports at any. ZeRO-3 rollouts and evaluations run on weights
    gathered once, with the per-module hooks set aside (the ranks make different numbers of policy
    calls there; TRL generates under ZeRO-3 the same way)."""

    def __init__(self, cfg: TrainEngineConfig, module: Policy, lr: float, device, value_lr: float | None = None):
        super().__init__(cfg, module, device)
        self.ds = init_process_group(self.device)
        self.world = current().world
        self._gathered: dict | None = None
        groups, self.lr_scales = param_groups(module, lr, value_lr)
        self.engine, self.optimizer, _, _ = self.ds.initialize(
            model=module, model_parameters=groups, config=deepspeed_config(cfg, lr)
        )
        if cfg.zero_stage == 3:  # MultiheadAttention reads out_proj's weights in its own forward
            for m in module.modules():
                if isinstance(m, nn.MultiheadAttention):
                    for p in m.out_proj.parameters():
                        self.ds.zero.register_external_parameter(m, p)

    def step(self, loss: torch.Tensor, max_norm: float | None = None) -> StepResult:
        if not finite_on_every_rank(loss):
            return StepResult(False, math.nan)
        for p in trainable(self.module):  # gradients left by a backward outside the engine (a warm
            p.grad = None  # start's) would be reduced into this step's
        self.engine.backward(loss)
        if isinstance(self.optimizer, torch.optim.Optimizer):  # ZeRO-0 in fp32: plain Adam, grads in p.grad
            norm = float(torch.nn.utils.clip_grad_norm_(trainable(self.module), max_norm or float("inf")))
            if not math.isfinite(norm):
                self.engine.zero_grad()
                return StepResult(False, norm)
            self.engine.step()
            return StepResult(True, norm)
        self.optimizer.clip_grad = float(max_norm or 0.0)  # DeepSpeed's wrappers clip in their step
        self.engine.step()  # skips (and zeroes the gradients) when the gradient norm is not finite
        norm = self.engine.get_global_grad_norm()
        norm = math.nan if norm is None else float(norm)
        return StepResult(math.isfinite(norm) and not getattr(self.optimizer, "overflow", False), norm)

    def full_params(self):
        if self.cfg.zero_stage != 3:
            return contextlib.nullcontext()
        return self.ds.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=0)

    @contextlib.contextmanager
    def rollout_weights(self):
        if self.cfg.zero_stage != 3:
            yield
            return
        offload = self.optimizer.parameter_offload  # ZeRO-3's per-module gather / release hooks
        with self.ds.zero.GatheredParameters(list(self.module.parameters())):  # read-only: no broadcast back
            for p in self.module.parameters():
                p.ds_active_sub_modules.clear()  # type: ignore[attr-defined]  # set by ZeRO-3
            for hook in (*offload.forward_hooks, *offload.backward_hooks):
                hook.remove()  # a hook would release a parameter after its module's forward
            offload.forward_hooks, offload.backward_hooks = [], []
            try:
                yield
            finally:
                offload._register_deepspeed_module(offload.module)

    @contextlib.contextmanager
    def checkpoint_state(self):
        if self.cfg.zero_stage != 3:
            yield
            return
        with self.ds.zero.GatheredParameters(list(self.module.parameters())):  # every rank takes part
            if current().main:
                self._gathered = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        try:
            yield
        finally:
            self._gathered = None

    def module_state_dict(self, exclude=()) -> dict:
        if self._gathered is not None:
            return {k: v for k, v in self._gathered.items() if k not in exclude}
        return super().module_state_dict(exclude)

    @property
    def _partitioned(self) -> bool:
        """Whether each rank holds its own part of the optimizer state (ZeRO 1-3 on N ranks)."""
        return self.world > 1 and self.cfg.zero_stage >= 1

    @property
    def writes_own_state(self) -> bool:
        return self._partitioned

    def write_own_state(self, folder: Path) -> list[str]:
        from mmrl.trainer.checkpoint import SHARD, write_shard

        write_shard(folder, current().rank, self._own_state())
        return [SHARD.format(r) for r in range(self.world)]

    def load_optimizer(self, sd: dict, folder) -> None:
        from mmrl.trainer.checkpoint import CheckpointError, read_shard

        if SHARDED in sd:
            raise CheckpointError(
                f"checkpoint {folder} holds an FSDP2 optimizer state in torch.distributed.checkpoint shards, which "
                "DeepSpeed does not read: resume it with trainer.engine.backend=fsdp (or torch) on any number of "
                "ranks (its weights alone load anywhere: mmrl eval, mmrl export)"
            )
        saved = sd.get(ZERO_RANKS, 1)
        if self._partitioned or saved > 1:
            if saved != self.world:
                raise CheckpointError(
                    f"checkpoint {folder} holds the DeepSpeed ZeRO-{self.cfg.zero_stage} optimizer partitions of "
                    f"{saved} rank(s), and this run has {self.world}: resume it on {saved} rank(s) (its weights alone "
                    "load on any number: mmrl eval, mmrl export)"
                )
            rank = current().rank
            parts: list = [None] * self.world  # DeepSpeed reads its own rank's entry of the list
            parts[rank] = read_shard(folder, rank)
            self._load_partitions(parts)
            return
        self.load_state_dict(sd)

    def state_dict(self) -> dict:
        """This rank's partition under ZeRO (its fp32 groups detached, so the dict can be copied);
        on N ranks with ZeRO 1-3, only their count (each rank writes its partition: `write_own_state`)."""
        if self._partitioned:
            return {ZERO_RANKS: self.world}
        return self._own_state()

    def _own_state(self) -> dict:
        return {
            k: [t.detach() for t in v] if k == "single_partition_of_fp32_groups" else v
            for k, v in self.optimizer.state_dict().items()
        }

    def load_state_dict(self, sd: dict) -> None:
        """The optimizer state, fp32 master weights included; the module gets those weights."""
        if "load_from_fp32_weights" not in inspect.signature(self.optimizer.load_state_dict).parameters:
            self.optimizer.load_state_dict(sd)  # ZeRO-0: torch Adam (fp32) or DeepSpeed's fp16 wrapper
            return
        self._load_partitions([sd])

    def _load_partitions(self, parts: list) -> None:
        self.optimizer.load_state_dict(parts, load_optimizer_states=True, load_from_fp32_weights=True)
        if hasattr(self.optimizer, "update_lp_params"):  # ZeRO-1/2 (ZeRO-3 copies them itself)
            self.optimizer.update_lp_params()

    def load_module_state_dict(self, sd: dict) -> None:
        super().load_module_state_dict(sd)
        if hasattr(self.optimizer, "refresh_fp32_params"):  # ZeRO's master weights follow the module
            self.optimizer.refresh_fp32_params()


def build_train_engine(
    cfg: TrainEngineConfig, module: Policy, lr: float, device, value_lr: float | None = None
) -> TrainEngine:
    """The engine ``cfg`` describes, optimizing ``module``'s trainable parameters at learning rate ``lr``
    (its critic at ``value_lr`` when given)."""
    cfg.validate(device)
    if cfg.gradient_checkpointing:
        module.enable_gradient_checkpointing()
    if cfg.backend == "deepspeed":
        return DeepSpeedTrainEngine(cfg, module, lr, device, value_lr)
    if cfg.backend == "fsdp":
        return FSDPEngine(cfg, module, lr, device, value_lr)
    if current().distributed:
        return DDPEngine(cfg, module, lr, device, value_lr)
    return TorchEngine(cfg, module, lr, device, value_lr)
