"""Policy/value losses, KL estimators and aggregation against hand-computed cases."""

import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algorithms import (
    aggregate_loss,
    gspo_log_ratio,
    gspo_token_ratio,
    kl_penalty,
    ppo_clip_loss,
    value_loss,
)

D = torch.float64


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


def logps(ratios, old=(-1.0, -2.0, -0.5, -3.0, -1.5, -0.7)):
    """logp / old_logp pairs whose ratio exp(logp - old) is exactly ``ratios``."""
    old = t(list(old[: len(ratios)]))
    logp = (old + torch.log(t(ratios))).requires_grad_(True)
    return logp, old


# ratios and advantages of the PPO cases:
#   e0 r=1.5  A=+1   e1 r=0.5 A=+1   e2 r=1.1 A=-1   e3 r=0.7 A=-1   e4 r=4.0 A=-2   e5 r=1.25 A=+1
RATIOS = [1.5, 0.5, 1.1, 0.7, 4.0, 1.25]
ADV = t([1.0, 1.0, -1.0, -1.0, -2.0, 1.0])


def test_ppo_clip_symmetric():
    # loss = max(-A r, -A clip(r, 0.8, 1.2))
    # e0: max(-1.5, -1.2) = -1.2 (clipped)   e1: max(-0.5, -0.8) = -0.5
    # e2: max(1.1, 1.1) = 1.1                e3: max(0.7, 0.8) = 0.8 (clipped)
    # e4: max(8.0, 2.4) = 8.0                e5: max(-1.25, -1.2) = -1.2 (clipped)
    logp, old = logps(RATIOS)
    loss, stats = ppo_clip_loss(logp, old, ADV, clip_low=0.2)
    assert_close(loss, t([-1.2, -0.5, 1.1, 0.8, 8.0, -1.2]))
    assert stats["clipped"].tolist() == [True, False, False, True, False, True]
    assert not stats["dual_clipped"].any()
    assert_close(stats["ratio"], t(RATIOS))
    # k3 approx KL(old||new) = r - 1 - ln r: r=1.5 -> 0.5 - 0.4054651 = 0.0945349,
    # r=0.5 -> -0.5 + 0.6931472 = 0.1931472
    assert_close(stats["approx_kl"][:2], t([0.0945348918918356, 0.1931471805599453]))
    # gradient: clipped elements get none; unclipped d(-A r)/dlogp = -A r
    loss.sum().backward()
    assert_close(logp.grad, t([0.0, -0.5, 1.1, 0.0, 8.0, 0.0]))


def test_ppo_clip_higher_asymmetric():
    # clip range [0.8, 1.28]: e0 max(-1.5, -1.28) = -1.28 (clipped); e5 r=1.25 inside -> -1.25;
    # negatives unchanged (lower bound still 0.8)
    logp, old = logps(RATIOS)
    loss, stats = ppo_clip_loss(logp, old, ADV, clip_low=0.2, clip_high=0.28)
    assert_close(loss, t([-1.28, -0.5, 1.1, 0.8, 8.0, -1.25]))
    assert stats["clipped"].tolist() == [True, False, False, True, False, False]


def test_ppo_dual_clip_bounds_negative_advantage():
    # c = 3: for A < 0 loss = min(loss, -3A). e4: min(8.0, 6.0) = 6.0 (dual clipped, no grad);
    # e2 (1.1 < 3), e3 (0.8 < 3) unchanged; positive-A elements unchanged.
    logp, old = logps(RATIOS)
    loss, stats = ppo_clip_loss(logp, old, ADV, clip_low=0.2, dual_clip=3.0)
    assert_close(loss, t([-1.2, -0.5, 1.1, 0.8, 6.0, -1.2]))
    assert stats["dual_clipped"].tolist() == [False, False, False, False, True, False]
    loss.sum().backward()
    assert_close(logp.grad, t([0.0, -0.5, 1.1, 0.0, 0.0, 0.0]))
    with pytest.raises(ValueError):
        ppo_clip_loss(logp, old, ADV, dual_clip=0.5)


def test_ppo_broadcast_advantage():
    # [B=1, T=2] log-probs, [B, 1] advantage; r = [1.5, 0.5], A = 2 -> max(-3, -2.4), max(-1, -1.6)
    logp, old = logps([1.5, 0.5])
    loss, _ = ppo_clip_loss(logp[None], old[None], t([[2.0]]))
    assert_close(loss, t([[-2.4, -1.0]]))


