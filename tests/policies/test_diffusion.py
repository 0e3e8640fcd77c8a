"""Diffusion policy: the built-in tiny generator and a tiny random-weight diffusers SD3 pipeline
with LoRA behind the policy contract (ratio 1 before an update, KL 0 against itself, CFG formula,
image layout, AWM regularisers, EMA)."""

from __future__ import annotations

import pytest
import torch

from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
from mmrl.policies.flow_vla import FlowVLAConfig
from mmrl.simulator import Observation

PROMPTS = ["a red circle on the left", "a red circle on the left", "two blue squares", "two blue squares"]


def _obs(n=4, size=16):
    return Observation(torch.zeros(n, size, size, 3, dtype=torch.uint8), PROMPTS[:n])


def _tiny(**kw):
    torch.manual_seed(0)
    return DiffusionPolicy(DiffusionConfig(num_steps=4, width=16, **kw), 16 * 16 * 3)


@pytest.mark.parametrize(
    "kw", [{}, {"stochastic": "one", "guidance_scale": 3.0}, {"logp_level": "sample", "method": "cps"}]
)
def test_ratio_is_one_before_an_update(kw):
    pol = _tiny(**kw)
    batch = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    out = pol.evaluate(batch)
    assert out.logp.shape == batch["old_logp"].shape == ((4, 4) if pol.cfg.logp_level == "step" else (4,))
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-5)
    if pol.cfg.logp_level == "step":
        assert torch.equal(out.logp_mask, batch["flow_stoch"])
        assert (out.logp[~batch["flow_stoch"]] == 0).all()


def test_actions_are_the_decoded_images_as_uint8_in_hwc_order():
    pol = _tiny()
    batch, img = pol.rollout(_obs(), torch.Generator().manual_seed(1))
    x0 = batch["flow_chain"][:, -1]  # pixel space: the image itself
    want = ((x0.clamp(-1, 1).permute(0, 2, 3, 1) + 1) * 127.5).round().to(torch.uint8)
    assert img.dtype == torch.uint8 and img.shape == (4, 16, 16, 3) and torch.equal(img, want)
    assert "actions" not in batch and batch["flow_chain"].shape == (4, 5, 3, 16, 16)
    ev, ev_img = pol.rollout(_obs(), torch.Generator().manual_seed(1), mode="eval")  # ODE, eval grid, no replay
    assert "flow_chain" not in ev and ev_img.shape == (4, 16, 16, 3)


def test_classifier_free_guidance_formula():
    pol = _tiny(guidance_scale=3.0)
    cond, null = pol._conds(PROMPTS, 3.0)
    x, t = torch.randn(4, 3, 16, 16), torch.full((4,), 0.5)
    with torch.no_grad():
        pol.gen.out[-1].weight.normal_(0, 0.1)  # a non-zero output layer, so v depends on the prompt
        v, _ = pol.model_fn(cond, null, 3.0)(x, t)
        vc, vu = pol.gen(x, t, cond), pol.gen(x, t, null)
    assert torch.allclose(v, vu + 3.0 * (vc - vu), atol=1e-5) and not torch.allclose(vc, vu)


def test_kl_to_reference_is_zero_then_positive():
    pol = _tiny(kl_reference=True)
    batch = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    assert torch.allclose(pol.evaluate(batch).kl, torch.zeros(4))
    with torch.no_grad():
        pol.gen.out[-1].bias.add_(0.1)  # velocity +0.1 everywhere: mean drift = dt * 0.1
    kl = pol.evaluate(batch).kl
    grid, a = pol.grid, pol.cfg.noise_level
    # hand computation for Flow-SDE: mean = x + [v + sigma^2/(2t) (x + (1-t) v)] dt, so a velocity
    # shift dv moves the mean by (1 + sigma^2 (1-t) / (2t)) dv dt; std = sigma sqrt(-dt)
    expected = []
    for k in range(4):
        t, tn = grid[k].double(), grid[k + 1].double()
        dt = tn - t
        sigma = a * torch.sqrt(t / (1 - (tn if t >= 1 else t)))
        drift = (1 + sigma**2 * (1 - t) / (2 * t)) * 0.1 * dt
        expected.append(drift**2 / (2 * sigma**2 * -dt))
    assert torch.allclose(kl, torch.stack(expected).mean().float().expand(4), rtol=1e-3)


