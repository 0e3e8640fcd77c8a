"""The memory plan of a diffusers generator (`mmrl.planning.estimate.diffusion_workload`) honours
``policy.dtype`` and gradient checkpointing: its weights, frozen-encoder and gradient bytes equal what
the diffusion policy actually holds once loaded (tiny random-weight pipelines, loaded for real), and
the knobs name the memory-saving modes when they would help."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmrl.experiment import load_experiment
from mmrl.planning.estimate import plan_experiment, workload
from mmrl.planning.memory import GIB

ROOT = Path(__file__).resolve().parents[2]
NFT = ROOT / "configs/diffusion_shapes_nft.yaml"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()
    pytest.importorskip("diffusers", reason="the diffusers family needs mmrl[diffusion]")
    pytest.importorskip("peft", reason="LoRA needs peft")
    from mmrl.tiny.tiny_diffusers import tiny_flux_pipeline, tiny_sd3_pipeline

    root = tmp_path_factory.mktemp("pipes")
    return {"sd3": tiny_sd3_pipeline(root / "sd3"), "flux": tiny_flux_pipeline(root / "flux")}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("family", ["sd3", "flux"])
@pytest.mark.parametrize("dtype, finetune", [("float32", "lora"), ("bfloat16", "lora"), ("bfloat16", "full")])
def test_plan_prices_the_loaded_policy(pipelines, family, dtype, finetune):
    """Weights (the transformer's parameters and buffers), frozen encoders (text encoders, VAE), gradients
    and the DiffusionNFT old copy, in the plan, are the bytes of the policy as built."""
    from mmrl.policies.diffusion import DiffusionPolicy

    overrides = [f"policy.model={pipelines[family]}", f"policy.dtype={dtype}", f"policy.finetune={finetune}",
                 "policy.lora_rank=4", "trainer.engine.precision=bf16"]  # fmt: skip
    cfg = load_experiment(NFT, overrides)
    w = workload(cfg)
    t = plan_experiment(cfg, 80 * GIB).terms
    policy = DiffusionPolicy(cfg.policy, action_dim=16 * 16 * 3)
    gen = policy.gen
    trained = [p for p in gen.transformer.parameters() if p.requires_grad]
    assert t["weights"] == _bytes(gen.transformer.parameters()) + _bytes(gen.transformer.buffers())
    assert t["frozen encoders"] == _bytes(p for m in gen._frozen() for p in m.parameters())
    assert t["gradients"] == _bytes(trained) and {p.dtype for p in trained} == {torch.float32}
    old = [b for n, b in policy.named_buffers() if n.startswith("nft_old__")]  # nft_old_decay: 0.0
    assert t["reference"] == _bytes(old) > 0
    assert w.act_bytes == 2 and ("float32" in w.notes[0]) == (dtype == "bfloat16")


def test_flux_tokens_are_packed_and_both_block_stacks_count(pipelines):
    """FLUX's 2x2 packing is its patch (16 px: an 8 x 8 latent, 16 tokens) and its single-stream blocks
    are a stack of their own; SD3 / FLUX carry their text tokens through the joint blocks."""
    w = workload(load_experiment(NFT, [f"policy.model={pipelines['flux']}", "policy.max_sequence_length=32"]))
    assert w.notes[0].startswith("16 latent tokens per sample (1 x 4 x 4) + 32 text tokens")
    assert [(s.name, s.layers, s.tokens) for s in w.stacks] == [
        ("joint blocks", 1, 16 + 32),
        ("single-stream blocks", 1, 16 + 32),
    ]
    sd3 = workload(load_experiment(NFT, [f"policy.model={pipelines['sd3']}", "policy.max_sequence_length=32"]))
    assert [s.tokens for s in sd3.stacks] == [16 * 16 + 77 + 32]  # patch 1 on a 16 x 16 latent; CLIP 77 + T5


def test_wan_plan_checkpointing_dtype_and_knobs():
    """The Wan 2.1 recipe on meta: gradient checkpointing keeps one input per block (activations drop by
    more than 10x), bf16 halves the frozen weights and the encoders; with both off the plan does not fit
    80 GiB and its knobs name policy.gradient_checkpointing=true and policy.dtype=bfloat16."""
    pytest.importorskip("diffusers", reason="the diffusers family needs mmrl[diffusion]")
    config = ROOT / "configs/wan21_t2v_1.3b_nft.yaml"
    off = ["policy.dtype=float32", "policy.gradient_checkpointing=false", "trainer.engine.precision=fp32"]
    plain = plan_experiment(load_experiment(config, off), 80 * GIB)
    assert not plain.fits and not plain.workload.checkpointing
    knobs = {k.change: k for k in plain.knobs}
    assert knobs["policy.gradient_checkpointing=true"].saves > 0 and knobs["policy.dtype=bfloat16"].saves > 0
    assert "weights fp32 as loaded" in plain.workload.notes[0]
    ckpt = plan_experiment(load_experiment(config, off[:1] + off[2:]), 80 * GIB)  # the config's checkpointing
    assert ckpt.workload.checkpointing and ckpt.terms["activations"] * 10 < plain.terms["activations"]
    half = plan_experiment(load_experiment(config, off[1:]), 80 * GIB)  # the config's bf16 pipeline
    assert half.terms["frozen encoders"] * 2 == plain.terms["frozen encoders"]
    assert half.terms["gradients"] == plain.terms["gradients"]  # the LoRA adapters stay float32
    assert half.terms["activations"] * 2 == plain.terms["activations"]
    assert "weights fp32 as loaded" not in half.workload.notes[0]
    engine = plan_experiment(load_experiment(config, off[:2] + ["trainer.engine.gradient_checkpointing=true"]), GIB)
    assert engine.workload.checkpointing  # the engine's switch counts too
