"""Flow-matching image and video generators as policies: Flow-GRPO (PPO on SDE rollouts), AWM and DiffusionNFT.

    prompt -> generator.encode -> cond
    noise x_1 -> K denoising transitions (mmrl.flow samplers: ODE / Flow-SDE / CPS; stochastic on
    all steps, one random step or a window) -> x_0 -> generator.decode -> image or clip -> the reward stage scores it

Generators (one file each): the built-in pixel-space `TinyTextToImage` (``model: tiny``) and two
diffusers families, LoRA through peft by default (``model:`` a hub id or a local pipeline folder):
SD3 (`mmrl.policies.sd3`, e.g. ``stabilityai/stable-diffusion-3.5-medium``) and FLUX.1
(`mmrl.policies.flux`, e.g. ``black-forest-labs/FLUX.1-dev``). `build_generator` picks the family
from a local folder's ``model_index.json`` (``_class_name`` ``FluxPipeline`` or
``StableDiffusion3Pipeline``), else from the hub id (``flux`` in it, any case, means FLUX; anything
else SD3). ``flux_guidance`` is FLUX.1-dev's distilled guidance embedding (ignored by schnell and
SD3); set ``shift`` to the generator's ``default_shift`` for diffusers' resolution-dependent FLUX
schedule. Training rollouts use ``num_steps`` transitions, evaluation ``eval_num_steps`` with
``eval_method`` (ODE by default). Classifier-free guidance (``guidance_scale``, off = 1) is applied
identically at rollout and at log-prob recomputation, so the PPO ratio is 1 before an update.

Log-prob level: ``logp_level="step"`` is Flow-GRPO's: one ratio per stochastic transition, the
per-element Gaussian log-prob averaged over the image (``old_logp [B, K]``, ``logp_mask`` = the
stochastic transitions); ``"sample"`` sums the steps (``[B]``). The KL penalty of Flow-GRPO is the
squared drift between the policy's and the reference's transition means over ``2 std^2``, per
step (``kl_reference: true`` to compute it; the reference is the adapter switched off with LoRA,
else a frozen copy taken after the warm start). AWM (``algorithm.objective: awm``) needs no
log-probs: fresh noise at ``awm_timesteps`` stratified times per sample, the flow-matching error
weighted by the advantage (uniform / t / pseudo-Huber), plus optional velocity regularisers to
the reference (``awm_ref_coef``) and to an EMA copy of the policy (``awm_ema_coef``). DiffusionNFT
(``algorithm.objective: nft``) takes the same drift term to the reference (``nft_ref_coef``), the guard
against reward hacking its paper's KL term plays.

DanceGRPO's options: ``shared_noise`` starts the samples of one prompt in a rollout batch from the
same noise (the SDE alone tells them apart); ``timestep_fraction < 1`` trains each sample on that
fraction of its stochastic transitions, drawn at random (``flow_train`` in the batch; the rollout
stays stochastic on all of them), which cuts the update's model calls in proportion.

Videos (``num_frames >= 1``): the same policy over video latents ``[C, F, H, W]``, clips as actions
(uint8 ``[B, F, H, W, 3]``, the ``video_prompts`` simulator): the built-in `TinyTextToVideo` or Wan
2.1 / 2.2 (`mmrl.policies.wan`, a ``WanPipeline`` id or folder).

Memory-saving modes of the diffusers generators (flow_grpo's and DanceGRPO's): ``dtype: bfloat16``
loads the pipeline in bf16 (VAE, text encoders, the transformer's frozen weights) while the trained
weights (LoRA adapters; a full fine-tune's transformer) stay float32, as diffusers' LoRA scripts keep
them (`mmrl.policies.diffusers_base`); ``float16`` needs ``trainer.engine.precision: fp16`` (DeepSpeed's
loss scaling), and bf16 weights under fp16 autocast are refused (`DiffusionConfig.check_engine`).
``gradient_checkpointing: true`` recomputes the transformer's blocks in the backward (diffusers'
``enable_gradient_checkpointing``; ``trainer.engine.gradient_checkpointing`` does the same). The
reference is the adapter switched off with LoRA (no copy); a full fine-tune's frozen copy shares the
pipeline's text encoders and VAE (only the transformer is copied).

`mmrl export` writes an SD3 / FLUX policy as diffusers loads it (`export_pretrained`): the pipeline
folder with the LoRA fused, or with ``--adapter`` the LoRA alone (``pipe.load_lora_weights``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from mmrl.batch import Batch
from mmrl.capabilities import Capabilities
from mmrl.config import ConfigError, check_range
from mmrl.flow import (
    awm_loss,
    chain_log_prob,
    flow_matching_loss,
    nft_loss,
    reduce_log_prob,
    sample,
    stochastic_mask,
    subsample_steps,
    time_grid,
)
from mmrl.flow.sampler import check_window, noisy_steps
from mmrl.flow.steps import transition
from mmrl.policies.base import Decision, Evaluation, Policy, PolicyConfig, decode_text, encode_text
from mmrl.policies.generator import TextToImageGenerator
from mmrl.utils.rows import randn_rows


@dataclass
class DiffusionConfig(PolicyConfig):
    """Configuration of `DiffusionPolicy` (the ``policy`` section of a diffusion experiment)."""

    type: str = "diffusion"
    model: str = "tiny"  # "tiny" (built-in pixel generator) or a diffusers SD3 / FLUX / Wan pipeline id / folder
    image_size: int = 16  # generated image side (SD3, FLUX: a multiple of 16)
    num_frames: int = 0  # 0: images; >= 1: videos of this many frames (Wan: 1 + a multiple of 4, e.g. 33, 81)
    width: int = 64  # tiny generator channels
    finetune: Literal["lora", "full"] = "lora"  # SD3 / FLUX; the tiny generator is always fully trained
    lora_rank: int = 32  # LoRA rank of the adapters (finetune: lora)
    lora_alpha: int = 64  # LoRA scale alpha (the update is scaled by alpha / rank)
    num_steps: int = 10  # denoising transitions of training rollouts
    eval_num_steps: int = 20  # denoising transitions at evaluation
    shift: float = 1.0  # SD3 time shift of the grid (SD3.5 uses 3.0; FLUX.1-dev: the generator's default_shift)
    method: Literal["sde", "cps"] = "sde"
    noise_level: float = 0.7
    stochastic: Literal["all", "one", "window"] = "all"  # which transitions are sampled and trained
    window: list[int] | None = None
    # DanceGRPO's options: the samples of one prompt in a rollout batch start from the same noise
    # (their differences then come from the SDE alone), and each sample trains on this fraction of
    # its stochastic transitions, drawn at random (1: all; the rollout stays stochastic on all)
    shared_noise: bool = False
    timestep_fraction: float = 1.0  # see shared_noise: the fraction of stochastic transitions each sample trains on
    eval_method: Literal["ode", "sde", "cps"] = "ode"
    guidance_scale: float = 1.0  # CFG in training rollouts and their log-probs (1 = off)
    eval_guidance_scale: float = 1.0  # CFG at evaluation (1 = off)
    flux_guidance: float = 3.5  # FLUX.1-dev's guidance embedding input (not CFG: one model call per step)
    cfg_dropout: float = 0.1  # prompts dropped while pretraining (enables CFG)
    logp_level: Literal["step", "sample"] = "step"
    kl_reference: bool = False  # compute Flow-GRPO's KL to the reference (set algorithm.kl_coef)
    awm_timesteps: int = 4  # AWM: stratified flow times per sample at which the matching loss is taken
    # AWM: the loss weight over flow time: uniform, t, or pseudo-Huber (huber)
    awm_weighting: Literal["uniform", "t", "huber"] = "uniform"
    awm_huber_c: float | None = None  # AWM's pseudo-Huber constant c (null: 1e-5)
    awm_ref_coef: float = 0.0  # ||v - v_ref||^2 regulariser of AWM
    awm_ema_coef: float = 0.0  # ||v - v_ema||^2 regulariser of AWM
    ema_decay: float = 0.95  # decay of the EMA copy awm_ema_coef regularises towards
    nft_beta: float = 1.0  # DiffusionNFT (algorithm.objective: nft): the implicit policies' step
    nft_timesteps: int = 1  # stratified training times per sample
    nft_adv_max: float = 5.0  # advantages mapped to optimality r in [0, 1] over [-nft_adv_max, nft_adv_max]
    nft_adaptive_weight: bool = True  # each row's error over its mean |x0_hat - x0| (the reference's)
    # ||v - v_ref||^2 regulariser of DiffusionNFT at its training points (the reference generator's
    # velocity; a guard against reward hacking, as awm_ref_coef for AWM): 0 = none
    nft_ref_coef: float = 0.0
    # DiffusionNFT's old policy (the reference's): a copy of the trainable weights that samples the
    # training rollouts and gives v_old, held fixed through each update and moved once per iteration
    # by old <- d old + (1 - d) policy (0: the policy as the update left it). null: no copy, v_old is
    # the current policy detached at every step (no trust region: the negative term pushes without bound)
    nft_old_decay: float | None = None
    prompt_bytes: int = 256  # stored prompt width (longer prompts are rejected)
    max_sequence_length: int | None = None  # text tokens of diffusers generators (None: the family's default, Wan 512)
    # diffusers VAEs: decode the batch one sample at a time (slicing) / in overlapping tiles (tiling),
    # less memory for large videos and images at some speed (the VAE's enable_slicing / enable_tiling)
    vae_slicing: bool = False
    vae_tiling: bool = False  # see vae_slicing
    # diffusers pipelines: the dtype they load in (VAE, text encoders, the transformer's frozen weights);
    # trained weights (LoRA adapters, a full fine-tune's transformer) stay float32. The tiny generator: float32
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gradient_checkpointing: bool = False  # diffusers transformers: recompute each block in the backward

    def validate(self) -> None:
        check_range(self, {"num_steps": ">=1", "eval_num_steps": ">=1", "nft_timesteps": ">=1", "num_frames": ">=0"})
        if self.model == "tiny" and self.dtype != "float32":
            raise ConfigError(
                f"policy.dtype = {self.dtype} loads a diffusers pipeline in that dtype; the built-in tiny generator "
                "keeps float32 weights: remove policy.dtype (trainer.engine.precision=bf16 computes it in bf16)"
            )
        if self.model == "tiny" and self.gradient_checkpointing:
            raise ConfigError(
                "policy.gradient_checkpointing recomputes a diffusers transformer's blocks; the built-in tiny "
                "generator has none: set policy.gradient_checkpointing=false"
            )
        if self.model != "tiny" and diffusers_family(self.model) == "wan" and self.num_frames < 1:
            raise ValueError(
                f"policy.model {self.model} is a Wan text-to-video pipeline: set policy.num_frames "
                "(1 + a multiple of 4, e.g. 33 or 81)"
            )
        check_range(self, {"nft_beta": ">0", "nft_adv_max": ">0"})
        check_range(self, {"awm_ref_coef": ">=0", "awm_ema_coef": ">=0", "nft_ref_coef": ">=0"})
        if self.nft_old_decay is not None and not 0.0 <= self.nft_old_decay < 1.0:
            raise ValueError(f"nft_old_decay = {self.nft_old_decay} must be in [0, 1) or null (no old copy)")
        if self.stochastic == "window":
            check_window(self.window, self.num_steps)
        if not 0.0 < self.timestep_fraction <= 1.0:
            raise ValueError(
                f"timestep_fraction = {self.timestep_fraction} must be in (0, 1] (1: every stochastic step)"
            )

    def check_engine(self, engine) -> None:
        """A half ``dtype`` goes with the engine's precision: float16 frozen weights need fp16's loss scaling
        (DeepSpeed; without it the adapters' gradients through float16 activations underflow), and bf16 weights
        are not autocast to float16. bf16 weights under fp32 or bf16 precision both run: the frozen matmuls
        in bf16, the float32 adapters in float32 (fp32) or bf16 (bf16 autocast, flow_grpo's setting)."""
        if self.dtype == "float16" and engine.precision != "fp16":
            raise ConfigError(
                f"policy.dtype = float16 runs the transformer in float16, whose gradients need the loss scaling of "
                f"trainer.engine.precision=fp16 (is {engine.precision}): set trainer.engine.backend=deepspeed "
                "trainer.engine.precision=fp16, or policy.dtype=bfloat16"
            )
        if self.dtype == "bfloat16" and engine.precision == "fp16":
            raise ConfigError(
                "policy.dtype = bfloat16 but trainer.engine.precision = fp16 autocasts to float16: set "
                "trainer.engine.precision=bf16 (or policy.dtype=float16)"
            )


#: buffer-name prefixes of the policy's EMA copies: AWM's EMA, DiffusionNFT's old policy
_COPY_PREFIX = {"ema": "ema__", "old": "nft_old__"}

#: ``(x, t, cond) -> v``: the generator, its EMA weights, or its reference
Velocity = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]


def _recording(fn, seen: list):
    """Wrap a model function so every call's ``(x, t, v)`` is appended to ``seen``."""

    def wrapped(x, t):
        v, std = fn(x, t)
        seen.append((x, t, v))
        return v, std

    return wrapped


def _cat(a, b):
    return tuple(torch.cat([x, y]) for x, y in zip(a, b)) if isinstance(a, tuple) else torch.cat([a, b])


class DiffusionPolicy(Policy[DiffusionConfig]):
    """A flow-matching generator behind the policy contract (see the module docstring)."""

    config_class = DiffusionConfig
    gen: TextToImageGenerator
    ref: TextToImageGenerator | None  # a frozen copy as the reference (None: the adapter switched off, or none)
    grid: torch.Tensor  # buffers: the time grids of training and evaluation rollouts
    eval_grid: torch.Tensor

    @classmethod
    def capabilities(cls, cfg: DiffusionConfig) -> Capabilities:
        """Generated images (uint8 [B, H, W, 3]) or videos (``num_frames``: uint8 [B, F, H, W, 3]),
        log-probs of the chain (per step or summed), AWM, DiffusionNFT, Flow-GRPO's own KL with
        ``kl_reference``; no critic."""
        return Capabilities(
            action_type="video" if cfg.num_frames else "image",
            logp="step" if cfg.logp_level == "step" else "decision",
            critic=False,
            likelihood_free=True,
            forward_process=True,
            kl_reference="own" if cfg.kl_reference else None,
            fixes={
                "critic": "the generator has no critic: use a group estimator (algorithm.advantage: "
                "grpo_global_std, grpo, ...) with group_size >= 2",
                "kl_reference": "set policy.kl_reference=true (Flow-GRPO's KL to the reference)",
            },
        )

    def warm_start_batch(self, data: dict) -> Batch:
        """Text-to-image pairs (``image``, ``prompt``) for the flow-matching warm start, or
        text-to-video pairs (``video`` uint8 [M, F, H, W, 3], ``prompt``) for a video generator."""
        media = "video" if self.cfg.num_frames else "image"
        for key in (media, "prompt"):
            if key not in data:
                raise ValueError(f"the diffusion warm start needs ({media}, prompt) pairs; the dataset has no '{key}'")
        return Batch(media=data[media], instruction=encode_text(data["prompt"], self.text_bytes, "policy.prompt_bytes"))

    def __init__(
        self,
        cfg: DiffusionConfig,
        action_dim: int,
        state_dim: int | None = None,
        generator: TextToImageGenerator | None = None,
    ):
        super().__init__()
        self.cfg = cfg
        self.text_bytes = cfg.prompt_bytes
        self.gen = generator if generator is not None else build_generator(cfg)
        self.uses_adapter = bool(getattr(self.gen, "has_adapter", False))
        needs_ref = cfg.kl_reference or cfg.awm_ref_coef > 0 or cfg.nft_ref_coef > 0
        self.ref = None
        if needs_ref and not self.uses_adapter:  # a frozen copy; a pipeline's text encoders and VAE are shared
            from mmrl.policies.diffusers_base import DiffusersGenerator

            frozen = self.gen._frozen() if isinstance(self.gen, DiffusersGenerator) else []
            shared = {id(m): m for m in frozen}  # deepcopy's memo: these are not copied
            self.ref = copy.deepcopy(self.gen, shared).requires_grad_(False)
        trainable = [k for k, p in self.gen.named_parameters() if p.requires_grad]
        # EMA copies of the trainable weights, as buffers (saved in checkpoints): AWM's regulariser
        # ("ema__") and DiffusionNFT's old policy with nft_old_decay set ("nft_old__")
        self._copies = {
            "ema": trainable if cfg.awm_ema_coef > 0 else [],
            "old": trainable if cfg.nft_old_decay is not None else [],
        }
        for which, prefix in _COPY_PREFIX.items():
            for k, p in self.gen.named_parameters():
                if k in self._copies[which]:
                    self.register_buffer(prefix + k.replace(".", "__"), p.detach().clone())
        self.logp_shape = (cfg.num_steps,) if cfg.logp_level == "step" else ()
        #: element dims of one sample: 3 for images [C, H, W], 4 for video latents [C, F, H, W]
        self.elem_dims = len(self.gen.sample_shape)
        self.register_buffer("grid", time_grid(cfg.num_steps, cfg.shift), persistent=False)
        self.register_buffer("eval_grid", time_grid(cfg.eval_num_steps, cfg.shift), persistent=False)

    # ---- velocity functions -------------------------------------------------------------------
    def _copy_params(self, which: str) -> dict[str, torch.Tensor]:
        return {k: getattr(self, _COPY_PREFIX[which] + k.replace(".", "__")) for k in self._copies[which]}

    def _velocity(self, which: str) -> Velocity:
        if which == "policy":
            return self.gen
        if which in _COPY_PREFIX:  # the generator run with its EMA / old weights
            return lambda x, t, cond: torch.func.functional_call(
                self.gen, self._copy_params(which), (x, t, cond), strict=False
            )
        if self.uses_adapter:

            def ref(x, t, cond):
                with self.gen.disable_adapter():
                    return self.gen(x, t, cond)

            return ref
        assert self.ref is not None, "the reference is asked for only where __init__ made one (needs_ref)"
        return self.ref

    def model_fn(self, cond, null, guidance: float, which: str = "policy"):
        """``(x, t) -> (v, None)`` with classifier-free guidance when ``guidance != 1``."""
        vel = self._velocity(which)

        def fn(x, t):
            if guidance == 1.0:
                return vel(x, t, cond), None
            vc, vu = vel(torch.cat([x, x]), torch.cat([t, t]), _cat(cond, null)).chunk(2)
            return vu + guidance * (vc - vu), None

        return fn

    def _conds(self, prompts: list[str], guidance: float):
        cond = self.gen.encode(prompts)
        null = self.gen.encode([""] * len(prompts)) if guidance != 1.0 else None
        return cond, null

    # ---- the policy contract ------------------------------------------------------------------
    @torch.no_grad()
    def rollout(self, obs, generator: torch.Generator | None = None, mode: str = "train") -> Decision:
        c = self.cfg
        prompts = list(obs.instruction)
        train = mode == "train"
        guidance = c.guidance_scale if train else c.eval_guidance_scale
        grid = self.grid if train else self.eval_grid
        method = c.method if train else c.eval_method
        cond, null = self._conds(prompts, guidance)
        dev = grid.device
        noise = randn_rows((len(prompts), *self.gen.sample_shape), generator=generator, device=dev)
        if train and c.shared_noise:  # each prompt's samples start from its first sample's noise
            noise = noise[first_of_equal(prompts).to(dev)]
        k = grid.shape[0] - 1
        stoch = stochastic_mask(
            len(prompts),
            k,
            "none" if method == "ode" else c.stochastic,
            generator=generator,
            window=tuple(c.window) if c.window else None,
            device=dev,
        )
        # DiffusionNFT with an old policy (nft_old_decay set) samples its training data with it, as
        # the reference does: v_old in the loss is then the policy the samples came from
        which = "old" if train and c.nft_old_decay is not None else "policy"
        out = sample(
            self.model_fn(cond, null, guidance, which),
            noise,
            grid,
            method,
            noise_level=c.noise_level,
            stoch=stoch,
            generator=generator,
        )
        images = to_uint8(self.gen.decode(out.x0))  # [B, H, W, 3] (videos: [B, F, H, W, 3])
        batch = Batch(instruction=encode_text(prompts, c.prompt_bytes, "policy.prompt_bytes").to(dev))
        if train:  # the replay inputs (evaluation rollouts are never trained on)
            trained = subsample_steps(out.stoch, c.timestep_fraction, generator)
            batch.update(flow_chain=out.chain, flow_stoch=out.stoch, old_logp=self._reduce(out.logp, trained))
            if c.timestep_fraction < 1:  # the transitions trained on, when not all stochastic ones
                batch["flow_train"] = trained
        return Decision(batch, images)

    def check_simulator(self, sim) -> None:
        """The simulator's images (its black placeholders, and the generated ones it shows) have the
        size this policy generates (videos: also its frame count)."""
        c = self.cfg
        frames = (c.num_frames,) if c.num_frames else ()
        want = (*frames, c.image_size, c.image_size, 3)
        if tuple(sim.image_shape) != want:
            also = f" and policy.num_frames = {c.num_frames}" if frames else ""
            fix = f" and sim.kwargs.num_frames to {c.num_frames}" if frames else ""
            raise ValueError(
                f"the simulator shows {tuple(sim.image_shape)} samples but policy.image_size = "
                f"{c.image_size}{also} generates {want}: set sim.kwargs.image_size to {c.image_size}{fix}"
            )

    def _reduce(self, logp_elem: torch.Tensor, stoch: torch.Tensor) -> torch.Tensor:
        step = "none" if self.cfg.logp_level == "step" else "sum"
        return reduce_log_prob(logp_elem, stoch, elem_dims=self.elem_dims, elem_reduce="mean", step_reduce=step)

    def evaluate(self, batch: Batch) -> Evaluation:
        c = self.cfg
        cond, null = self._conds(decode_text(batch["instruction"]), c.guidance_scale)
        # the transitions trained on: the stochastic ones, or DanceGRPO's subsample of them
        chain, stoch = batch["flow_chain"], batch["flow_train"] if "flow_train" in batch else batch["flow_stoch"]
        seen: list = []  # the one batched model call of chain_log_prob, reused by the KL
        logp_elem = chain_log_prob(
            _recording(self.model_fn(cond, null, c.guidance_scale), seen),
            chain,
            self.grid,
            stoch,
            c.method,
            noise_level=c.noise_level,
        )
        return Evaluation(
            logp=self._reduce(logp_elem, stoch),
            entropy=-(logp_elem.flatten(2).mean(2) * stoch).sum() / stoch.sum().clamp(min=1),
            logp_mask=stoch if c.logp_level == "step" else None,
            kl=self._kl(seen, stoch, cond, null) if c.kl_reference else None,
        )

    def _kl(self, seen: list, stoch, cond, null) -> torch.Tensor:
        """Flow-GRPO's KL per sample: mean over stochastic steps of mean_E (mu - mu_ref)^2 / (2 std^2).

        ``seen`` holds the policy's ``(x, t, v)`` from `chain_log_prob`'s batched call: rows
        sample-major over the transitions where some sample is stochastic with std > 0."""
        c, b = self.cfg, stoch.shape[0]
        if not seen:  # no stochastic transition with a density: nothing drifts
            return torch.zeros(b, device=stoch.device)
        x, t, v = seen[0]
        stoch = stoch & noisy_steps(self.grid, c.method, c.noise_level)[None]
        steps = stoch.any(0).nonzero().flatten()
        kp = steps.numel()
        t_next = self.grid[steps + 1].repeat(b)
        with torch.no_grad():
            v_ref, _ = self.model_fn(cond, null, c.guidance_scale, "ref")(x, t)
        mean, std = transition(c.method, x, v, t, t_next, c.noise_level)
        mean_ref, _ = transition(c.method, x, v_ref, t, t_next, c.noise_level)
        std = torch.broadcast_to(torch.as_tensor(std, dtype=mean.dtype), mean.shape)
        kl = ((mean - mean_ref) ** 2 / (2 * std.clamp(min=1e-8) ** 2)).flatten(1).mean(1).reshape(b, kp)
        m = stoch[:, steps].to(kl.dtype)
        return (kl * m).sum(1) / m.sum(1).clamp(min=1)

    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Pretraining / SFT: flow matching on ``media`` (uint8 images [B, H, W, 3] or videos
        [B, F, H, W, 3]) given its prompt (``cfg_dropout`` of the prompts replaced by the empty prompt)."""
        prompts = decode_text(batch["instruction"])
        drop = torch.rand(len(prompts)) < self.cfg.cfg_dropout
        prompts = ["" if d else p for p, d in zip(prompts, drop.tolist())]
        x0 = self.gen.encode_images(batch["media"])
        return flow_matching_loss(self.model_fn(self.gen.encode(prompts), None, 1.0), x0)

    def likelihood_free_loss(self, batch: Batch, advantages: torch.Tensor) -> torch.Tensor:
        """AWM on the rollout's own samples (detached), plus the optional velocity regularisers."""
        c = self.cfg
        cond = self.gen.encode(decode_text(batch["instruction"]))
        seen: list = []
        loss = awm_loss(
            _recording(self.model_fn(cond, None, 1.0), seen),
            batch["flow_chain"][:, -1],
            advantages,
            c.awm_timesteps,
            c.awm_weighting,
            huber_c=c.awm_huber_c,
        )
        return loss + self._drift(cond, seen[0], len(loss), ((c.awm_ref_coef, "ref"), (c.awm_ema_coef, "ema")))

    def _drift(self, cond, seen: tuple, n: int, terms) -> torch.Tensor | float:
        """Per sample ``[n]``: sum over ``terms`` ((coef, which): "ref", "ema") of coef x the mean
        squared gap between the policy's velocity ``v`` at the loss's points ``(x, t)`` (``seen``:
        one recorded call, rows sample-major) and that copy's there (no gradient); 0 with no term."""
        x, t, v = seen
        out: torch.Tensor | float = 0.0
        for coef, which in terms:
            if coef > 0:
                with torch.no_grad():
                    target, _ = self.model_fn(cond, None, 1.0, which)(x, t)
                out = out + coef * ((v - target) ** 2).flatten(1).mean(1).reshape(n, -1).mean(1)
        return out

    def forward_process_loss(self, batch: Batch, advantages: torch.Tensor) -> torch.Tensor:
        """DiffusionNFT (`mmrl.flow.nft_loss`) on the rollout's own clean samples, without CFG: the
        policy against its old copy (``nft_old_decay`` set) or against itself detached."""
        c = self.cfg
        cond = self.gen.encode(decode_text(batch["instruction"]))
        old = self.model_fn(cond, None, 1.0, "old") if c.nft_old_decay is not None else None
        seen: list = []
        loss = nft_loss(
            _recording(self.model_fn(cond, None, 1.0), seen),
            old,
            batch["flow_chain"][:, -1],
            advantages,
            beta=c.nft_beta,
            adv_max=c.nft_adv_max,
            num_timesteps=c.nft_timesteps,
            adaptive_weight=c.nft_adaptive_weight,
        )
        return loss + self._drift(cond, seen[0], len(loss), ((c.nft_ref_coef, "ref"),))

    def rebuilds_frozen_weights(self) -> bool:
        from mmrl.policies.diffusers_base import DiffusersGenerator

        return isinstance(self.gen, DiffusersGenerator)  # a pipeline's from_pretrained (not the tiny generator)

    def export_pretrained(self, folder, merge: bool = True) -> str:
        """SD3 / FLUX: diffusers' formats (the pipeline folder, LoRA fused; with ``merge=False`` a LoRA
        run's ``pytorch_lora_weights.safetensors``; `DiffusersGenerator.export_pretrained`); the
        built-in tiny generator: mmrl's safetensors (the default)."""
        from mmrl.policies.diffusers_base import DiffusersGenerator

        if isinstance(self.gen, DiffusersGenerator):
            return self.gen.export_pretrained(folder, merge=merge)
        return super().export_pretrained(folder, merge=merge)

    # ---- hooks the trainer calls --------------------------------------------------------------
    @torch.no_grad()
    def after_warm_start(self) -> None:
        """The reference and the EMA start from the warm-started (pretrained) generator."""
        if self.ref is not None:
            self.ref.load_state_dict(self.gen.state_dict())
        params = dict(self.gen.named_parameters())
        for which in _COPY_PREFIX:
            for k, e in self._copy_params(which).items():
                e.copy_(params[k].detach())

    @torch.no_grad()
    def after_step(self) -> None:
        """AWM's EMA follows every optimizer step."""
        self._follow("ema", self.cfg.ema_decay)

    @torch.no_grad()
    def sync_rollout(self) -> None:
        """DiffusionNFT's old policy moves once per iteration, after the update: it stays the policy
        the update's samples came from while the update runs."""
        super().sync_rollout()
        if self.cfg.nft_old_decay is not None:
            self._follow("old", self.cfg.nft_old_decay)

    def _follow(self, which: str, decay: float) -> None:
        """``copy <- decay copy + (1 - decay) weights`` for the copy ``which``."""
        params = dict(self.gen.named_parameters())
        for k, e in self._copy_params(which).items():
            e.mul_(decay).add_(params[k].detach(), alpha=1 - decay)


#: the diffusers pipelines the diffusion policy drives, by ``model_index.json``'s ``_class_name``
FAMILIES = {"FluxPipeline": "flux", "StableDiffusion3Pipeline": "sd3", "WanPipeline": "wan"}


def first_of_equal(keys: list[str]) -> torch.Tensor:
    """long ``[B]``: for each row, the first row with the same key (the prompt), e.g. a, b, a -> 0, 1, 0."""
    first: dict[str, int] = {}
    return torch.tensor([first.setdefault(k, i) for i, k in enumerate(keys)], dtype=torch.long)


def diffusers_family(model: str) -> str:
    """``"flux"``, ``"wan"`` or ``"sd3"``: a local folder's ``model_index.json`` decides, else the hub
    id's name (``flux`` or ``wan`` in it, any case; anything else SD3)."""
    index = Path(model) / "model_index.json"
    if index.exists():
        name = json.loads(index.read_text()).get("_class_name")
        if name not in FAMILIES:
            raise ValueError(f"{model} holds a {name}; the diffusion policy supports {sorted(FAMILIES)}")
        return FAMILIES[name]
    name = Path(model).name.lower()  # a hub id's repository name, or a folder's
    return "flux" if "flux" in name else "wan" if name.startswith("wan") else "sd3"


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Generated images ``[B, 3, H, W]`` (videos ``[B, F, 3, H, W]``) in [-1, 1] -> uint8
    ``[B, H, W, 3]`` (``[B, F, H, W, 3]``), -1 black and 1 white."""
    x = (images.movedim(-3, -1).float().clamp(-1, 1) + 1) * 127.5
    return x.round().to(torch.uint8).cpu()


def build_generator(cfg: DiffusionConfig) -> TextToImageGenerator:
    if cfg.model == "tiny":
        if cfg.num_frames:
            from mmrl.policies.tiny_video_generator import TinyTextToVideo

            return TinyTextToVideo(image_size=cfg.image_size, num_frames=cfg.num_frames, ch=cfg.width)
        from mmrl.policies.tiny_generator import TinyTextToImage

        return TinyTextToImage(image_size=cfg.image_size, ch=cfg.width)
    kwargs: dict[str, Any] = dict(
        image_size=cfg.image_size,
        finetune=cfg.finetune,
        lora_rank=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        dtype=getattr(torch, cfg.dtype),
        gradient_checkpointing=cfg.gradient_checkpointing,
    )
    if cfg.max_sequence_length is not None:
        kwargs["max_sequence_length"] = cfg.max_sequence_length
    gen = _diffusers_generator(cfg, kwargs)
    vae = gen.pipe.vae
    if cfg.vae_slicing:
        vae.enable_slicing()
    if cfg.vae_tiling:
        vae.enable_tiling()
    return gen


def _diffusers_generator(cfg: DiffusionConfig, kwargs: dict):
    family = diffusers_family(cfg.model)
    if family == "wan":  # all need mmrl[diffusion]
        from mmrl.policies.wan import WanGenerator

        return WanGenerator.from_pretrained(cfg.model, num_frames=cfg.num_frames, **kwargs)
    if cfg.num_frames:
        raise ValueError(f"policy.num_frames = {cfg.num_frames}, but {cfg.model} is a {family} image pipeline")
    if family == "flux":
        from mmrl.policies.flux import FluxGenerator

        return FluxGenerator.from_pretrained(cfg.model, guidance=cfg.flux_guidance, **kwargs)
    from mmrl.policies.sd3 import SD3Generator

    return SD3Generator.from_pretrained(cfg.model, **kwargs)
