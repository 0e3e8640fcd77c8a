"""Flow VLA policy: gradients, detached value, eval ODE, warm start, an HF backbone. Ratio 1 before an
update for every sampler x stochastic steps x log-prob level: tests/policies/test_policy_check.py."""

import pytest
import torch

from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
from mmrl.simulator import Observation


def make_obs(b=6, size=32, state_dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (b, size, size, 3), generator=g, dtype=torch.uint8)
    colors = ["red", "green", "blue"]
    instr = [f"reach the {colors[i % 3]} target" for i in range(b)]
    return Observation(image, instr, torch.randn(b, state_dim, generator=g))


def make_policy(**kw):
    torch.manual_seed(0)
    cfg = FlowVLAConfig(dim=32, expert_dim=32, expert_layers=1, **kw)
    return FlowVLAPolicy(cfg, action_dim=2, state_dim=2)


def test_gradients_reach_expert_backbone_and_noise_head():
    policy = make_policy(method="noise")
    batch = policy.rollout(make_obs(), generator=torch.Generator().manual_seed(2)).batch
    out = policy.evaluate(batch)
    (out.logp.sum() + out.values.sum()).backward()
    assert policy.expert.out.weight.grad.abs().sum() > 0
    assert policy.noise_head is not None
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.noise_head.parameters())
    assert policy.backbone.conv1.weight.grad.abs().sum() > 0
    assert policy.value_head[0].weight.grad.abs().sum() > 0


def test_detached_value_does_not_train_backbone():
    policy = make_policy(detach_value=True)
    batch = policy.rollout(make_obs(), generator=torch.Generator().manual_seed(3)).batch
    policy.evaluate(batch).values.sum().backward()
    assert policy.backbone.conv1.weight.grad is None or policy.backbone.conv1.weight.grad.abs().sum() == 0


def test_eval_mode_is_deterministic_ode():
    policy = make_policy()
    obs = make_obs()
    a = policy.rollout(obs, generator=torch.Generator().manual_seed(5), mode="eval").batch
    b = policy.rollout(obs, generator=torch.Generator().manual_seed(5), mode="eval").batch
    torch.testing.assert_close(a["actions"], b["actions"])
    assert not a["flow_stoch"].any()  # ODE: no stochastic transitions


@pytest.mark.parametrize("method", ["sde", "noise"])
def test_eval_method_mean_is_the_training_chain_without_noise_from_zero(method):
    from mmrl.flow import mean_path

    policy = make_policy(method=method, noise_level=1.5, eval_method="mean")
    obs = make_obs()
    a = policy.rollout(obs, generator=torch.Generator().manual_seed(5), mode="eval").batch
    b = policy.rollout(obs, generator=torch.Generator().manual_seed(6), mode="eval").batch
    torch.testing.assert_close(a["actions"], b["actions"])  # one action per observation, whatever the seed
    assert not a["flow_stoch"].any() and torch.all(a["old_logp"] == 0)
    prefix, mask = policy.encode(obs.image, obs.instruction, obs.state)
    zeros = torch.zeros_like(a["flow_chain"][:, 0])
    want = mean_path(policy.model_fn(prefix, mask, method), zeros, policy.grid, method, 1.5).x0
    torch.testing.assert_close(a["actions"], policy.normalizer.unnormalize(want))
    policy.cfg.eval_method = "ode"
    ode = policy.rollout(obs, generator=torch.Generator().manual_seed(5), mode="eval").batch
    assert not torch.allclose(a["actions"], ode["actions"])  # not the ODE from a noise sample
    train = policy.rollout(obs, generator=torch.Generator().manual_seed(5)).batch
    assert train["flow_stoch"].all()  # rollouts still sample


def test_supervised_flow_matching_fits_a_fixed_batch(supervised_steps):
    policy = make_policy()
    obs = make_obs(b=16)
    from mmrl.batch import Batch
    from mmrl.policies.base import encode_text

    per_colour = torch.tanh(torch.randn(3, 4, 2, generator=torch.Generator().manual_seed(9)))
    target = per_colour[torch.arange(16) % 3]  # the chunk to imitate is decided by the instruction
    batch = Batch(image=obs.image, instruction=encode_text(obs.instruction), state=obs.state, actions=target)
    opt = torch.optim.Adam(policy.parameters(), lr=3e-3)

    def held_out_loss():  # the same flow times and noise before and after training
        torch.manual_seed(123)
        with torch.no_grad():
            return sum(policy.supervised_loss(batch).mean().item() for _ in range(8)) / 8

    first = held_out_loss()
    torch.manual_seed(0)
    supervised_steps(policy, batch, opt, 200)
    last = held_out_loss()
    assert last < 0.5 * first


def test_policy_with_hf_backbone_ratio_one(tmp_path):
    pytest.importorskip("transformers")
    from mmrl.policies.hf_backbone import HFImageTextBackbone
    from mmrl.tiny.tiny_models import tiny_image_text_model

    model, processor = tiny_image_text_model(tmp_path)
    backbone = HFImageTextBackbone.from_pretrained(tmp_path)
    torch.manual_seed(0)
    cfg = FlowVLAConfig(backbone=str(tmp_path), expert_dim=32, expert_layers=1, method="sde")
    policy = FlowVLAPolicy(cfg, action_dim=2, state_dim=2, backbone=backbone)
    batch = policy.rollout(make_obs(b=3), generator=torch.Generator().manual_seed(0)).batch
    out = policy.evaluate(batch)
    torch.testing.assert_close(out.logp, batch["old_logp"], atol=1e-4, rtol=0)
    out.logp.sum().backward()
    assert any(p.grad is not None for p in backbone.parameters())


@pytest.mark.gpu
def test_cuda_rollout_and_recompute_agree():
    policy = make_policy(method="sde").cuda()
    obs = make_obs()
    obs = Observation(obs.image.cuda(), obs.instruction, obs.state.cuda())
    batch = policy.rollout(obs, generator=torch.Generator(device="cuda").manual_seed(0)).batch
    assert batch["actions"].is_cuda
    out = policy.evaluate(batch)
    torch.testing.assert_close(out.logp, batch["old_logp"], atol=1e-4, rtol=0)


def test_action_bounds_from_the_config_map_the_policy_space_to_env_units():
    """policy.action_low / action_high: rollouts act in env units, demonstrations are normalised back."""
    from mmrl.experiment import load_experiment

    cfg = load_experiment(
        None,
        [
            "policy.action_low=[0.0, -2.0]",
            "policy.action_high=[1.0, 2.0]",
            "policy.backbone=tiny",
            "policy.num_views=1",
        ],
    ).policy
    policy = FlowVLAPolicy(cfg, action_dim=2, state_dim=None)
    x = torch.tensor([[[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5]]])
    env = policy.normalizer.unnormalize(x)
    assert env.tolist() == [[[0.0, -2.0], [1.0, 2.0], [0.5, 1.0]]]
    assert torch.allclose(policy.normalizer.normalize(env), x)
