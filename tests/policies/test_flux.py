"""FLUX generator: a tiny random-weight diffusers FLUX pipeline with LoRA behind the diffusion policy
(packing and position ids as diffusers', mmrl's ODE sampler reproduces `FluxPipeline.__call__`, ratio
1 before an update, reference = adapter off, family detection) and 2-iteration Flow-GRPO / AWM runs
on the shared trainer."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.experiment import build_trainer
from mmrl.flow import sample, time_grid
from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy, diffusers_family
from mmrl.simulator import Observation
from tests.trainer.test_diffusion_training import cfg as trainer_cfg

PROMPTS = ["a red circle on the left", "a red circle on the left", "two blue squares", "two blue squares"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_flux(tmp_path_factory):
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()  # peft imports transformers models, which import torchvision
    pytest.importorskip("diffusers", reason="the FLUX generator needs diffusers (mmrl[diffusion])")
    pytest.importorskip("peft", reason="LoRA needs peft")
    from mmrl.tiny.tiny_diffusers import tiny_flux_pipeline

    return tiny_flux_pipeline(tmp_path_factory.mktemp("flux"))  # FLUX.1-dev style: guidance embedding


def _policy(folder, **kw):
    torch.manual_seed(0)
    cfg = DiffusionConfig(model=str(folder), num_steps=3, lora_rank=4, lora_alpha=8, **kw)
    return DiffusionPolicy(cfg, 16 * 16 * 3)


def _obs(n=4):
    return Observation(torch.zeros(n, 16, 16, 3, dtype=torch.uint8), PROMPTS[:n])


def test_packing_and_ids_match_diffusers(tiny_flux):
    from diffusers import FluxPipeline

    from mmrl.policies.flux import latent_image_ids, pack_latents, unpack_latents

    x = torch.randn(2, 16, 8, 6)
    packed = pack_latents(x)
    assert packed.shape == (2, 12, 64)
    assert torch.equal(packed, FluxPipeline._pack_latents(x, 2, 16, 8, 6))
    assert torch.equal(unpack_latents(packed, 8, 6), x)  # round trip is the identity
    # diffusers unpacks from the pixel size and the VAE factor (2 for a 16 x 12 image here)
    assert torch.equal(unpack_latents(packed, 8, 6), FluxPipeline._unpack_latents(packed, 16, 12, 2))
    assert torch.equal(packed[0, 1, :8], x[0, :2, 0:2, 2:4].flatten())  # patch (0, 1): channel, then 2x2
    ids = latent_image_ids(4, 3)
    assert torch.equal(ids, FluxPipeline._prepare_latent_image_ids(2, 4, 3, "cpu", torch.float32))
    assert ids[5].tolist() == [0.0, 1.0, 2.0]  # patch 5 = row 1, column 2


def test_ode_sampler_reproduces_the_flux_pipeline(tiny_flux):
    """mmrl's Euler ODE on the unpacked latent, with the generator's time (t, not 1000 t), distilled
    guidance 3.5 and `default_shift`, gives diffusers' own `FluxPipeline.__call__` latents and image."""
    pol = _policy(tiny_flux)
    from mmrl.policies.flux import pack_latents, unpack_latents

    gen, pipe = pol.gen, pol.gen.pipe
    pipe.set_progress_bar_config(disable=True)
    assert gen.sample_shape == (16, 8, 8) and gen.guidance == 3.5
    assert gen.default_shift == pytest.approx(torch.tensor(0.5 + 0.65 * (16 - 256) / 3840).exp().item())
    noise = torch.randn(2, *gen.sample_shape, generator=torch.Generator().manual_seed(0))
    cond = gen.encode(PROMPTS[1:3])
    with torch.no_grad():
        out = sample(pol.model_fn(cond, None, 1.0), noise, time_grid(4, gen.default_shift), "ode")
        kw = dict(
            prompt=PROMPTS[1:3],
            num_inference_steps=4,
            guidance_scale=3.5,
            height=16,
            width=16,
            latents=pack_latents(noise),
            max_sequence_length=gen.max_sequence_length,
        )
        ref = unpack_latents(pipe(output_type="latent", **kw).images, 8, 8)
        image = pipe(output_type="pt", **kw).images  # [0, 1]
    assert out.x0.abs().mean() > 0.1 and torch.allclose(out.x0, ref, atol=1e-4)
    decoded = gen.decode(out.x0)
    assert decoded.shape == (2, 3, 16, 16) and decoded.min() >= -1 and decoded.max() <= 1
    assert torch.allclose((decoded + 1) / 2, image, atol=1e-4)
    x, t = noise, torch.full((2,), 0.7)
    with torch.no_grad():  # the guidance embedding is live: another value changes the velocity
        v = gen(x, t, cond)
        gen.guidance = 1.0
        assert (gen(x, t, cond) - v).abs().max() > 1e-3


