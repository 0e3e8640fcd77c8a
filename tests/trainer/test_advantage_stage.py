"""The trainer's advantage stage: GAE bootstrapped where the time limit cuts an episode and at the
end of a fixed-length rollout, hand-computed."""

from types import SimpleNamespace

import pytest
import torch

from mmrl.batch import Batch
from mmrl.trainer.objectives import compute_advantages

ALGO = SimpleNamespace(advantage="gae", gamma=0.5, lam=1.0)


def batch(dones, bootstrap=None):
    b = Batch(
        rewards=torch.tensor([[1.0], [1.0]]),
        old_values=torch.tensor([[2.0], [4.0]]),
        dones=torch.tensor(dones),
        valid=torch.ones(2, 1, dtype=torch.bool),
    )
    if bootstrap is not None:
        b["bootstrap"] = torch.tensor(bootstrap)
    return b


def test_terminal_episode_has_no_bootstrap():
    out = compute_advantages(batch([[False], [True]]), ALGO)
    # t=1: 1 - 4 = -3; t=0: 1 + 0.5*4 - 2 = 1, plus 0.5 * -3 -> -0.5
    assert out["advantages"][:, 0].tolist() == [-0.5, -3.0]
    assert out["returns"][:, 0].tolist() == [1.5, 1.0]


def test_time_limit_cut_bootstraps_from_the_last_observation():
    out = compute_advantages(batch([[False], [True]], bootstrap=[[0.0], [6.0]]), ALGO)
    # t=1 truncated: 1 + 0.5*6 - 4 = 0; t=0: 1 + 0.5*4 - 2 + 0.5*0 = 1
    assert out["advantages"][:, 0].tolist() == [1.0, 0.0]
    assert out["returns"][:, 0].tolist() == [3.0, 4.0]


def test_end_of_a_fixed_length_rollout_bootstraps_with_last_values():
    out = compute_advantages(batch([[False], [False]]), ALGO, last_values=torch.tensor([8.0]))
    # t=1: 1 + 0.5*8 - 4 = 1; t=0: 1 + 0.5*4 - 2 + 0.5*1 = 1.5
    assert out["advantages"][:, 0].tolist() == pytest.approx([1.5, 1.0])


def test_reinforce_pp_is_selectable_and_whitens_the_return_to_go():
    """REINFORCE++ from the config: per-decision discounted return-to-go [2, 3, 1] (gamma 0.5, rewards
    [1, 2, 1] in one env, [0, 0, pad] in the other), whitened over the 5 valid decisions."""
    from mmrl.experiment import load_experiment

    algo = load_experiment(None, ["algorithm.advantage=reinforce_pp", "algorithm.gamma=0.5"]).algorithm
    b = Batch(
        rewards=torch.tensor([[1.0, 0.0], [2.0, 0.0], [1.0, 0.0]]),
        dones=torch.tensor([[False, False], [False, True], [True, True]]),
        valid=torch.tensor([[True, True], [True, True], [True, False]]),
    )
    out = compute_advantages(b, algo)
    g = torch.tensor([1 + 0.5 * (2 + 0.5 * 1), 2 + 0.5 * 1, 1.0, 0.0, 0.0])  # env 0 t=0..2, env 1 t=0..1
    want = (g - g.mean()) / g.std()
    got = torch.cat([out["advantages"][:, 0], out["advantages"][:2, 1]])
    assert torch.allclose(got, want, atol=1e-5)
    assert out["advantages"][2, 1] == 0  # padding stays 0


def test_psr_nsr_weights_scale_positive_and_negative_advantages():
    from mmrl.experiment import load_experiment
    from mmrl.trainer.objectives import weight_advantages

    algo = load_experiment(None, ["algorithm.pos_weight=0.1", "algorithm.neg_weight=2.0"]).algorithm
    out = weight_advantages(Batch(advantages=torch.tensor([1.0, -1.0, 0.0])), algo.pos_weight, algo.neg_weight)
    assert out["advantages"].tolist() == pytest.approx([0.1, -2.0, 0.0])
    with pytest.raises(ValueError, match="pos_weight"):
        load_experiment(None, ["algorithm.pos_weight=-1"])
