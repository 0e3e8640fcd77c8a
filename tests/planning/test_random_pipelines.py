"""`mmrl.planning.random_pipelines` writes a random-weight pipeline folder from a published `Arch`: tested
on scaled-down copies of the published SD3.5-medium, FLUX.1-dev and Wan 2.1 architectures (the same
classes, pipelines, schedulers and component names, few layers and small widths), which the diffusion
policy's own loading code then runs in bf16 (a real-size folder is never written in tests)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mmrl.planning import architectures as A
from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from mmrl.simulator import Observation

PROMPTS = ["a red circle on the left", "a red circle on the left", "two blue squares", "two blue squares"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _diffusers():
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()
    pytest.importorskip("diffusers", reason="the diffusers family needs mmrl[diffusion]")
    pytest.importorskip("peft", reason="LoRA needs peft")


def _small(hub_id: str, transformer: dict, parts: dict[str, dict]) -> A.Arch:
    """The published `Arch` of ``hub_id`` with some fields replaced (its transformer's, and its parts')."""
    arch = A.ARCHITECTURES[hub_id]
    small = tuple((n, dataclasses.replace(p, fields={**p.fields, **parts.get(n, {})})) for n, p in arch.parts)
    return dataclasses.replace(arch, fields={**arch.fields, **transformer}, parts=small)


CLIP = {
    "hidden_size": 32,
    "intermediate_size": 37,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "projection_dim": 32,
}
T5 = {"d_model": 64, "d_ff": 37, "d_kv": 8, "num_heads": 2, "num_layers": 1, "relative_attention_num_buckets": 8}
VAE = {
    "block_out_channels": [8, 8],
    "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2,
    "layers_per_block": 1,
    "norm_num_groups": 4,
}
SMALL = {
    "sd3": _small(
        "stabilityai/stable-diffusion-3.5-medium",
        {
            "num_layers": 2,
            "num_attention_heads": 2,
            "attention_head_dim": 8,
            "caption_projection_dim": 16,
            "joint_attention_dim": 64,
            "pooled_projection_dim": 64,
            "dual_attention_layers": [0],
            "pos_embed_max_size": 16,
            "sample_size": 8,
        },
        {"text_encoder": CLIP, "text_encoder_2": CLIP, "text_encoder_3": T5, "vae": VAE},
    ),
    "flux": _small(
        "black-forest-labs/FLUX.1-dev",
        {
            "num_layers": 1,
            "num_single_layers": 1,
            "num_attention_heads": 2,
            "attention_head_dim": 16,
            "joint_attention_dim": 64,
            "pooled_projection_dim": 32,
            "axes_dims_rope": [4, 4, 8],
        },
        {"text_encoder": CLIP, "text_encoder_2": T5, "vae": VAE},
    ),
    "wan": _small(
        "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
        {
            "num_attention_heads": 2,
            "attention_head_dim": 12,
            "text_dim": 64,
            "freq_dim": 32,
            "ffn_dim": 32,
            "num_layers": 1,
            "rope_max_seq_len": 32,
        },
        {"text_encoder": T5, "vae": {"base_dim": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1}},
    ),
}


@pytest.mark.parametrize("family", ["sd3", "flux", "wan"])
def test_written_folder_loads_and_trains_through_the_policy(family, tmp_path):
    from safetensors import safe_open

    from mmrl.planning.random_pipelines import write_random_pipeline

    arch = SMALL[family]
    folder = write_random_pipeline(arch, tmp_path / family, dtype=torch.bfloat16, seed=0)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == arch.pipeline and index["scheduler"] == ["diffusers", arch.scheduler[0]]
    assert {n: index[n] for n, _ in arch.parts} == {n: [p.library, p.cls] for n, p in arch.parts}
    for name, _ in (("transformer", arch), *arch.parts):  # every weight written in bf16
        for file in (folder / name).glob("*.safetensors"):
            with safe_open(file, "pt") as f:
                assert {f.get_slice(k).get_dtype() for k in f.keys()} <= {"BF16"}, (name, file)
    transformer, parts = A.diffusers_parts(str(folder))  # the folder holds the Arch's sizes, part for part
    assert A.count(transformer) == A.count(A.build_meta(arch))
    assert {n: A.count(m) for n, m in parts.items()} == {n: A.count(A.build_meta(p)) for n, p in arch.parts}
    if family == "wan":
        assert index["transformer_2"] == [None, None]  # the A14B expert, absent as save_pretrained writes it
    frames = {"num_frames": 5} if family == "wan" else {}
    cfg = DiffusionConfig(
        model=str(folder),
        image_size=16,
        num_steps=2,
        lora_rank=4,
        lora_alpha=8,
        dtype="bfloat16",
        gradient_checkpointing=True,
        max_sequence_length=16,
        **frames,
    )
    torch.manual_seed(0)
    pol = DiffusionPolicy(cfg, 16 * 16 * 3)
    assert type(pol.gen.pipe).__name__ == arch.pipeline
    assert type(pol.gen.pipe.scheduler).__name__ == arch.scheduler[0]
    assert pol.gen.transformer.is_gradient_checkpointing
    size = (5, 16, 16, 3) if family == "wan" else (16, 16, 3)
    obs = Observation(torch.zeros(4, *size, dtype=torch.uint8), PROMPTS)
    batch, media = pol.rollout(obs, torch.Generator().manual_seed(0))
    assert media.shape == (4, *size) and torch.isfinite(batch["old_logp"]).all()
    out = pol.evaluate(batch)
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-4)  # ratio 1 before an update
    out.logp.sum().backward()
    assert all(p.grad is not None for n, p in pol.named_parameters() if "lora_B" in n)


def test_cli_and_unknown_names(tmp_path, capsys):
    from mmrl.planning.random_pipelines import main, write_random_pipeline

    with pytest.raises(ValueError, match="not a published pipeline"):
        write_random_pipeline("someone/unknown", tmp_path / "x")
    with pytest.raises(ValueError, match="not a diffusers pipeline"):
        write_random_pipeline(A.ARCHITECTURES["Qwen/Qwen2.5-VL-3B-Instruct"], tmp_path / "x")
    with pytest.raises(SystemExit):
        main(["someone/unknown", str(tmp_path / "x")])
    assert "stabilityai/stable-diffusion-3.5-medium" in capsys.readouterr().err