def test_awm_regularisers_and_ema():
    pol = _tiny(awm_ref_coef=1.0, awm_ema_coef=1.0, ema_decay=0.5)
    batch = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    adv = torch.zeros(4)
    torch.manual_seed(0)
    assert torch.allclose(pol.likelihood_free_loss(batch, adv), torch.zeros(4), atol=1e-7)  # v == v_ref == v_ema
    before = {k: v.clone() for k, v in pol._copy_params("ema").items()}
    with torch.no_grad():
        pol.gen.out[-1].bias.add_(0.2)
    pol.after_step()
    key = "out.2.bias"
    assert torch.allclose(pol._copy_params("ema")[key], 0.5 * before[key] + 0.5 * pol.gen.out[-1].bias)
    torch.manual_seed(0)
    loss = pol.likelihood_free_loss(batch, adv)  # advantage 0: only the regularisers remain
    assert torch.allclose(loss, torch.full((4,), 0.2**2 + 0.1**2), atol=1e-5)
    assert "ema__out__2__bias" in pol.state_dict()  # EMA weights are checkpointed
    pol.after_warm_start()
    assert torch.equal(pol._copy_params("ema")[key], pol.gen.out[-1].bias)


def test_nft_drift_to_the_reference():
    # DiffusionNFT's guard: coef x ||v - v_ref||^2 at the loss's own points, 0 while v == v_ref
    pol = _tiny(nft_ref_coef=1.0)
    batch = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    adv = torch.randn(4, generator=torch.Generator().manual_seed(1))

    def loss(coef):
        pol.cfg.nft_ref_coef = coef
        torch.manual_seed(0)  # the same training times and noise both ways
        return pol.forward_process_loss(batch, adv)

    assert torch.allclose(loss(1.0), loss(0.0), atol=1e-7)
    with torch.no_grad():
        pol.gen.out[-1].bias.add_(0.2)  # the policy's velocity moves 0.2 everywhere from the reference's
    assert torch.allclose(loss(1.0) - loss(0.0), torch.full((4,), 0.2**2), atol=1e-5)
    assert torch.allclose(loss(0.5) - loss(0.0), torch.full((4,), 0.5 * 0.2**2), atol=1e-5)
    with pytest.raises(ValueError, match="nft_ref_coef"):
        DiffusionConfig(nft_ref_coef=-1.0).validate()


def test_supervised_loss_and_size_mismatch():
    pol = _tiny()
    from mmrl.policies.base import encode_text

    batch = {"media": torch.randint(0, 256, (4, 16, 16, 3), dtype=torch.uint8), "instruction": encode_text(PROMPTS)}
    loss = pol.supervised_loss(batch)
    assert loss.shape == (4,) and torch.isfinite(loss).all()
    from simulators.prompts import PromptSim

    pol.check_simulator(PromptSim(num_envs=2, image_size=16))
    with pytest.raises(ValueError, match="set sim.kwargs.image_size to 16$"):
        pol.check_simulator(PromptSim(num_envs=2, image_size=32))


@pytest.fixture(scope="module")
def tiny_sd3(tmp_path_factory):
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()  # peft imports transformers models, which import torchvision
    pytest.importorskip("diffusers")
    pytest.importorskip("peft")
    from mmrl.tiny.tiny_diffusers import tiny_sd3_pipeline

    return tiny_sd3_pipeline(tmp_path_factory.mktemp("sd3"))


def test_sd3_lora_ratio_reference_and_training(tiny_sd3):
    torch.manual_seed(0)
    cfg = DiffusionConfig(
        model=str(tiny_sd3), num_steps=3, lora_rank=4, lora_alpha=8, kl_reference=True, guidance_scale=2.0
    )
    pol = DiffusionPolicy(cfg, 16 * 16 * 3)
    trainable = [n for n, p in pol.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable) and pol.ref is None  # reference = adapter off
    batch, images = pol.rollout(_obs(), torch.Generator().manual_seed(0))
    assert batch["flow_chain"].shape == (4, 4, 4, 16, 16) and images.shape == (4, 16, 16, 3)
    out = pol.evaluate(batch)
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-4)
    assert torch.allclose(out.kl, torch.zeros(4), atol=1e-8)  # LoRA B starts at 0
    (out.logp.sum() + pol.likelihood_free_loss(batch, torch.ones(4)).sum()).backward()
    assert all(p.grad is not None for n, p in pol.named_parameters() if p.requires_grad and "lora_B" in n)


