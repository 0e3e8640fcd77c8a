"""Wan generator: a tiny random-weight diffusers Wan text-to-video pipeline (offline round trip), mmrl's
Euler ODE sampler with the generator's velocity reproducing `WanPipeline.__call__` (latents and
frames, with and without CFG), the scheduler grids it must be given, prompt embeddings as Wan pads
them, and LoRA (the only trainable weights, gradients from a velocity loss, reference = adapter off,
fused export)."""

from __future__ import annotations

import pytest
import torch

from mmrl.flow import flow_matching_loss, sample, time_grid
from mmrl.utils.compat import patch_torchvision

patch_torchvision()  # before diffusers' pipelines (and peft) import transformers, which imports torchvision
pytest.importorskip("diffusers", reason="the Wan generator needs diffusers (mmrl[diffusion])")
pytest.importorskip("peft", reason="LoRA needs peft")

from diffusers import UniPCMultistepScheduler, WanPipeline  # noqa: E402

from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy  # noqa: E402
from mmrl.policies.wan import WanGenerator  # noqa: E402
from mmrl.tiny.tiny_wan import LATENTS_MEAN  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["a red circle moving left", "two blue squares"]
SIZE, FRAMES, STEPS, MAX_LEN = 16, 5, 4, 16


def _gen(folder, **kw) -> WanGenerator:
    torch.manual_seed(0)
    kw = {"lora_rank": 4, "lora_alpha": 8, **kw}
    gen = WanGenerator.from_pretrained(
        str(folder), image_size=SIZE, num_frames=FRAMES, max_sequence_length=MAX_LEN, **kw
    )
    assert isinstance(gen, WanGenerator)
    gen.pipe.set_progress_bar_config(disable=True)
    return gen


