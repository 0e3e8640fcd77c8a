"""Pure step functions of mmrl.flow.steps: hand-computed values, a = 0 limits, edges."""

import math

import torch

from mmrl.flow import cps_step, gaussian_log_prob, noise_step, ode_step, sde_sigma, sde_step


def test_gaussian_log_prob_matches_torch_normal():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, 3, generator=g)
    mean = torch.randn(5, 4, 3, generator=g)
    std = torch.rand(5, 4, 3, generator=g) + 0.05
    ref = torch.distributions.Normal(mean, std).log_prob(x)
    torch.testing.assert_close(gaussian_log_prob(x, mean, std), ref, atol=1e-6, rtol=0)
    # broadcast std (one value per row) and a 0-dim std
    std_row = torch.rand(5, 1, 1, generator=g) + 0.1
    ref = torch.distributions.Normal(mean, std_row.expand_as(mean)).log_prob(x)
    torch.testing.assert_close(gaussian_log_prob(x, mean, std_row), ref, atol=1e-6, rtol=0)
    ref = torch.distributions.Normal(mean, torch.full_like(mean, 0.3)).log_prob(x)
    torch.testing.assert_close(gaussian_log_prob(x, mean, torch.tensor(0.3)), ref, atol=1e-6, rtol=0)


def test_sde_step_hand_computed():
    # x = 1, v = 0.5, t = 0.5, t_next = 0.25, a = 0.5:
    #   sigma_t = a * sqrt(t / (1 - t)) = 0.5 * sqrt(0.5 / 0.5) = 0.5
    #   dt = t_next - t = -0.25
    #   sigma_t^2 / (2 t) = 0.25 / 1.0 = 0.25
    #   x + (1 - t) v = 1 + 0.5 * 0.5 = 1.25
    #   bracket = v + 0.25 * 1.25 = 0.5 + 0.3125 = 0.8125
    #   mean = x + bracket * dt = 1 - 0.203125 = 0.796875
    #   std = sigma_t * sqrt(-dt) = 0.5 * 0.5 = 0.25
    # Flow-GRPO's form gives the same: x (1 + s^2 dt / 2t) + v (1 + s^2 (1-t) / 2t) dt
    #   = 1 * (1 - 0.0625) + 0.5 * (1 + 0.125) * (-0.25) = 0.9375 - 0.140625 = 0.796875
    x, v = torch.tensor([1.0]), torch.tensor([0.5])
    mean, std = sde_step(x, v, 0.5, 0.25, 0.5)
    assert abs(mean.item() - 0.796875) < 1e-7
    assert abs(float(std) - 0.25) < 1e-7


def test_cps_step_hand_computed():
    # same scalar example, a = 0.5:
    #   std = t_next * sin(a pi / 2) = 0.25 * sin(pi / 4) = 0.1767767
    #   x0_hat = x - t v = 0.75 ; noise_hat = x + (1 - t) v = 1.25
    #   mean = (1 - t_next) x0_hat + sqrt(t_next^2 - std^2) noise_hat
    #        = 0.75 * 0.75 + sqrt(0.0625 - 0.03125) * 1.25 = 0.5625 + 0.1767767 * 1.25 = 0.7834709
    x, v = torch.tensor([1.0]), torch.tensor([0.5])
    mean, std = cps_step(x, v, 0.5, 0.25, 0.5)
    s = 0.25 * math.sin(math.pi / 4)
    assert abs(float(std) - s) < 1e-7
    assert abs(mean.item() - (0.5625 + s * 1.25)) < 1e-6


def test_zero_noise_level_is_euler():
    g = torch.Generator().manual_seed(1)
    x, v = torch.randn(3, 4, 3, generator=g), torch.randn(3, 4, 3, generator=g)
    for t, tn in [(1.0, 0.9), (0.6, 0.3), (0.2, 0.0)]:
        ref, std0 = ode_step(x, v, t, tn)
        assert float(std0) == 0.0
        for step in (sde_step, cps_step):
            mean, std = step(x, v, t, tn, 0.0)
            torch.testing.assert_close(mean, ref, atol=1e-6, rtol=0)
            assert torch.all(torch.as_tensor(std) == 0)
    mean, std = noise_step(x, v, 0.6, 0.3, torch.full_like(x, 0.2))
    torch.testing.assert_close(mean, ode_step(x, v, 0.6, 0.3)[0])


def test_per_row_times_broadcast_over_elements():
    g = torch.Generator().manual_seed(2)
    x, v = torch.randn(3, 4, 3, generator=g), torch.randn(3, 4, 3, generator=g)
    t, tn = torch.tensor([1.0, 0.7, 0.4]), torch.tensor([0.8, 0.5, 0.0])
    mean, std = sde_step(x, v, t, tn, 0.7)
    for i in range(3):
        m_i, s_i = sde_step(x[i : i + 1], v[i : i + 1], float(t[i]), float(tn[i]), 0.7)
        torch.testing.assert_close(mean[i : i + 1], m_i)
        torch.testing.assert_close(std[i].reshape(()), s_i.reshape(()))


def test_t_equal_one_edge_is_finite():
    g = torch.Generator().manual_seed(3)
    x, v = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    for tn in (0.9, 0.0):
        mean, std = sde_step(x, v, 1.0, tn, 0.7)
        assert torch.isfinite(mean).all() and torch.isfinite(std).all() and float(std) > 0
        lp = gaussian_log_prob(mean + std * x, mean, std)
        assert torch.isfinite(lp).all()
    # the edge substitutes t_next (= grid[1], Flow-GRPO's sigma_max) in 1 / (1 - t)
    sig = sde_sigma(1.0, 0.9, 0.7, x)
    assert abs(float(sig) - 0.7 * math.sqrt(1.0 / 0.1)) < 1e-5
    assert abs(float(sde_sigma(1.0, 0.9, 0.7, x, sigma_max=0.95)) - 0.7 * math.sqrt(20.0)) < 1e-4
    mean, std = cps_step(x, v, 1.0, 0.9, 0.7)
    assert torch.isfinite(mean).all() and float(std) > 0
