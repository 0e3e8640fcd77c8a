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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mmrl.utils.compat import patch_torchvision


@dataclass(frozen=True)
class Arch:
    """A published architecture: ``library`` (transformers / diffusers), the model ``cls``, its config
    class ``config_cls`` (transformers) and the config fields; ``parts``: frozen pipeline components
    (diffusers: the text encoders and the VAE, under their ``model_index.json`` names), each an `Arch`
    of its own. A diffusers pipeline also names its ``pipeline`` class, its ``scheduler`` (class and
    the published ``scheduler_config.json`` fields) and ``pipeline_config``, the pipeline's own config
    arguments in ``model_index.json`` (Wan 2.2's ``expand_timesteps``): what
    `mmrl.planning.random_pipelines` writes a random-weight pipeline folder from."""

    library: str
    cls: str
    fields: dict[str, Any]
    config_cls: str | None = None
    parts: tuple[tuple[str, Arch], ...] = ()
    pipeline: str | None = None
    scheduler: tuple[str, dict[str, Any]] | None = None
    pipeline_config: dict[str, Any] = field(default_factory=dict)


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

#: HuggingFaceTB/SmolVLM2-500M-Video-Instruct (SmolVLA's VLM), config.json on the hub: text SmolLM2-360M
#: (32 layers of width 960, 15 heads with 5 kv heads, MLP 2560, vocab 49280, rope theta 1e5); the same
#: SigLIP vision tower, pixel shuffle and untied head as SmolVLM-256M (64 tokens per 512 px image).
_SMOLVLM2_500M = Arch(
    "transformers",
    "SmolVLMForConditionalGeneration",
    {
        **_SMOLVLM_256M.fields,
        "text_config": {
            **_SMOLVLM_256M.fields["text_config"],
            "hidden_size": 960,
            "intermediate_size": 2560,
            "num_hidden_layers": 32,
            "num_attention_heads": 15,
            "num_key_value_heads": 5,
        },
    },
    config_cls="SmolVLMConfig",
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
    pipeline="WanPipeline",
    # scheduler/scheduler_config.json: UniPC on flow sigmas shifted by 3.0 (480p; mmrl.policies.wan)
    scheduler=(
        "UniPCMultistepScheduler",
        {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 3.0, "num_train_timesteps": 1000},
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
    pipeline="WanPipeline",
    scheduler=(  # scheduler/scheduler_config.json: UniPC, flow_shift 5.0
        "UniPCMultistepScheduler",
        {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "flow_shift": 5.0, "num_train_timesteps": 1000},
    ),
    pipeline_config={"expand_timesteps": True},  # model_index.json: one timestep per latent token (TI2V)
)

#: CLIP ViT-L/14's text tower, as text_encoder/config.json of black-forest-labs/FLUX.1-schnell (the same
#: file as FLUX.1-dev's; read from a copy of the folder in github.com/edkamesh/FluX-optimized,
#: text_encoder/config.json): width 768, 12 layers of 12 heads, MLP 3072, quick_gelu, vocab 49408, 77
#: positions, projection 768, token ids bos 0 / eos 2 / pad 1 (transformers then pools at the highest id).
#: SD3's text_encoder is the same tower with its projection (CLIPTextModelWithProjection).
_CLIP_L_FIELDS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "hidden_act": "quick_gelu",
    "vocab_size": 49408,
    "max_position_embeddings": 77,
    "projection_dim": 768,
    "layer_norm_eps": 1e-5,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}

#: OpenCLIP ViT-bigG/14's text tower, SD3's text_encoder_2/config.json (the text config of
#: laion/CLIP-ViT-bigG-14-laion2B-39B-b160k, as SDXL's text_encoder_2): width 1280, 32 layers of 20 heads,
#: MLP 5120, gelu (not quick_gelu), projection 1280, token ids bos 0 / eos 2 / pad 1. The SD3.5 repositories
#: are gated: read from copies embedded in public repositories (found with the code search: an mflux SD3.5
#: port whose values were read off stabilityai's files, and copies of the laion text config).
_CLIP_G = Arch(
    "transformers",
    "CLIPTextModelWithProjection",
    {
        **_CLIP_L_FIELDS,
        "hidden_size": 1280,
        "intermediate_size": 5120,
        "num_hidden_layers": 32,
        "num_attention_heads": 20,
        "hidden_act": "gelu",
        "projection_dim": 1280,
    },
    config_cls="CLIPTextConfig",
)

#: google/t5-v1_1-xxl's encoder, as SD3's text_encoder_3/config.json and FLUX's text_encoder_2/config.json
#: (read from the FLUX.1-schnell copy, github.com/edkamesh/FluX-optimized text_encoder_2/config.json):
#: width 4096, 24 layers, 64 heads of 64, gated-GELU MLP 10240, vocab 32128, untied embeddings.
_T5_XXL = Arch(
    "transformers",
    "T5EncoderModel",
    {
        "d_model": 4096,
        "d_ff": 10240,
        "d_kv": 64,
        "num_heads": 64,
        "num_layers": 24,
        "vocab_size": 32128,
        "feed_forward_proj": "gated-gelu",
        "dense_act_fn": "gelu_new",
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "layer_norm_epsilon": 1e-6,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    },
    config_cls="T5Config",
)


