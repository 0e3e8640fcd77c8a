"""Flow-matching vision-language-action policy (pi0-style), trained by Flow-SDE / Flow-Noise PPO.

    images + instruction (+ proprio state)
        -> backbone -> prefix tokens [B, L, D]            (built-in TinyBackbone or any HF VLM)
        -> action expert: transformer over the C action tokens of a noisy chunk x_t, with the flow
           time added to every token and cross-attention to the prefix -> velocity v [B, C, A]
        -> denoise K steps from noise (mmrl.flow samplers) -> action chunk x_0 [B, C, A]

RL needs a likelihood: rollouts use a stochastic sampler (Flow-SDE, CPS, or Flow-Noise whose std
comes from a learnable bounded head on the expert's hidden state), the denoising chain is stored,
and training recomputes the exact Gaussian log-prob of every stochastic transition
(`mmrl.flow.chain_log_prob`). The log-prob level is a chunk (one number per decision) or per
action dimension ([C, A]). A value head on the pooled prefix (optionally detached from the
backbone) serves PPO with GAE. Evaluation samples with the deterministic ODE by default.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import nn

from mmrl.algorithms.normalization import RunningMeanStd
from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import ConfigError, check_range
from mmrl.flow import (
    FlowNoiseHead,
    FlowSample,
    awm_loss,
    chain_log_prob,
    flow_matching_loss,
    gaussian_log_prob,
    mean_path,
    reduce_log_prob,
    sample,
    stochastic_mask,
    time_grid,
    velocity_from_sample,
)
from mmrl.flow.sampler import check_window
from mmrl.policies.base import Decision, Evaluation, PolicyConfig, decode_text, encode_text, log_std_grid
from mmrl.policies.off_policy import LatentNoiseBase
from mmrl.policies.processing import ActionNormalizer, resize_images
from mmrl.policies.state_backbone import HashedText
from mmrl.utils.rows import randn_rows

LOG_STD_MIN, LOG_STD_MAX = -5.0, 1.0  # bounds of the learned log stds (initial noise, action noise)


#: width of the critic's own instruction features (``backbone: state_text``)
CRITIC_TEXT_DIM = 16


@dataclass
class FlowVLAConfig(PolicyConfig):
    """Configuration of `FlowVLAPolicy` (the ``policy`` section of an experiment)."""

    type: str = "flow_vla"  # the policy family (`mmrl list`): the flow-matching VLA
    # "auto": the built-in image encoder ("tiny") if the simulator renders images, else "state" (an
    # MLP over the state vector); "state_text": the state MLP and the instruction (tasks told apart by
    # their instruction: Meta-World MT10 from state); or a transformers image-text hub id / local path
    backbone: str = "auto"
    # keep the image / state backbone's weights fixed (only the action expert and heads train)
    freeze_backbone: bool = False
    # a transformers backbone's weights dtype (float32 / bfloat16 / float16, or auto: the checkpoint's);
    # its prefix reaches the expert in float32 whatever it is
    backbone_dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    image_size: int = 32  # camera images are resized to this side before the built-in encoder
    num_views: int | None = None  # cameras per observation; None = the simulator's
    dim: int = 64  # built-in backbone width
    expert_dim: int = 64  # width of the action expert
    expert_layers: int = 2  # layers of the action expert
    # the action expert: "transformer" (action tokens attend to the prefix, pi0-style), "mlp" (the
    # whole chunk, flow time and pooled prefix through an MLP: ReinFlow / DPPO-style, far cheaper for
    # state tasks), or "auto": mlp on the state backbone, transformer otherwise
    expert: Literal["auto", "transformer", "mlp"] = "auto"
    chunk_size: int = 4  # actions per decision (executed open-loop before the next observation)
    # environment units of the action bounds, per dimension (or one value for all): the policy
    # samples in [-1, 1] and the environment gets low + (x + 1) (high - low) / 2 (e.g. a dataset's
    # 1st / 99th percentiles, as OpenVLA); null = the simulator's [-1, 1] contract
    action_low: list[float] | None = None
    action_high: list[float] | None = None  # upper bounds, as action_low
    num_steps: int = 4  # denoising steps (rollout and training)
    method: Literal["sde", "cps", "noise"] = "sde"  # stochastic sampler used by RL rollouts
    noise_level: float = 0.5  # a of Flow-SDE / CPS
    # a at the end of the run: the level goes linearly from noise_level to this over the planned
    # iterations (the trainer's progress, as lr_schedule: linear), so exploration shrinks as a
    # Gaussian's learned std does; null = fixed (docs/notes/2026-11-28-ant-exploration-noise.md)
    noise_level_final: float | None = None
    # the chain's initial noise x_1 ~ N(0, std^2) per action dimension: "fixed" std 1 (pi0's), or
    # "learned": log std a parameter from 0, trained by the RL objective through x_1's density added
    # to the chain's log-prob (as a Gaussian policy's log std), so the policy can narrow the spread
    # the untrained velocity field passes on from unit noise (docs/notes/2026-11-28-ant-exploration-noise.md)
    init_noise: Literal["fixed", "learned"] = "fixed"
    # exploration by a Gaussian on the chain's final action: "none", or "learned": the executed action is
    # x_0 + std * eps, std = exp(log std) a parameter per action dimension (from action_log_std_init,
    # as a Gaussian policy's), its log-prob the Gaussian density around x_0 recomputed by the ODE from
    # the stored x_1 (exact: a Gaussian policy whose mean is the flow's ODE sample, so PPO narrows the
    # spread as it does a Gaussian's; docs/notes/2026-11-28-ant-exploration-noise.md); needs stochastic: none
    action_noise: Literal["none", "learned"] = "none"
    # its initial log std: a number, or "auto": the trainer starts from 0 (std 1, SB3's) and, where
    # the first rollout shows that noise makes ending an episode pay (episodes terminate and a step
    # costs more than it earns: Ant), moves down to the largest of 0.61 / 0.37 / 0.22 / 0.14 whose
    # rollout earns per step (mmrl.trainer.exploration; docs/notes/2026-11-28-ant-exploration-noise.md)
    action_log_std_init: float | Literal["auto"] = "auto"
    # what the action expert outputs: "velocity" (v = noise - x0, pi0's) or "sample" (x-prediction:
    # the clean chunk x0, v = (x_t - x0) / t): the untrained expert's output is near 0, so its ODE
    # lands near 0 from any initial noise (a Gaussian policy's mean at initialisation) instead of
    # passing the noise's spread on (docs/notes/2026-11-28-ant-exploration-noise.md)
    prediction: Literal["velocity", "sample"] = "velocity"
    # which denoising steps are stochastic ("none": the ODE, for likelihood-free objectives or
    # action_noise: learned)
    stochastic: Literal["all", "one", "window", "none"] = "all"
    window: list[int] | None = None  # [start, end) transitions when stochastic == "window"
    noise_min_std: float = 0.08  # Flow-Noise bounds
    noise_max_std: float = 0.4  # Flow-Noise's learned std stays in [noise_min_std, noise_max_std]
    # evaluation sampler: "ode" (the flow's ODE from a noise sample: a sample of the learned action
    # distribution, as pi0's inference), "mean" (the rollout sampler's chain with its noise left
    # out, from zero noise: one deterministic action per observation, as a Gaussian policy's mean),
    # or a stochastic sampler
    eval_method: Literal["ode", "mean", "sde", "cps", "noise"] = "ode"
    # chunk: one log-prob (and PPO ratio) per decision; dim: one per action dimension
    logp_level: Literal["chunk", "dim"] = "chunk"
    elem_reduce: Literal["sum", "mean"] = "sum"  # over the chunk's elements (chunk level only)
    step_reduce: Literal["sum", "mean"] = "sum"  # over the stochastic denoising steps
    critic: bool = True  # a value head for GAE (false for critic-free estimators such as GRPO)
    detach_value: bool = True  # value head does not backpropagate into the backbone
    # running mean / std normalisation of the state vector (statistics saved with the weights,
    # updated after each RL iteration's update, frozen during the warm start's first use)
    obs_norm: bool = True
    # when the statistics update: "always" (the demonstrations, then every RL iteration), or
    # "warm_start" (the demonstrations only, then fixed: a warm-started policy keeps seeing its inputs
    # scaled as in its supervised training; RL rollouts that drift elsewhere, e.g. long episodes past
    # the demonstrations' end, no longer move them). Without a warm start "warm_start" acts as "always"
    obs_norm_update: Literal["always", "warm_start"] = "always"

    def validate(self) -> None:
        check_range(self, {"num_steps": ">=1", "noise_level": ">=0", "noise_level_final": ">=0"})
        if self.stochastic == "window":
            check_window(self.window, self.num_steps)
        sums = (self.logp_level, self.elem_reduce, self.step_reduce) == ("chunk", "sum", "sum")
        if self.init_noise == "learned" and not sums:
            raise ConfigError(
                "policy.init_noise=learned adds the initial noise's density to the chunk's log-prob, a sum: "
                "set policy.logp_level=chunk, policy.elem_reduce=sum and policy.step_reduce=sum, or init_noise=fixed"
            )
        if self.action_noise == "learned" and self.stochastic != "none":
            raise ConfigError(
                f"policy.action_noise=learned explores by a Gaussian on the ODE's action, but policy.stochastic="
                f"{self.stochastic} also draws denoising steps: set policy.stochastic=none, or action_noise=none"
            )


class PrefixBackbone(Protocol):
    """The observation encoder of `FlowVLAPolicy`: an ``nn.Module`` (`TinyBackbone`, `StateBackbone`,
    `HFImageTextBackbone` or one of your own) called as ``backbone(images, instructions)`` or, with
    ``uses_images = False``, ``backbone(state)``, returning the prefix ``(tokens [B, L, out_dim],
    mask [B, L])``."""

    uses_images: bool
    out_dim: int

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def requires_grad_(self, requires_grad: bool = True) -> Any: ...


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of flow times t [B] in [0, 1] -> [B, dim]."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device) / half)
    args = t.float()[:, None] * 1000.0 * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=-1)


class ActionExpert(nn.Module):
    """Transformer over action tokens, conditioned on the flow time and the prefix."""

    def __init__(self, action_dim: int, chunk: int, dim: int, prefix_dim: int, layers: int):
        super().__init__()
        self.dim = dim
        self.inp = nn.Linear(action_dim, dim)
        self.time = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.pos = nn.Parameter(torch.randn(1, chunk, dim) * 0.02)
        self.ctx = nn.Linear(prefix_dim, dim)
        layer = nn.TransformerDecoderLayer(dim, 4, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerDecoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, action_dim)

    def forward(self, x, t, prefix, mask):
        h = self.inp(x) + self.pos + self.time(timestep_embedding(t, self.dim))[:, None]
        h = self.norm(self.blocks(h, self.ctx(prefix), memory_key_padding_mask=~mask))
        return self.out(h), h


class MLPExpert(nn.Module):
    """Velocity MLP over the flattened chunk, the flow time embedding and the pooled prefix
    (same interface as `ActionExpert`: ``(v [B, C, A], hidden [B, C, dim])``)."""

    def __init__(self, action_dim: int, chunk: int, dim: int, prefix_dim: int, layers: int):
        super().__init__()
        self.dim, self.chunk, self.action_dim = dim, chunk, action_dim
        self.time = nn.Sequential(nn.Linear(dim, dim), nn.SiLU())
        sizes = [chunk * action_dim + dim + prefix_dim] + [dim * max(1, chunk // 2)] * max(1, layers)
        self.body = nn.Sequential(*[m for a, b in zip(sizes, sizes[1:]) for m in (nn.Linear(a, b), nn.SiLU())])
        self.hidden = nn.Linear(sizes[-1], chunk * dim)
        self.out = nn.Linear(dim, action_dim)

    def forward(self, x, t, prefix, mask):
        m = mask.unsqueeze(-1).to(prefix.dtype)
        pooled = (prefix * m).sum(1) / m.sum(1).clamp(min=1)
        h = self.body(torch.cat([x.flatten(1), self.time(timestep_embedding(t, self.dim)), pooled], -1))
        h = torch.nn.functional.silu(self.hidden(h)).view(x.shape[0], self.chunk, self.dim)
        return self.out(h), h


class FlowVLAPolicy(LatentNoiseBase[FlowVLAConfig]):
    """Flow-matching VLA: backbone prefix + action expert + value head (+ Flow-Noise head)."""

    config_class = FlowVLAConfig
    grid: torch.Tensor  # buffer: the denoising time grid

    @classmethod
    def capabilities(cls, cfg: FlowVLAConfig) -> Capabilities:
        """Action chunks, exact log-probs of the denoising chain (per chunk or per element), AWM, a
        critic with ``critic``; no KL reference."""
        return Capabilities(
            logp="decision" if cfg.logp_level == "chunk" else "element",
            critic=cfg.critic,
            likelihood_free=True,
            latent_noise=True,  # act_from_noise: the ODE from a given noise (DSRL steers it)
            # an annealed noise level follows the trainer's progress, which a background copy misses;
            # the initial std's probe collects its rollouts in order
            asynchronous=cfg.noise_level_final is None and not cls.probes_std(cfg),
            exploration_probe=cls.probes_std(cfg),
            # FSDP2 units: the layers of the tiny backbone's mixer and of the action expert
            sharding_units=("TransformerEncoderLayer", "TransformerDecoderLayer"),
            fixes={
                "critic": "set policy.critic=true, or use a group estimator "
                "(algorithm.advantage: grpo, rloo, ...) with group_size >= 2",
                "kl_reference": "the flow VLA keeps no reference model: set algorithm.kl_coef=0",
                "asynchronous": "an annealed noise level (policy.noise_level_final) and the initial action "
                "std's probe (policy.action_log_std_init: auto, with action_noise: learned) need synchronous "
                "rollouts: set trainer.async_staleness=0, or policy.noise_level_final=null and "
                "policy.action_log_std_init to a number (e.g. 0)",
            },
        )

    @staticmethod
    def probes_std(cfg: FlowVLAConfig) -> bool:
        """Whether the trainer chooses the action noise's initial std (`exploration_stds`)."""
        return cfg.action_noise == "learned" and cfg.action_log_std_init == "auto"

    @property
    def log_std_start(self) -> float:
        """The action noise's log std as built: ``action_log_std_init``, 0 under ``auto``."""
        init = self.cfg.action_log_std_init
        return 0.0 if init == "auto" else float(init)

    def exploration_stds(self) -> list[float]:
        return log_std_grid(self.log_std_start) if self.probes_std(self.cfg) else []

    def set_exploration_std(self, std: float) -> None:
        assert self.action_log_std is not None, "set_exploration_std needs policy.action_noise=learned"
        with torch.no_grad():
            self.action_log_std.fill_(math.log(std))

    @property
    def chunk_size(self) -> int:
        return self.cfg.chunk_size

    def set_progress(self, progress: float) -> None:
        self.progress = min(max(float(progress), 0.0), 1.0)

    @property
    def noise_level(self) -> float:
        """The Flow-SDE / CPS level ``a`` now: ``noise_level``, or with ``noise_level_final`` the
        linear interpolation at the trainer's progress (rollout and update of one iteration share it)."""
        c = self.cfg
        if c.noise_level_final is None:
            return c.noise_level
        return c.noise_level + (c.noise_level_final - c.noise_level) * self.progress

    def rollout_stats(self) -> dict[str, float]:
        stats = {} if self.cfg.noise_level_final is None else {"noise_level": self.noise_level}
        if self.init_log_std is not None:
            stats["init_noise_std"] = self.init_std().mean().item()
        if self.action_log_std is not None:
            stats["action_noise_std"] = self.action_std().mean().item()
        return stats

    def init_std(self) -> torch.Tensor:
        """Std ``[A]`` of the chain's initial noise (1 unless ``init_noise: learned``)."""
        if self.init_log_std is None:
            return torch.ones(self.action_dim, device=self.grid.device)
        return self.init_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()

    def scale_init_noise(self, eps: torch.Tensor) -> torch.Tensor:
        """The chain's initial noise from a standard-normal draw ``eps`` ``[B, C, A]``: ``eps`` itself
        with fixed unit noise (no work on the rollout's path), else ``eps * init_std``."""
        return eps if self.init_log_std is None else eps * self.init_std().to(eps.device)

    def action_std(self) -> torch.Tensor:
        """Std ``[A]`` of the Gaussian on the final action (``action_noise: learned``)."""
        assert self.action_log_std is not None, "action_std needs policy.action_noise=learned"
        return self.action_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()

    def action_log_prob(self, action: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """Log-density of the executed ``action`` ``[B, C, A]`` (normalised units) under the Gaussian
        around the ODE's ``mean``: ``[B]`` summed over the chunk, or ``[B, C, A]`` with
        ``logp_level: dim``."""
        lp = gaussian_log_prob(action.float(), mean.float(), self.action_std().to(mean.device))
        return lp.sum((1, 2)) if self.cfg.logp_level == "chunk" else lp

    @property
    def chain_method(self) -> str:
        """The transitions of the rollout's chain: ``"ode"`` with ``stochastic: none`` (no step is
        drawn, so the mean path is the ODE too), else ``method``."""
        return "ode" if self.cfg.stochastic == "none" else self.cfg.method

    def init_log_prob(self, x1: torch.Tensor) -> torch.Tensor | float:
        """Log-density ``[B]`` of the chain's initial noise ``x1`` ``[B, C, A]`` under N(0, init_std^2),
        summed over the chunk (0 with fixed unit noise: a constant that cancels in every ratio)."""
        if self.init_log_std is None:
            return 0.0
        std = self.init_std().to(x1.device)
        return gaussian_log_prob(x1.float(), torch.zeros_like(std), std).sum((1, 2))

    @classmethod
    def configure(cls, cfg: FlowVLAConfig, sim) -> FlowVLAConfig:
        """The camera count from the simulator (``num_views: null``) and, for ``backbone: auto``,
        the built-in image encoder where the simulator renders images, else the state MLP."""
        if cfg.num_views is None:
            cfg = dataclasses.replace(cfg, num_views=sim.image_shape[0] if len(sim.image_shape) == 4 else 1)
        if cfg.backbone == "auto":
            cfg = dataclasses.replace(cfg, backbone="tiny" if sim.has_images else "state")
        return cfg

    def __init__(
        self,
        cfg: FlowVLAConfig,
        action_dim: int,
        state_dim: int | None = None,
        backbone: PrefixBackbone | None = None,
        normalizer: ActionNormalizer | None = None,
    ):
        super().__init__()
        self.state_dim = state_dim
        self.cfg, self.action_dim = cfg, action_dim
        self.progress = 0.0  # fraction of the planned run done (`set_progress`; noise_level_final)
        self.backbone = backbone if backbone is not None else build_backbone(cfg, state_dim)
        if cfg.freeze_backbone:
            self.backbone.requires_grad_(False)
        d = self.backbone.out_dim
        self.uses_images = self.backbone.uses_images
        #: a state backbone that also reads the instruction (`StateTextBackbone`)
        self.uses_text = not self.uses_images and bool(getattr(self.backbone, "uses_instructions", False))
        # image backbones get the state as one extra prefix token; the state backbone reads it itself
        self.state_proj = nn.Linear(state_dim, d) if state_dim and self.uses_images else None
        self.obs_norm = RunningMeanStd(state_dim) if state_dim and cfg.obs_norm else None
        if self.obs_norm is not None and cfg.obs_norm_update == "warm_start":  # saved: a resumed run stays fixed
            self.register_buffer("obs_norm_fixed", torch.zeros((), dtype=torch.bool))
        mlp = cfg.expert == "mlp" or (cfg.expert == "auto" and not self.uses_images)
        self.expert = (MLPExpert if mlp else ActionExpert)(
            action_dim, cfg.chunk_size, cfg.expert_dim, d, cfg.expert_layers
        )
        # log std of the initial noise per action dimension (init_noise: learned), shared by the chunk
        self.init_log_std = nn.Parameter(torch.zeros(action_dim)) if cfg.init_noise == "learned" else None
        # log std per action dimension of the Gaussian on the final action (action_noise: learned)
        self.action_log_std = (
            nn.Parameter(torch.full((action_dim,), self.log_std_start)) if cfg.action_noise == "learned" else None
        )
        self.noise_head = (
            FlowNoiseHead(cfg.expert_dim, action_dim, cfg.noise_min_std, cfg.noise_max_std)
            if cfg.method == "noise"
            else None
        )
        # the critic reads the pooled prefix (detached by default); without images it is its own MLP
        # on the normalised state, as in SB3 / CleanRL (actor and critic share no layers)
        self.value_head: nn.Sequential | None = None
        #: the critic's own reading of the instruction (state_text): its task, beside the state
        self.value_text: HashedText | None = None
        if cfg.critic and not self.uses_images:
            assert state_dim is not None, "a backbone without images encodes the state vector: there is one"
            text_dim = CRITIC_TEXT_DIM if self.uses_text else 0
            self.value_text = HashedText(CRITIC_TEXT_DIM) if self.uses_text else None
            self.value_head = nn.Sequential(
                nn.Linear(state_dim + text_dim, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)
            )
        elif cfg.critic:
            self.value_head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))
        self.normalizer = normalizer or ActionNormalizer.from_config(cfg.action_low, cfg.action_high)
        self.register_buffer("grid", time_grid(cfg.num_steps), persistent=False)
        self.logp_shape = () if cfg.logp_level == "chunk" else (cfg.chunk_size, action_dim)

    # ---- encoding -----------------------------------------------------------------------------
    def normalized_state(self, state: torch.Tensor | None) -> torch.Tensor | None:
        if state is None:
            return None
        state = state.to(self.grid.device).float()
        return state if self.obs_norm is None else self.obs_norm.normalize(state)

    def encode(self, image: torch.Tensor | None, instructions: list[str], state: torch.Tensor | None):
        """Prefix tokens ``[B, L, D]`` and mask of observations (``state`` raw, normalised here)."""
        state = self.normalized_state(state)
        if not self.uses_images:
            return self.backbone(state, instructions) if self.uses_text else self.backbone(state)
        assert image is not None, "observations of a simulator with images carry them"
        image = resize_images(image.to(self.grid.device), self.cfg.image_size)
        prefix, mask = self.backbone(image, instructions)
        if self.state_proj is not None and state is not None:
            tok = self.state_proj(state)[:, None]
            prefix = torch.cat([prefix, tok], 1)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        return prefix, mask

    def encode_batch(self, batch: Batch):
        """`encode` for observations stored in a `Batch` (instructions as UTF-8 bytes)."""
        if not self.uses_images:
            return self.encode(None, self.batch_instructions(batch), batch["state"])
        return self.encode(batch["image"], decode_text(batch["instruction"]), batch.get("state"))

    def batch_instructions(self, batch: Batch) -> list[str]:
        """The instructions a `Batch` stores, where the policy reads them (state backbones without
        text store none)."""
        return decode_text(batch["instruction"]) if self.uses_images or self.uses_text else []

    def values(
        self,
        prefix: torch.Tensor | None,
        mask: torch.Tensor | None,
        state: torch.Tensor | None = None,
        instructions: list[str] | None = None,
    ) -> torch.Tensor | None:
        """Critic value ``[B]`` from the prefix (image backbones) or the raw state (state backbone,
        which needs no prefix; ``state_text``: and the instruction, through the critic's own text)."""
        if self.value_head is None:
            return None
        if not self.uses_images:
            x = self.normalized_state(state)
            assert x is not None, "a state backbone's critic reads the state"
            if self.value_text is not None:
                x = torch.cat([x, self.value_text(instructions or [])], -1)
            return self.value_head(x).squeeze(-1)
        assert prefix is not None and mask is not None, "an image backbone's critic reads its prefix"
        m = mask.unsqueeze(-1).float()
        pooled = (prefix * m).sum(1) / m.sum(1).clamp(min=1)
        if self.cfg.detach_value:
            pooled = pooled.detach()
        return self.value_head(pooled).squeeze(-1)

    @torch.no_grad()
    def value(self, obs) -> torch.Tensor | None:
        if self.value_head is None:
            return None
        if not self.uses_images:
            return self.values(None, None, obs.state, obs.instruction)
        return self.values(*self.encode(obs.image, obs.instruction, obs.state))

    def update_statistics(self, batch: Batch) -> None:
        if self.obs_norm is not None and "state" in batch and not self.stats_fixed:
            self.obs_norm.update(batch["state"][batch["valid"]] if "valid" in batch else batch["state"])

    @property
    def stats_fixed(self) -> bool:
        """``obs_norm_update: warm_start`` once the warm start has set the statistics."""
        return bool(getattr(self, "obs_norm_fixed", False))

    def after_warm_start(self) -> None:
        super().after_warm_start()
        fixed = getattr(self, "obs_norm_fixed", None)
        if fixed is not None and self.obs_norm is not None and self.obs_norm.count.item() >= 1:
            fixed.fill_(True)  # demonstrations set the statistics: they stay (no warm start: they keep updating)

    def model_fn(self, prefix: torch.Tensor, mask: torch.Tensor, method: str):
        """Velocity (and Flow-Noise std) as a function of (x_t, t); rows of x may be a multiple of
        the prefix rows (the chain's K transitions batched sample-major: row b*K + k)."""

        def fn(x: torch.Tensor, t: torch.Tensor):
            reps = x.shape[0] // prefix.shape[0]
            p, m = (prefix, mask) if reps == 1 else (prefix.repeat_interleave(reps, 0), mask.repeat_interleave(reps, 0))
            v, h = self.expert(x, t, p, m)
            if self.cfg.prediction == "sample":  # the expert's output is x0: its velocity
                v = velocity_from_sample(x, v, t)
            std = self.noise_head(h) if (method == "noise" and self.noise_head is not None) else None
            return v, std

        return fn

    def _reduce(self, logp_elem: torch.Tensor, stoch: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        keep = 0 if c.logp_level == "chunk" else 2
        return reduce_log_prob(
            logp_elem, stoch, elem_dims=2, elem_reduce=c.elem_reduce, step_reduce=c.step_reduce, keep=keep
        )

    # ---- the policy contract ------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        c = self.cfg
        prefix, mask = self.encode(obs.image, obs.instruction, obs.state)
        b, dev = prefix.shape[0], prefix.device
        method = c.method if mode == "train" else c.eval_method
        shape = (b, c.chunk_size, self.action_dim)
        if method == "mean":  # deterministic: the training sampler's means, from zero noise (none drawn)
            zeros = torch.zeros(shape, device=dev)
            m = self.chain_method
            out = mean_path(self.model_fn(prefix, mask, m), zeros, self.grid, m, self.noise_level)
            return self._decision(obs, out, prefix, mask)
        noise = self.scale_init_noise(randn_rows(shape, generator=generator, device=dev))
        stoch = stochastic_mask(
            b,
            c.num_steps,
            "none" if method == "ode" else c.stochastic,
            generator=generator,
            window=tuple(c.window) if c.window else None,
            device=dev,
        )
        out = sample(
            self.model_fn(prefix, mask, method),
            noise,
            self.grid,
            method,
            noise_level=self.noise_level,
            stoch=stoch,
            generator=generator,
        )
        action = None
        if mode == "train" and self.action_log_std is not None:  # the Gaussian on the ODE's action
            eps = randn_rows(shape, generator=generator, device=dev)
            action = out.x0.float() + self.action_std().to(dev) * eps
        return self._decision(obs, out, prefix, mask, action)

    @property
    def noise_shape(self) -> tuple[int, ...]:
        return (self.cfg.chunk_size, self.action_dim)

    @torch.no_grad()
    def act_from_noise(self, obs, noise: torch.Tensor) -> torch.Tensor:
        """The ODE's chunk ``[B, C, A]`` (env units) from the initial ``noise`` ``[B, C, A]``: exactly
        the ``eval_method: ode`` rollout's actions when ``noise`` is the one it draws."""
        prefix, mask = self.encode(obs.image, obs.instruction, obs.state)
        noise = self.scale_init_noise(noise.to(prefix.device).float())
        return self.normalizer.unnormalize(self._ode(prefix, mask, noise).x0)

    def _ode(self, prefix: torch.Tensor, mask: torch.Tensor, x1: torch.Tensor, grad: bool = False) -> FlowSample:
        """The ODE chain from the (scaled) initial noise ``x1`` under the current weights, with
        gradients through every step when ``grad``: `act_from_noise`'s map and `action_noise`'s mean."""
        return sample(self.model_fn(prefix, mask, "ode"), x1, self.grid, "ode", grad=grad)

    @torch.no_grad()
    def observation_features(self, obs) -> torch.Tensor:
        """``[B, out_dim (+ state_dim)]``: the prefix's masked mean, then the normalised state where
        the policy reads one."""
        prefix, mask = self.encode(obs.image, obs.instruction, obs.state)
        m = mask.unsqueeze(-1).to(prefix.dtype)
        parts = [(prefix * m).sum(1) / m.sum(1).clamp(min=1)]
        state = self.normalized_state(obs.state) if self.state_dim else None
        if state is not None:
            parts.append(state)
        return torch.cat(parts, -1).float()

    @property
    def feature_dim(self) -> int:
        """Width of `observation_features`' rows."""
        return self.backbone.out_dim + (self.state_dim or 0)

    def _decision(
        self, obs, out, prefix: torch.Tensor, mask: torch.Tensor, action: torch.Tensor | None = None
    ) -> Decision:
        """The `Decision` of a sampled chain ``out`` (`FlowSample`) for observations ``obs``; ``action``
        (normalised) is the executed one where the final Gaussian drew it (``action_noise: learned``)."""
        dev = prefix.device
        old_logp = self._reduce(out.logp, out.stoch) + self.init_log_prob(out.chain[:, 0])
        if action is not None:
            old_logp = old_logp + self.action_log_prob(action, out.x0)
        batch = Batch(
            actions=self.normalizer.unnormalize(out.x0 if action is None else action),
            flow_chain=out.chain,
            flow_stoch=out.stoch,
            old_logp=old_logp,
        )
        if action is not None:
            batch["flow_action"] = action
        if self.uses_images:  # replay inputs: what `encode_batch` reads again
            batch["image"] = obs.image.to(dev)
        if self.uses_images or self.uses_text:
            batch["instruction"] = encode_text(obs.instruction).to(dev)
        if obs.state is not None:
            batch["state"] = obs.state.to(dev).float()
        values = self.values(prefix, mask, obs.state, obs.instruction)
        if values is not None:
            batch["old_values"] = values
        return Decision(batch, batch["actions"])

    def evaluate(self, batch: Batch) -> Evaluation:
        c = self.cfg
        prefix, mask = self.encode_batch(batch)
        if self.action_log_std is not None:
            return self._evaluate_action_noise(batch, prefix, mask)
        logp_elem = chain_log_prob(
            self.model_fn(prefix, mask, c.method),
            batch["flow_chain"],
            self.grid,
            batch["flow_stoch"],
            c.method,
            noise_level=self.noise_level,
        )
        stoch_elems = batch["flow_stoch"][..., None, None].expand_as(logp_elem)
        entropy = -(logp_elem * stoch_elems).sum() / stoch_elems.sum().clamp(min=1)
        return Evaluation(
            logp=self._reduce(logp_elem, batch["flow_stoch"]) + self.init_log_prob(batch["flow_chain"][:, 0]),
            entropy=entropy,
            values=self.values(prefix, mask, batch.get("state"), self.batch_instructions(batch)),
        )

    def _evaluate_action_noise(self, batch: Batch, prefix: torch.Tensor, mask: torch.Tensor) -> Evaluation:
        """`evaluate` with ``action_noise: learned``: the ODE from the stored x_1 integrated again
        under the current weights (gradients through every step), the executed action's density
        around its end, and the Gaussian's entropy per element."""
        x1 = batch["flow_chain"][:, 0]
        mean = self._ode(prefix, mask, x1, grad=True).x0
        log_std = self.action_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)  # type: ignore[union-attr]
        return Evaluation(
            logp=self.action_log_prob(batch["flow_action"], mean) + self.init_log_prob(x1),
            entropy=(log_std + 0.5 * math.log(2 * math.pi * math.e)).mean(),
            values=self.values(prefix, mask, batch.get("state"), self.batch_instructions(batch)),
        )

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Conditional flow matching on demonstration chunks ``actions`` [B, C, A] (env units)."""
        prefix, mask = self.encode_batch(batch)
        x0 = self.normalizer.normalize(batch["actions"].to(prefix.device))
        return flow_matching_loss(self.model_fn(prefix, mask, "ode"), x0)

    def likelihood_free_loss(self, batch: Batch, advantages: torch.Tensor) -> torch.Tensor:
        """Advantage-weighted matching on the rollout's own chunks (no log-likelihood needed)."""
        prefix, mask = self.encode_batch(batch)
        x0 = batch["flow_action"] if "flow_action" in batch else batch["flow_chain"][:, -1]  # the executed chunk
        return awm_loss(self.model_fn(prefix, mask, "ode"), x0, advantages)


def build_backbone(cfg: FlowVLAConfig, state_dim: int | None = None) -> PrefixBackbone:
    # "auto" is resolved from the simulator by `FlowVLAPolicy.configure`; built by hand it is "tiny"
    if cfg.backbone in ("state", "state_text"):
        from mmrl.policies.state_backbone import StateBackbone, StateTextBackbone

        return (StateTextBackbone if cfg.backbone == "state_text" else StateBackbone)(state_dim or 0, dim=cfg.dim)
    if cfg.backbone in ("tiny", "auto"):
        from mmrl.policies.tiny_backbone import TinyBackbone

        return TinyBackbone(image_size=cfg.image_size, dim=cfg.dim, num_views=cfg.num_views or 1)
    from mmrl.policies.hf_backbone import HFImageTextBackbone  # needs mmrl[vlm]

    dtype = cfg.backbone_dtype if cfg.backbone_dtype == "auto" else getattr(torch, cfg.backbone_dtype)
    return HFImageTextBackbone.from_pretrained(cfg.backbone, torch_dtype=dtype, freeze=cfg.freeze_backbone)