@pytest.mark.parametrize("logp_level", ["step", "sample"])
def test_dancegrpo_timestep_subsampling_trains_a_fraction_of_the_steps(logp_level):
    pol = _tiny(timestep_fraction=0.5, logp_level=logp_level)  # 4 stochastic steps -> 2 trained
    batch = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    trained = batch["flow_train"]
    assert batch["flow_stoch"].all() and (trained.sum(1) == 2).all()  # rolled out stochastic on all
    assert len({tuple(r.tolist()) for r in trained}) > 1  # each sample draws its own steps
    out = pol.evaluate(batch)
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-5)  # ratio 1 on the trained steps
    if logp_level == "step":
        assert torch.equal(out.logp_mask, trained) and (out.logp[~trained] == 0).all()
    full = _tiny(logp_level=logp_level)  # the same chain, every step trained: another log-prob
    assert not torch.allclose(full.evaluate({**batch, "flow_train": batch["flow_stoch"]}).logp, out.logp)
    assert "flow_train" not in _tiny().rollout(_obs(), torch.Generator().manual_seed(0)).batch


def test_dancegrpo_shared_noise_per_prompt():
    pol = _tiny(shared_noise=True)
    batch, images = pol.rollout(_obs(), torch.Generator().manual_seed(0))
    start = batch["flow_chain"][:, 0]  # PROMPTS: rows 0, 1 one prompt; rows 2, 3 another
    assert torch.equal(start[0], start[1]) and torch.equal(start[2], start[3])
    assert not torch.equal(start[0], start[2])
    assert not torch.equal(batch["flow_chain"][0, -1], batch["flow_chain"][1, -1])  # the SDE tells them apart
    assert torch.allclose(pol.evaluate(batch).logp, batch["old_logp"], atol=1e-5)
    alone = _tiny().rollout(_obs(), torch.Generator().manual_seed(0)).batch["flow_chain"][:, 0]
    assert not torch.equal(alone[0], alone[1])  # off by default
    ev = pol.rollout(_obs(), torch.Generator().manual_seed(0), mode="eval")  # evaluation: independent noise
    assert not torch.equal(ev.actions[0], ev.actions[1])


@pytest.mark.parametrize("config", [DiffusionConfig, FlowVLAConfig])
@pytest.mark.parametrize("window", [[0, 5], [2, 2], None, [0]])
def test_a_window_outside_the_steps_is_refused_when_the_config_is_checked(config, window):
    """stochastic: window with a window the rollout cannot have fails at config time (one line naming
    num_steps and an example), not at the first rollout after pretraining; generators and flow VLAs
    share the check (`mmrl.flow.sampler.check_window`)."""
    with pytest.raises(ValueError, match=r"0 <= start < end <= num_steps \(4\)"):
        config(num_steps=4, stochastic="window", window=window).validate()
    config(num_steps=4, stochastic="window", window=[0, 4]).validate()  # the whole range is fine
    config(num_steps=4, stochastic="all", window=[0, 9]).validate()  # ignored unless stochastic: window


