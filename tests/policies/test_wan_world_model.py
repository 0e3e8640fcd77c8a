"""The world model on Wan (`mmrl.policies.wan_world_model`), on the tiny random-weight diffusers Wan
pipeline (`mmrl.tiny.tiny_wan`, 16 px frames: 4 x 4 latents, 2 x 2 tokens per frame): its warm start
lowers the loss, its samples are frames and states that the generator decides, the actions reach the
prediction, the context is clean at timestep 0 and only the next frame is noised and scored, and a
trained run exports, loads back and plays as the world-model simulator."""

from __future__ import annotations

import pytest
import torch
import yaml

from mmrl.utils.compat import patch_torchvision

patch_torchvision()  # before diffusers' pipelines (and peft) import transformers, which imports torchvision
pytest.importorskip("diffusers", reason="the Wan world model needs diffusers (mmrl[diffusion])")

from mmrl.batch import Batch  # noqa: E402
from mmrl.config import ConfigError  # noqa: E402
from mmrl.policies.base import encode_text  # noqa: E402
from mmrl.policies.wan_world_model import WanWorldModelConfig, WanWorldModelPolicy, shifted  # noqa: E402
from tests.policies.test_world_model import SIM, demos, played  # noqa: E402  (the built-in model's test data)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def model(folder, state_dim: int = 2, seed: int = 0, **kw) -> WanWorldModelPolicy:
    torch.manual_seed(seed)
    kw = {"image_size": 16, "max_sequence_length": 8, "cond_hidden": 32, "sample_steps": 2, **kw}
    return WanWorldModelPolicy(WanWorldModelConfig(pretrained=str(folder), **kw), action_dim=2, state_dim=state_dim)


def mean_loss(m, batch: Batch, seeds=(100, 101, 102)) -> float:
    """The loss under fixed flow times and noise (the same draws for every call)."""
    out = []
    for s in seeds:
        torch.manual_seed(s)
        out.append(m.supervised_loss(batch).mean().item())
    return sum(out) / len(out)


def train(m, batch: Batch, steps: int, lr: float, rows: int = 16) -> None:
    opt = torch.optim.Adam([p for p in m.parameters() if p.requires_grad], lr=lr)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = m.supervised_loss(batch.index(torch.randint(0, batch.size, (rows,), generator=gen))).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_the_warm_start_lowers_the_loss_on_recorded_episodes(tiny_wan):
    m = model(tiny_wan, context=2)
    d = demos()
    batch = m.warm_start_batch(d)
    assert batch["context"].shape == (batch.size, 2, 16, 16, 3)  # the built-in model's rows, unchanged
    loss = m.supervised_loss(batch.index(torch.arange(8)))
    assert loss.shape == (8,) and bool(torch.isfinite(loss).all())
    before = mean_loss(m, batch)
    train(m, batch, steps=40, lr=3e-3)
    assert mean_loss(m, batch) < 0.5 * before
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert any(n.startswith("gen.transformer.") for n in trainable) and any(n.startswith("heads.") for n in trainable)
    frozen = [*m.gen.pipe.vae.parameters(), *m.gen.pipe.text_encoder.parameters()]
    assert frozen and not any(p.requires_grad for p in frozen)  # VAE and UMT5 stay as loaded