def test_tiny_pipeline_round_trips_offline(tiny_wan, tmp_path):
    pipe = WanPipeline.from_pretrained(tiny_wan)
    vae = pipe.vae.config
    assert (vae.scale_factor_spatial, vae.scale_factor_temporal, vae.z_dim) == (4, 4, len(LATENTS_MEAN))
    assert pipe.transformer_2 is None and type(pipe.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    pipe.save_pretrained(tmp_path)
    again = WanPipeline.from_pretrained(tmp_path)
    for name in ("transformer", "vae", "text_encoder"):
        a, b = getattr(pipe, name).state_dict(), getattr(again, name).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    again.set_progress_bar_config(disable=True)
    video = again(PROMPTS[0], height=SIZE, width=SIZE, num_frames=FRAMES, num_inference_steps=2, output_type="pt")
    assert video.frames.shape == (1, FRAMES, 3, SIZE, SIZE) and 0 <= video.frames.min() < video.frames.max() <= 1
    with pytest.raises(ValueError, match="1 \\+ a multiple of 4"):
        WanGenerator(pipe, image_size=SIZE, num_frames=6)
    with pytest.raises(ValueError, match="multiple of 8"):
        WanGenerator(pipe, image_size=12, num_frames=FRAMES)


def test_scheduler_grids(tiny_wan):
    """The tiny pipeline's Euler scheduler, given mmrl's unshifted linear times as ``sigmas``, runs on
    ``time_grid(K, shift)``; its own default grid shifts twice (linspace between shifted end points,
    then shifted again). Real Wan's UniPC flow sigmas are nearly ``time_grid(K, flow_shift)``."""
    gen = _gen(tiny_wan)
    sched, grid = gen.pipe.scheduler, time_grid(STEPS, gen.default_shift)
    assert gen.default_shift == 3.0
    sched.set_timesteps(STEPS, sigmas=torch.linspace(1, 0, STEPS + 1)[:-1].tolist())
    assert torch.allclose(sched.sigmas, grid, atol=1e-6) and torch.allclose(sched.timesteps, 1000 * grid[:-1])
    sched.set_timesteps(STEPS)
    assert (sched.sigmas - grid).abs().max() > 0.1
    unipc = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    gen.pipe.scheduler = unipc
    assert gen.default_shift == 3.0
    unipc.set_timesteps(STEPS)
    assert torch.allclose(unipc.sigmas, grid, atol=1e-3) and unipc.sigmas[0] < 1


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_ode_sampler_reproduces_the_wan_pipeline(tiny_wan, monkeypatch, guidance):
    """mmrl's Euler ODE on ``time_grid(K, shift)`` with the generator's velocity (``1000 t``, output
    as is) and the policy's CFG (empty negative prompt) gives `WanPipeline.__call__`'s latents and
    frames from the same noise."""
    gen = _gen(tiny_wan)
    pipe = gen.pipe
    assert gen.sample_shape == (len(LATENTS_MEAN), 2, 4, 4)
    grid = time_grid(STEPS, gen.default_shift)
    set_timesteps = pipe.scheduler.set_timesteps  # feed the scheduler mmrl's linear times (it shifts them)
    monkeypatch.setattr(
        pipe.scheduler,
        "set_timesteps",
        lambda n, device=None: set_timesteps(n, device=device, sigmas=torch.linspace(1, 0, n + 1)[:-1].tolist()),
    )
    pol = DiffusionPolicy(DiffusionConfig(num_steps=STEPS, shift=gen.default_shift), SIZE * SIZE * 3, generator=gen)
    noise = torch.randn(2, *gen.sample_shape, generator=torch.Generator().manual_seed(0))
    cond, null = gen.encode(PROMPTS), gen.encode([""] * len(PROMPTS))  # CFG's negative: the empty prompt
    kw = dict(
        prompt=PROMPTS,
        height=SIZE,
        width=SIZE,
        num_frames=FRAMES,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        latents=noise,
        max_sequence_length=MAX_LEN,
    )
    with torch.no_grad():
        out = sample(pol.model_fn(cond, null, guidance), noise, grid, "ode")
        ref = pipe(output_type="latent", **kw).frames
    assert torch.allclose(pipe.scheduler.sigmas, grid, atol=1e-6)
    assert out.x0.abs().mean() > 0.1 and torch.allclose(out.x0, ref, atol=1e-5)
    if guidance == 1.0:
        frames = pipe(output_type="pt", **kw).frames  # [B, F, 3, H, W] in [0, 1]
        decoded = gen.decode(out.x0)
        assert decoded.shape == (2, FRAMES, 3, SIZE, SIZE) and decoded.min() >= -1 and decoded.max() <= 1
        assert torch.allclose((decoded + 1) / 2, frames, atol=1e-5)


def test_velocity_inputs(tiny_wan):
    """Prompt embeddings are zero after the prompt's tokens and their padded length counts; Wan 2.2
    TI2V's per-token timesteps, all equal for text-to-video, give the scalar timestep's velocity;
    `encode_images` inverts the VAE's per-channel normalisation."""
    gen = _gen(tiny_wan)
    (embeds,) = gen.encode(["ab", "abcd ef"])
    masks = gen.pipe.tokenizer(["ab", "abcd ef"]).attention_mask  # unpadded: the prompt's tokens and </s>
    assert embeds.shape == (2, MAX_LEN, 32)
    for row, mask in zip(embeds, masks):
        assert row[: len(mask)].abs().sum(-1).gt(0).all() and row[len(mask) :].eq(0).all()
    x, t = torch.randn(2, *gen.sample_shape), torch.tensor([0.9, 0.3])
    with torch.no_grad():
        v = gen(x, t, (embeds,))
        gen.max_sequence_length = 2 * MAX_LEN
        assert (gen(x, t, gen.encode(["ab", "abcd ef"])) - v).abs().max() > 1e-4  # more zero rows, new velocity
        tokens = gen.sample_shape[1] * (SIZE // 4 // 2) ** 2
        per_token = gen.transformer(
            hidden_states=x, timestep=1000 * t[:, None].expand(-1, tokens), encoder_hidden_states=embeds
        ).sample
    assert torch.allclose(per_token, v, atol=1e-5)
    video = torch.randint(0, 256, (2, FRAMES, SIZE, SIZE, 3), dtype=torch.uint8)
    z = gen.encode_images(video)
    assert z.shape == (2, *gen.sample_shape)
    raw = gen.pipe.vae.encode(video.permute(0, 4, 1, 2, 3).float() / 127.5 - 1).latent_dist.mean
    mean, std = (torch.tensor(s).view(1, -1, 1, 1, 1) for s in (LATENTS_MEAN, gen.pipe.vae.config.latents_std))
    assert torch.allclose(z * std + mean, raw, atol=1e-5)


def test_lora_trains_alone_reference_and_export(tiny_wan, tmp_path):
    gen = _gen(tiny_wan)
    trainable = [n for n, p in gen.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable) and gen.has_adapter
    for target in ("attn1.to_q", "attn1.to_out.0", "attn2.to_k", "attn2.to_v"):
        assert any(f"blocks.0.{target}.lora_A" in n for n in trainable)
    assert not any(p.requires_grad for m in gen._frozen() for p in m.parameters())  # UMT5, VAE
    cond = gen.encode(PROMPTS)
    x0 = torch.randn(2, *gen.sample_shape)
    loss = flow_matching_loss(lambda x, t: (gen(x, t, cond), None), x0).mean()
    loss.backward()
    grads = {n: p.grad for n, p in gen.named_parameters() if p.grad is not None}
    assert set(grads) == set(trainable)
    assert all(grads[n].abs().sum() > 0 for n in trainable if "lora_B" in n)  # lora_B starts at 0: A gets none yet
    x, t = torch.randn(2, *gen.sample_shape), torch.tensor([0.8, 0.4])
    with torch.no_grad():
        before = gen(x, t, cond)
        for n, p in gen.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)  # a trained adapter
        with gen.disable_adapter():
            ref = gen(x, t, cond)
        after = gen(x, t, cond)
    assert torch.equal(ref, before) and (after - before).abs().max() > 1e-3
    gen.pipe.register_to_config(expand_timesteps=True)  # Wan 2.2 TI2V's flag survives the export
    assert gen.export_pretrained(tmp_path / "merged") == "diffusers"
    merged = _gen(tmp_path / "merged", finetune="full")
    assert merged.pipe.config.expand_timesteps
    with torch.no_grad():
        assert torch.allclose(merged(x, t, merged.encode(PROMPTS)), after, atol=1e-5)  # LoRA fused
    assert gen.export_pretrained(tmp_path / "adapter", merge=False) == "diffusers lora"
    base = WanPipeline.from_pretrained(tiny_wan)
    base.load_lora_weights(str(tmp_path / "adapter"))
    with torch.no_grad():
        v = base.transformer(hidden_states=x, timestep=1000 * t, encoder_hidden_states=cond[0]).sample
    assert torch.allclose(v, after, atol=1e-5)
