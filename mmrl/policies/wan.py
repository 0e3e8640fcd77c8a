"""Wan 2.1 / 2.2 text-to-video (diffusers ``WanPipeline``) as an mmrl generator: LoRA (peft) or full
fine-tuning of its ``WanTransformer3DModel``.

``WanGenerator.from_pretrained("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", image_size=480, num_frames=33)``
loads the transformer, the causal 3-D VAE (``AutoencoderKLWan``) and the UMT5 text encoder. Loading
(`DiffusersGenerator.from_pretrained`), freezing the text encoder and VAE, the reference (adapter
switched off), device moves and `export_pretrained` are the shared diffusers ones
(`mmrl.policies.diffusers_base`). Samples are video latents ``[C, F', H', W']``.

Wan specifics, checked against diffusers' ``pipelines/wan/pipeline_wan.py``,
``models/transformers/transformer_wan.py`` and ``models/autoencoders/autoencoder_kl_wan.py``:

- Same rectified flow as SD3 and `mmrl.flow`: ``x_t = sigma * noise + (1 - sigma) * x0``, the
  transformer's output is the velocity ``noise - x0`` that the scheduler's Euler step adds
  (``x + (sigma_next - sigma) * v``), so ``t = sigma`` and the output is used as is.
- Time: the scheduler's timesteps are ``1000 * sigma`` and the pipeline passes them unscaled (the
  transformer's sinusoidal embedding takes them as they are), so `forward` passes ``1000 t``, kept in
  float32 as the pipeline does (its time embedder is one of the modules diffusers keeps in fp32;
  bf16 would round ``1000 t`` to 3 significant digits).
- Prompts: UMT5 hidden states of ``max_sequence_length`` tokens (512 by default, as
  ``WanPipeline.__call__``; ``encode_prompt`` alone defaults to 226), computed with the attention
  mask, then zeroed after the prompt's own length (``_get_t5_prompt_embeds``; also its
  ``prompt_clean``: ftfy where installed, html unescaping, collapsed whitespace). The cross-attention
  has no mask, so the zero rows still count (the text embedder maps them to a constant): the padding
  length changes the velocity, and 512 is what Wan was trained with. The negative prompt of CFG is the
  empty prompt here (the policy's ``null``), where Wan's model cards use a long negative prompt.
- Latents: ``F' = (F - 1) / scale_factor_temporal + 1`` frames (the first video frame is encoded
  alone), ``H' = H / scale_factor_spatial``; Wan 2.1: factors 4 and 8, 16 channels; Wan 2.2
  TI2V-5B: 4 and 16, 48 channels. The VAE normalises per channel with ``latents_mean`` /
  ``latents_std`` (``z = (mu - mean) / std``), not SD3's scalar ``scaling_factor`` /
  ``shift_factor``; `decode` undoes it and returns frames ``[B, F, 3, H, W]`` in ``[-1, 1]``
  (diffusers' ``postprocess_video(output_type="pt")`` layout, in ``[0, 1]`` there).
- Time grid: real checkpoints ship ``UniPCMultistepScheduler`` (flow sigmas shifted by
  ``flow_shift``: 3.0 at 480p, 5.0 at 720p): `default_shift` reads it; mmrl's Euler sampler on
  ``time_grid(K, default_shift)`` follows the same probability-flow ODE on nearly the same sigmas,
  but UniPC is a second-order multistep solver, so the two agree only as K grows.
- LoRA: the self- and cross-attention projections of every block (`LORA_TARGETS`: ``attn1`` /
  ``attn2`` ``to_q``, ``to_k``, ``to_v``, ``to_out.0``); diffusers' ``WanLoraLoaderMixin`` loads the
  exported adapter.
- Wan 2.2 TI2V-5B's ``expand_timesteps`` (one timestep per latent token, for image conditioning of
  the first frame) is, for text-to-video, the same ``t`` on every token: the scalar timestep gives
  the same velocity (tests/policies/test_wan.py checks it).

Not covered: Wan 2.2 A14B's second transformer (``transformer_2``, the low-noise expert switched in
below ``boundary_ratio``; refused here), image-to-video / VACE conditioning. Wan's VAE and module
names differ from SD3's / FLUX's: `latent_geometry` and `lora_targets` say how.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mmrl.policies.diffusers_base import DiffusersGenerator

#: the attention projections given LoRA: self-attention (``attn1``) and text cross-attention
#: (``attn2``) of every block (peft matches them as name suffixes)
LORA_TARGETS = [f"{attn}.{proj}" for attn in ("attn1", "attn2") for proj in ("to_q", "to_k", "to_v", "to_out.0")]


def latent_frames(num_frames: int, temporal_factor: int) -> int:
    """Latent frames of a ``num_frames`` video: the first frame alone, then one per ``temporal_factor``."""
    if num_frames < 1 or (num_frames - 1) % temporal_factor:
        raise ValueError(f"num_frames must be 1 + a multiple of {temporal_factor}, got {num_frames}")
    return (num_frames - 1) // temporal_factor + 1


def latent_stats(vae_config, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The VAE's per-channel ``(mean, std)`` as ``[1, C, 1, 1, 1]`` tensors on ``like``'s device / dtype."""
    mean, std = (
        torch.tensor(s, device=like.device, dtype=like.dtype).view(1, -1, 1, 1, 1)
        for s in (vae_config.latents_mean, vae_config.latents_std)
    )
    return mean, std


