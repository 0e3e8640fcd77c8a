"""Stable Diffusion 3 / 3.5 (diffusers) as an mmrl generator: LoRA (peft) or full fine-tuning.

``SD3Generator.from_pretrained("stabilityai/stable-diffusion-3.5-medium")`` loads the pipeline's
``SD3Transformer2DModel``, VAE and text encoders (CLIP-L, CLIP-G, T5; a pipeline saved without T5
works, as diffusers allows). Only the transformer is trained: with ``finetune="lora"`` a peft
adapter (rank ``lora_rank`` on the attention projections, as Flow-GRPO does) and the reference
model is the same transformer with the adapter switched off (`disable_adapter`); with ``"full"``
every transformer weight trains. Text encoders and VAE are frozen.

Conventions match `mmrl.flow`: diffusers' SD3 flow matching uses ``x_t = t * noise + (1 - t) * x0``
and predicts ``v = noise - x0`` with ``timestep = 1000 * t``. Samples live in the VAE latent space
(``[16, H/8, W/8]`` for SD3); `decode` maps latents to images in ``[-1, 1]`` with the VAE's
``scaling_factor`` / ``shift_factor``.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from torch import nn

from mmrl.utils.compat import patch_torchvision

LORA_TARGETS = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out"]


class SD3Generator(nn.Module):
    """Wraps a diffusers `StableDiffusion3Pipeline`'s components (see the module docstring)."""

    def __init__(self, pipe, image_size: int, finetune: str = "lora", lora_rank: int = 32, lora_alpha: int = 64,
                 max_sequence_length: int = 128):
        super().__init__()
        factor = 2 ** (len(pipe.vae.config.block_out_channels) - 1)
        patch = pipe.transformer.config.patch_size
        if image_size % (factor * patch):
            raise ValueError(f"image_size {image_size} must be a multiple of {factor * patch} for this pipeline")
        self.pipe = pipe  # not a submodule: the text encoders and the VAE stay out of the state dict
        self.transformer = pipe.transformer
        for m in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3):
            if m is not None:
                m.requires_grad_(False)
        self.finetune = finetune
        if finetune == "lora":
            from peft import LoraConfig

            self.transformer.requires_grad_(False)
            targets = sorted({name.split("transformer_blocks.")[-1].split(".", 1)[-1]
                              for name, _ in self.transformer.named_modules()
                              if any(name.endswith(t) for t in LORA_TARGETS)})
            self.transformer.add_adapter(LoraConfig(r=lora_rank, lora_alpha=lora_alpha, init_lora_weights="gaussian",
                                                    target_modules=targets))
        elif finetune == "full":
            self.transformer.requires_grad_(True)
        else:
            raise ValueError(f"finetune must be 'lora' or 'full', got {finetune!r}")
        self.latent_channels = pipe.transformer.config.in_channels
        self.latent_size = image_size // factor
        self.max_sequence_length = max_sequence_length
        self.has_adapter = finetune == "lora"  # else the policy keeps a frozen copy as its reference

    @classmethod
    def from_pretrained(cls, name_or_path: str, image_size: int = 512, dtype: torch.dtype | None = None,
                        **kwargs) -> "SD3Generator":
        patch_torchvision()
        try:
            from diffusers import StableDiffusion3Pipeline
        except ImportError as exc:
            raise ImportError("the SD3 generator needs diffusers: pip install 'mmrl[diffusion]'") from exc
        index = Path(name_or_path) / "model_index.json"
        absent = {}  # components a local folder saved as null (e.g. no T5) must be passed as None
        if index.exists():
            absent = {k: None for k, v in json.loads(index.read_text()).items()
                      if isinstance(v, list) and v == [None, None]}
        pipe = StableDiffusion3Pipeline.from_pretrained(name_or_path, torch_dtype=dtype, **absent)
        return cls(pipe, image_size, **kwargs)

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (self.latent_channels, self.latent_size, self.latent_size)

    def _apply(self, fn, *args, **kwargs):  # .to(device) moves the frozen pipeline parts too
        for m in (self.pipe.vae, self.pipe.text_encoder, self.pipe.text_encoder_2, self.pipe.text_encoder_3):
            if m is not None:
                m._apply(fn, *args, **kwargs)
        return super()._apply(fn, *args, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts -> (prompt_embeds [B, L, D], pooled [B, P]) from the frozen text encoders."""
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, prompt_3=prompts, device=self.device,
            do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length)
        return embeds, pooled

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        embeds, pooled = cond
        reps = x.shape[0] // embeds.shape[0]
        if reps > 1:
            embeds, pooled = embeds.repeat_interleave(reps, 0), pooled.repeat_interleave(reps, 0)
        dtype = self.transformer.dtype
        out = self.transformer(hidden_states=x.to(dtype), timestep=(t * 1000).to(dtype),
                               encoder_hidden_states=embeds.to(dtype), pooled_projections=pooled.to(dtype),
                               return_dict=False)[0]
        return out.to(x.dtype)

    @contextlib.contextmanager
    def disable_adapter(self):
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self.transformer.enable_adapters()

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        z = x0.to(vae.dtype) / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        with torch.no_grad():
            return vae.decode(z, return_dict=False)[0].float().clamp(-1, 1)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, H, W, 3] -> latents (the VAE posterior mean, scaled and shifted)."""
        vae = self.pipe.vae
        x = images.to(self.device).permute(0, 3, 1, 2).to(vae.dtype).div(127.5).sub(1.0)
        z = vae.encode(x).latent_dist.mean
        return ((z - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor).float()
