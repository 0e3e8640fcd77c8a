"""Running statistics, reward scaling and explained variance, against hand-computed values."""

import math

import pytest
import torch

from mmrl.algorithms.normalization import (
    RewardScaler,
    RunningMeanStd,
    discounted_returns,
    explained_variance,
    merge_moments,
)


def test_merge_moments_equals_the_statistics_of_the_union():
    a, b = torch.tensor([1.0, 2.0, 6.0]), torch.tensor([4.0, 8.0])
    mean, var, count = merge_moments(
        a.mean().double(),
        a.var(unbiased=False).double(),
        torch.tensor(3.0).double(),
        b.mean().double(),
        b.var(unbiased=False).double(),
        2,
    )
    # the union [1, 2, 6, 4, 8]: mean 4.2, population variance (10.24+4.84+3.24+0.04+14.44)/5 = 6.56
    assert count.item() == 5
    assert mean.item() == pytest.approx(4.2)
    assert var.item() == pytest.approx(6.56)


def test_running_mean_std_over_batches_and_normalize():
    rms = RunningMeanStd(2, clip=3.0)
    x = torch.tensor([[0.0, 10.0], [2.0, 10.0], [4.0, 13.0], [6.0, 7.0]])
    rms.update(x[:1])
    rms.update(x[1:])
    # column 0: mean 3, population var 5; column 1: mean 10, var 4.5 (count starts at 1e-4)
    assert rms.mean.tolist() == pytest.approx([3.0, 10.0], abs=1e-3)
    assert rms.var.tolist() == pytest.approx([5.0, 4.5], abs=1e-2)
    z = rms.normalize(torch.tensor([[3.0 + math.sqrt(5.0), 100.0]]))
    assert z[0, 0].item() == pytest.approx(1.0, abs=1e-3)
    assert z[0, 1].item() == 3.0  # clipped
    rms.update(torch.tensor([[float("nan"), 1.0]]))  # a non-finite row is skipped
    assert rms.count.item() == pytest.approx(4.0, abs=1e-3)


def test_discounted_returns_reset_after_done_and_carry():
    r = torch.tensor([[1.0], [1.0], [1.0], [2.0]])
    d = torch.tensor([[False], [True], [False], [False]])
    g, carry = discounted_returns(r, d, 0.5, start=torch.tensor([4.0]))
    # 0.5*4 + 1 = 3; 0.5*3 + 1 = 2.5 (done); 1; 0.5*1 + 2 = 2.5
    assert g[:, 0].tolist() == [3.0, 2.5, 1.0, 2.5]
    assert carry.tolist() == [2.5]


def test_reward_scaler_divides_by_the_std_of_discounted_returns():
    scaler = RewardScaler(gamma=0.0)  # gamma 0: the discounted return is the reward itself
    r = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
    valid = torch.ones_like(r, dtype=torch.bool)
    out = scaler.scale(r, torch.zeros_like(valid), valid)
    std = math.sqrt(torch.tensor([1.0, 3.0, 5.0, 7.0]).var(unbiased=False).item())  # sqrt(5)
    assert out.flatten().tolist() == pytest.approx((r / std).flatten().tolist(), rel=1e-3)
    assert (out * std).sign().tolist() == r.sign().tolist()  # scaled, not centred


def test_explained_variance():
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 2.5), target) == pytest.approx(0.0)
    # residuals [1, -1, 1, -1]: var 4/3 against var(target) 5/3 -> 1 - 0.8 = 0.2
    assert explained_variance(target + torch.tensor([1.0, -1.0, 1.0, -1.0]), target) == pytest.approx(0.2)
    # masked to targets [1, 2, 4], predictions [1, 2, 1]: residual var 3 over target var 7/3 -> -2/7
    pred = torch.tensor([1.0, 2.0, 0.0, 1.0])
    assert explained_variance(pred, target, mask=torch.tensor([True, True, False, True])) == pytest.approx(-2 / 7)
    assert math.isnan(explained_variance(target, torch.ones(4)))


def test_reward_scaler_per_task_gives_each_task_its_own_scale():
    # two tasks whose rewards differ a hundredfold (Meta-World's reach against pick-place): one std for
    # both leaves the small task's scaled rewards near zero; one std per task scales both to about 1
    gen = torch.Generator().manual_seed(0)
    r = torch.randn(64, 4, generator=gen).abs()
    r[:, 2:] *= 100.0
    keys = torch.tensor([7, 7, 9, 9]).expand(64, 4)
    valid, dones = torch.ones_like(r, dtype=torch.bool), torch.zeros_like(r, dtype=torch.bool)
    shared = RewardScaler(gamma=0.0).scale(r, dones, valid)
    per_task = RewardScaler(gamma=0.0, per_key=True)
    scaled = per_task.scale(r, dones, valid, keys=keys)
    assert shared[:, :2].std() < 0.05 < 0.5 < shared[:, 2:].std()
    assert 0.5 < scaled[:, :2].std() < 2.0 and 0.5 < scaled[:, 2:].std() < 2.0
    stds = per_task.stds()
    assert sorted(stds) == [7, 9] and 50 < stds[9] / stds[7] < 200
    # the statistics survive a checkpoint: a restored scaler scales the next batch identically
    restored = RewardScaler(gamma=0.0, per_key=True)
    restored.load_state_dict(per_task.state_dict())
    assert torch.equal(restored.scale(r, dones, valid, keys=keys), per_task.scale(r, dones, valid, keys=keys))
    # steps that did not happen neither update a task's std nor create one
    invalid = valid.clone()
    invalid[:, 0] = False
    before = RewardScaler(gamma=0.0, per_key=True)
    before.scale(r, dones, invalid, keys=torch.where(invalid, keys, torch.zeros_like(keys)))
    assert sorted(before.stds()) == [7, 9]
    with pytest.raises(ValueError, match="keys"):
        RewardScaler(gamma=0.0, per_key=True).scale(r, dones, valid)
