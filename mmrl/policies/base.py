"""The policy contract shared by every family (VLA, VLM, diffusion).

A policy turns a batch of observations into actions plus everything training needs later, and
evaluates log-probs / values / entropy of given actions:

- ``rollout(obs, generator, mode)`` -> `Decision`: the training `Batch` (``old_logp``, the
  behaviour log-prob at the policy's log-prob level; ``old_values`` with a critic; the replay inputs
  that ``evaluate`` needs: observations as tensors, a flow chain, tokens...) and the ``actions`` the
  environment receives in their natural type (``action_type``): a float chunk for a robot,
  `Completions` for a VLM, uint8 images for a generator.
- ``evaluate(batch)`` -> `Evaluation` with ``logp`` (same shape as ``old_logp``), ``entropy`` and
  optionally ``values``, ``logp_mask``, ``kl``, differentiable w.r.t. the policy's parameters.
- ``supervised_loss(batch)`` -> per-sample loss for warm start on rows of ``warm_start_batch(data)``.
- ``likelihood_free_loss(batch, advantages)`` -> per-sample loss for objectives that need no
  log-likelihood (advantage-weighted matching).
- ``forward_process_loss(batch, advantages)`` -> per-sample DiffusionNFT loss on a generator's own
  clean samples (``Capabilities.forward_process``).

The off-policy mode's hooks are no part of this contract: a policy opts into them by subclassing a
role of `mmrl.policies.off_policy`: `OffPolicyActor` (SAC's actor: ``sample_reparameterized``,
``replay_state``, ``env_actions``, ...) or `LatentNoiseBase` (``act_from_noise``: the flow base that
DSRL and residual RL steer). The config check refuses an off-policy objective for a policy without
the role (`mmrl.capabilities.ROLES`).

Observations cross into a `Batch` as tensors only: instruction strings are stored as padded UTF-8
bytes (``encode_text`` / ``decode_text``) so they index, flatten and checkpoint like any tensor.
Every hook of the contract, with its default, is on `Policy` below.
"""

from __future__ import annotations

import builtins
import math
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torch import nn

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import Variants

TEXT_BYTES = 96  # default width of a stored instruction (longer ones are rejected, not cut)

#: a transformers ``PreTrainedModel``, or a peft ``PeftModel`` around one, as the VLM and token-VLA
#: families hold it: its attributes (config fields, peft's forwarding to the base model) are dynamic,
#: beyond what a type checker follows
HFModel = Any


