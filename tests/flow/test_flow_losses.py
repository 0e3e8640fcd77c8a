"""Likelihood-free objectives (flow matching, AWM) and the Flow-Noise head."""

import pytest
import torch

from mmrl.flow import FlowNoiseHead, awm_loss, flow_matching_loss


def _data(seed=0, shape=(5, 4, 3)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g), g


def test_flow_matching_loss_zero_for_exact_velocity():
    x0, noise, g = _data()
    t = torch.rand(5, generator=g)

    def oracle(x, tt):  # knows x0 and noise through the closure
        return noise - x0, None

    loss = flow_matching_loss(oracle, x0, t=t, noise=noise)
    assert loss.shape == (5,) and torch.all(loss.abs() < 1e-12)


def test_flow_matching_loss_hand_value():
    # model v = 0: loss_b = mean_E (noise - x0)^2 ; with weights w_b: w_b * that
    x0, noise, g = _data(1)
    t = torch.rand(5, generator=g)
    zero = lambda x, tt: (torch.zeros_like(x), None)  # noqa: E731
    expect = ((noise - x0) ** 2).reshape(5, -1).mean(1)
    torch.testing.assert_close(flow_matching_loss(zero, x0, t=t, noise=noise), expect)
    w = torch.tensor([1.0, 0.0, 2.0, 1.0, 0.5])
    torch.testing.assert_close(flow_matching_loss(zero, x0, t=t, noise=noise, weights=w), w * expect)
    # the model sees x_t = t noise + (1 - t) x0 and t
    seen = {}

    def spy(x, tt):
        seen["x"], seen["t"] = x, tt
        return torch.zeros_like(x), None

    flow_matching_loss(spy, x0, t=t, noise=noise)
    torch.testing.assert_close(seen["x"], t[:, None, None] * noise + (1 - t[:, None, None]) * x0)
    assert torch.equal(seen["t"], t)
    # random draws are reproducible with a generator, and stay in (0, 1) for logit-normal
    a = flow_matching_loss(zero, x0, generator=torch.Generator().manual_seed(3))
    b = flow_matching_loss(zero, x0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    flow_matching_loss(spy, x0, generator=g, time_sampling="logit_normal")
    assert torch.all((seen["t"] > 0) & (seen["t"] < 1))


def test_awm_uniform_equals_advantage_times_fm_loss(tiny_net):
    x0, noise, g = _data(2)
    t = torch.rand(5, generator=g)
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0, -1.0])
    fm = flow_matching_loss(tiny_net, x0, t=t, noise=noise)
    awm = awm_loss(tiny_net, x0, adv, t=t[:, None], noise=noise[:, None])
    torch.testing.assert_close(awm, adv * fm)
    # "t" weighting scales by t; "huber" is t * (sqrt(err + c^2) - c)
    torch.testing.assert_close(
        awm_loss(tiny_net, x0, adv, weighting="t", t=t[:, None], noise=noise[:, None]), adv * t * fm
    )
    c = 0.1
    torch.testing.assert_close(
        awm_loss(tiny_net, x0, adv, weighting="huber", huber_c=c, t=t[:, None], noise=noise[:, None]),
        adv * t * (torch.sqrt(fm + c * c) - c),
    )


def test_awm_stratified_timesteps_one_batched_call(tiny_net):
    x0, _, _ = _data(3)
    K, seen = 4, {}

    def spy(x, tt):
        seen["x"], seen["t"] = x, tt
        return tiny_net(x, tt)

    loss = awm_loss(spy, x0, torch.ones(5), num_timesteps=K, generator=torch.Generator().manual_seed(0))
    assert loss.shape == (5,) and torch.isfinite(loss).all()
    assert seen["x"].shape == (5 * K, 4, 3)  # one call, sample-major rows
    t = seen["t"].reshape(5, K)
    for j in range(K):  # one t per stratum [j/K, (j+1)/K)
        assert torch.all((t[:, j] >= j / K) & (t[:, j] < (j + 1) / K))
    loss.mean().backward()
    assert tiny_net.v_head.weight.grad is not None
    with pytest.raises(ValueError):
        awm_loss(spy, x0, torch.ones(5), weighting="bogus")


def test_flow_noise_head_bounds_and_shapes():
    torch.manual_seed(0)
    head = FlowNoiseHead(16, 7, min_std=0.05, max_std=0.5)
    h = torch.randn(2, 10, 16)
    std = head(h)
    assert std.shape == (2, 10, 7)
    torch.testing.assert_close(std, torch.full_like(std, 0.275))  # zero-init: the midpoint
    torch.nn.init.normal_(head.mlp[-1].weight, std=10.0)
    std = head(h * 10)
    assert torch.all((std >= 0.05) & (std <= 0.5)) and std.std() > 0
    timed = FlowNoiseHead(16, 7, time_dim=4)
    assert timed(h, torch.randn(2, 1, 4)).shape == (2, 10, 7)
    with pytest.raises(ValueError):
        timed(h)
