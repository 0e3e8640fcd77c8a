"""Stable Diffusion 3 / 3.5 (diffusers) as an mmrl generator: LoRA (peft) or full fine-tuning.

``SD3Generator.from_pretrained("stabilityai/stable-diffusion-3.5-medium")`` loads the pipeline's
``SD3Transformer2DModel``, VAE and text encoders (CLIP-L, CLIP-G, T5; a pipeline saved without T5
works, as diffusers allows). Only the transformer is trained: with ``finetune="lora"`` a peft
adapter (rank ``lora_rank`` on the attention projections, as Flow-GRPO does) and the reference
model is the same transformer with the adapter switched off (`disable_adapter`); with ``"full"``
every transformer weight trains. Text encoders and VAE are frozen. Loading, freezing, LoRA, the
reference and the VAE side are shared with FLUX in `mmrl.policies.diffusers_base`.

Conventions match `mmrl.flow`: diffusers' SD3 flow matching uses ``x_t = t * noise + (1 - t) * x0``
and predicts ``v = noise - x0`` with ``timestep = 1000 * t``. Samples live in the VAE latent space
(``[16, H/8, W/8]`` for SD3); `decode` maps latents to images in ``[-1, 1]`` with the VAE's
``scaling_factor`` / ``shift_factor``.
"""

from __future__ import annotations

import torch

from mmrl.policies.diffusers_base import LORA_TARGETS, DiffusersGenerator

__all__ = ["SD3Generator", "LORA_TARGETS"]


class SD3Generator(DiffusersGenerator):
    """Wraps a diffusers `StableDiffusion3Pipeline`'s components (see the module docstring)."""

    pipeline_class = "StableDiffusion3Pipeline"

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts -> (prompt_embeds [B, L, D], pooled [B, P]) from the frozen text encoders."""
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts,
            prompt_2=prompts,
            prompt_3=prompts,
            device=self.device,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return embeds, pooled

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        embeds, pooled = self._per_sample(cond, x.shape[0])
        dtype = self.transformer.dtype
        out = self.transformer(
            hidden_states=x.to(dtype),
            timestep=(t * 1000).to(dtype),
            encoder_hidden_states=embeds.to(dtype),
            pooled_projections=pooled.to(dtype),
            return_dict=False,
        )[0]
        return out.to(x.dtype)
