"""A tiny random-weight Wan 2.1 / 2.2 text-to-video pipeline built offline (the real diffusers classes).

- ``WanTransformer3DModel``: one block (self-attention, cross-attention to the text, FFN), 2 heads of
  12 channels (the 3-D rotary embedding splits a head into frame / row / column parts of 4 each),
  patch ``(1, 2, 2)`` as every Wan checkpoint.
- ``AutoencoderKLWan``: a causal 3-D VAE with 4 latent channels and two down-sampling levels, both
  also temporal: ``scale_factor_spatial = 4``, ``scale_factor_temporal = 4`` (Wan 2.1: 8 and 4, 16
  channels; Wan 2.2 TI2V-5B: 16 and 4, 48 channels). Frames map as ``F -> (F - 1) / 4 + 1``: the
  first frame is encoded alone, then chunks of 4 (diffusers hard-codes the chunk of 4, so the
  temporal factor is kept at 4). ``latents_mean`` / ``latents_std`` are set away from 0 / 1, so a
  decoder that forgets Wan's per-channel latent normalisation is caught. So 16 x 16 px, 5 frames
  is a ``[4, 2, 4, 4]`` latent and 8 transformer tokens.
- ``UMT5EncoderModel`` (one layer) with the Unigram tokenizer of printable characters that the tiny
  FLUX pipeline uses for T5 (`mmrl.tiny.tiny_diffusers.tiny_t5_tokenizer`).
- ``FlowMatchEulerDiscreteScheduler(shift=3.0)``. Real Wan checkpoints ship
  ``UniPCMultistepScheduler`` with ``prediction_type="flow_prediction"``, ``use_flow_sigmas=True``
  and ``flow_shift`` 3.0 (480p) / 5.0 (720p): the same velocity and almost the same sigmas
  (``flow_shift``-shifted ``linspace(1, 1/1000, K + 1)[:-1]``, then 0, vs mmrl's shifted
  ``linspace(1, 0, K + 1)``), but a second-order multistep predictor-corrector solver, so mmrl's
  Euler ODE sampler matches it only as K grows, never step for step. The Euler scheduler here is
  one mmrl's sampler can match exactly (given its sigmas: its own default grid shifts twice; see
  tests/policies/test_wan.py).

``save_pretrained`` writes the standard pipeline folder, so ``WanPipeline.from_pretrained(path)`` takes
the same code path as a hub id. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmrl.tiny.tiny_diffusers import tiny_t5_encoder_kwargs, tiny_t5_tokenizer
from mmrl.utils.compat import patch_torchvision

#: the tiny VAE's per-channel latent statistics (Wan's VAE normalises latents per channel)
LATENTS_MEAN = [0.1, -0.2, 0.3, 0.0]
LATENTS_STD = [1.5, 0.5, 2.0, 1.0]


def tiny_wan_pipeline(folder: str | Path, seed: int = 0) -> Path:
    """Build and save a tiny ``WanPipeline`` in ``folder``; returns the folder."""
    patch_torchvision()
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    folder = Path(folder)
    torch.manual_seed(seed)
    channels = len(LATENTS_MEAN)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=channels,
        out_channels=channels,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=1,
        rope_max_seq_len=32,
    )
    vae = AutoencoderKLWan(
        base_dim=4,
        z_dim=channels,
        dim_mult=[1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[True, True],
        latents_mean=LATENTS_MEAN,
        latents_std=LATENTS_STD,
        scale_factor_spatial=4,  # declared, not derived: must match the two down-sampling levels
        scale_factor_temporal=4,
    )
    tok = tiny_t5_tokenizer(folder / "_tokenizer")
    text_encoder = UMT5EncoderModel(UMT5Config(**tiny_t5_encoder_kwargs(tok)))
    pipe = WanPipeline(
        tokenizer=tok,
        text_encoder=text_encoder,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=transformer,
    )
    pipe.save_pretrained(folder)
    return folder
