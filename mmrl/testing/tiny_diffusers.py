"""A tiny random-weight Stable Diffusion 3 pipeline built offline (the real diffusers classes).

Components sized like diffusers' own SD3 pipeline tests: a one-layer ``SD3Transformer2DModel``,
a one-level ``AutoencoderKL`` (latents at 1/1 resolution, 4 channels), two tiny
``CLIPTextModelWithProjection`` encoders and no T5 (diffusers then feeds zeros, as it allows), and a
``CLIPTokenizer`` whose vocabulary is the 256 byte symbols (each word splits into characters).
``save_pretrained`` writes the standard pipeline folder, so `SD3Generator.from_pretrained(path)`
takes the same code path as a hub id. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mmrl.utils.compat import patch_torchvision


def _byte_symbols() -> list[str]:
    """GPT-2 / CLIP byte-to-unicode table, in order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def tiny_clip_tokenizer(folder: Path):
    """A CLIPTokenizer over single byte symbols (plus their end-of-word forms), saved in ``folder``."""
    from transformers import CLIPTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    symbols = _byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols + [s + "</w>" for s in symbols])}
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77)
    tok.save_pretrained(folder)
    return tok


def tiny_sd3_pipeline(folder: str | Path, seed: int = 0, sample_size: int = 16) -> Path:
    """Build and save a tiny SD3 pipeline in ``folder``; returns the folder."""
    patch_torchvision()
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    folder = Path(folder)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=sample_size, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8,
        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64,
        out_channels=4)
    tok = tiny_clip_tokenizer(folder / "_tokenizer")
    clip = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, hidden_size=32, intermediate_size=37,
                layer_norm_eps=1e-5, num_attention_heads=4, num_hidden_layers=2, pad_token_id=tok.pad_token_id,
                vocab_size=len(tok), hidden_act="gelu", projection_dim=32)
    text_encoder = CLIPTextModelWithProjection(CLIPTextConfig(**clip))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**clip))
    vae = AutoencoderKL(sample_size=sample_size, in_channels=3, out_channels=3, block_out_channels=(4,),
                        layers_per_block=1, latent_channels=4, norm_num_groups=1, use_quant_conv=False,
                        use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
        text_encoder=text_encoder, tokenizer=tok, text_encoder_2=text_encoder_2, tokenizer_2=tok,
        text_encoder_3=None, tokenizer_3=None)
    pipe.save_pretrained(folder)
    return folder
