"""The diffusion policy over videos (issue 34): the built-in tiny text-to-video generator (frames
folded into the batch, temporal mixing) and a tiny random-weight diffusers Wan pipeline with LoRA
behind the policy contract: clips as uint8 [B, F, H, W, 3], ratio 1 before an update for Flow-SDE
and CPS, the video simulator, and the simulator / policy size check."""

from __future__ import annotations

import pytest
import torch

from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy, build_generator, diffusers_family
from mmrl.policies.tiny_video_generator import TinyTextToVideo
from mmrl.simulator import Observation

PROMPTS = ["a red square moving to the right", "a red square moving to the right", "a blue circle moving up"]
SIZE, FRAMES = 8, 4


def _obs(n=3, frames=FRAMES, size=SIZE):
    return Observation(torch.zeros(n, frames, size, size, 3, dtype=torch.uint8), PROMPTS[:n])


def _tiny(**kw):
    torch.manual_seed(0)
    cfg = DiffusionConfig(num_steps=3, width=16, image_size=SIZE, num_frames=FRAMES, **kw)
    return DiffusionPolicy(cfg, 0)


def _randomise_temporal(gen: TinyTextToVideo) -> None:
    with torch.no_grad():  # a trained model: the temporal convolutions start at zero
        for conv in gen.temporal.values():
            conv.weight.normal_(0, 0.3)
        gen.out[-1].weight.normal_(0, 0.1)


def test_tiny_video_generator_clips_are_independent_and_frames_mix():
    torch.manual_seed(0)
    gen = TinyTextToVideo(image_size=SIZE, num_frames=FRAMES, ch=16, dim=32)
    _randomise_temporal(gen)
    cond = gen.encode(PROMPTS[1:])
    x, t = torch.randn(2, *gen.sample_shape), torch.tensor([0.7, 0.3])
    with torch.no_grad():
        v = gen(x, t, cond)
        alone = gen(x[1:], t[1:], (cond[0][1:], cond[1][1:]))
        y = x.clone()
        y[:, :, 0] += 1.0  # change the first frame only
        w = gen(y, t, cond)
    assert v.shape == x.shape == (2, 3, FRAMES, SIZE, SIZE)
    assert torch.allclose(v[1], alone[0], atol=1e-5)  # a clip's velocity does not depend on its batch
    assert (w[:, :, FRAMES - 1] - v[:, :, FRAMES - 1]).abs().max() > 1e-4  # the last frame sees the first
    with torch.no_grad():
        for conv in gen.temporal.values():
            conv.weight.zero_()
        v0, w0 = gen(x, t, cond), gen(y, t, cond)
    assert torch.equal(v0[:, :, 1:], w0[:, :, 1:])  # without temporal mixing, frames are separate images


@pytest.mark.parametrize("kw", [{}, {"method": "cps"}, {"stochastic": "one", "guidance_scale": 2.0}])
def test_video_ratio_is_one_before_an_update(kw):
    pol = _tiny(**kw)
    batch, clips = pol.rollout(_obs(), torch.Generator().manual_seed(0))
    assert pol.caps.action_type == "video"
    assert clips.dtype == torch.uint8 and clips.shape == (3, FRAMES, SIZE, SIZE, 3)
    assert batch["flow_chain"].shape == (3, 4, 3, FRAMES, SIZE, SIZE)
    x0 = batch["flow_chain"][:, -1]
    want = ((x0.clamp(-1, 1).permute(0, 2, 3, 4, 1) + 1) * 127.5).round().to(torch.uint8)
    assert torch.equal(clips, want)  # frames in [F, H, W, 3] order
    out = pol.evaluate(batch)
    assert out.logp.shape == batch["old_logp"].shape == (3, 3)
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-5)
    assert torch.isfinite(out.entropy)


def test_video_losses_warm_start_and_simulator_check(tmp_path):
    from simulators.prompts import PromptSim, VideoPromptSim

    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    data = {"dataset": "prompt_list", "dataset_kwargs": {"path": str(tmp_path / "prompts.txt")}}

    pol = _tiny()
    clips = torch.randint(0, 256, (3, FRAMES, SIZE, SIZE, 3), dtype=torch.uint8)
    batch = pol.warm_start_batch({"video": clips, "prompt": PROMPTS})
    loss = pol.supervised_loss(batch)
    assert loss.shape == (3,) and torch.isfinite(loss).all()
    with pytest.raises(ValueError, match="needs \\(video, prompt\\) pairs; the dataset has no 'video'"):
        pol.warm_start_batch({"image": clips[:, 0], "prompt": PROMPTS})
    rollout = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    adv = torch.tensor([1.0, -1.0, 0.5])
    for loss in (pol.likelihood_free_loss(rollout, adv), pol.forward_process_loss(rollout, adv)):
        assert loss.shape == (3,) and torch.isfinite(loss).all()
    sim = VideoPromptSim(num_envs=2, image_size=SIZE, num_frames=FRAMES, **data)
    pol.check_simulator(sim)
    assert sim.reset(seed=0).image.shape == (2, FRAMES, SIZE, SIZE, 3)
    with pytest.raises(ValueError, match="set sim.kwargs.image_size to 8 and sim.kwargs.num_frames to 4"):
        pol.check_simulator(VideoPromptSim(num_envs=2, image_size=SIZE, num_frames=2, **data))
    with pytest.raises(ValueError, match="num_frames to 4"):
        pol.check_simulator(PromptSim(num_envs=2, image_size=SIZE, **data))
    with pytest.raises(ValueError, match="VideoPromptSim takes uint8 videos"):
        sim.step(clips[:2, :2])