def test_sd3_bf16_lora_keeps_adapters_float32_and_checkpoints_blocks(tiny_sd3, monkeypatch):
    """policy.dtype=bfloat16 loads the pipeline in bf16 (VAE, text encoders, the transformer's frozen
    weights) with the LoRA adapters in float32; the chain and log-probs stay float32 (ratio 1 before an
    update); policy.gradient_checkpointing recomputes the transformer's blocks in the backward."""
    import torch.utils.checkpoint as ckpt

    torch.manual_seed(0)
    cfg = DiffusionConfig(
        model=str(tiny_sd3), num_steps=3, lora_rank=4, lora_alpha=8, dtype="bfloat16", gradient_checkpointing=True
    )
    pol = DiffusionPolicy(cfg, 16 * 16 * 3)
    trainable = {p.dtype for p in pol.parameters() if p.requires_grad}
    frozen = {p.dtype for p in pol.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}
    assert {p.dtype for m in pol.gen._frozen() for p in m.parameters()} == {torch.bfloat16}  # VAE, CLIPs
    assert pol.gen.transformer.is_gradient_checkpointing and pol.ref is None  # reference: adapter off
    batch = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    assert batch["flow_chain"].dtype == batch["old_logp"].dtype == torch.float32
    calls = []
    real = ckpt.checkpoint
    monkeypatch.setattr(ckpt, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    out = pol.evaluate(batch)  # one batched model call over the steps: each block checkpointed once
    assert len(calls) == len(pol.gen.transformer.transformer_blocks)
    assert torch.allclose(out.logp, batch["old_logp"], atol=1e-5)
    out.logp.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in pol.parameters() if p.requires_grad)
    with torch.no_grad():
        calls.clear()
        pol.evaluate(batch)
    assert not calls  # no backward, nothing to recompute


def test_sd3_bf16_full_finetune_trains_float32_and_shares_the_encoders(tiny_sd3):
    """A full fine-tune in bf16: the trained transformer stays float32 (the engines keep fp32 weights), the
    frozen parts are bf16, and the reference copies the transformer only (text encoders and VAE shared)."""
    cfg = DiffusionConfig(model=str(tiny_sd3), num_steps=3, finetune="full", dtype="bfloat16", kl_reference=True)
    pol = DiffusionPolicy(cfg, 16 * 16 * 3)
    assert {p.dtype for p in pol.gen.transformer.parameters()} == {torch.float32}
    assert pol.gen.pipe.vae.dtype == pol.gen.pipe.text_encoder.dtype == torch.bfloat16
    assert pol.ref is not None and pol.ref.transformer is not pol.gen.transformer
    assert pol.ref.pipe.vae is pol.gen.pipe.vae and pol.ref.pipe.text_encoder is pol.gen.pipe.text_encoder
    batch = pol.rollout(_obs(), torch.Generator().manual_seed(0)).batch
    out = pol.evaluate(batch)
    assert torch.allclose(out.kl, torch.zeros(4), atol=1e-8)


def test_engine_gradient_checkpointing_reaches_a_diffusers_transformer(tiny_sd3):
    """trainer.engine.gradient_checkpointing (Policy.enable_gradient_checkpointing) finds the diffusers
    model; the tiny generator has none and says so."""
    from mmrl.config import ConfigError

    pol = DiffusionPolicy(DiffusionConfig(model=str(tiny_sd3), num_steps=3, lora_rank=4), 16 * 16 * 3)
    assert not pol.gen.transformer.is_gradient_checkpointing
    pol.enable_gradient_checkpointing()
    assert pol.gen.transformer.is_gradient_checkpointing
    with pytest.raises(ConfigError, match="transformers / diffusers"):
        _tiny().enable_gradient_checkpointing()


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["policy.dtype=bfloat16"], "tiny generator keeps float32 weights"),
        (["policy.gradient_checkpointing=true"], "tiny generator has none"),
        (["policy.model=FOLDER", "policy.dtype=float16"], "set trainer.engine.backend=deepspeed"),
        (
            [
                "policy.model=FOLDER",
                "policy.dtype=bfloat16",
                "trainer.engine.precision=fp16",
                "trainer.engine.backend=deepspeed",
                "run.device=cuda",
            ],
            "set trainer.engine.precision=bf16",
        ),
    ],
)
def test_incoherent_precision_is_refused_when_the_config_loads(tiny_sd3, overrides, match):
    from pathlib import Path

    from mmrl.config import ConfigError
    from mmrl.experiment import load_experiment

    config = Path(__file__).resolve().parents[2] / "configs/diffusion_shapes_nft.yaml"
    overrides = [o.replace("FOLDER", str(tiny_sd3)) for o in overrides]
    with pytest.raises(ConfigError, match=match) as err:
        load_experiment(config, overrides)
    assert "\n" not in str(err.value)
    load_experiment(config, [f"policy.model={tiny_sd3}", "policy.dtype=bfloat16", "trainer.engine.precision=bf16"])
