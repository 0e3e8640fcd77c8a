"""FLUX.1 (diffusers) as an mmrl generator: LoRA (peft) or full fine-tuning.

``FluxGenerator.from_pretrained("black-forest-labs/FLUX.1-dev")`` loads the pipeline's
``FluxTransformer2DModel``, VAE (16 latent channels), CLIP text encoder (its pooled output is the
transformer's ``pooled_projections``) and T5 encoder (its hidden states, padded to
``max_sequence_length`` tokens, are the ``encoder_hidden_states``; 128 by default as for SD3, where
diffusers' pipeline pads to 512). Loading, freezing, LoRA (the
attention projections of the double-stream blocks, image and text side, and of the single-stream
blocks), the reference (adapter switched off) and the VAE side are shared with SD3 in
`mmrl.policies.diffusers_base`.

FLUX specifics, checked against diffusers' ``pipelines/flux/pipeline_flux.py``,
``models/transformers/transformer_flux.py`` and ``FlowMatchEulerDiscreteScheduler``:

- Same rectified flow as SD3 and `mmrl.flow`: the scheduler's ``scale_noise`` makes
  ``x_t = sigma * noise + (1 - sigma) * x0`` and its Euler ``step`` is
  ``x_next = x + (sigma_next - sigma) * v``, so ``v = noise - x0`` with ``t = sigma``.
- Time: the pipeline passes ``timestep / 1000`` (= sigma = t in [0, 1]) and the transformer
  multiplies by 1000 inside, so `forward` passes ``t`` itself (SD3 takes ``1000 t``).
- Guidance-distilled FLUX.1-dev (``guidance_embeds`` in the transformer config) takes a
  ``guidance`` tensor (the pipeline's ``guidance_scale``, default 3.5, one value per row; the
  transformer also scales it by 1000); FLUX.1-schnell has no guidance embedding and gets none.
  This is independent of the policy's classifier-free ``guidance_scale`` (diffusers'
  ``true_cfg_scale``, with the empty prompt as negative here).
- Latents are packed into 2x2 patches: ``[B, C, H, W] -> [B, H/2 * W/2, 4C]`` (`pack_latents`,
  as ``FluxPipeline._pack_latents``; `unpack_latents` inverts it). The sample space stays the
  unpacked ``[C, H/8, W/8]`` latent so the `mmrl.flow` samplers see a plain tensor; packing
  happens inside `forward`. Positions: ``img_ids`` ``[H/2 * W/2, 3]`` = (0, row, col) per patch
  (`latent_image_ids`, as ``_prepare_latent_image_ids``), ``txt_ids`` zeros ``[L, 3]``.
- Time grid: FLUX.1-dev's scheduler shifts sigmas by ``exp(mu) t / (1 + (exp(mu) - 1) t)``, with
  ``mu`` linear in the packed sequence length (``calculate_shift``); that is the SD3 shift with
  ``shift = exp(mu)`` (about 3.16 at 1024 px). `default_shift` gives the value for the configured
  size; set ``policy.shift`` to it to sample on diffusers' schedule.

Not covered: FLUX Kontext / Fill / ControlNet / IP-Adapter inputs (image conditioning), and
per-row guidance values.
"""

from __future__ import annotations

import math

import torch

from mmrl.policies.diffusers_base import DiffusersGenerator


def pack_latents(x: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W] -> [B, (H/2)(W/2), 4C]``: 2x2 patches, row-major, channels then (dy, dx)."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), 4 * c)


def unpack_latents(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of `pack_latents` for a latent of side ``h`` x ``w``."""
    b, _, d = x.shape
    return x.view(b, h // 2, w // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, d // 4, h, w)


def latent_image_ids(h2: int, w2: int, device=None, dtype=None) -> torch.Tensor:
    """Rotary position ids of the ``h2 x w2`` packed patches: rows ``(0, row, col)``, ``[h2 * w2, 3]``."""
    ids = torch.zeros(h2, w2, 3, device=device, dtype=dtype)
    ids[..., 1] = torch.arange(h2, device=device, dtype=dtype)[:, None]
    ids[..., 2] = torch.arange(w2, device=device, dtype=dtype)[None, :]
    return ids.reshape(h2 * w2, 3)


class FluxGenerator(DiffusersGenerator):
    """Wraps a diffusers `FluxPipeline`'s components (see the module docstring)."""

    pipeline_class = "FluxPipeline"

    def __init__(self, pipe, image_size: int, guidance: float = 3.5, **kwargs):
        super().__init__(pipe, image_size, **kwargs)
        self.guidance = guidance if pipe.transformer.config.guidance_embeds else None

    @staticmethod
    def latent_patch(pipe) -> int:
        return 2  # 2x2 packing (the transformer's own patch_size is 1)

    @property
    def default_shift(self) -> float:
        """The time shift of diffusers' FLUX schedule at this size (``exp(mu)``, or the scheduler's fixed shift)."""
        sc = self.pipe.scheduler.config
        if not sc.get("use_dynamic_shifting", False):
            return float(sc.get("shift", 1.0))
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        mu = calculate_shift(
            (self.latent_size // 2) ** 2,
            sc.get("base_image_seq_len", 256),  # packed tokens
            sc.get("max_image_seq_len", 4096),
            sc.get("base_shift", 0.5),
            sc.get("max_shift", 1.15),
        )
        return math.exp(mu)

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts -> (T5 embeds [B, L, D], CLIP pooled [B, P]) from the frozen text encoders."""
        embeds, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, device=self.device, max_sequence_length=self.max_sequence_length
        )
        return embeds, pooled

    def forward(self, x: torch.Tensor, t: torch.Tensor, cond) -> torch.Tensor:
        embeds, pooled = self._per_sample(cond, x.shape[0])
        b, _, h, w = x.shape
        dtype = self.transformer.dtype
        guidance = None if self.guidance is None else torch.full((b,), self.guidance, device=x.device, dtype=dtype)
        out = self.transformer(
            hidden_states=pack_latents(x.to(dtype)),
            timestep=t.to(dtype),
            guidance=guidance,
            encoder_hidden_states=embeds.to(dtype),
            pooled_projections=pooled.to(dtype),
            txt_ids=torch.zeros(embeds.shape[1], 3, device=x.device, dtype=dtype),
            img_ids=latent_image_ids(h // 2, w // 2, x.device, dtype),
            return_dict=False,
        )[0]
        return unpack_latents(out, h, w).to(x.dtype)
