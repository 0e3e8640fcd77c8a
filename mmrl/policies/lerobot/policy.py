"""A pretrained LeRobot flow VLA (SmolVLA, PI0, PI05) RL-fine-tuned by Flow-SDE / CPS / Flow-Noise PPO.

    camera images + instruction (+ state)
      -> the checkpoint's own LeRobot preprocessor (its normalisation statistics, tokenizer, newline
         or PI05 state prompt)                                      -> a LeRobot batch
      -> the family's prefix: VLM over images, language (and state)  -> VLM output + KV cache
      -> mmrl.flow sampler over LeRobot's ``denoise_step``            -> chain [B, K+1, H, 32]
      -> the checkpoint's postprocessor (un-normalise) on the first ``chunk_size`` steps and the
         real action dims                                           -> the environment's actions

``model`` is a hub id or a local folder of any LeRobot SmolVLA / PI0 / PI05 checkpoint
(``lerobot/smolvla_base``, ``lerobot/pi0_base``, ``lerobot/pi05_base``, a user's fine-tune), loaded
by LeRobot's own ``from_pretrained`` (strictly: a checkpoint whose weights do not all match fails
instead of running with random weights) with its saved pre/post-processors; or ``tiny:FAMILY``, a
tiny random-initialised model of the real class built here (sizes in ``tiny``), for CPU runs.

Sampling and log-probs. The flow runs where LeRobot's does: in normalised action space padded to
``max_action_dim`` over the model's whole chunk ``H`` (50 for the released checkpoints). mmrl's
samplers call the model's own ``denoise_step`` (`families`), so ``eval_method: ode`` *is*
LeRobot's ``sample_actions`` (same noise, same result; the tests check it). Rollouts sample with
``method`` (Flow-SDE, CPS, or Flow-Noise: a bounded std from a head on the expert's output, the
input of ``action_out_proj``) on ``stochastic`` steps; the chain is stored and training recomputes
its exact Gaussian log-likelihood counting only the executed actions (the first ``chunk_size``
steps) and the real action dimensions, never the chunk's tail or the padding to 32 (as RLinf's
pi_RL does). Before an update the recomputed log-prob equals the rollout's: PPO ratio exactly 1.

Value head (``critic``): an MLP on the masked mean of the VLM's output over the prefix (images,
language, and SmolVLA's state token), detached from the VLM by default. It reads the prefix, not
the action expert, because the prefix is a function of the observation alone: the expert's output
depends on the sampled noise and denoising step, so a critic there sees a different input at
rollout and at training (RLinf's pi0 variant averages it over steps at rollout and reads one step
in training). The prefix is computed once per decision anyway, so the critic costs one MLP.

Fine-tuning (``finetune``): ``expert`` (LeRobot's ``train_expert_only``: the VLM frozen, the
action expert, projections and state projection train; SmolVLA's default), ``full`` (everything
LeRobot lets train), ``lora`` (peft adapters on LeRobot's default targets for the family, the base
frozen). The KL reference (``reference``): ``adapter`` (LoRA off), ``copy`` (the trainable weights
as they were after the warm start) or ``none``.

Normalisation statistics (``stats``): ``checkpoint`` uses those saved with the model; ``demos``
computes them (mean, std, min, max, 1st / 99th percentiles) from the warm-start demonstrations, as
``lerobot-train`` does from its dataset; ``auto`` is ``demos`` for a ``tiny:`` model, else
``checkpoint``. They are saved in mmrl's checkpoints and in the exported LeRobot folder.

`save_pretrained` writes the policy in LeRobot's format (``config.json``, ``model.safetensors``,
processors with the statistics; LoRA merged), which LeRobot's ``from_pretrained`` and
``make_pre_post_processors`` load. Needs LeRobot 0.6.1: ``bash scripts/setup_lerobot.sh``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import lerobot  # the policy needs LeRobot; without it the registry names the fix
import torch
from torch import nn

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import ConfigError
from mmrl.flow import FlowNoiseHead, awm_loss, chain_log_prob, reduce_log_prob, sample, stochastic_mask, time_grid
from mmrl.policies.base import Decision, Evaluation, PolicyConfig, decode_text, encode_text
from mmrl.policies.lerobot.families import FAMILIES, Prefix
from mmrl.policies.off_policy import LatentNoiseBase
from mmrl.utils.rows import randn_rows

SUPPORTED_LEROBOT = "0.6.1"  # families.py calls into this release's model internals
TINY = "tiny:"
STATE = "observation.state"
ACTION = "action"


@dataclass
class LeRobotVLAConfig(PolicyConfig):
    """Configuration of `LeRobotVLAPolicy` (the ``policy`` section of an experiment)."""

    type: str = "lerobot"
    # a LeRobot SmolVLA / PI0 / PI05 checkpoint: hub id or local folder; or tiny:smolvla | tiny:pi0 |
    # tiny:pi05, a tiny random-initialised model of the real class built here (sizes in `tiny`)
    model: str = "lerobot/smolvla_base"
    revision: str | None = None  # hub revision of `model`
    # tokenizer (hub id or folder) in place of the checkpoint's; PI0 / PI05 name the gated
    # google/paligemma-3b-pt-224, so point this at a local copy if the hub refuses you
    tokenizer: str | None = None
    # LeRobot config fields set before the model is built, e.g. {n_action_steps: 10, dtype: float32}
    overrides: dict = field(default_factory=dict)
    # LeRobot image features fed by the simulator's cameras, in order; null = the checkpoint's image
    # features in order (cameras it has and the simulator lacks are LeRobot's masked empty cameras)
    camera_keys: list[str] | None = None
    num_views: int | None = None  # cameras of a tiny: model; null = the simulator's
    chunk_size: int | None = None  # actions executed per decision; null = the checkpoint's n_action_steps
    num_steps: int | None = None  # denoising steps; null = the checkpoint's
    method: Literal["sde", "cps", "noise"] = "noise"  # stochastic sampler of RL rollouts
    noise_level: float = 0.5  # a of Flow-SDE / CPS
    stochastic: Literal["all", "one", "window"] = "all"  # which denoising steps are stochastic
    window: list[int] | None = None  # [start, end) when stochastic == "window"
    noise_min_std: float = 0.08  # Flow-Noise bounds (pi_RL's [0.08, 0.16])
    noise_max_std: float = 0.16
    eval_method: Literal["ode", "sde", "cps", "noise"] = "ode"
    logp_level: Literal["chunk", "dim"] = "chunk"
    elem_reduce: Literal["sum", "mean"] = "sum"  # over executed steps x real action dims (chunk level)
    step_reduce: Literal["sum", "mean"] = "sum"  # over stochastic denoising steps
    finetune: Literal["expert", "full", "lora"] = "expert"
    lora_rank: int = 16
    lora_alpha: int = 32
    reference: Literal["none", "adapter", "copy"] = "none"  # the KL's reference (algorithm.kl_coef)
    critic: bool = True
    detach_value: bool = True
    value_hidden: int = 256
    stats: Literal["auto", "checkpoint", "demos"] = "auto"
    # sizes of a tiny: model (TINY_SIZES): image_size, patch_size, scale_factor (SmolVLM's pixel
    # shuffle: (image_size / patch_size / scale_factor)**2 tokens per image), hidden and layers of the
    # language model, vision_hidden and vision_layers of the vision encoder, horizon (the model's chunk)
    tiny: dict = field(default_factory=dict)

    def validate(self) -> None:
        if self.model.startswith(TINY) and self.model[len(TINY) :] not in FAMILIES:
            raise ConfigError(
                f"'model' = {self.model!r}: a tiny model is one of {', '.join(TINY + f for f in FAMILIES)}"
            )
        unknown = set(self.tiny) - set(TINY_SIZES)
        if unknown:
            raise ConfigError(f"'tiny' has unknown keys {sorted(unknown)}; valid: {', '.join(TINY_SIZES)}")
        if self.finetune == "lora" and self.reference == "copy":
            raise ConfigError("'reference' = copy with finetune: lora: use reference: adapter (the adapter off)")
        if self.reference == "adapter" and self.finetune != "lora":
            raise ConfigError(
                f"'reference' = adapter needs finetune: lora (got {self.finetune!r}); use reference: copy"
            )
        if not 0 < self.noise_min_std < self.noise_max_std:
            raise ConfigError(f"need 0 < noise_min_std < noise_max_std, got {self.noise_min_std}, {self.noise_max_std}")
        for key in ("chunk_size", "num_steps"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"'{key}' = {value} must be >= 1 or null (the checkpoint's)")


#: sizes of a ``tiny:`` model and their defaults (mmrl.tiny.tiny_lerobot)
TINY_SIZES = {
    "image_size": 32,
    "patch_size": 4,
    "scale_factor": 2,
    "hidden": 64,
    "layers": 4,
    "vision_hidden": 32,
    "vision_layers": 1,
    "horizon": 8,
}


def check_versions() -> None:
    """LeRobot's model internals that `families` calls move between releases: refuse others."""
    import transformers

    if lerobot.__version__ != SUPPORTED_LEROBOT:
        raise ConfigError(
            f"policy 'lerobot' is written against lerobot {SUPPORTED_LEROBOT}, found "
            f"{lerobot.__version__}. Fix: bash scripts/setup_lerobot.sh (a venv with the pinned stack)"
        )
    major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    if major_minor >= (5, 9):
        raise ConfigError(
            f"lerobot {SUPPORTED_LEROBOT}'s PI0 / PI05 call create_causal_mask(cache_position=...), "
            f"which transformers removed in 5.9 (found {transformers.__version__}). "
            "Fix: bash scripts/setup_lerobot.sh (transformers 5.5.4, as lerobot pins)"
        )