def test_lora_ratio_reference_and_training(tiny_flux):
    pol = _policy(tiny_flux, kl_reference=True, guidance_scale=2.0)
    trainable = [n for n, p in pol.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable) and pol.ref is None  # reference = adapter off
    for block in ("transformer_blocks.0.attn.", "single_transformer_blocks.0.attn."):  # both block kinds
        assert any(f".{block}to_q.lora_A" in n for n in trainable)
    assert any("add_q_proj.lora_A" in n for n in trainable) and any("to_add_out.lora_A" in n for n in trainable)
    batch, images = pol.rollout(_obs(), torch.Generator().manual_seed(0))
    assert batch["flow_chain"].shape == (4, 4, 16, 8, 8) and images.shape == (4, 16, 16, 3)
    assert images.dtype == torch.uint8 and images.float().std() > 0
    out = pol.evaluate(batch)
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-4)  # ratio 1 before an update
    assert torch.allclose(out.kl, torch.zeros(4), atol=1e-8)  # LoRA B starts at 0
    (out.logp.sum() + pol.likelihood_free_loss(batch, torch.ones(4)).sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in pol.named_parameters() if "lora_B" in n)
    cond = pol.gen.encode(PROMPTS)
    x, t = batch["flow_chain"][:, 1], torch.full((4,), pol.grid[1].item())
    with torch.no_grad():
        before = pol.gen(x, t, cond)
        for n, p in pol.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # a trained adapter
        with pol.gen.disable_adapter():
            ref = pol.gen(x, t, cond)
        after = pol.gen(x, t, cond)
    assert torch.equal(ref, before) and (after - before).abs().max() > 1e-3  # reference = the untrained policy
    out = pol.evaluate(batch)
    assert (out.kl > 0).all() and not torch.allclose(out.logp, batch["old_logp"], atol=1e-4)


def test_family_detection_and_schnell(tiny_flux, tmp_path):
    from mmrl.policies.flux import FluxGenerator
    from mmrl.tiny.tiny_diffusers import tiny_flux_pipeline

    assert diffusers_family(str(tiny_flux)) == "flux"
    assert diffusers_family("black-forest-labs/FLUX.1-schnell") == "flux"
    assert diffusers_family("stabilityai/stable-diffusion-3.5-medium") == "sd3"
    (tmp_path / "sd3").mkdir()
    (tmp_path / "sd3" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    assert diffusers_family(str(tmp_path / "sd3")) == "sd3"
    (tmp_path / "flux_sdxl").mkdir()  # the folder's pipeline class wins over its name
    (tmp_path / "flux_sdxl" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    with pytest.raises(ValueError, match="StableDiffusionXLPipeline"):
        diffusers_family(str(tmp_path / "flux_sdxl"))
    schnell = tiny_flux_pipeline(tmp_path / "schnell", guidance_embeds=False)
    pol = _policy(schnell, flux_guidance=7.0)
    assert isinstance(pol.gen, FluxGenerator) and pol.gen.guidance is None  # no guidance embedding to feed
    assert pol.gen.default_shift == 1.0  # schnell's scheduler: no resolution-dependent shift
    batch = pol.rollout(_obs(2), torch.Generator().manual_seed(0)).batch
    assert torch.allclose(pol.evaluate(batch).logp, batch["old_logp"], atol=1e-4)
    with pytest.raises(ValueError, match="multiple of 4"):
        FluxGenerator.from_pretrained(str(schnell), image_size=18)


@pytest.mark.parametrize("objective", ["ppo", "awm"])
def test_flux_lora_flow_grpo_and_awm_smoke(tmp_path, tiny_flux, objective):
    c = trainer_cfg(
        tmp_path,
        f"policy.model={tiny_flux}",
        "policy.lora_rank=4",
        "policy.lora_alpha=8",
        f"algorithm.objective={objective}",
        # random weights draw nothing the shapes reward scores; JPEG size varies per image
        "sim.kwargs={dataset: shapes_prompts, image_size: 16}",
        "reward={type: jpeg_compressibility}",
    )
    trainer = build_trainer(c)
    assert type(trainer.policy.gen).__name__ == "FluxGenerator"
    lora = {k: v.clone() for k, v in trainer.policy.state_dict().items() if "lora_B" in k}
    frozen = {k: v.clone() for k, v in trainer.policy.state_dict().items() if "lora" not in k and "transformer" in k}
    assert lora and frozen
    results = trainer.run()
    assert results["final"]["iteration"] == 2
    after = trainer.policy.state_dict()
    assert any(not torch.equal(after[k], v) for k, v in lora.items())  # the adapter trained
    assert all(torch.equal(after[k], v) for k, v in frozen.items())  # the base transformer did not
    rows = [json.loads(x) for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    key = "train/awm_loss" if objective == "awm" else "train/policy_loss"
    train = [r for r in rows if "train/return" in r]
    assert len(train) == 2 and all(torch.isfinite(torch.tensor(r[key])) for r in train)