def test_predict_gives_frames_and_states_that_the_generator_decides(tiny_wan):
    m = model(tiny_wan, context=2).eval()
    d = demos(3)
    b = m.warm_start_batch(d)
    args = (b["context"][:4], d["instruction"][:4], b["actions"][:4], b["state"][:4])
    img, state = m.predict(*args, torch.Generator().manual_seed(0))
    assert img.shape == (4, 16, 16, 3) and img.dtype == torch.uint8
    assert state is not None and state.shape == (4, 2) and state.dtype == torch.float32
    again, state2 = m.predict(*args, torch.Generator().manual_seed(0))
    assert torch.equal(img, again) and torch.equal(state, state2)
    other, _ = m.predict(*args, torch.Generator().manual_seed(1))
    assert not torch.equal(img, other)  # the noise comes from the generator
    with pytest.raises(ValueError, match="pass state"):
        m.predict(*args[:3], None)
    # the sampler: given the exact velocity of a straight path to x0, (x_t - x0) / t, the Euler steps
    # from noise end at x0, and the frame is x0 decoded (the VAE's per-channel normalisation undone)
    x0 = torch.randn(4, m.gen.latent_channels, 4, 4, generator=torch.Generator().manual_seed(2))
    m.velocity = lambda ctx, x, t, cond: (x - x0) / t.view(-1, 1, 1, 1)  # type: ignore[method-assign]
    img, _ = m.predict(*args, torch.Generator().manual_seed(0))
    want = ((m.gen.decode(x0[:, :, None])[:, 0] + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    assert torch.equal(img, want.permute(0, 2, 3, 1))


def test_the_actions_reach_the_prediction(tiny_wan):
    """Untrained, the action token is zero (its last layer starts at zero: the pretrained model sees one
    more padding row), yet the loss's gradient reaches it; trained on frames that the action decides
    (white after a positive first action component, black otherwise), the recorded actions fit better
    than the opposite ones, and the prediction follows the actions."""
    m = model(tiny_wan, state_dim=0)
    n, gen = 32, torch.Generator().manual_seed(0)
    actions = torch.rand(n, 1, 2, generator=gen) * 2 - 1
    ctx = torch.randint(0, 256, (n, 1, 16, 16, 3), dtype=torch.uint8, generator=gen)
    nxt = torch.where(actions[:, 0, 0, None, None, None] > 0, 255, 0).expand(n, 16, 16, 3).to(torch.uint8)
    batch = Batch(context=ctx, next_image=nxt, instruction=encode_text(["go"] * n), actions=actions)
    flipped = Batch(**{**batch, "actions": -actions})
    assert mean_loss(m, batch) == mean_loss(m, flipped)
    m.supervised_loss(batch).mean().backward()
    grad = m.heads["action"][-1].weight.grad
    assert grad is not None and grad.abs().sum() > 0
    m.zero_grad(set_to_none=True)
    train(m, batch, steps=100, lr=1e-2)
    assert mean_loss(m, flipped) > 1.05 * mean_loss(m, batch)
    with torch.no_grad():
        a, _ = m.predict(ctx[:8], ["go"] * 8, actions[:8], None, torch.Generator().manual_seed(0))
        b, _ = m.predict(ctx[:8], ["go"] * 8, -actions[:8], None, torch.Generator().manual_seed(0))
    assert not torch.equal(a, b)


def record_transformer(m) -> list[dict]:
    """Every transformer call's inputs (hidden states, timesteps)."""
    calls: list[dict] = []

    def hook(module, args, kwargs):
        calls.append({"hidden": kwargs["hidden_states"].detach().clone(), "timestep": kwargs["timestep"].clone()})

    m.gen.transformer.register_forward_pre_hook(hook, with_kwargs=True)
    return calls


def test_the_context_is_clean_at_timestep_0_and_only_the_next_frame_is_noised_and_scored(tiny_wan):
    k, tokens = 2, 4  # 16 px -> 4 x 4 latents -> 2 x 2 patches per frame
    m = model(tiny_wan, context=k, shift=3.0)
    batch = m.warm_start_batch(demos(3)).index(torch.arange(6))
    calls = record_transformer(m)
    torch.manual_seed(7)
    loss = m.supervised_loss(batch)
    (call,) = calls
    with torch.no_grad():
        ctx, x0 = m.encode_frames(batch["context"]), m.encode_frames(batch["next_image"])
    torch.manual_seed(7)  # the same draws, in supervised_loss's order
    t = shifted(torch.rand(6), 3.0)
    eps = torch.randn_like(x0)
    hidden, timestep = call["hidden"], call["timestep"]
    assert hidden.shape == (6, x0.shape[1], k + 1, 4, 4) and timestep.shape == (6, (k + 1) * tokens)
    assert torch.equal(hidden[:, :, :k], ctx.transpose(1, 2))  # the context latents, clean
    tt = t.view(-1, 1, 1, 1)
    assert torch.allclose(hidden[:, :, k], tt * eps + (1 - tt) * x0, atol=1e-6)  # the target, noised at t
    assert torch.equal(timestep[:, : k * tokens], torch.zeros(6, k * tokens))
    assert torch.allclose(timestep[:, k * tokens :], 1000 * t[:, None].expand(6, tokens))
    assert timestep.dtype == torch.float32 and bool((timestep[:, k * tokens :] > 0).all())

    def corrupt(at: slice):
        def hook(module, args, out):
            sample = out[0].clone()
            sample[:, :, at] += 100.0
            return (sample,)

        return m.gen.transformer.register_forward_hook(hook)

    with torch.no_grad():
        handle = corrupt(slice(0, k))  # the output at the context tokens is not scored
        torch.manual_seed(7)
        assert torch.equal(m.supervised_loss(batch), loss.detach())
        handle.remove()
        handle = corrupt(slice(k, k + 1))
        torch.manual_seed(7)
        assert (m.supervised_loss(batch) - loss).abs().min() > 1.0
        handle.remove()
    calls.clear()  # imagining: the context is clean at timestep 0 at every step
    m.predict(batch["context"][:2], ["a", "b"], batch["actions"][:2], batch["state"][:2])
    assert len(calls) == m.cfg.sample_steps
    for call in calls:
        assert torch.equal(call["hidden"][:, :, :k], ctx[:2].transpose(1, 2))
        assert not call["timestep"][:, : k * tokens].any() and call["timestep"][:, k * tokens :].min() > 0


def test_bad_settings_are_one_line_config_errors(tiny_wan):
    with pytest.raises(ConfigError, match="'policy.pretrained' is unset"):
        WanWorldModelPolicy(WanWorldModelConfig(image_size=16), action_dim=2)
    with pytest.raises(ConfigError, match=r"'policy.image_size' = 12: .*multiple of 8.*sim.kwargs.image_size"):
        model(tiny_wan, image_size=12)
    from mmrl.config import load_config

    with pytest.raises(ConfigError, match="'context' = 0 must be >= 1"):
        load_config(WanWorldModelConfig, {"type": "wan_world_model", "context": 0})


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_trained_run_exports_loads_back_and_plays_as_a_checked_simulator(tiny_wan, tmp_path, finetune):
    from mmrl.api import load_policy
    from mmrl.checks.simulator import check_simulator
    from mmrl.experiment import build_trainer, load_experiment

    section = {"context": 2, "max_sequence_length": 8, "cond_hidden": 16, "finetune": finetune, "lora_rank": 4}
    spec = yaml.safe_load(open("configs/reach_world_model.yaml"))
    spec["run"].update(name="wan_tiny", output_dir=str(tmp_path), threads=1)
    spec["sim"]["kwargs"] = SIM
    spec["policy"] = {"type": "wan_world_model", "pretrained": str(tiny_wan), "sample_steps": 2, **section}
    spec["warm_start"].update(num_episodes=4, steps=3, batch_size=8)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(spec))
    cfg = load_experiment(tmp_path / "run.yaml")
    build_trainer(cfg).run()
    trained = load_policy(tmp_path / "wan_tiny")
    from mmrl.planning.estimate import workload

    plan = workload(cfg)  # from the folder's configs on meta and one env of the simulator: the real counts
    assert plan.params == sum(p.numel() for p in trained.parameters())
    assert plan.trainable == sum(p.numel() for p in trained.parameters() if p.requires_grad)
    assert isinstance(trained, WanWorldModelPolicy) and trained.cfg.image_size == 16
    if finetune == "lora":  # the adapters trained, the transformer's own weights did not
        assert trained.gen.has_adapter
        assert all("lora_" in n for n, p in trained.gen.named_parameters() if p.requires_grad)
    trained.export_pretrained(tmp_path / "export")
    exported = load_policy(tmp_path / "export")
    assert isinstance(exported, WanWorldModelPolicy)
    d = demos(2, seed=3)
    b = trained.warm_start_batch(d)
    args = (b["context"][:3], d["instruction"][:3], b["actions"][:3], b["state"][:3])
    img, state = trained.predict(*args, torch.Generator().manual_seed(0))
    img2, state2 = exported.predict(*args, torch.Generator().manual_seed(0))
    assert torch.equal(img, img2) and state is not None and state2 is not None and torch.equal(state, state2)
    one, two = trained.state_dict(), exported.state_dict()
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    rows = b.index(torch.arange(4))
    losses = [mean_loss(p, rows) for p in (trained, exported, model(tiny_wan, **section))]
    assert losses[0] == losses[1] != losses[2]  # the trained weights came back; an untrained model differs
    make = played(tmp_path, num_envs=2, max_episode_steps=4)
    assert {"reset", "step", "step_chunk", "episode", "truncation"} <= set(check_simulator(make(), chunk_size=2))
    sim = make()
    assert isinstance(sim.model, WanWorldModelPolicy)
    obs = sim.reset(0)
    assert obs.image.shape == (2, 16, 16, 3) and obs.state.shape == (2, 2)
    sim.step_chunk(torch.zeros(2, 2, 2))
    assert sim.imagined_steps == 4