class LeRobotVLAPolicy(LatentNoiseBase[LeRobotVLAConfig]):
    """A LeRobot SmolVLA / PI0 / PI05 driven by mmrl's flow samplers; see the module docstring."""

    config_class = LeRobotVLAConfig
    grid: torch.Tensor  # buffer: the denoising time grid

    @classmethod
    def capabilities(cls, cfg: LeRobotVLAConfig) -> Capabilities:
        """Action chunks, exact log-probs of the executed steps (per chunk or per element), AWM, a
        value head with ``critic``, a KL reference with ``reference``."""
        return Capabilities(
            logp="decision" if cfg.logp_level == "chunk" else "element",
            critic=cfg.critic,
            likelihood_free=True,
            latent_noise=True,  # act_from_noise: LeRobot's own ODE from a given noise (DSRL steers it)
            kl_reference="logp" if cfg.reference != "none" else None,
            fixes={
                "critic": "set policy.critic=true, or use a group estimator "
                "(algorithm.advantage: grpo, rloo, ...) with group_size >= 2",
                "kl_reference": "set policy.reference=copy (or adapter with finetune: lora)",
            },
        )

    def __init__(self, cfg: LeRobotVLAConfig, action_dim: int, state_dim: int | None = None):
        super().__init__()
        check_versions()
        self.cfg, self.action_dim, self.state_dim = cfg, action_dim, state_dim
        lr_policy, self.preprocessor, self.postprocessor = load_lerobot(cfg, action_dim, state_dim)
        lcfg = lr_policy.config
        self.family = FAMILIES[lcfg.type]
        self.horizon, self.max_action_dim, self.max_state_dim = lcfg.chunk_size, lcfg.max_action_dim, lcfg.max_state_dim
        self._chunk = cfg.chunk_size or lcfg.n_action_steps
        if self._chunk > self.horizon:
            raise ConfigError(
                f"'policy.chunk_size' = {self._chunk} executes more steps than the model's chunk ({self.horizon})"
            )
        self.camera_keys = list(cfg.camera_keys or lcfg.image_features)
        unknown = [k for k in self.camera_keys if k not in lcfg.image_features]
        if unknown:
            raise ConfigError(
                f"'policy.camera_keys' names {unknown}, which the checkpoint {cfg.model!r} "
                "does not read; "
                f"its image features: {', '.join(lcfg.image_features)}"
            )
        self.state_key = STATE if STATE in lcfg.input_features else None
        self.real_action_dim = lcfg.output_features[ACTION].shape[0]
        if self.real_action_dim != action_dim:
            raise ConfigError(
                f"the checkpoint {cfg.model!r} acts in {self.real_action_dim} dims, the simulator in "
                f"{action_dim}: pick the checkpoint of this robot, or a simulator with its action space"
            )
        self.fit_stats = cfg.stats == "demos" or (cfg.stats == "auto" and cfg.model.startswith(TINY))
        self._register_stats()
        set_trainable(lr_policy, cfg.finetune)
        self.net = add_lora(lr_policy, cfg) if cfg.finetune == "lora" else lr_policy
        out_proj = lr_policy.model.action_out_proj  # (LoRA-wrapped where it is a target)
        out_proj.register_forward_hook(_keep_input)
        width = out_proj.in_features
        self.noise_head = (
            FlowNoiseHead(width, self.max_action_dim, cfg.noise_min_std, cfg.noise_max_std)
            if "noise" in (cfg.method, cfg.eval_method)
            else None
        )
        prefix_width = prefix_hidden_size(lr_policy)
        self.value_head = (
            nn.Sequential(nn.Linear(prefix_width, cfg.value_hidden), nn.Tanh(), nn.Linear(cfg.value_hidden, 1))
            if cfg.critic
            else None
        )
        self.register_buffer("grid", time_grid(cfg.num_steps or flow_steps(lcfg)), persistent=False)
        self.logp_shape = () if cfg.logp_level == "chunk" else (self._chunk, action_dim)
        if cfg.reference == "copy":
            self.take_reference()

    # ---- plumbing ---------------------------------------------------------------------------
    @classmethod
    def configure(cls, cfg: LeRobotVLAConfig, sim) -> LeRobotVLAConfig:
        """A ``tiny:`` model gets one image feature per simulator camera."""
        if cfg.num_views is None:
            cfg = dataclasses.replace(cfg, num_views=sim.image_shape[0] if len(sim.image_shape) == 4 else 1)
        return cfg

    @property
    def lerobot(self):
        """The LeRobot policy (``SmolVLAPolicy`` / ``PI0Policy`` / ``PI05Policy``), adapters included."""
        return self.net.get_base_model() if hasattr(self.net, "get_base_model") else self.net

    @property
    def chunk_size(self) -> int:
        return self._chunk

    @property
    def device(self) -> torch.device:
        return self.grid.device

    def check_simulator(self, sim) -> None:
        views = sim.image_shape[0] if len(sim.image_shape) == 4 else 1
        if views > len(self.camera_keys):
            raise ValueError(
                f"simulator '{type(sim).__name__}' renders {views} cameras but the policy has "
                f"{len(self.camera_keys)} image features ({', '.join(self.camera_keys)}): set "
                "policy.camera_keys to one LeRobot image feature per camera"
            )
        if self.state_key and not sim.state_dim:
            raise ValueError(
                f"the checkpoint {self.cfg.model!r} reads '{STATE}' but simulator "
                f"'{type(sim).__name__}' has no state vector"
            )

    def lerobot_batch(
        self,
        image: torch.Tensor,
        instructions: list[str],
        state: torch.Tensor | None,
        actions: torch.Tensor | None = None,
    ) -> dict:
        """Observations (uint8 images ``[B, (V,) H, W, 3]``, instructions, raw state; demonstration
        ``actions`` in env units) through the checkpoint's preprocessor, on the policy's device."""
        views = image if image.dim() == 5 else image[:, None]
        raw: dict = {
            key: views[:, i].permute(0, 3, 1, 2).float().div(255.0).cpu()
            for i, key in enumerate(self.camera_keys[: views.shape[1]])
        }
        if self.state_key:
            assert state is not None, "check_simulator refused simulators without the state this checkpoint reads"
            raw[self.state_key] = state.float().cpu()
        if actions is not None:
            raw[ACTION] = actions.float().cpu()
        raw["task"] = list(instructions)
        out = self.preprocessor(raw)
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in out.items()}

    def stored_batch(self, batch: Batch, with_actions: bool = False) -> dict:
        return self.lerobot_batch(
            batch["image"],
            decode_text(batch["instruction"]),
            batch.get("state"),
            batch["actions"] if with_actions else None,
        )

    def model_fn(self, prefix: Prefix, method: str):
        """``(x [N, H, 32], t [N]) -> (v, std)`` for mmrl.flow; N a multiple of the prefix's rows
        (sample-major), evaluated as that many calls on the prefix's own cache."""
        rows = prefix.pad_masks.shape[0]

        def one(x, t):
            v = self.family.velocity(self.lerobot, prefix, x, t)
            if method != "noise":
                return v, None
            assert self.noise_head is not None  # built when either sampling method is "noise"
            return v, self.noise_head(self.lerobot.model.action_out_proj.last_input)

        def fn(x, t):
            reps = x.shape[0] // rows
            if reps == 1:
                return one(x, t)
            outs = [one(x.view(rows, reps, *x.shape[1:])[:, j], t.view(rows, reps)[:, j]) for j in range(reps)]
            v = torch.stack([o[0] for o in outs], 1).flatten(0, 1)
            std = None if method != "noise" else torch.stack([o[1] for o in outs], 1).flatten(0, 1)
            return v, std

        return fn

    def executed(self, logp_elem: torch.Tensor) -> torch.Tensor:
        """Per-element log-probs ``[B, K, H, 32]`` -> the executed steps and real dims ``[B, K, C, A]``."""
        return logp_elem[:, :, : self._chunk, : self.real_action_dim]

    def _reduce(self, logp_elem: torch.Tensor, stoch: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        return reduce_log_prob(
            self.executed(logp_elem),
            stoch,
            elem_dims=2,
            elem_reduce=c.elem_reduce,
            step_reduce=c.step_reduce,
            keep=0 if c.logp_level == "chunk" else 2,
        )

    def values(self, prefix: Prefix) -> torch.Tensor | None:
        if self.value_head is None:
            return None
        pooled = self.pooled(prefix)
        return self.value_head(pooled.detach() if self.cfg.detach_value else pooled).squeeze(-1)

    @staticmethod
    def pooled(prefix: Prefix) -> torch.Tensor:
        """``[B, D]``: the VLM's prefix output averaged over its real (not padded) positions."""
        m = prefix.pad_masks.unsqueeze(-1).float()
        return (prefix.hidden.float() * m).sum(1) / m.sum(1).clamp(min=1)

    def to_env(self, x0: torch.Tensor) -> torch.Tensor:
        """Normalised padded chunks ``[B, H, 32]`` -> executed actions in env units ``[B, C, A]``
        through the checkpoint's postprocessor (un-normalise, absolute actions where relative)."""
        return self.postprocessor(x0[:, : self._chunk, : self.real_action_dim]).to(x0.device)

    # ---- the policy contract ------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        c = self.cfg
        prefix = self.family.prefix(self.lerobot, self.lerobot_batch(obs.image, obs.instruction, obs.state))
        b, dev = prefix.pad_masks.shape[0], self.device
        method = c.method if mode == "train" else c.eval_method
        noise = randn_rows((b, self.horizon, self.max_action_dim), generator=generator, device=dev)
        stoch = stochastic_mask(
            b,
            len(self.grid) - 1,
            "none" if method == "ode" else c.stochastic,
            generator=generator,
            window=tuple(c.window) if c.window else None,
            device=dev,
        )
        out = sample(
            self.model_fn(prefix, method),
            noise,
            self.grid,
            method,
            noise_level=c.noise_level,
            stoch=stoch,
            generator=generator,
        )
        actions = self.to_env(out.x0)
        batch = Batch(
            actions=actions,
            flow_chain=out.chain,
            flow_stoch=out.stoch,
            old_logp=self._reduce(out.logp, out.stoch),
            image=obs.image.to(dev),
            instruction=encode_text(obs.instruction, self.text_bytes).to(dev),
        )
        if obs.state is not None:
            batch["state"] = obs.state.to(dev).float()
        values = self.values(prefix)
        if values is not None:
            batch["old_values"] = values
        if self.cfg.reference != "none" and mode == "train":
            with self.reference():
                ref_prefix = self.family.prefix(self.lerobot, self.stored_batch(batch))
                ref = chain_log_prob(
                    self.model_fn(ref_prefix, c.method),
                    out.chain,
                    self.grid,
                    out.stoch,
                    c.method,
                    noise_level=c.noise_level,
                )
            batch["ref_logp"] = self._reduce(ref, out.stoch)
        return Decision(batch, actions)

    def evaluate(self, batch: Batch) -> Evaluation:
        c = self.cfg
        prefix = self.family.prefix(self.lerobot, self.stored_batch(batch))
        logp_elem = chain_log_prob(
            self.model_fn(prefix, c.method),
            batch["flow_chain"],
            self.grid,
            batch["flow_stoch"],
            c.method,
            noise_level=c.noise_level,
        )
        executed = self.executed(logp_elem)
        stoch = batch["flow_stoch"][..., None, None].expand_as(executed)
        entropy = -(executed * stoch).sum() / stoch.sum().clamp(min=1)
        return Evaluation(
            logp=self._reduce(logp_elem, batch["flow_stoch"]), entropy=entropy, values=self.values(prefix)
        )

    # ---- the latent-noise map (DSRL, `mmrl.policies.dsrl`) ---------------------------------------
    @property
    def noise_shape(self) -> tuple[int, ...]:
        """The whole padded chunk LeRobot's ``sample_actions`` starts from: ``(chunk_size,
        max_action_dim)`` of the checkpoint, so a steered noise reaches every input the base reads."""
        return (self.horizon, self.max_action_dim)

    @torch.no_grad()
    def act_from_noise(self, obs, noise: torch.Tensor) -> torch.Tensor:
        """The executed chunk ``[B, C, A]`` (env units, through the checkpoint's postprocessor) that
        mmrl's ODE, which reproduces LeRobot's ``sample_actions``, integrates from ``noise`` ``[B,
        chunk_size, max_action_dim]``: LeRobot's own action for that noise."""
        if tuple(noise.shape[1:]) != self.noise_shape:
            raise ValueError(
                f"noise of shape {tuple(noise.shape)}: the checkpoint starts from [B, *{self.noise_shape}]"
            )
        batch = self.lerobot_batch(obs.image, obs.instruction, obs.state)
        prefix = self.family.prefix(self.lerobot, batch)
        out = sample(self.model_fn(prefix, "ode"), noise.to(self.device).float(), self.grid, "ode")
        return self.to_env(out.x0)

    @property
    def feature_dim(self) -> int:
        """Width of `observation_features`' rows."""
        return prefix_hidden_size(self.lerobot) + (self.max_state_dim if self.state_key else 0)

    @torch.no_grad()
    def observation_features(self, obs) -> torch.Tensor:
        """``[B, feature_dim]``: the VLM's prefix output averaged over its real positions (what the value
        head reads), then the checkpoint's normalised state padded to ``max_state_dim`` where it reads one."""
        batch = self.lerobot_batch(obs.image, obs.instruction, obs.state)
        parts = [self.pooled(self.family.prefix(self.lerobot, batch))]
        if self.state_key:
            state = batch[self.state_key].float()
            parts.append(torch.nn.functional.pad(state, (0, self.max_state_dim - state.shape[-1])))
        return torch.cat(parts, -1)

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor | None:
        if self.value_head is None:
            return None
        return self.values(self.family.prefix(self.lerobot, self.lerobot_batch(obs.image, obs.instruction, obs.state)))

    def warm_start_batch(self, data: dict) -> Batch:
        """The demonstrations; with ``stats: demos`` (a ``tiny:`` model by default) they also set the
        normalisation statistics, as ``lerobot-train`` computes them from its dataset."""
        batch = super().warm_start_batch(data)
        if self.state_key and "state" not in batch:
            raise ValueError(f"the checkpoint reads '{STATE}' but the demonstrations have no 'state'")
        if self.fit_stats:
            found = demo_stats(batch.get("state") if self.state_key else None, batch["actions"])
            self.set_stats({key: found[key] for key in self.stats()})
        return batch

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """LeRobot's own flow-matching loss (its time and noise draws) on demonstration chunks
        ``actions [B, C, A]`` (env units), averaged over their C steps and A real dims; a chunk
        shorter than the model's is padded and its tail does not count (LeRobot's ``action_is_pad``)."""
        inputs = self.stored_batch(batch, with_actions=True)
        actions = inputs[ACTION]
        steps = actions.shape[1]
        if steps > self.horizon:
            raise ValueError(f"demonstration chunks of {steps} steps exceed the model's chunk ({self.horizon})")
        padded = actions.new_zeros(actions.shape[0], self.horizon, self.max_action_dim)
        padded[:, :steps, : actions.shape[2]] = actions
        errors = self.family.matching_errors(self.lerobot, inputs, padded)
        return errors[:, :steps, : self.real_action_dim].mean(dim=(1, 2))

    def likelihood_free_loss(self, batch: Batch, advantages: torch.Tensor) -> torch.Tensor:
        """Advantage-weighted matching on the rollout's own normalised chunks."""
        prefix = self.family.prefix(self.lerobot, self.stored_batch(batch))
        return awm_loss(self.model_fn(prefix, "ode"), batch["flow_chain"][:, -1], advantages)

    def after_warm_start(self) -> None:
        if self.cfg.reference == "copy":
            self.take_reference()

    # ---- reference for the KL -----------------------------------------------------------------
    def take_reference(self) -> None:
        """Keep the trainable weights as they are now as the KL reference (``reference: copy``),
        as buffers so that checkpoints hold them."""
        for name, p in self.net.named_parameters():
            if p.requires_grad:
                self.register_buffer("ref__" + name.replace(".", "__"), p.detach().clone())

    @contextlib.contextmanager
    def reference(self):
        """The reference model for the duration of the block (no gradients): the adapter switched
        off, or the reference weights swapped in."""
        if self.cfg.reference == "adapter":
            with self.net.disable_adapter():
                yield
            return
        params = [
            (p, getattr(self, "ref__" + n.replace(".", "__")))
            for n, p in self.net.named_parameters()
            if hasattr(self, "ref__" + n.replace(".", "__"))
        ]
        with torch.no_grad():
            saved = [p.detach().clone() for p, _ in params]
            for p, ref in params:
                p.copy_(ref)
            try:
                yield
            finally:
                for (p, _), old in zip(params, saved):
                    p.copy_(old)

    # ---- statistics and export --------------------------------------------------------------
    def stats(self) -> dict[str, torch.Tensor]:
        """The normalisation statistics the processors use, flat (``'action.mean'`` ...)."""
        return {key: getattr(self, name) for name, key in self._stat_buffers.items()}

    def set_stats(self, flat: dict[str, torch.Tensor]) -> None:
        """Use these statistics (flat, as `stats`; the same keys) in the pre- and postprocessor."""
        missing = set(self._stat_buffers.values()) - set(flat)
        if missing:
            raise ValueError(
                f"statistics lack {sorted(missing)} (the processors use {sorted(self._stat_buffers.values())})"
            )
        for name, key in self._stat_buffers.items():
            getattr(self, name).copy_(flat[key])
        self._apply_stats()

    def _register_stats(self) -> None:
        """The processors' statistics as buffers, so that checkpoints and ``load_state_dict`` carry them."""
        self._stat_buffers = {}
        for key, value in normalizer(self.preprocessor).state_dict().items():
            name = "stats__" + key.replace(".", "__")
            self.register_buffer(name, value.detach().clone().float())
            self._stat_buffers[name] = key
        self.register_load_state_dict_post_hook(_stats_loaded)

    def _apply_stats(self) -> None:
        from lerobot.processor.normalize_processor import hotswap_stats

        nested: dict = {}
        for key, value in self.stats().items():
            feature, stat = key.rsplit(".", 1)
            nested.setdefault(feature, {})[stat] = value.detach().cpu()
        self.preprocessor = hotswap_stats(self.preprocessor, nested)
        self.postprocessor = hotswap_stats(self.postprocessor, nested)

    def save_pretrained(self, folder: str | Path) -> str:
        """Write the policy in LeRobot's checkpoint format (LoRA merged into the weights), with its
        processors and statistics: ``<family>Policy.from_pretrained(folder)`` and
        ``make_pre_post_processors(config, pretrained_path=folder)`` load it."""
        import copy

        folder = Path(folder)
        net = copy.deepcopy(self.net).cpu()
        lr_policy = net.merge_and_unload() if hasattr(net, "merge_and_unload") else net
        lr_policy.config.n_action_steps = self._chunk
        if self.cfg.num_steps:
            setattr(lr_policy.config, steps_field(lr_policy.config), self.cfg.num_steps)
        lr_policy.save_pretrained(folder)
        self.preprocessor.save_pretrained(folder)
        self.postprocessor.save_pretrained(folder)
        return str(folder)

    def rebuilds_frozen_weights(self) -> bool:
        return not self.cfg.model.startswith(TINY)  # from_pretrained; a tiny: model draws from the global RNG

    def export_pretrained(self, folder, merge: bool = True) -> str:
        """LeRobot's checkpoint format (`save_pretrained`; LoRA is always merged)."""
        self.save_pretrained(folder)
        return "lerobot"


# ---- loading ----------------------------------------------------------------------------------
def _stats_loaded(policy: LeRobotVLAPolicy, incompatible) -> None:
    """``load_state_dict`` post-hook: the loaded statistics reach the processors."""
    policy._apply_stats()


def _keep_input(module: nn.Module, args, output) -> None:
    """Forward hook on ``action_out_proj``: keeps the expert output it reads (Flow-Noise's input)."""
    module.last_input = args[0]


def flow_steps(lcfg) -> int:
    return getattr(lcfg, steps_field(lcfg))


def steps_field(lcfg) -> str:
    """The LeRobot config field of the denoising step count (SmolVLA and PI0 name it differently)."""
    return "num_steps" if hasattr(lcfg, "num_steps") else "num_inference_steps"


def prefix_hidden_size(lr_policy) -> int:
    model = lr_policy.model
    if hasattr(model, "vlm_with_expert"):
        return model.vlm_with_expert.config.text_config.hidden_size
    return model.paligemma_with_expert.paligemma.config.text_config.hidden_size


def normalizer(pipeline):
    from lerobot.processor.normalize_processor import NormalizerProcessorStep

    return next(step for step in pipeline.steps if isinstance(step, NormalizerProcessorStep))


def set_trainable(lr_policy, finetune: str) -> None:
    """``expert``: LeRobot's ``train_expert_only`` (VLM frozen); ``full``: what LeRobot trains with
    it off (the vision encoder too unless ``freeze_vision_encoder``, LeRobot's knob, is set);
    ``lora``: set by `add_lora`. Parameters no forward of RL uses (the VLM's unused LM
    heads) never train."""
    model = lr_policy.model
    lr_policy.requires_grad_(True)  # LeRobot's rules below only freeze
    if hasattr(model, "vlm_with_expert"):
        inner = model.vlm_with_expert
        inner.train_expert_only = finetune == "expert"
        inner.set_requires_grad()
        model.set_requires_grad()  # the state projection (train_state_proj)
    else:
        inner = model.paligemma_with_expert
        inner.train_expert_only = finetune == "expert"
        inner._set_requires_grad()
        # the expert reads the VLM's K / V of every layer, never its output: the last layer's query,
        # attention output, MLP and the final norm only make the VLM's own hidden states (frozen, as
        # LeRobot does for SmolVLA's last layers)
        lm = inner.paligemma.model.language_model
        last = lm.layers[-1]
        for name, p in [*last.named_parameters(), *lm.norm.named_parameters(prefix="norm")]:
            if not name.startswith(("self_attn.k_proj", "self_attn.v_proj", "input_layernorm")):
                p.requires_grad_(False)
    for name, p in lr_policy.named_parameters():
        if "lm_head" in name:
            p.requires_grad_(False)


def add_lora(lr_policy, cfg: LeRobotVLAConfig):
    """peft LoRA adapters on LeRobot's default targets for the family (the base frozen)."""
    from peft import LoraConfig, get_peft_model

    targets = lr_policy._get_default_peft_targets()
    for p in lr_policy.parameters():
        p.requires_grad_(False)
    return get_peft_model(
        lr_policy, LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=targets["target_modules"])
    )


