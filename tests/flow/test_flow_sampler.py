"""mmrl.flow.sampler: a = 0 reproduces the ODE, rollout vs recomputed log-probs, masks, reducing."""

import pytest
import torch

from mmrl.flow import (
    chain_log_prob,
    mean_path,
    noisy_steps,
    reduce_log_prob,
    sample,
    stochastic_mask,
    time_grid,
)

B, K = 6, 8


def _noise(seed=0, shape=(B, 4, 3)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_time_grid_linear_and_shift():
    g = time_grid(4)
    torch.testing.assert_close(g, torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))
    gs = time_grid(4, shift=3.0)
    assert gs[0] == 1.0 and gs[-1] == 0.0 and torch.all(gs[1:] < gs[:-1])
    assert abs(float(gs[2]) - 3 * 0.5 / (1 + 2 * 0.5)) < 1e-6  # 0.75
    assert torch.all(gs[1:-1] > g[1:-1])  # shift > 1 stays noisier


@pytest.mark.parametrize("method", ["sde", "cps"])
def test_zero_noise_level_reproduces_ode_chain(tiny_net, method):
    grid, noise = time_grid(K, shift=2.0), _noise()
    ode = sample(tiny_net, noise, grid, "ode")
    out = sample(tiny_net, noise, grid, method, noise_level=0.0, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(out.chain, ode.chain, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.x0, ode.chain[:, K])
    assert not out.stoch.any() and torch.all(out.logp == 0)
    assert torch.equal(ode.chain[:, 0], noise)


def test_ode_matches_manual_euler(tiny_net):
    grid, x = time_grid(3), _noise()
    out = sample(tiny_net, x, grid, "ode")
    for k in range(3):
        v, _ = tiny_net(x, grid[k].expand(B))
        x = x + (grid[k + 1] - grid[k]) * v
    torch.testing.assert_close(out.x0, x)


@pytest.mark.parametrize("method,a", [("sde", 0.7), ("cps", 0.7), ("noise", 0.0)])
@pytest.mark.parametrize("mode", ["all", "one", "window"])
def test_recomputed_log_probs_equal_rollout(tiny_net, method, a, mode):
    grid = time_grid(K, shift=3.0)
    g = torch.Generator().manual_seed(11)
    mask = stochastic_mask(B, K, mode, generator=g, window=(2, 5))
    out = sample(tiny_net, _noise(1), grid, method, noise_level=a, stoch=mask, generator=g)
    assert torch.isfinite(out.logp).all()
    assert torch.equal(out.stoch, mask & noisy_steps(grid, method, a)[None])
    assert out.stoch.any()
    for batch_steps in (True, False):
        re = chain_log_prob(tiny_net, out.chain, grid, out.stoch, method, a, batch_steps=batch_steps)
        assert re.shape == out.logp.shape
        ratio = torch.exp(re - out.logp)
        torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
        seq = torch.exp(reduce_log_prob(re, out.stoch) - reduce_log_prob(out.logp, out.stoch))
        torch.testing.assert_close(seq, torch.ones_like(seq), atol=1e-4, rtol=0)
        assert torch.all(re[~out.stoch] == 0)


def test_chain_log_prob_batches_steps_and_has_gradients(tiny_net):
    grid = time_grid(K)
    mask = stochastic_mask(B, K, "window", window=(3, 6))
    out = sample(
        tiny_net, _noise(2), grid, "sde", noise_level=0.7, stoch=mask, generator=torch.Generator().manual_seed(0)
    )
    tiny_net.calls = 0
    re = chain_log_prob(tiny_net, out.chain, grid, out.stoch, "sde", 0.7)
    assert tiny_net.calls == 1  # one call on [B * 3, *E]
    tiny_net.calls = 0
    chain_log_prob(tiny_net, out.chain, grid, out.stoch, "sde", 0.7, batch_steps=False)
    assert tiny_net.calls == 3  # only the window's steps
    reduce_log_prob(re, out.stoch).sum().backward()
    grads = [p.grad for p in tiny_net.v_head.parameters()]
    assert all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    assert any(gr.abs().sum() > 0 for gr in grads)


def test_cps_last_step_is_deterministic():
    grid = time_grid(4)
    assert noisy_steps(grid, "cps", 0.7).tolist() == [True, True, True, False]
    assert noisy_steps(grid, "sde", 0.7).all()
    assert not noisy_steps(grid, "sde", 0.0).any()


def test_stochastic_mask_modes():
    g = torch.Generator().manual_seed(0)
    one = stochastic_mask(64, K, "one", generator=g)
    assert one.shape == (64, K) and one.dtype == torch.bool
    assert torch.all(one.sum(1) == 1)
    assert len(set(one.float().argmax(1).tolist())) > 1  # not always the same step
    win = stochastic_mask(3, K, "window", window=(2, 5))
    assert win[:, 2:5].all() and not win[:, :2].any() and not win[:, 5:].any()
    assert stochastic_mask(3, K, "all").all() and not stochastic_mask(3, K, "none").any()
    with pytest.raises(ValueError):
        stochastic_mask(3, K, "window", window=(5, 5))


def test_reduce_log_prob_hand_example():
    # B = 1, K = 3, E = [2, 2]; step 1 is not stochastic (its values must be ignored).
    logp = torch.tensor(
        [
            [
                [[1.0, 2.0], [3.0, 4.0]],  # step 0: sum 10, mean 2.5
                [[9.0, 9.0], [9.0, 9.0]],  # step 1: masked out
                [[-1.0, 0.0], [1.0, 2.0]],
            ]
        ]
    )  # step 2: sum 2, mean 0.5
    stoch = torch.tensor([[True, False, True]])
    assert reduce_log_prob(logp, stoch, 2).tolist() == [12.0]  # 10 + 2
    assert reduce_log_prob(logp, stoch, 2, step_reduce="mean").tolist() == [6.0]  # 12 / 2
    assert reduce_log_prob(logp, stoch, 2, elem_reduce="mean").tolist() == [3.0]  # 2.5 + 0.5
    assert reduce_log_prob(logp, stoch, 2, "mean", "mean").tolist() == [1.5]
    # per-dimension level [B, C, A]: steps summed, elements kept
    per_dim = reduce_log_prob(logp, stoch, 2, keep=2)
    assert per_dim.tolist() == [[[0.0, 2.0], [4.0, 6.0]]]
    # keep=1: sum over the chunk dim C, keep the action dim A: step0 [4, 6] + step2 [0, 2]
    assert reduce_log_prob(logp, stoch, 2, keep=1).tolist() == [[4.0, 8.0]]
    # no stochastic step: mean guards the zero count
    none = torch.zeros(1, 3, dtype=torch.bool)
    assert reduce_log_prob(logp, none, 2, step_reduce="mean").tolist() == [0.0]


@pytest.mark.parametrize("method,a", [("ode", 0.0), ("sde", 0.7), ("sde", 1.0), ("cps", 0.1)])
def test_samplers_preserve_gaussian_marginal(method, a):
    # 1-D data x0 ~ N(0, s^2) has the exact velocity E[noise - x0 | x_t] in closed form:
    #   Var x_t = t^2 + (1-t)^2 s^2,  v(x, t) = x (t - (1-t) s^2) / Var x_t.
    # Every sampler must then end with std(x0) ~= s (a sign error in the drift would not).
    # (CPS only for small a: with a = 0.7 it shrinks the spread to ~0.42, see cps_step.)
    s = 0.5

    def exact(x, t):
        tt = t.reshape(-1, 1)
        return x * (tt - (1 - tt) * s * s) / (tt * tt + (1 - tt) ** 2 * s * s), None

    g = torch.Generator().manual_seed(0)
    noise = torch.randn(20000, 1, generator=g, dtype=torch.float64)
    out = sample(exact, noise, time_grid(100, dtype=torch.float64), method, a, generator=g)
    assert abs(out.x0.std().item() - s) < 0.03
    assert abs(out.x0.mean().item()) < 0.03


def test_low_precision_chain_keeps_ratio_one(tiny_net):
    # bf16 model and chain: steps and log-probs are computed in float32 on the bf16-rounded
    # chain, so the per-step recompute (same batch composition as the rollout) gives ratio 1.
    net = tiny_net.to(torch.bfloat16)
    grid = time_grid(K)
    out = sample(
        net, _noise(3).to(torch.bfloat16), grid, "sde", noise_level=0.7, generator=torch.Generator().manual_seed(0)
    )
    assert out.chain.dtype == torch.bfloat16 and out.logp.dtype == torch.float32
    re = chain_log_prob(net, out.chain, grid, out.stoch, "sde", 0.7, batch_steps=False)
    torch.testing.assert_close(torch.exp(re - out.logp), torch.ones_like(re), atol=1e-5, rtol=0)


class _AffineNet(torch.nn.Module):
    """v = x W + b(t): every transition's mean is affine in x, so the mean of many stochastic chains
    from N(0, I) noise is the noise-free chain from zeros."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = torch.randn(3, 3, generator=g) * 0.3
        self.b = torch.randn(3, generator=g)

    def forward(self, x, t):
        return x @ self.w + self.b * (1 + t.reshape(-1, 1, 1)), None


@pytest.mark.parametrize("method", ["sde", "cps"])
def test_mean_path_is_the_stochastic_sampler_without_its_noise(method):
    net, grid = _AffineNet(), time_grid(4)
    n = 200_000
    noise = torch.randn(n, 1, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    net.w, net.b = net.w.double(), net.b.double()
    samples = sample(net, noise, grid.double(), method, noise_level=0.8, generator=torch.Generator().manual_seed(1))
    det = mean_path(net, torch.zeros(1, 1, 3, dtype=torch.float64), grid.double(), method, noise_level=0.8)
    torch.testing.assert_close(samples.x0.mean(0), det.x0[0], atol=0.02, rtol=0)
    ode = mean_path(net, torch.zeros(1, 1, 3, dtype=torch.float64), grid.double(), "ode")
    assert (det.x0 - ode.x0).abs().max() > 0.05  # the correction the ODE drops is kept
    assert not det.stoch.any() and torch.all(det.logp == 0) and det.chain.shape == (1, 5, 1, 3)


@pytest.mark.parametrize("method,a", [("ode", 0.0), ("noise", 0.0), ("sde", 0.0)])
def test_mean_path_of_an_euler_mean_is_the_ode(tiny_net, method, a):
    grid, noise = time_grid(K, shift=2.0), _noise()
    ode = sample(tiny_net, noise, grid, "ode")
    torch.testing.assert_close(mean_path(tiny_net, noise, grid, method, a).chain, ode.chain)


def test_subsample_steps_keeps_a_fraction_of_each_rows_stochastic_steps():
    from mmrl.flow import subsample_steps

    stoch = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0]]).bool()
    kept = subsample_steps(stoch, 0.5, torch.Generator().manual_seed(0))
    assert kept.sum(1).tolist() == [3, 2, 0, 1]  # max(1, round(0.5 n)); an empty row stays empty
    assert not (kept & ~stoch).any()  # only stochastic steps are trained
    assert subsample_steps(stoch, 1.0) is stoch
    draws = {tuple(subsample_steps(stoch, 0.5, torch.Generator().manual_seed(s))[0].tolist()) for s in range(20)}
    assert len(draws) > 5  # uniform over the row's steps, not always the first ones
    with pytest.raises(ValueError, match="fraction must be in"):
        subsample_steps(stoch, 0.0)