def test_gspo_sequence_ratio_value_and_grad():
    # logp - old: row 0 [0.3, -0.1, 0.4] all valid -> mean 0.2
    #             row 1 [0.6, 0.2, 5.0] last masked -> mean 0.4
    old = t([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    logp = (old + t([[0.3, -0.1, 0.4], [0.6, 0.2, 5.0]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    seq = gspo_log_ratio(logp, old, mask)
    assert_close(seq, t([0.2, 0.4]))
    seq.sum().backward()  # d/dlogp_t = mask_t / |y|
    assert_close(logp.grad, t([[1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0.0]]))


def test_gspo_token_ratio_value_and_grad():
    # values: every token carries s_i = exp(0.2) = 1.2214028, exp(0.4) = 1.4918247
    # gradient: d s_it / d logp_t = s_i only (the sequence part is stop-gradient), so with
    # weights w the grad of sum(w * s) is w * s_i.
    old = t([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    logp = (old + t([[0.3, -0.1, 0.4], [0.6, 0.2, 5.0]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    ratio = gspo_token_ratio(logp, old, mask)
    s0, s1 = 1.2214027581601699, 1.4918246976412703
    assert_close(ratio, t([[s0, s0, s0], [s1, s1, s1]]))
    w = t([[1.0, 2.0, 3.0], [1.0, 1.0, 0.0]])
    (ratio * w).sum().backward()
    assert_close(logp.grad, t([[s0, 2 * s0, 3 * s0], [s1, s1, 0.0]]))


def test_kl_estimators():
    # x = logp - ref = [1, 0, -1.5]
    # k1 = x;  k2 = x^2/2 = [0.5, 0, 1.125]
    # k3 = exp(-x) + x - 1 = [e^-1, 0, e^1.5 - 2.5] = [0.3678794, 0, 1.9816891]
    logp, ref = t([0.0, -1.0, -2.0]), t([-1.0, -1.0, -0.5])
    assert_close(kl_penalty(logp, ref, "k1"), t([1.0, 0.0, -1.5]))
    assert_close(kl_penalty(logp, ref, "k2"), t([0.5, 0.0, 1.125]))
    assert_close(kl_penalty(logp, ref, "k3"), t([0.36787944117144233, 0.0, 1.9816890703380645]))
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(logp, ref, "k4")


def test_k3_clamps_log_ratio():
    # x = -100 -> log(ref/pi) = 100 clamped to 20: e^20 - 20 - 1 = 485165174.4097903
    out = kl_penalty(t([-100.0]), t([0.0]), "k3")
    assert torch.isfinite(out).all()
    assert math.isclose(out.item(), 485165174.4097903, rel_tol=1e-12)
    out32 = kl_penalty(torch.tensor([-1000.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(out32).all()


def test_value_loss_plain_and_clipped():
    # V = [1, 2, 0, 0], V_old = [0.5, 2.5, 0, 1], R = [2, 1, 0.1, 3], clip 0.2
    # plain: 0.5*(V-R)^2 = [0.5, 0.5, 0.005, 4.5]
    # clipped V: [0.7, 2.3, 0, 0.8] -> (Vc-R)^2 = [1.69, 1.69, 0.01, 4.84]
    # 0.5*max = [0.845, 0.845, 0.005, 4.5]
    v, v_old, ret = t([1.0, 2.0, 0.0, 0.0]), t([0.5, 2.5, 0.0, 1.0]), t([2.0, 1.0, 0.1, 3.0])
    assert_close(value_loss(v, v_old, ret), t([0.5, 0.5, 0.005, 4.5]))
    assert_close(value_loss(v, v_old, ret, clip=0.2), t([0.845, 0.845, 0.005, 4.5]))


# loss [[1,2,3],[4,5,6]], mask [[1,1,0],[1,0,0]]
LOSS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
MASK = [[1, 1, 0], [1, 0, 0]]


@pytest.mark.parametrize(
    "mode,norm_len,expected",
    [
        ("token-mean", None, 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-mean", None, 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum", None, 3.5),  # (3 + 4) / 2
        ("seq-mean-token-sum-norm", None, 7 / 6),  # (3/3 + 4/3) / 2
        ("seq-mean-token-sum-norm", 4, 0.875),  # (3/4 + 4/4) / 2
    ],
)
def test_aggregate_modes(mode, norm_len, expected):
    out = aggregate_loss(t(LOSS), torch.tensor(MASK), mode, norm_len=norm_len)
    assert_close(out, t(expected))
    # an all-padding row (even holding NaN) changes nothing
    loss3 = t(LOSS + [[float("nan"), 7.0, 8.0]])
    mask3 = torch.tensor(MASK + [[0, 0, 0]])
    assert_close(aggregate_loss(loss3, mask3, mode, norm_len=norm_len), t(expected))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_aggregate_1d_and_empty(mode):
    # [B] loss is read as T = 1: every mode is the mean over valid entries, (1 + 3) / 2 = 2
    assert_close(aggregate_loss(t([1.0, 2.0, 3.0]), torch.tensor([1, 0, 1]), mode), t(2.0))
    loss = t([[1.0, 2.0]]).requires_grad_(True)
    out = aggregate_loss(loss, torch.zeros(1, 2), mode)
    assert out.item() == 0.0
    out.backward()
    assert_close(loss.grad, t([[0.0, 0.0]]))


def test_aggregate_bad_mode():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        aggregate_loss(t(LOSS), torch.tensor(MASK), "sum")