def demo_stats(state: torch.Tensor | None, actions: torch.Tensor) -> dict[str, torch.Tensor]:
    """LeRobot's statistics of demonstrations (flat keys): mean, std, min, max, q01, q99 of the
    state vectors and of the actions (every step of every chunk)."""
    out = {}
    for key, x in ((STATE, state), (ACTION, actions)):
        if x is None:
            continue
        x = x.reshape(-1, x.shape[-1]).double()
        stats = {
            "mean": x.mean(0),
            "std": x.std(0).clamp(min=1e-6),
            "min": x.min(0).values,
            "max": x.max(0).values,
            "q01": torch.quantile(x, 0.01, dim=0),
            "q99": torch.quantile(x, 0.99, dim=0),
        }
        out.update({f"{key}.{k}": v.float() for k, v in stats.items()})
    return out


def load_lerobot(cfg: LeRobotVLAConfig, action_dim: int, state_dim: int | None):
    """(LeRobot policy, preprocessor, postprocessor) of ``cfg.model`` on the CPU, in train mode."""
    if cfg.model.startswith(TINY):
        return build_tiny(cfg, action_dim, state_dim)
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    kw = {"revision": cfg.revision} if cfg.revision else {}
    lcfg = PreTrainedConfig.from_pretrained(cfg.model, **kw)
    if lcfg.type not in FAMILIES:
        raise ConfigError(
            f"'policy.model' = {cfg.model!r} is a LeRobot '{lcfg.type}' policy; policy 'lerobot' "
            f"drives the flow VLAs {', '.join(FAMILIES)}"
        )
    apply_overrides(lcfg, cfg)
    if lcfg.type == "smolvla":
        lcfg.load_vlm_weights = False  # the checkpoint holds every VLM weight: no download of the base VLM
    lcfg.device = "cpu"  # mmrl moves the policy to run.device
    lr_policy = get_policy_class(lcfg.type).from_pretrained(cfg.model, config=lcfg, strict=True, **kw)
    verify_loaded(lr_policy, cfg.model, cfg.revision)
    over = {"tokenizer_processor": {"tokenizer": load_tokenizer(cfg.tokenizer)}} if cfg.tokenizer else {}
    pre, post = make_pre_post_processors(
        lcfg,
        pretrained_path=cfg.model,
        pretrained_revision=cfg.revision,
        preprocessor_overrides={**over, "device_processor": {"device": "cpu"}},
    )
    lr_policy.train()
    return lr_policy, pre, post


