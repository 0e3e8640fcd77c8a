"""Tiny random-weight Stable Diffusion 3 and FLUX pipelines built offline (the real diffusers classes).

SD3, sized like diffusers' own SD3 pipeline tests: a one-layer ``SD3Transformer2DModel``, a
one-level ``AutoencoderKL`` (latents at 1/1 resolution, 4 channels), two tiny
``CLIPTextModelWithProjection`` encoders and no T5 (diffusers then feeds zeros, as it allows), and a
``CLIPTokenizer`` whose vocabulary is the 256 byte symbols (each word splits into characters).

FLUX: a ``FluxTransformer2DModel`` with one double-stream and one single-stream block (with or
without the guidance embedding of FLUX.1-dev), a two-level ``AutoencoderKL`` (latents at 1/2
resolution, 16 channels, FLUX's scaling / shift factors), a tiny ``CLIPTextModel`` (pooled output)
with the same byte tokenizer, and a one-layer ``T5EncoderModel`` with a Unigram ``T5Tokenizer``
whose pieces are the printable ASCII characters (with and without the word-start mark).

``save_pretrained`` writes the standard pipeline folder, so ``from_pretrained(path)`` takes the
same code path as a hub id. Nothing is downloaded.
"""

from __future__ import annotations

import json
import string
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


def tiny_t5_encoder_kwargs(tok) -> dict:
    """The config of a one-layer T5-family text encoder (T5, UMT5) over tokenizer ``tok``."""
    return dict(
        vocab_size=len(tok),
        d_model=32,
        d_kv=8,
        d_ff=37,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    )


def tiny_sd3_pipeline(folder: str | Path, seed: int = 0, sample_size: int = 16) -> Path:
    """Build and save a tiny SD3 pipeline in ``folder``; returns the folder."""
    patch_torchvision()
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    folder = Path(folder)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(
        sample_size=sample_size,
        patch_size=1,
        in_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=32,
        pooled_projection_dim=64,
        out_channels=4,
    )
    tok = tiny_clip_tokenizer(folder / "_tokenizer")
    clip = dict(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        hidden_size=32,
        intermediate_size=37,
        layer_norm_eps=1e-5,
        num_attention_heads=4,
        num_hidden_layers=2,
        pad_token_id=tok.pad_token_id,
        vocab_size=len(tok),
        hidden_act="gelu",
        projection_dim=32,
    )
    text_encoder = CLIPTextModelWithProjection(CLIPTextConfig(**clip))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(**clip))
    vae = AutoencoderKL(
        sample_size=sample_size,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tok,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tok,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipe.save_pretrained(folder)
    return folder


def tiny_t5_tokenizer(folder: Path):
    """A T5 tokenizer (Unigram: pad, eos, unk, then single characters), saved in ``folder``."""
    from transformers import T5Tokenizer

    chars, mark = [c for c in string.printable if not c.isspace()], "\u2581"  # SentencePiece's word start
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), (mark, -2.0)]
    vocab += [(mark + c, -2.5) for c in chars] + [(c, -3.0) for c in chars]
    tok = T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=512)
    tok.save_pretrained(folder)
    return tok


def tiny_flux_pipeline(folder: str | Path, seed: int = 0, sample_size: int = 16, guidance_embeds: bool = True) -> Path:
    """Build and save a tiny FLUX pipeline in ``folder`` (``guidance_embeds``: FLUX.1-dev style, else
    schnell style); returns the folder."""
    patch_torchvision()
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    folder = Path(folder)
    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=(4, 4, 8),
    )
    tok = tiny_clip_tokenizer(folder / "_tokenizer")
    clip = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            hidden_size=32,
            intermediate_size=37,
            layer_norm_eps=1e-5,
            num_attention_heads=4,
            num_hidden_layers=2,
            pad_token_id=tok.pad_token_id,
            vocab_size=len(tok),
            hidden_act="gelu",
            projection_dim=32,
        )
    )
    tok_2 = tiny_t5_tokenizer(folder / "_tokenizer_2")
    t5 = T5EncoderModel(T5Config(**tiny_t5_encoder_kwargs(tok_2)))
    vae = AutoencoderKL(
        sample_size=sample_size,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4, 4),
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.1159,
        scaling_factor=0.3611,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=guidance_embeds,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe = FluxPipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=tok,
        text_encoder_2=t5,
        tokenizer_2=tok_2,
    )
    pipe.save_pretrained(folder)
    return folder
