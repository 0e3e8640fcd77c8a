"""Parameter counts of the memory plan (`mmrl.planning.architectures`, built on meta) equal those of
the real classes instantiated for real: tiny configs of the same classes, and the LoRA adapters peft
actually adds."""

import pytest
import torch

from mmrl.planning import architectures as A
from mmrl.utils.compat import patch_torchvision

patch_torchvision()


def real_count(model: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def test_published_arch_builds_the_real_class_on_meta():
    """An `Arch` entry is built by the real class; a small one built for real counts the same."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    small = A.Arch(
        "transformers",
        "Qwen2_5_VLForConditionalGeneration",
        {
            "text_config": {
                "hidden_size": 32,
                "intermediate_size": 48,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 100,
                "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6},
            },
            "vision_config": {
                "depth": 2,
                "hidden_size": 16,
                "intermediate_size": 24,
                "num_heads": 2,
                "out_hidden_size": 32,
                "fullatt_block_indexes": [1],
            },
            "vocab_size": 100,
        },
        config_cls="Qwen2_5_VLConfig",
    )
    meta = A.build_meta(small)
    assert next(meta.parameters()).is_meta
    real = Qwen2_5_VLForConditionalGeneration(meta.config)
    assert A.count(meta) == real_count(real)


@pytest.mark.parametrize("name", [n for n, a in A.ARCHITECTURES.items() if a.library == "transformers"])
def test_published_sizes(name):
    """The table's checkpoints have their published sizes (Qwen2.5-VL-3B: 3.75B, -7B: 8.29B,
    SmolVLM-256M: 256M, SmolVLM2-500M: 507M)."""
    expect = {
        "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
        "Qwen/Qwen2.5-VL-7B-Instruct": 8_292_166_656,
        "HuggingFaceTB/SmolVLM-256M-Instruct": 256_484_928,
        "HuggingFaceTB/SmolVLM2-500M-Video-Instruct": 507_482_304,
    }
    assert A.count(A.build_meta(A.ARCHITECTURES[name])) == expect[name]


def test_local_transformers_folder_and_lora_match_the_real_model(tmp_path):
    """A local checkpoint folder's config.json on meta counts what the saved model holds, and the
    LoRA count equals the parameters peft adds with the VLM policy's own targets."""
    from mmrl.policies.vlm import VLMConfig, add_lora, lora_targets
    from mmrl.tiny.tiny_qwen_vl import tiny_qwen_vl_model

    real, _ = tiny_qwen_vl_model(tmp_path)
    meta = A.meta_transformers(A.transformers_arch(str(tmp_path)))
    assert A.count(meta) == real_count(real)
    cfg = VLMConfig(model="tiny-qwen2.5-vl", finetune="lora", lora_rank=4)
    expect = A.lora_count(meta, lora_targets(meta, False), 4)
    adapted = add_lora(real, cfg)
    assert expect == real_count(adapted, trainable_only=True) > 0


def test_diffusers_folder_and_lora_match_the_real_pipeline(tmp_path):
    """A local Wan pipeline folder: transformer, text encoder and VAE on meta count what the loaded
    pipeline holds; the LoRA count equals what the Wan generator's adapter adds."""
    pytest.importorskip("diffusers", reason="the diffusers family needs mmrl[diffusion]")
    from mmrl.policies.wan import WanGenerator
    from mmrl.tiny.tiny_wan import tiny_wan_pipeline

    folder = tiny_wan_pipeline(tmp_path / "wan")
    transformer, parts = A.diffusers_parts(str(folder))
    gen = WanGenerator.from_pretrained(str(folder), image_size=16, num_frames=5, lora_rank=4)
    pipe = gen.pipe
    assert {k: A.count(v) for k, v in parts.items()} == {
        "text_encoder": real_count(pipe.text_encoder),
        "vae": real_count(pipe.vae),
    }
    lora = A.lora_count(transformer, WanGenerator.lora_targets(transformer), 4, suffix=True)
    assert lora == real_count(gen.transformer, trainable_only=True) > 0
    assert A.count(transformer) + lora == real_count(gen.transformer)


def test_unknown_checkpoint_names_the_fix():
    with pytest.raises(ValueError, match="ARCHITECTURES"):
        A.transformers_arch("someone/unknown-model")


def test_lora_count_of_rectangular_layers_matches_peft():
    """peft's A (rank x in) and B (out x rank) on layers whose in and out widths differ."""
    from peft import LoraConfig, get_peft_model

    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 11))
    expect = A.lora_count(net, ["0", "2"], 2)
    assert expect == 2 * (3 + 5) + 2 * (5 + 11)
    adapted = get_peft_model(net, LoraConfig(r=2, target_modules=["0", "2"]))
    assert real_count(adapted, trainable_only=True) == expect


def test_published_diffusers_sizes():
    """SD3.5-medium's and FLUX.1-dev's published architectures, built on meta by the real classes, have
    their published sizes: the SD3.5-medium transformer 2.47B tensors (2.24B parameters and its
    226M-element positional table, a buffer), the FLUX.1-dev transformer 11.9B, T5-XXL's encoder 4.76B,
    CLIP-G's text tower 0.69B, CLIP-L's 0.12B, the 16-channel VAE 84M."""
    pytest.importorskip("diffusers", reason="the diffusers family needs mmrl[diffusion]")
    sd3, flux = (
        A.ARCHITECTURES[n] for n in ("stabilityai/stable-diffusion-3.5-medium", "black-forest-labs/FLUX.1-dev")
    )
    transformer = A.build_meta(sd3)
    assert A.count(transformer) == 2_243_171_520 and A.count_buffers(transformer) == 384 * 384 * 1536
    assert round((A.count(transformer) + A.count_buffers(transformer)) / 1e9, 2) == 2.47
    assert A.count(A.build_meta(flux)) == 11_901_408_320
    parts = {name: A.count(A.build_meta(arch)) for name, arch in sd3.parts}
    assert parts == {
        "text_encoder": 123_650_304,  # CLIP-L with its projection
        "text_encoder_2": 694_659_840,  # CLIP-G with its projection
        "text_encoder_3": 4_762_310_656,  # T5-XXL's encoder
        "vae": 83_819_683,
    }
    assert {name: A.count(A.build_meta(arch)) for name, arch in flux.parts} == {
        "text_encoder": 123_060_480,  # CLIP-L (pooled output, no projection)
        "text_encoder_2": 4_762_310_656,
        "vae": 83_819_683,
    }
    assert (sd3.pipeline, flux.pipeline) == ("StableDiffusion3Pipeline", "FluxPipeline")
