"""Advantage estimators against hand-computed cases (float64, expected numbers written out)."""

import math

import pytest
import torch
from torch.testing import assert_close

from mmrl.algorithms import (
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    ngrpo_advantages,
    psr_nsr_weights,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from mmrl.registry import ADVANTAGES

D = torch.float64


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


# ------------------------------------------------------------------------------------------- GAE


def test_gae_two_envs_one_done():
    # gamma = 0.9, lam = 0.8, gamma*lam = 0.72; both envs r = [1, 0, 2], V = [0.5, 1.0, 1.5],
    # last_values = 2.0.
    # env 0, no done:
    #   d2 = 2 + 0.9*2.0 - 1.5 = 2.3          A2 = 2.3
    #   d1 = 0 + 0.9*1.5 - 1.0 = 0.35         A1 = 0.35 + 0.72*2.3   = 2.006
    #   d0 = 1 + 0.9*1.0 - 0.5 = 1.4          A0 = 1.4  + 0.72*2.006 = 2.84432
    # env 1, episode ends at t=1 (no bootstrap past it, nothing flows back from t=2):
    #   A2 = 2.3;  d1 = 0 - 1.0 = -1.0, A1 = -1.0;  A0 = 1.4 + 0.72*(-1.0) = 0.68
    rewards = t([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
    values = t([[0.5, 0.5], [1.0, 1.0], [1.5, 1.5]])
    dones = torch.tensor([[False, False], [False, True], [False, False]])
    adv, ret = gae(rewards, values, dones, t([2.0, 2.0]), gamma=0.9, lam=0.8)
    assert_close(adv, t([[2.84432, 0.68], [2.006, -1.0], [2.3, 2.3]]))
    # returns = A + V
    assert_close(ret, t([[3.34432, 1.18], [3.006, 0.0], [3.8, 3.8]]))


def test_gae_lambda_one_gamma_one_is_return_minus_value():
    # gamma = lam = 1: A_t = sum_{k>=t} r_k + last_value - V_t = [6+4-1, 5+4-2, 3+4-3]
    adv, ret = gae(
        t([[1.0], [2.0], [3.0]]),
        t([[1.0], [2.0], [3.0]]),
        torch.zeros(3, 1, dtype=torch.bool),
        t([4.0]),
        gamma=1.0,
        lam=1.0,
    )
    assert_close(adv, t([[9.0], [7.0], [4.0]]))
    assert_close(ret, t([[10.0], [9.0], [7.0]]))


@pytest.mark.parametrize("done_marked", [True, False])
def test_gae_invalid_steps_are_zero_and_do_not_propagate(done_marked):
    # r = [1, 1, 5], V = [0.5, 0.5, 9], valid = [1, 1, 0], last_values = 7 (must be ignored).
    # t=2 invalid -> A2 = 0.  t=1 is followed by an invalid step -> terminal:
    #   A1 = 1 - 0.5 = 0.5;  A0 = (1 + 0.9*0.5 - 0.5) + 0.72*0.5 = 0.95 + 0.36 = 1.31
    dones = torch.tensor([[False], [done_marked], [False]])
    valid = torch.tensor([[True], [True], [False]])
    adv, ret = gae(t([[1.0], [1.0], [5.0]]), t([[0.5], [0.5], [9.0]]), dones, t([7.0]), gamma=0.9, lam=0.8, valid=valid)
    assert_close(adv, t([[1.31], [0.5], [0.0]]))
    assert_close(ret, t([[1.81], [1.0], [9.0]]))


# ------------------------------------------------------------------------------------ GRPO family

R8 = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
G8 = [5, 5, 5, 5, 2, 2, 2, 2]  # non-contiguous, unsorted ids on purpose


def test_grpo_std():
    # group 5: [1,0,0,1], mean 0.5, unbiased var = 4*0.25/3 = 1/3, std = 0.5773503
    #   A = +-0.5 / 0.5773503 = +-0.8660254 (= sqrt(3)/2);  group 2: all equal -> 0
    adv = grpo_advantages(t(R8), torch.tensor(G8), eps=1e-12)
    s = 0.8660254037844386
    assert_close(adv, t([s, -s, -s, s, 0, 0, 0, 0]))


def test_grpo_default_eps_constant_group_is_zero_not_nan():
    adv = grpo_advantages(t([3.0, 3.0, 3.0]), torch.tensor([0, 0, 0]))
    assert_close(adv, t([0.0, 0.0, 0.0]))


def test_dr_grpo_no_std_division():
    expected = t([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    assert_close(grpo_advantages(t(R8), torch.tensor(G8), scale="none"), expected)
    assert_close(dr_grpo_advantages(t(R8), torch.tensor(G8)), expected)


def test_grpo_batch_std():
    # all 8 rewards: six 1s, two 0s, mean 0.75; sum of squared deviations 6*0.0625 + 2*0.5625
    # = 1.5; unbiased var = 1.5/7; std = 0.4629100; A = +-0.5/0.4629100 = +-1.0801234
    adv = grpo_advantages(t(R8), torch.tensor(G8), scale="batch_std", eps=1e-12)
    s = 1.0801234497346435
    assert_close(adv, t([s, -s, -s, s, 0, 0, 0, 0]))


def test_grpo_single_sample_group_and_bad_scale():
    adv = grpo_advantages(t([1.0, 0.0, 0.7]), torch.tensor([0, 0, 1]))
    assert adv[2].item() == 0.0 and torch.isfinite(adv).all()
    with pytest.raises(ValueError, match="batch_std"):
        grpo_advantages(t([1.0, 0.0]), torch.tensor([0, 0]), scale="mad")


def test_rloo():
    # [1,0,0,1]: r0 - mean(0,0,1) = 1 - 1/3 = 2/3; r1 - mean(1,0,1) = 0 - 2/3
    # [2,4,9]:  2 - 6.5 = -4.5;  4 - 5.5 = -1.5;  9 - 3 = 6
    # [5]: alone -> 0
    adv = rloo_advantages(t([1, 0, 0, 1, 2, 4, 9, 5.0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 2]))
    assert_close(adv, t([2 / 3, -2 / 3, -2 / 3, 2 / 3, -4.5, -1.5, 6.0, 0.0]))


def test_ngrpo_all_zero_group_negative():
    # all-zero group of 4 with virtual r_max = 1: values {0,0,0,0,1}, mean' = 0.2,
    #   squared deviations 4*0.04 + 0.64 = 0.8, unbiased var = 0.8/4 = 0.2, std = 0.4472136
    #   A = -0.2 / 0.4472136 = -0.4472136 (= -1/sqrt(5))
    # group [1,0,0,1] + virtual 1: values {1,0,0,1,1}, mean' = 0.6,
    #   sq = 3*0.16 + 2*0.36 = 1.2, var = 1.2/4 = 0.3, std = 0.5477226
    #   A(1) = 0.4/0.5477226 = 0.7302967,  A(0) = -0.6/0.5477226 = -1.0954451
    # all-ones group: identical to the virtual sample -> 0
    rewards = t([0, 0, 0, 0, 1, 0, 0, 1, 1, 1.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    adv = ngrpo_advantages(rewards, group, r_max=1.0, eps=1e-12)
    a, p, n = -0.4472135954999579, 0.7302967433402214, -1.0954451150103321
    assert_close(adv, t([a, a, a, a, p, n, n, p, 0.0, 0.0]))


def test_ngrpo_matches_paper_example():
    # NGRPO paper's analytic case, G = 8 with one correct: GRPO gives +2.47 / -0.35,
    # NGRPO +1.76 / -0.50.
    rewards = t([1.0] + [0.0] * 7)
    group = torch.zeros(8, dtype=torch.long)
    ng = ngrpo_advantages(rewards, group)
    gr = grpo_advantages(rewards, group)
    assert_close(ng[:2], t([1.76, -0.50]), atol=0.005, rtol=0)
    assert_close(gr[:2], t([2.47, -0.35]), atol=0.005, rtol=0)


def test_reinforce_pp_baseline():
    # group 0 [1,0,0,1] -> a = [.5,-.5,-.5,.5]; group 1 [2,2] -> a = [0, 0]
    # batch (unbiased) var of a over 6 samples = 1.0/5 = 0.2, std = 0.4472136
    # A = +-0.5/0.4472136 = +-1.1180340 (= sqrt(5)/2)
    adv = reinforce_pp_baseline_advantages(t([1, 0, 0, 1, 2, 2.0]), torch.tensor([0, 0, 0, 0, 1, 1]), eps=0.0)
    s = 1.118033988749895
    assert_close(adv, t([s, -s, -s, s, 0, 0]))


def test_reinforce_pp_token_level():
    # gamma = 0.5.  row 0 rewards [0,0,1], mask [1,1,1] -> G = [0.25, 0.5, 1]
    # row 1 rewards [0,2,9], mask [1,1,0] (9 is padding, ignored) -> G = [1, 2, 0]
    # valid G: 0.25, 0.5, 1, 1, 2 -> mean 0.95; deviations -0.7,-0.45,0.05,0.05,1.05;
    # squares sum 1.8; unbiased var 1.8/4 = 0.45; std 0.6708204
    # A = dev / 0.6708204: -1.0434984, -0.6708204, 0.0745356 | 0.0745356, 1.5652476, 0 (masked)
    rewards = t([[0, 0, 1], [0, 2, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = reinforce_pp_advantages(rewards, mask, gamma=0.5, eps=0.0)
    assert_close(
        adv,
        t(
            [
                [-1.0434983894999017, -0.6708203932499369, 0.07453559924999299],
                [0.07453559924999299, 1.5652475842498528, 0.0],
            ]
        ),
    )


def test_psr_nsr_weights():
    # W-REINFORCE: positive x0.1, negative x1
    adv = psr_nsr_weights(t([2.0, -1.0, 0.0, 0.5]), pos_weight=0.1, neg_weight=1.0)
    assert_close(adv, t([0.2, -1.0, 0.0, 0.05]))
    assert_close(psr_nsr_weights(t([2.0, -1.0]), 1.0, 0.0), t([2.0, 0.0]))


def test_registry_entries_share_one_signature_and_declare_their_needs():
    from types import SimpleNamespace

    from mmrl.capabilities import Component

    needs = {
        "grpo": {"groups"},
        "grpo_global_std": {"groups"},
        "dr_grpo": {"groups"},
        "rloo": {"groups"},
        "reinforce_pp_baseline": {"groups"},
        "ngrpo": {"groups"},
        "gae": {"critic"},
        "reinforce_pp": set(),
    }
    assert set(ADVANTAGES.names()) >= set(needs)
    for name, want in needs.items():
        entry = ADVANTAGES.get(name)
        assert isinstance(entry, Component) and entry.needs == want, name
    assert all(desc for _, desc in ADVANTAGES.describe())
    # estimate(batch, algo, last_values) -> (advantages [T, N], returns [T, N]): a group estimator scores
    # each episode's return within its group and gives it to every valid decision of the episode
    batch = {
        "rewards": t([[1.0, 0.0, 2.0], [1.0, 5.0, 0.0]]),
        "valid": torch.tensor([[1, 1, 1], [1, 0, 1]]).bool(),
        "group": torch.tensor([[3, 3, 4], [3, 3, 4]]),
    }
    adv, ret = ADVANTAGES.get("dr_grpo")(batch, SimpleNamespace(), None)
    # returns [2, 0, 2]; groups {0, 1} -> mean 1 -> [1, -1], {2} alone -> 0
    assert_close(adv, t([[1.0, -1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert_close(ret, t([[2.0, 0.0, 2.0], [2.0, 0.0, 2.0]]))
    assert_close(adv[0], dr_grpo_advantages(ret[0], batch["group"][0]) * batch["valid"][0])


def test_float32_inputs_work():
    adv = grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))
    assert adv.dtype == torch.float32
    assert math.isclose(adv[0].item(), 0.5 / (math.sqrt(0.5) + 1e-6), rel_tol=1e-5)


def test_reinforce_pp_skips_masked_tokens_inside_response():
    # mask [1, 0, 1] (middle token is e.g. tool output), reward 4 on the last token, gamma 0.5:
    # the masked token neither adds reward nor discounts -> G = [0.5*4, -, 4] = [2, -, 4]
    # second row [1, 1, 0] rewards [0, 3, 0] -> G = [1.5, 3, -]
    # valid G: 2, 4, 1.5, 3 -> mean 2.625; deviations -0.625, 1.375, -1.125, 0.375;
    # squares 0.390625 + 1.890625 + 1.265625 + 0.140625 = 3.6875; var = 3.6875/3 = 1.2291667;
    # std = 1.1086779; A = dev / std
    rewards = t([[0, 7, 4], [0, 3, 0.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])
    adv = reinforce_pp_advantages(rewards, mask, gamma=0.5, eps=0.0)
    std = 1.1086778913041726
    assert_close(adv, t([[-0.625 / std, 0.0, 1.375 / std], [-1.125 / std, 0.375 / std, 0.0]]))


def test_group_reward_stats_are_trls():
    """TRL's reward_std (mean of the groups' unbiased stds) and frac_reward_zero_std (groups whose
    rewards are all equal)."""
    from mmrl.algorithms.advantages import group_reward_stats

    returns = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 2.0, 0.0])
    group = torch.tensor([7, 7, 3, 3, 9, 9, 4, 4])
    stats = group_reward_stats(returns, group)
    stds = [torch.tensor(g).std().item() for g in ([1.0, 0.0], [1.0, 1.0], [0.5, 0.5], [2.0, 0.0])]
    assert stats["reward_std"] == pytest.approx(sum(stds) / 4)
    assert stats["frac_reward_zero_std"] == 0.5
