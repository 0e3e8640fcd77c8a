"""DAPO dynamic sampling filter and refill buffer."""

import pytest
import torch
from torch.testing import assert_close

from mmrl.algorithms import DynamicSamplingBuffer, nonconstant_group_mask


def test_nonconstant_group_mask():
    # groups: 0 -> [1, 0] mixed; 1 -> [1, 1] constant; 2 -> [.5, .5] constant; 3 -> [2] alone
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 2.0])
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert nonconstant_group_mask(rewards, group).tolist() == [True, True] + [False] * 5


def test_nonconstant_group_mask_atol():
    rewards, group = torch.tensor([1.0, 1.05, 0.0, 1.0]), torch.tensor([4, 4, 9, 9])
    assert nonconstant_group_mask(rewards, group).tolist() == [True, True, True, True]
    assert nonconstant_group_mask(rewards, group, atol=0.1).tolist() == [False, False, True, True]


def test_buffer_refills_across_three_batches():
    buf = DynamicSamplingBuffer(target_groups=3)
    # batch 1: group 10 [1, 0] kept, group 11 [1, 1] filtered
    buf.add(
        {"x": torch.tensor([0, 1, 2, 3]), "obs": torch.arange(8.0).reshape(4, 2)},
        torch.tensor([1.0, 0.0, 1.0, 1.0]),
        torch.tensor([10, 10, 11, 11]),
    )
    assert (buf.num_groups, buf.ready, buf.num_filtered_groups) == (1, False, 1)
    # batch 2: both groups all-zero -> filtered
    buf.add({"x": torch.tensor([50, 51, 52, 53]), "obs": torch.zeros(4, 2)}, torch.zeros(4), torch.tensor([0, 0, 1, 1]))
    assert (buf.num_groups, buf.ready, buf.num_filtered_groups) == (1, False, 3)
    # batch 3: groups 4, 7, 9 all mixed -> 4 kept groups in total, 3 needed
    buf.add(
        {"x": torch.tensor([100, 101, 102, 103, 104, 105]), "obs": torch.ones(6, 2)},
        torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0]),
        torch.tensor([4, 4, 7, 7, 9, 9]),
    )
    assert buf.ready and buf.num_batches == 3 and buf.num_kept_groups == 4

    out = buf.pop()
    assert set(out) == {"x", "obs", "rewards", "group"}
    assert out["x"].tolist() == [0, 1, 100, 101, 102, 103]
    assert out["group"].tolist() == [0, 0, 1, 1, 2, 2]  # renumbered, distinct per group
    assert_close(out["rewards"], torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0]))
    assert_close(out["obs"], torch.tensor([[0.0, 1.0], [2.0, 3.0]] + [[1.0, 1.0]] * 4))
    # leftover group 9 waits for the next pop
    assert buf.num_groups == 1 and not buf.ready
    with pytest.raises(RuntimeError):
        buf.pop()

    # next step: a ragged batch fills up again; leftover comes first
    buf.add(
        {"x": torch.tensor([200, 201, 202, 203, 204]), "obs": torch.zeros(5, 2)},
        torch.tensor([1.0, 0.0, 2.0, 0.0, 0.0]),
        torch.tensor([0, 0, 1, 1, 1]),
    )
    out = buf.pop()
    assert out["x"].tolist() == [104, 105, 200, 201, 202, 203, 204]
    assert out["group"].tolist() == [0, 0, 1, 1, 2, 2, 2]
    assert buf.num_groups == 0 and buf.num_batches == 4 and buf.num_filtered_groups == 3


def test_buffer_rejects_mismatched_batch():
    buf = DynamicSamplingBuffer(target_groups=1)
    with pytest.raises(ValueError):
        buf.add({"x": torch.zeros(3)}, torch.zeros(2), torch.zeros(2, dtype=torch.long))


def test_partial_pop_takes_what_is_buffered():
    buf = DynamicSamplingBuffer(target_groups=3)
    with pytest.raises(RuntimeError):
        buf.pop(partial=True)  # nothing buffered: nothing to train on
    buf.add({"x": torch.tensor([0, 1, 2, 3])}, torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([5, 5, 6, 6]))
    with pytest.raises(RuntimeError):
        buf.pop()
    out = buf.pop(partial=True)
    assert out["x"].tolist() == [0, 1] and out["group"].tolist() == [0, 0] and buf.num_groups == 0