def _image_vae(scaling: float, shift: float) -> Arch:
    """The 16-channel AutoencoderKL of SD3 and FLUX (vae/config.json: four levels of 128, 256, 512, 512
    channels, 2 layers per block, no quant convs); only the latent scaling / shift differ."""
    return Arch(
        "diffusers",
        "AutoencoderKL",
        {
            "in_channels": 3,
            "out_channels": 3,
            "down_block_types": ["DownEncoderBlock2D"] * 4,
            "up_block_types": ["UpDecoderBlock2D"] * 4,
            "block_out_channels": [128, 256, 512, 512],
            "layers_per_block": 2,
            "latent_channels": 16,
            "norm_num_groups": 32,
            "sample_size": 1024,
            "scaling_factor": scaling,
            "shift_factor": shift,
            "force_upcast": True,
            "use_quant_conv": False,
            "use_post_quant_conv": False,
        },
    )


#: stabilityai/stable-diffusion-3.5-medium (gated on the hub), transformer/config.json as copied in
#: public repositories (found with the code search; several agree field for field, among them an SD3.5
#: FP8 loader's embedded configs and an mflux SD3.5 port checked against the checkpoint's tensors):
#: MMDiT-X, 24 blocks of 24 heads x 64 (width 1536), the first 13 with dual attention, RMS qk-norm,
#: patch 2, 16 latent channels, T5 width 4096 and pooled CLIP 2048, a 384 x 384 positional table (a
#: 226M-element buffer: 2.24B parameters, 2.47B with it). Text encoders CLIP-L and CLIP-G with
#: projections and T5-XXL; vae/config.json: scaling 1.5305, shift 0.0609; scheduler/scheduler_config.json:
#: flow-matching Euler with a static shift of 3.0 over 1000 steps.
_SD35_MEDIUM = Arch(
    "diffusers",
    "SD3Transformer2DModel",
    {
        "sample_size": 128,
        "patch_size": 2,
        "in_channels": 16,
        "out_channels": 16,
        "num_layers": 24,
        "attention_head_dim": 64,
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,
        "caption_projection_dim": 1536,
        "pooled_projection_dim": 2048,
        "pos_embed_max_size": 384,
        "dual_attention_layers": list(range(13)),
        "qk_norm": "rms_norm",
    },
    parts=(
        ("text_encoder", Arch("transformers", "CLIPTextModelWithProjection", _CLIP_L_FIELDS, "CLIPTextConfig")),
        ("text_encoder_2", _CLIP_G),
        ("text_encoder_3", _T5_XXL),
        ("vae", _image_vae(1.5305, 0.0609)),
    ),
    pipeline="StableDiffusion3Pipeline",
    scheduler=("FlowMatchEulerDiscreteScheduler", {"num_train_timesteps": 1000, "shift": 3.0}),
)

#: black-forest-labs/FLUX.1-dev (gated), transformer/config.json: 19 double-stream and 38 single-stream
#: blocks of 24 heads x 128 (width 3072), in_channels 64 (16 latent channels in 2x2 patches), patch 1, T5
#: width 4096, pooled CLIP 768, the distilled guidance embedding, rotary axes [16, 56, 56] (11.9B
#: parameters); as the FLUX.1-schnell copy in github.com/edkamesh/FluX-optimized (transformer/config.json)
#: with guidance_embeds true, the one field dev's differs in (dev's own transformer config, guidance_embeds
#: true, is also embedded in several public repositories the code search finds). Text encoders CLIP-L
#: (pooled) and T5-XXL; the VAE's scaling 0.3611 / shift 0.1159 (vae/config.json, the same copy);
#: scheduler/scheduler_config.json: Euler with the resolution-dependent shift (base 0.5 at 256 packed
#: tokens to 1.15 at 4096), shift 3.0.
_FLUX1_DEV = Arch(
    "diffusers",
    "FluxTransformer2DModel",
    {
        "patch_size": 1,
        "in_channels": 64,
        "num_layers": 19,
        "num_single_layers": 38,
        "attention_head_dim": 128,
        "num_attention_heads": 24,
        "joint_attention_dim": 4096,
        "pooled_projection_dim": 768,
        "guidance_embeds": True,
        "axes_dims_rope": [16, 56, 56],
    },
    parts=(
        ("text_encoder", Arch("transformers", "CLIPTextModel", _CLIP_L_FIELDS, "CLIPTextConfig")),
        ("text_encoder_2", _T5_XXL),
        ("vae", _image_vae(0.3611, 0.1159)),
    ),
    pipeline="FluxPipeline",
    scheduler=(
        "FlowMatchEulerDiscreteScheduler",
        {
            "base_image_seq_len": 256,
            "base_shift": 0.5,
            "max_image_seq_len": 4096,
            "max_shift": 1.15,
            "num_train_timesteps": 1000,
            "shift": 3.0,
            "use_dynamic_shifting": True,
        },
    ),
)

ARCHITECTURES: dict[str, Arch] = {
    "Qwen/Qwen2.5-VL-3B-Instruct": _QWEN25_VL_3B,
    "Qwen/Qwen2.5-VL-7B-Instruct": _QWEN25_VL_7B,
    "HuggingFaceTB/SmolVLM-256M-Instruct": _SMOLVLM_256M,
    "HuggingFaceTB/SmolVLM2-500M-Video-Instruct": _SMOLVLM2_500M,
    "Wan-AI/Wan2.1-T2V-1.3B-Diffusers": _WAN21_T2V_1_3B,
    "Wan-AI/Wan2.2-TI2V-5B-Diffusers": _WAN22_TI2V_5B,
    "stabilityai/stable-diffusion-3.5-medium": _SD35_MEDIUM,
    "black-forest-labs/FLUX.1-dev": _FLUX1_DEV,
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


def count_buffers(module: nn.Module) -> int:
    """Elements of ``module``'s floating-point buffers (weights-like memory that is no parameter, e.g.
    SD3's positional table)."""
    return sum(b.numel() for b in module.buffers() if b.is_floating_point())


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
