"""DiffusionNFT's forward-process loss (`mmrl.flow.nft_loss`): a case computed by hand, the direction
its gradient moves the velocity for good and bad samples (which fails when the positive and
negative roles are swapped), the on-policy form, and the loss on the diffusion policy."""

from __future__ import annotations

import pytest
import torch

from mmrl.flow import nft_loss, nft_optimality


def constant_velocity(theta: torch.Tensor):
    """``v(x, t) = theta`` for every row: the velocity is the parameter itself."""
    return lambda x, t: (theta.expand_as(x), None)


# x0 = 1, noise = 2, t = 0.5: x_t = 1.5; the velocity that reconstructs x0 is (x_t - x0) / t = 1
X0, NOISE, T = torch.tensor([[1.0]]), torch.tensor([[[2.0]]]), torch.tensor([[0.5]])


def loss_and_grad(theta0: float, old: float | None, adv: float, beta: float, adaptive: bool):
    theta = torch.tensor([theta0], requires_grad=True)
    old_fn = None if old is None else constant_velocity(torch.tensor([old]))
    loss = nft_loss(
        constant_velocity(theta), old_fn, X0, torch.tensor([adv]), beta, 5.0, adaptive_weight=adaptive, t=T, noise=NOISE
    )
    loss.sum().backward()
    return loss.item(), theta.grad.item()


def test_a_case_computed_by_hand():
    """v = 0.4, v_old = 0.2, beta = 0.5: v_pos = 0.3, v_neg = 0.1; x0_pos = 1.35, x0_neg = 1.45;
    A = 2.5 of 5 -> r = 0.75; loss = 5 / 0.5 * (0.75 * 0.35^2 + 0.25 * 0.45^2) = 1.425 and
    d loss / d v = 10 * (0.75 * 2 * 0.35 * (-0.25) + 0.25 * 2 * 0.45 * 0.25) = -0.75; with the
    adaptive weight each squared error is divided by its absolute error: 10 * (0.75 * 0.35 + 0.25 * 0.45)."""
    assert nft_optimality(torch.tensor([2.5, -9.0, 0.0]), 5.0).tolist() == [0.75, 0.0, 0.5]
    loss, grad = loss_and_grad(0.4, 0.2, 2.5, 0.5, adaptive=False)
    assert loss == pytest.approx(1.425) and grad == pytest.approx(-0.75)
    loss, _ = loss_and_grad(0.4, 0.2, 2.5, 0.5, adaptive=True)
    assert loss == pytest.approx(3.75)


def test_the_adaptive_weights_gradient_by_hand():
    """The default mode (``adaptive_weight``): the weight w = |x0_hat - x0| is a constant of the
    step (detached), so d(e^2 / w) / dv = 2 e / w * de/dv = 2 sign(e) de/dv:
    10 * (0.75 * 2 * (-0.25) + 0.25 * 2 * 0.25) = -2.5. A weight left attached gives d|e| / dv
    instead, half of it (-1.25); the loss's value cannot tell the two apart."""
    loss, grad = loss_and_grad(0.4, 0.2, 2.5, 0.5, adaptive=True)
    assert loss == pytest.approx(3.75) and grad == pytest.approx(-2.5)


@pytest.mark.parametrize("adaptive", [False, True])
def test_good_samples_pull_the_velocity_to_them_and_bad_ones_push_it_away(adaptive):
    """At v = 0.4 (the reconstructing velocity is 1): a good sample's gradient raises v towards 1,
    a bad one's lowers it, an average one (r = 1/2) leaves the on-policy velocity alone. Swapping
    the positive and negative policies' roles flips both signs."""
    _, good = loss_and_grad(0.4, None, 5.0, 1.0, adaptive)
    _, bad = loss_and_grad(0.4, None, -5.0, 1.0, adaptive)
    _, average = loss_and_grad(0.4, None, 0.0, 1.0, adaptive)
    assert good < 0 < bad and average == pytest.approx(0.0, abs=1e-7)