def encode_text(texts: list[str], width: int = TEXT_BYTES, setting: str | None = None) -> torch.Tensor:
    """Strings -> uint8 [B, width] zero-padded UTF-8. One that does not fit raises
    `mmrl.errors.TextTooLongError` naming ``setting``, the config key of ``width`` (None: the width is
    fixed for this policy)."""
    from mmrl.errors import TextTooLongError

    out = torch.zeros(len(texts), width, dtype=torch.uint8)
    for i, text in enumerate(texts):
        data = text.encode("utf-8")
        if len(data) > width:
            fix = (
                f"raise {setting} (e.g. {setting}={1 << (len(data) - 1).bit_length()}) or shorten it"
                if setting
                else "shorten it (this policy stores instructions of at most that many bytes)"
            )
            raise TextTooLongError(
                f"instruction of {len(data)} bytes exceeds the {width}-byte text field: {text[:40]!r}...; {fix}"
            )
        if data:
            out[i, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out


def decode_text(data: torch.Tensor) -> list[str]:
    """uint8 [B, width] -> strings (inverse of `encode_text`)."""
    rows = data.reshape(-1, data.shape[-1]).cpu().numpy()
    return [bytes(r).rstrip(b"\0").decode("utf-8") for r in rows]


class Decision(NamedTuple):
    """What `Policy.rollout` returns for B envs."""

    batch: Batch  # B rows of what training needs (old_logp, replay inputs, ...)
    actions: Any  # what the simulator's ``step_chunk`` takes (`mmrl.simulator.ACTION_TYPES`)


@dataclass
class PolicyConfig(Variants):
    """The ``policy`` section; its ``type`` names a registered policy, whose ``config_class`` is the
    dataclass this section becomes (e.g. `FlowVLAConfig`). One registration per policy carries both,
    so a plugin's policy (entry point ``mmrl.policies``) is selectable from YAML like a built-in."""

    type: str = "flow_vla"

    @classmethod
    def variant_class(cls, name: str) -> builtins.type | None:  # builtins: `type` here is the field
        from mmrl.registry import POLICIES

        return POLICIES.get(name).config_class if name in POLICIES else None

    @classmethod
    def variant_names(cls) -> list[str]:
        from mmrl.registry import POLICIES

        return POLICIES.names()

    def check_engine(self, engine) -> None:
        """Raise `mmrl.config.ConfigError` naming the fix if this policy, as configured, does not fit the
        training engine ``engine`` (``trainer.engine``, e.g. its precision); checked when the experiment's
        config loads. Default: nothing to check."""


@dataclass
class Evaluation:
    """What `Policy.evaluate` returns for a minibatch of B samples (differentiable)."""

    logp: torch.Tensor  # same shape as the batch's ``old_logp``: [B, *logp_shape]
    entropy: torch.Tensor  # scalar: mean entropy (estimate) of the policy on these samples
    values: torch.Tensor | None = None  # [B] critic values; None without a critic
    #: bool like ``logp``: elements that count (real tokens, noisy steps); None = all
    logp_mask: torch.Tensor | None = None
    kl: torch.Tensor | None = None  # [B] the policy's own KL to its reference (else estimated from ``ref_logp``)


def log_std_grid(start: float, count: int = 5, step: float = 0.5) -> list[float]:
    """The initial stds a policy with ``log std init: auto`` offers (`Policy.exploration_stds`):
    ``exp(start - step * k)`` for k < ``count``; from log std 0: 1, 0.61, 0.37, 0.22, 0.14 (the grid
    of the sweeps in docs/notes/)."""
    return [math.exp(start - step * k) for k in range(count)]


#: the config dataclass a policy class is built from (`Policy` is generic in it)
C = TypeVar("C", bound=PolicyConfig)


class Policy(nn.Module, Generic[C]):
    """Base class of every policy family: the whole contract between a policy and the trainer.

    A subclass (``class MyPolicy(Policy[MyConfig])``: its ``cfg`` and the config its class methods
    take are a ``MyConfig``) sets ``config_class``, declares what it can do as configured
    (`capabilities`) and implements ``rollout`` and ``evaluate`` (plus ``supervised_loss`` /
    ``likelihood_free_loss`` where it supports a warm start / AWM); every other hook has a default
    that fits a robot policy acting in a simulator. The trainer and the experiment builder call these
    hooks and read the declared capabilities; they never probe a policy for optional methods.
    ``mmrl check policy NAME`` checks a policy against this contract, its capabilities included.
    """

    #: the config dataclass of the ``policy`` section when ``type`` names this policy
    config_class: type[PolicyConfig] = PolicyConfig
    #: the (configured) ``policy`` section it was built from
    cfg: C
    #: what rebuilds it without a simulator (set by `mmrl.experiment.build_policy`; checkpoints keep it)
    build_spec: dict | None = None
    #: the frozen pretrained parameters as built, which checkpoints leave to the policy's source
    #: (set by `mmrl.trainer.checkpoint.mark_source` when the policy is built; None: none marked)
    frozen_source: dict | None = None
    #: shape of one sample's log-prob after the leading batch dim (``capabilities(cfg).logp`` says
    #: its granularity): () per decision, (C, A) per element, (T,) per token, (K,) per denoising step
    logp_shape: tuple[int, ...] = ()
    #: bytes of a stored instruction / prompt (`encode_text`); longer ones are rejected
    text_bytes: int = TEXT_BYTES
    #: the simulator's state vector width the policy reads (None / 0: it reads no state)
    state_dim: int | None = None

    @property
    def chunk_size(self) -> int:
        """Environment steps one decision executes: an action chunk of a robot policy; 1 for a
        single-turn policy (one answer, one image per episode)."""
        return 1

    @classmethod
    def configure(cls, cfg: C, sim) -> C:
        """The config completed from the simulator the policy will act in (e.g. the number of
        cameras, an image or a state encoder), before the policy is built. Default: unchanged."""
        return cfg

    @classmethod
    def capabilities(cls, cfg: C) -> Capabilities:
        """What this policy can do as configured by ``cfg`` (`mmrl.capabilities.Capabilities`):
        checked when the experiment's config loads, against the estimator, the objective, the KL
        and the rollout mode it asks for. Default: a robot policy with one exact log-prob per
        decision and nothing else."""
        return Capabilities()

    @property
    def caps(self) -> Capabilities:
        """`capabilities` of this policy's own config."""
        return type(self).capabilities(self.cfg)

    def check_simulator(self, sim) -> None:
        """Raise ValueError naming the fix if this policy cannot act in ``sim`` (e.g. a VLM question
        longer than its prompt budget). Called on the training and evaluation simulators when the
        experiment is built, before any work. Default: nothing to check."""

    def warm_start_batch(self, data: dict) -> Batch:
        """A warm-start dataset (columns of a `mmrl.data` builder) as the `Batch` that
        ``supervised_loss`` takes rows of. Default: demonstrations ``image``, ``instruction``,
        ``actions`` and, where the policy reads a state, ``state``."""
        for key in ("image", "instruction", "actions"):
            if key not in data:
                raise ValueError(
                    f"{type(self).__name__}'s warm start needs demonstrations with '{key}'; "
                    f"the dataset has: {', '.join(data)}"
                )
        batch = Batch(
            image=data["image"],
            instruction=encode_text(data["instruction"], self.text_bytes),
            actions=data["actions"].float(),
        )
        if self.state_dim and "state" in data:
            batch["state"] = data["state"].float()
        return batch

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critic's parameters, which ``trainer.value_lr`` optimises at their own learning rate.
        Default: those of a ``value_head`` submodule (none without one)."""
        head = getattr(self, "value_head", None)
        return list(head.parameters()) if isinstance(head, nn.Module) else []

    def enable_gradient_checkpointing(self) -> None:
        """Recompute activations in the backward pass (``trainer.engine.gradient_checkpointing``).
        Default: on the outermost Hugging Face models inside the policy (transformers models, and diffusers
        models such as a pipeline's transformer); a ConfigError if none."""
        from mmrl.config import ConfigError

        found: list[str] = []
        for name, sub in self.named_modules():
            if any(name.startswith(f"{outer}.") for outer in found):
                continue
            if getattr(sub, "supports_gradient_checkpointing", False):  # the transformers API
                sub.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                found.append(name)
            elif getattr(sub, "_supports_gradient_checkpointing", False) and hasattr(
                sub, "enable_gradient_checkpointing"
            ):  # diffusers' ModelMixin (its default recomputes with use_reentrant=False)
                sub.enable_gradient_checkpointing()
                found.append(name)
        if not found:
            raise ConfigError(
                f"'gradient_checkpointing' = true but policy '{self.cfg.type}' has no model that "
                "supports it (only Hugging Face transformers / diffusers models do): set gradient_checkpointing: false"
            )

    def after_warm_start(self) -> None:
        """Called once the supervised warm start is done (e.g. to take a reference copy)."""

    def after_step(self) -> None:
        """Called after every optimizer step of the RL update (e.g. to update an EMA copy)."""

    def sync_rollout(self) -> None:
        """Called after each RL update: push weights to an out-of-process rollout engine and release
        per-iteration caches (default: nothing; the policy samples with its own weights)."""

    def set_progress(self, progress: float) -> None:
        """Called by the trainer before each iteration's rollout with the fraction of the planned
        run done (0 at the start, as ``lr_schedule: linear`` counts it), for exploration that
        follows the run (e.g. the flow VLA's ``noise_level_final``); default: nothing."""

    def exploration_stds(self) -> list[float]:
        """``Capabilities.exploration_probe``: the initial action stds (normalised action units) the
        trainer may start RL from, tried in this order on a fresh run's first rollouts
        (`mmrl.trainer.exploration`); the first is the std the policy was built with. Default: none."""
        return []

    def set_exploration_std(self, std: float) -> None:
        """``Capabilities.exploration_probe``: set every action dimension's std to ``std`` (one of
        `exploration_stds`) before a rollout."""
        raise NotImplementedError(f"{type(self).__name__} has no action std to set")

    def rollout_stats(self) -> dict[str, float]:
        """Metrics of the last training rollout for the log (e.g. engine-vs-trainer log-prob mismatch)."""
        return {}

    def value(self, obs) -> torch.Tensor | None:
        """Critic value ``[B]`` of observations (an `Observation` of B envs), or None without a
        critic. The trainer bootstraps with it where a rollout is cut without the episode ending
        (a time limit, or the end of a fixed-length rollout)."""
        return None

    def update_statistics(self, batch: Batch) -> None:
        """Called once per RL iteration after the update, with the iteration's rollout [T, N, ...]:
        update running statistics the policy keeps (e.g. observation normalisation). Updating them
        after the update, not during the rollout, keeps the PPO ratio exactly 1 on the first
        minibatch: rollout and update see the same statistics."""

    def rebuilds_frozen_weights(self) -> bool:
        """Whether building this policy again from its config gives the same frozen weights (loaded
        from pretrained files, or a tiny model seeded by its config): then checkpoints leave them
        out (`mmrl.trainer.checkpoint.mark_source`). Default: no, every weight is written."""
        return False

    def export_pretrained(self, folder, merge: bool = True) -> str:
        """Write the trained policy to ``folder`` in its family's standard format (`mmrl export`);
        returns the format's name. Default: ``model.safetensors`` (the state dict) and
        ``mmrl_policy.json`` (what `mmrl.load_policy` rebuilds it from). Families override this with
        the format their users load (a transformers / peft folder, LeRobot's checkpoint)."""
        import json
        from pathlib import Path

        from mmrl.utils.weights import save_weights

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        others = save_weights(self.state_dict(), folder / "model.safetensors")  # tied weights once
        if others:
            raise ValueError(
                f"{type(self).__name__}'s state dict holds non-tensor entries ({', '.join(others)}): "
                "override export_pretrained to write them"
            )
        (folder / "mmrl_policy.json").write_text(json.dumps(self.build_spec or {}, indent=2))
        return "mmrl (safetensors state dict + mmrl_policy.json)"

    @torch.no_grad()
    def act(self, obs, seed: int = 0, mode: str = "eval"):
        """Inference: the actions for observations ``obs`` (an `mmrl.simulator.Observation` of B envs)
        in the simulator's action type (a robot policy: float [B, chunk, action_dim]; a VLM: the B
        answers; a generator: images). ``mode="eval"`` is the evaluation sampler, ``"train"`` samples
        as rollouts do; the noise they draw comes from ``seed``, so one call gives one answer."""
        device = next((p.device for p in self.parameters()), torch.device("cpu"))
        return self.rollout(obs, torch.Generator(device).manual_seed(seed), mode=mode).actions

    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        """Observations of B envs -> `Decision`: a `Batch` of B rows (``old_logp`` [B, *logp_shape],
        ``old_values`` [B] with a critic, the replay inputs ``evaluate`` reads; a robot policy also
        stores its float ``actions`` there) and the environment's actions in ``action_type``.
        ``mode="eval"`` is the deterministic evaluation sampler."""
        raise NotImplementedError

    def evaluate(self, batch: Batch) -> Evaluation:
        """Log-probs of the batch's actions (and values, entropy) under the current weights."""
        raise NotImplementedError

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Per-sample warm-start loss [B] on rows of `warm_start_batch`."""
        raise NotImplementedError(f"{type(self).__name__} has no supervised warm start")

    def likelihood_free_loss(self, batch: Batch, advantages: torch.Tensor) -> torch.Tensor:
        """Per-sample loss [B] of an objective that needs no log-likelihood (advantage-weighted matching)."""
        raise NotImplementedError(f"{type(self).__name__} has no likelihood-free objective")

    def forward_process_loss(self, batch: Batch, advantages: torch.Tensor) -> torch.Tensor:
        """Per-sample DiffusionNFT loss [B] on the rollout's own clean samples (`mmrl.flow.nft_loss`)."""
        raise NotImplementedError(f"{type(self).__name__} has no forward-process (DiffusionNFT) objective")