class WanGenerator(DiffusersGenerator):
    """Wraps a diffusers `WanPipeline`'s components (see the module docstring)."""

    pipeline_class = "WanPipeline"

    def __init__(
        self,
        pipe,
        image_size: int,
        num_frames: int = 81,
        finetune: str = "lora",
        lora_rank: int = 32,
        lora_alpha: int = 64,
        max_sequence_length: int = 512,
        gradient_checkpointing: bool = False,
    ):
        if getattr(pipe, "transformer_2", None) is not None:
            raise NotImplementedError("Wan 2.2 A14B's two-expert pipeline (transformer_2) is not supported")
        self.latent_frames = latent_frames(num_frames, pipe.vae.config.scale_factor_temporal)
        super().__init__(pipe, image_size, finetune, lora_rank, lora_alpha, max_sequence_length, gradient_checkpointing)
        self.num_frames = num_frames

    @staticmethod
    def latent_geometry(pipe) -> tuple[int, int]:
        """Wan's video VAE: ``scale_factor_spatial`` and ``z_dim`` channels (the transformer takes
        them as they are for text-to-video)."""
        return pipe.vae.config.scale_factor_spatial, pipe.vae.config.z_dim

    @staticmethod
    def lora_targets(transformer) -> list[str]:
        return LORA_TARGETS

    @staticmethod
    def latent_patch(pipe) -> int:
        return pipe.transformer.config.patch_size[1]  # (frames, rows, columns); Wan's is (1, 2, 2)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (self.latent_channels, self.latent_frames, self.latent_size, self.latent_size)

    @property
    def default_shift(self) -> float:
        """The time shift of the pipeline's scheduler (UniPC's ``flow_shift``, Euler's ``shift``)."""
        sc = self.pipe.scheduler.config
        return float(sc.get("flow_shift", 1.0) if sc.get("use_flow_sigmas", False) else sc.get("shift", 1.0))

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor]:
        """Prompts -> (UMT5 embeds [B, L, D], zero after each prompt's tokens) from the frozen encoder."""
        embeds, _ = self.pipe.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return (embeds,)

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        (embeds,) = self._per_sample(cond, x.shape[0])
        dtype = self.transformer.dtype
        out = self.transformer(
            hidden_states=x.to(dtype),
            timestep=t.float() * 1000,
            encoder_hidden_states=embeds.to(dtype),
            return_dict=False,
        )[0]
        return out.to(x.dtype)

    def export_pretrained(self, folder, merge: bool = True) -> str:
        """`DiffusersGenerator.export_pretrained`, keeping the pipeline's ``expand_timesteps`` (Wan 2.2
        TI2V): the base rebuilds the pipeline from its components, and that flag is a pipeline
        config argument, not a component, so it would be written as False."""
        kind = super().export_pretrained(folder, merge)
        if kind == "diffusers":
            index = Path(folder) / "model_index.json"
            meta = json.loads(index.read_text())
            meta["expand_timesteps"] = bool(self.pipe.config.get("expand_timesteps", False))
            index.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        return kind

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, C, F', H', W']`` -> frames ``[B, F, 3, H, W]`` in ``[-1, 1]``."""
        vae = self.pipe.vae
        mean, std = latent_stats(vae.config, x0.to(vae.dtype))
        with torch.no_grad():
            video = vae.decode(x0.to(vae.dtype) * std + mean, return_dict=False)[0]  # [B, 3, F, H, W]
        return video.float().clamp(-1, 1).transpose(1, 2)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 videos ``[B, F, H, W, 3]`` -> latents (the VAE posterior mean, normalised per channel)."""
        vae = self.pipe.vae
        x = images.to(self.device).permute(0, 4, 1, 2, 3).to(vae.dtype).div(127.5).sub(1.0)
        z = vae.encode(x).latent_dist.mean
        mean, std = latent_stats(vae.config, z)
        return ((z - mean) / std).float()