def test_on_policy_form_equals_an_old_velocity_equal_to_the_current_one():
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 3)
    fn = lambda x, t: (net(x) * t[:, None], None)  # noqa: E731
    x0, adv = torch.randn(4, 3), torch.tensor([1.0, -2.0, 0.5, 4.0])
    gen = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    a = nft_loss(fn, None, x0, adv, num_timesteps=3, generator=gen())
    b = nft_loss(fn, fn, x0, adv, num_timesteps=3, generator=gen())
    assert a.shape == (4,) and torch.allclose(a, b)
    with pytest.raises(ValueError, match="beta must be > 0"):
        nft_loss(fn, None, x0, adv, beta=0.0)


def test_the_diffusion_policy_trains_with_nft_and_keeps_its_old_copy():
    from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
    from mmrl.simulator import Observation

    torch.manual_seed(0)
    pol = DiffusionPolicy(DiffusionConfig(num_steps=3, width=16, nft_old_decay=0.5, nft_timesteps=2), 16 * 16 * 3)
    obs = Observation(torch.zeros(4, 16, 16, 3, dtype=torch.uint8), ["a red circle"] * 2 + ["two blue squares"] * 2)
    batch = pol.rollout(obs, torch.Generator().manual_seed(0)).batch
    loss = pol.forward_process_loss(batch, torch.tensor([2.0, -2.0, 1.0, -1.0]))
    assert loss.shape == (4,) and torch.isfinite(loss).all()
    loss.mean().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pol.gen.parameters())
    key = "out.2.bias"
    before = pol._copy_params("old")[key].clone()
    with torch.no_grad():
        pol.gen.out[-1].bias.add_(0.2)
    pol.after_step()  # an optimizer step of the update: the old policy holds still
    assert torch.equal(pol._copy_params("old")[key], before)
    pol.sync_rollout()  # the update is over: it moves once
    assert torch.allclose(pol._copy_params("old")[key], 0.5 * before + 0.5 * pol.gen.out[-1].bias)
    assert "nft_old__out__2__bias" in pol.state_dict()  # the old policy is checkpointed


def test_with_an_old_policy_the_training_rollouts_come_from_it():
    """nft_old_decay set: the old copy samples the training data (v_old is the data policy, as in the
    reference) and stays put through the update; evaluation rollouts use the current policy."""
    from mmrl.policies.diffusion import DiffusionConfig, DiffusionPolicy
    from mmrl.simulator import Observation

    torch.manual_seed(0)
    pol = DiffusionPolicy(DiffusionConfig(num_steps=3, width=16, nft_old_decay=0.0, method="ode"), 16 * 16 * 3)
    pol.after_warm_start()
    obs = Observation(torch.zeros(2, 16, 16, 3, dtype=torch.uint8), ["a red circle", "two blue squares"])

    def chain(mode):
        return pol.rollout(obs, torch.Generator().manual_seed(0), mode=mode).batch.get("flow_chain")

    def images(mode):
        return pol.rollout(obs, torch.Generator().manual_seed(0), mode=mode).actions

    before, shown = chain("train"), images("eval")
    with torch.no_grad():
        pol.gen.out[-1].bias.add_(0.5)  # the current policy moves, the old copy does not
    assert torch.equal(chain("train"), before)
    assert not torch.equal(images("eval"), shown)  # evaluation shows the current policy
    pol.after_step()
    assert torch.equal(chain("train"), before)  # not within the update
    pol.sync_rollout()  # decay 0: the next rollouts come from the policy the update left
    assert not torch.equal(chain("train"), before)
    params = dict(pol.gen.named_parameters())
    assert all(torch.equal(e, params[k]) for k, e in pol._copy_params("old").items())  # a copy of it


def test_an_old_policy_outside_diffusionnft_is_refused_at_load():
    """The old copy samples the rollouts: under Flow-GRPO's PPO that would be off-policy in silence."""
    from pathlib import Path

    from mmrl.config import ConfigError
    from mmrl.experiment import load_experiment

    root = Path(__file__).resolve().parents[2] / "configs"
    with pytest.raises(ConfigError, match="nft_old_decay.*'ppo'.*set policy.nft_old_decay=null"):
        load_experiment(root / "diffusion_shapes_flow_grpo.yaml", ["policy.nft_old_decay=0.0"])
    cfg = load_experiment(root / "diffusion_shapes_nft.yaml", ["policy.nft_old_decay=0.0"])
    assert cfg.policy.nft_old_decay == 0.0
