"""Published architectures of the hub checkpoints mmrl's configs name, and model skeletons built from
them on torch's meta device (no weights, no download), so parameter counts are those of the real
classes.

`ARCHITECTURES` maps a hub id to its library, class and the architecture fields of its published
``config.json`` (copied from the checkpoint's own config.json on the Hugging Face hub as published; the
fields not listed are the class's defaults, which match those checkpoints). A local folder with a
``config.json`` is read instead (`meta_model`). Add a checkpoint by adding its entry here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmrl.utils.compat import patch_torchvision


@dataclass(frozen=True)
class Arch:
    """A published architecture: ``library`` (transformers / diffusers), the model ``cls``, its config
    class ``config_cls`` (transformers) and the config fields; ``parts``: frozen pipeline components
    (diffusers: the text encoder and the VAE), each an `Arch` of its own."""

    library: str
    cls: str
    fields: dict[str, Any]
    config_cls: str | None = None
    parts: tuple[tuple[str, Arch], ...] = ()


#: Qwen/Qwen2.5-VL-3B-Instruct, config.json on the hub: text 36 layers of width 2048, 16 heads with
#: 2 kv heads (head_dim 128), MLP 11008, vocab 151936, tied embeddings; vision tower 32 blocks of
#: width 1280, 16 heads, MLP 3420, patch 14, temporal patch 2, 2x2 merge into 2048.
_QWEN25_VL_3B = Arch(
    "transformers",
    "Qwen2_5_VLForConditionalGeneration",
    {
        "text_config": {
            "hidden_size": 2048,
            "intermediate_size": 11008,
            "num_hidden_layers": 36,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 128000,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
        },
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 2048,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    config_cls="Qwen2_5_VLConfig",
)

#: Qwen/Qwen2.5-VL-7B-Instruct, config.json on the hub: text 28 layers of width 3584, 28 heads with
#: 4 kv heads (head_dim 128), MLP 18944, vocab 152064, untied head; the 3B's vision tower, merged into 3584.
_QWEN25_VL_7B = Arch(
    "transformers",
    "Qwen2_5_VLForConditionalGeneration",
    {
        "text_config": {
            **_QWEN25_VL_3B.fields["text_config"],
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "vocab_size": 152064,
            "tie_word_embeddings": False,
        },
        "vision_config": {**_QWEN25_VL_3B.fields["vision_config"], "out_hidden_size": 3584},
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    config_cls="Qwen2_5_VLConfig",
)

#: HuggingFaceTB/SmolVLM2-500M-Video-Instruct (SmolVLA's VLM), config.json on the hub: text SmolLM2-360M
#: (32 layers of width 960, 15 heads with 5 kv heads, MLP 2560, vocab 49280, rope theta 1e5); SigLIP
#: base vision 12 layers of width 768, 512 px in patches of 16; pixel shuffle 4 (64 tokens per image).
_SMOLVLM2_500M = Arch(
    "transformers",
    "SmolVLMForConditionalGeneration",
    {
        "text_config": {
            "model_type": "llama",
            "hidden_size": 960,
            "intermediate_size": 2560,
            "num_hidden_layers": 32,
            "num_attention_heads": 15,
            "num_key_value_heads": 5,
            "vocab_size": 49280,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "image_size": 512,
            "patch_size": 16,
        },
        "scale_factor": 4,
        "vocab_size": 49280,
        "tie_word_embeddings": False,
    },
    config_cls="SmolVLMConfig",
)

#: HuggingFaceTB/SmolVLM-256M-Instruct, config.json on the hub (Idefics3): text 30 layers of width
#: 576, 9 heads with 3 kv heads, MLP 1536, vocab 49280, untied head; SigLIP vision 12 layers of width
#: 768, 12 heads, MLP 3072, 512 px in patches of 16; pixel shuffle scale factor 4.
_SMOLVLM_256M = Arch(
    "transformers",
    "Idefics3ForConditionalGeneration",
    {
        "text_config": {
            "model_type": "llama",
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "vocab_size": 49280,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "hidden_size": 768,
            "intermediate_size": 3072,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "image_size": 512,
            "patch_size": 16,
        },
        "scale_factor": 4,
        "vocab_size": 49280,
        "tie_word_embeddings": False,
    },
    config_cls="Idefics3Config",
)

#: Wan-AI/Wan2.1-T2V-1.3B-Diffusers and Wan-AI/Wan2.2-TI2V-5B-Diffusers: text_encoder/config.json
#: (UMT5-XXL encoder: width 4096, 24 layers, 64 heads of 64, gated-GELU MLP 10240, vocab 256384).
_UMT5_XXL = Arch(
    "transformers",
    "UMT5EncoderModel",
    {
        "d_model": 4096,
        "d_ff": 10240,
        "d_kv": 64,
        "num_heads": 64,
        "num_layers": 24,
        "vocab_size": 256384,
        "feed_forward_proj": "gated-gelu",
        "relative_attention_num_buckets": 32,
    },
    config_cls="UMT5Config",
)

#: Wan-AI/Wan2.1-T2V-1.3B-Diffusers, transformer/config.json (12 heads of 128 = width 1536, 30 blocks,
#: FFN 8960, 16 latent channels, patch (1, 2, 2), text width 4096) and vae/config.json (AutoencoderKLWan
#: defaults: base_dim 96, z_dim 16).
_WAN21_T2V_1_3B = Arch(
    "diffusers",
    "WanTransformer3DModel",
    {
        "patch_size": [1, 2, 2],
        "num_attention_heads": 12,
        "attention_head_dim": 128,
        "in_channels": 16,
        "out_channels": 16,
        "text_dim": 4096,
        "freq_dim": 256,
        "ffn_dim": 8960,
        "num_layers": 30,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "eps": 1e-6,
    },
    parts=(
        ("text_encoder", _UMT5_XXL),
        ("vae", Arch("diffusers", "AutoencoderKLWan", {"base_dim": 96, "z_dim": 16})),
    ),
)

#: Wan-AI/Wan2.2-TI2V-5B-Diffusers, transformer/config.json (24 heads of 128 = width 3072, 30 blocks,
#: FFN 14336, 48 latent channels) and vae/config.json (the Wan 2.2 VAE: base_dim 160, decoder_base_dim
#: 256, z_dim 48, 12 input channels after its 2x2 patching, residual, 16x spatial compression).
_WAN22_TI2V_5B = Arch(
    "diffusers",
    "WanTransformer3DModel",
    {**_WAN21_T2V_1_3B.fields, "num_attention_heads": 24, "in_channels": 48, "out_channels": 48, "ffn_dim": 14336},
    parts=(
        ("text_encoder", _UMT5_XXL),
        (
            "vae",
            Arch(
                "diffusers",
                "AutoencoderKLWan",
                {
                    "base_dim": 160,
                    "decoder_base_dim": 256,
                    "z_dim": 48,
                    "in_channels": 12,
                    "out_channels": 12,
                    "patch_size": 2,
                    "is_residual": True,
                    "scale_factor_spatial": 16,
                    "scale_factor_temporal": 4,
                },
            ),
        ),
    ),
)

ARCHITECTURES: dict[str, Arch] = {
    "Qwen/Qwen2.5-VL-3B-Instruct": _QWEN25_VL_3B,
    "Qwen/Qwen2.5-VL-7B-Instruct": _QWEN25_VL_7B,
    "HuggingFaceTB/SmolVLM-256M-Instruct": _SMOLVLM_256M,
    "HuggingFaceTB/SmolVLM2-500M-Video-Instruct": _SMOLVLM2_500M,
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": _WAN21_T2V_1_3B,
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": _WAN22_TI2V_5B,
}


def _unknown(name: str, key: str) -> ValueError:
    return ValueError(
        f"{key} = {name!r} is neither a local folder with a config.json nor a checkpoint whose published "
        f"architecture mmrl knows ({', '.join(ARCHITECTURES)}): point {key} at a local copy, or add its "
        "config.json fields to mmrl.planning.architectures.ARCHITECTURES"
    )


def build_meta(arch: Arch) -> nn.Module:
    """The model of ``arch`` on the meta device (shapes only, nothing allocated)."""
    patch_torchvision()  # a broken torchvision install would otherwise break transformers imports
    if arch.library == "transformers":
        import transformers

        config = getattr(transformers, arch.config_cls or "AutoConfig")(**arch.fields)
        with torch.device("meta"):
            return getattr(transformers, arch.cls)(config)
    import diffusers

    with torch.device("meta"):
        return getattr(diffusers, arch.cls)(**arch.fields)


def transformers_arch(name: str, key: str = "policy.model") -> Arch:
    """The transformers `Arch` of a hub id in `ARCHITECTURES`, or of a local folder's config.json."""
    local = Path(name) / "config.json"
    if local.is_file():
        fields = json.loads(local.read_text())
        classes = fields.get("architectures") or []
        if not classes:
            raise ValueError(f"{key} = {name!r}: its config.json names no architectures class")
        return Arch("transformers", classes[0], fields, config_cls=None)
    if name in ARCHITECTURES and ARCHITECTURES[name].library == "transformers":
        return ARCHITECTURES[name]
    raise _unknown(name, key)