def test_family_detection_and_wan_needs_frames(tmp_path):
    assert diffusers_family("Wan-AI/Wan2.1-T2V-1.3B-Diffusers") == "wan"
    assert diffusers_family("Wan-AI/Wan2.2-TI2V-5B-Diffusers") == "wan"
    assert diffusers_family("stabilityai/stable-diffusion-3.5-medium") == "sd3"
    with pytest.raises(ValueError, match="set policy.num_frames"):
        DiffusionConfig(model="Wan-AI/Wan2.1-T2V-1.3B-Diffusers").validate()


@pytest.mark.parametrize("method", ["sde", "cps"])
def test_wan_lora_policy_ratio_is_one_and_trains(tiny_wan, method):
    torch.manual_seed(0)
    cfg = DiffusionConfig(
        model=str(tiny_wan),
        image_size=16,
        num_frames=5,
        num_steps=3,
        method=method,
        lora_rank=4,
        lora_alpha=8,
        max_sequence_length=16,
        guidance_scale=2.0,
    )
    assert diffusers_family(cfg.model) == "wan"
    pol = DiffusionPolicy(cfg, 0)
    assert pol.gen.sample_shape[1] == 2 and pol.elem_dims == 4  # 5 frames -> 2 latent frames
    obs = Observation(torch.zeros(2, 5, 16, 16, 3, dtype=torch.uint8), PROMPTS[:2])
    batch, clips = pol.rollout(obs, torch.Generator().manual_seed(0))
    assert clips.dtype == torch.uint8 and clips.shape == (2, 5, 16, 16, 3)
    out = pol.evaluate(batch)
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-5)
    trainable = [p for p in pol.parameters() if p.requires_grad]
    assert trainable and all(p.grad is None for p in trainable)
    (-(out.logp * batch["flow_stoch"]).sum()).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)


def test_wan_with_frames_builds_and_image_pipelines_refuse_frames(tiny_wan, tmp_path):
    gen = build_generator(
        DiffusionConfig(model=str(tiny_wan), image_size=16, num_frames=9, lora_rank=4, max_sequence_length=16)
    )
    assert gen.sample_shape[1] == 3
    import json

    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
    with pytest.raises(ValueError, match="is a sd3 image pipeline"):
        build_generator(DiffusionConfig(model=str(tmp_path), num_frames=5))


def test_exported_wan_folder_reproduces_the_policys_clips(tiny_wan, tmp_path):
    """A trained Wan LoRA policy exported as a diffusers folder (LoRA fused): the policy built from
    that folder by WanPipeline.from_pretrained generates the same clips from the same noise."""
    torch.manual_seed(0)
    kw = dict(image_size=16, num_frames=5, num_steps=3, eval_num_steps=3, max_sequence_length=16)
    pol = DiffusionPolicy(DiffusionConfig(model=str(tiny_wan), lora_rank=4, lora_alpha=8, **kw), 0)
    with torch.no_grad():
        for n, p in pol.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)  # a trained adapter
    obs = Observation(torch.zeros(2, 5, 16, 16, 3, dtype=torch.uint8), PROMPTS[:2])
    want = pol.rollout(obs, torch.Generator().manual_seed(3), mode="eval").actions
    assert pol.export_pretrained(tmp_path / "out") == "diffusers"
    again = DiffusionPolicy(DiffusionConfig(model=str(tmp_path / "out"), finetune="full", **kw), 0)
    got = again.rollout(obs, torch.Generator().manual_seed(3), mode="eval").actions
    base = DiffusionPolicy(DiffusionConfig(model=str(tiny_wan), finetune="full", **kw), 0)
    untrained = base.rollout(obs, torch.Generator().manual_seed(3), mode="eval").actions
    assert (want.int() - got.int()).abs().max() <= 1  # uint8 rounding of frames within 1e-5
    assert (want.int() - untrained.int()).abs().max() > 1  # the adapter changed the clips


def test_vae_slicing_and_tiling_options_reach_the_pipelines_vae(tiny_wan):
    kw = dict(model=str(tiny_wan), image_size=16, num_frames=5, lora_rank=4, max_sequence_length=16)
    plain = build_generator(DiffusionConfig(**kw))
    sliced = build_generator(DiffusionConfig(vae_slicing=True, vae_tiling=True, **kw))
    assert (plain.pipe.vae.use_slicing, plain.pipe.vae.use_tiling) == (False, False)
    assert (sliced.pipe.vae.use_slicing, sliced.pipe.vae.use_tiling) == (True, True)
    x0 = torch.randn(2, *plain.sample_shape)
    assert torch.allclose(plain.decode(x0), sliced.decode(x0), atol=1e-5)  # one clip at a time, same frames