def verify_loaded(lr_policy, model: str, revision: str | None) -> None:
    """Raise unless every weight of the policy is in the checkpoint file with its shape (tied weights:
    one of the names). LeRobot's PI0 / PI05 ``from_pretrained`` print a warning and carry on with
    random weights where loading fails; this makes that an error."""
    from safetensors import safe_open
    from transformers.utils import cached_file

    def canonical(key: str) -> str:  # the key mapping of LeRobot's PI0 loader (_fix_pytorch_state_dict_keys)
        key = key.removeprefix("model.")
        return (
            key.replace("time_mlp_in.", "action_time_mlp_in.").replace("time_mlp_out.", "action_time_mlp_out.")
            if key.startswith("time_mlp_")
            else key
        )

    with safe_open(cached_file(model, "model.safetensors", revision=revision), "pt") as f:
        shapes = {canonical(k): tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    head = "paligemma_with_expert.paligemma.lm_head.weight"
    if head in shapes:  # LeRobot copies it into the (tied) token embedding
        shapes["paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"] = shapes[head]
    tied: dict[int, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in lr_policy.state_dict(keep_vars=True).items():
        tied.setdefault(tensor.data_ptr(), []).append((canonical(name), tensor))
    bad = [names[0][0] for names in tied.values() if not any(shapes.get(n) == tuple(t.shape) for n, t in names)]
    if bad:
        raise ConfigError(
            f"the weights of {model!r} did not load into LeRobot's {type(lr_policy).__name__}: "
            f"{len(bad)} tensors are missing from its model.safetensors or have another shape "
            f"(e.g. {', '.join(bad[:3])}); the checkpoint is incomplete or of another architecture, "
            "and LeRobot would have run with random weights"
        )


def apply_overrides(lcfg, cfg: LeRobotVLAConfig) -> None:
    for key, value in cfg.overrides.items():
        if not hasattr(lcfg, key):
            raise ConfigError(f"'policy.overrides.{key}' is not a field of LeRobot's {type(lcfg).__name__}")
        setattr(lcfg, key, tuple(value) if isinstance(getattr(lcfg, key), tuple) else value)
    if cfg.num_steps:
        setattr(lcfg, steps_field(lcfg), cfg.num_steps)


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


@functools.cache
def _tiny_folder(kind: str, **sizes) -> str:
    """A tiny SmolVLM folder (``vlm``) or a tiny PaliGemma-style tokenizer folder (``tokenizer``),
    written once per process."""
    from mmrl.tiny import tiny_lerobot

    folder = tempfile.mkdtemp(prefix=f"mmrl_tiny_{kind}_")
    if kind == "vlm":
        return tiny_lerobot.tiny_smolvlm_folder(folder, **sizes)
    return tiny_lerobot.tiny_gemma_tokenizer_folder(folder)


def build_tiny(cfg: LeRobotVLAConfig, action_dim: int, state_dim: int | None):
    """A tiny random-initialised policy of the real LeRobot class (``tiny:FAMILY``) for this
    simulator's cameras, state and actions, with LeRobot's own processors (identity statistics
    until `set_stats`). Weights come from the global torch RNG (seeded by the trainer)."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    from mmrl.tiny import tiny_lerobot

    family = cfg.model[len(TINY) :]
    sizes = {**TINY_SIZES, **cfg.tiny}
    views = cfg.num_views or 1
    common = dict(
        cameras=views,
        image_size=sizes["image_size"],
        state_dim=state_dim,
        action_dim=action_dim,
        chunk_size=sizes["horizon"],
        n_action_steps=cfg.chunk_size or sizes["horizon"],
        num_steps=cfg.num_steps or 4,
        **cfg.overrides,
    )
    identity = {
        k: {
            "mean": torch.zeros(n),
            "std": torch.ones(n),
            "min": -torch.ones(n),
            "max": torch.ones(n),
            "q01": -torch.ones(n),
            "q99": torch.ones(n),
        }
        for k, n in ((STATE, state_dim), (ACTION, action_dim))
        if n
    }
    if family == "smolvla":
        vlm = _tiny_folder(
            "vlm",
            image_size=sizes["image_size"],
            patch_size=sizes["patch_size"],
            scale_factor=sizes["scale_factor"],
            hidden=sizes["hidden"],
            layers=sizes["layers"],
            vision_hidden=sizes["vision_hidden"],
            vision_layers=sizes["vision_layers"],
        )
        lcfg = tiny_lerobot.tiny_lerobot_config(family, vlm_folder=vlm, **common)
        lr_policy = get_policy_class(family)(lcfg)
        pre, post = make_pre_post_processors(lcfg, dataset_stats=identity)
    else:
        with tiny_lerobot.TinyPiVariants(
            _tiny_folder("tokenizer"),
            width=sizes["hidden"],
            depth=sizes["layers"],
            patch_size=sizes["patch_size"],
            vision_hidden=sizes["vision_hidden"],
        ):
            lcfg = tiny_lerobot.tiny_lerobot_config(family, **common)
            lr_policy = get_policy_class(family)(lcfg)
            pre, post = make_pre_post_processors(lcfg, dataset_stats=identity)
    lr_policy.train()
    return lr_policy, pre, post