def meta_transformers(arch: Arch) -> nn.Module:
    """A transformers model on meta: from a published `Arch`, or a local config.json (AutoConfig)."""
    if arch.config_cls is not None:
        return build_meta(arch)
    patch_torchvision()
    import transformers

    fields = dict(arch.fields)
    config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        return getattr(transformers, arch.cls)(config)


def diffusers_parts(name: str, key: str = "policy.model") -> tuple[nn.Module, dict[str, nn.Module]]:
    """A diffusers pipeline's transformer and its frozen parts (text encoder, VAE), all on meta: from a
    local pipeline folder (each component's config.json) or a published `Arch`."""
    folder = Path(name)
    if (folder / "model_index.json").is_file():
        index = json.loads((folder / "model_index.json").read_text())
        built: dict[str, nn.Module] = {}
        for part, spec in index.items():
            cfg_file = folder / part / "config.json"
            if not (isinstance(spec, list) and spec[0] in ("diffusers", "transformers") and cfg_file.is_file()):
                continue
            fields = json.loads(cfg_file.read_text())
            if spec[0] == "diffusers":
                fields = {k: v for k, v in fields.items() if not k.startswith("_")}
                built[part] = build_meta(Arch("diffusers", spec[1], fields))
            else:
                built[part] = meta_transformers(Arch("transformers", spec[1], fields))
        if "transformer" not in built:
            raise ValueError(f"{key} = {name!r}: its model_index.json names no transformer with a config.json")
        return built.pop("transformer"), built
    arch = ARCHITECTURES.get(name)
    if arch is None or arch.library != "diffusers":
        raise _unknown(name, key)
    return build_meta(arch), {part: build_meta(sub) for part, sub in arch.parts}


def count(module: nn.Module, trainable_only: bool = False) -> int:
    """Parameters of ``module`` (each shared tensor once), all or those that require grad."""
    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def lora_count(module: nn.Module, names: list[str], rank: int, suffix: bool = False) -> int:
    """Parameters peft's LoRA adds at ``rank`` on the linear layers ``names`` (full module names, or
    with ``suffix`` names matched as suffixes, as peft matches ``target_modules``):
    ``rank x (in_features + out_features)`` each (A and B, no bias)."""
    wanted = set(names)
    total = 0
    for name, mod in module.named_modules():
        if not isinstance(mod, nn.Linear):
            continue
        hit = any(name == n or name.endswith("." + n) for n in wanted) if suffix else name in wanted
        if hit:
            total += rank * (mod.in_features + mod.out_features)
    return total
