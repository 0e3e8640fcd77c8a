"""SAC's losses, target and temperature on hand-computed cases, Polyak averaging, n-step returns
(issue 36); each fails under the mutation its comment names."""

from __future__ import annotations

import pytest
import torch

from mmrl.algorithms.sac import (
    actor_loss,
    critic_loss,
    n_step_returns,
    polyak_update,
    soft_q_target,
    temperature_loss,
)


def test_soft_q_target_by_hand():
    # y = r + gamma (1 - done) (min(Q1', Q2') - alpha logp')
    y = soft_q_target(
        reward=torch.tensor([1.0, 2.0]),
        done=torch.tensor([False, True]),
        next_q1=torch.tensor([3.0, 5.0]),
        next_q2=torch.tensor([4.0, 1.0]),
        next_logp=torch.tensor([-1.0, 0.5]),
        alpha=0.2,
        gamma=0.9,
    )
    assert torch.allclose(y, torch.tensor([1.0 + 0.9 * (3.0 + 0.2), 2.0]))  # min, entropy bonus, no bootstrap at done
    per_sample = soft_q_target(
        torch.ones(2), torch.zeros(2), torch.ones(2), torch.ones(2), torch.zeros(2), 0.0, torch.tensor([0.5, 0.25])
    )
    assert torch.allclose(per_sample, torch.tensor([1.5, 1.25]))  # gamma^m of n-step returns
    q = torch.ones(2, requires_grad=True)
    assert not soft_q_target(torch.ones(2), torch.zeros(2), q, q, q, 0.1, 0.9).requires_grad  # a fixed target


def test_critic_and_actor_losses_by_hand():
    q1, q2, y = torch.tensor([1.0, 0.0]), torch.tensor([2.0, 1.0]), torch.tensor([1.5, 1.0])
    assert torch.allclose(critic_loss(q1, q2, y), torch.tensor([0.5 * (0.25 + 0.25), 0.5 * (1.0 + 0.0)]))
    # alpha logp - min(Q1, Q2): the smaller critic (not the larger, not the mean)
    out = actor_loss(torch.tensor([1.0, 4.0]), torch.tensor([2.0, 3.0]), torch.tensor([-1.0, 0.5]), 0.5)
    assert torch.allclose(out, torch.tensor([-0.5 - 1.0, 0.25 - 3.0]))
    a = torch.tensor([0.3], requires_grad=True)  # the actor moves toward higher Q
    actor_loss(2 * a, 3 * a, torch.zeros(1), 0.1).sum().backward()
    assert a.grad is not None and a.grad.item() == pytest.approx(-2.0)


@pytest.mark.parametrize("entropy,direction", [(-3.0, 1), (1.0, -1)])
def test_temperature_moves_toward_the_target_entropy(entropy, direction):
    """target entropy -2 (a 2-d action): a policy with entropy -3 (logp 3, too certain) raises alpha,
    one with entropy 1 lowers it."""
    log_alpha = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([log_alpha], lr=0.1)
    logp = torch.full((8,), -entropy)
    for _ in range(3):
        opt.zero_grad()
        temperature_loss(log_alpha, logp, target_entropy=-2.0).mean().backward()
        opt.step()
    assert torch.sign(log_alpha.detach()).item() == direction
    assert log_alpha.item() == pytest.approx(direction * 3 * 0.1 * abs(entropy + 2.0))


def test_polyak_update_by_hand():
    target, source = [torch.tensor([0.0, 10.0])], [torch.tensor([1.0, 20.0])]
    polyak_update(target, source, tau=0.25)
    assert torch.allclose(target[0], torch.tensor([0.25, 12.5]))  # not a copy (no target network)
    polyak_update(target, source, tau=1.0)
    assert torch.equal(target[0], source[0])
    with pytest.raises(ValueError, match="tau"):
        polyak_update(target, source, tau=0.0)


def test_n_step_returns_by_hand():
    # one env, 5 steps: rewards 1, 2, 3, 4, 5; the episode terminates at step 1, a new one is truncated at 3
    r = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])
    term = torch.tensor([[False], [True], [False], [False], [False]])
    trunc = torch.tensor([[False], [False], [False], [True], [False]])
    ret, disc, last = n_step_returns(r, term, trunc, gamma=0.5, n=3)
    assert torch.allclose(ret[:, 0], torch.tensor([1 + 0.5 * 2, 2.0, 3 + 0.5 * 4, 4.0, 5.0]))
    # t=0 and t=1 reach the termination: nothing to bootstrap; t=2 stops at the truncation and
    # bootstraps from step 3's final observation with gamma^2; t=4 runs out of rollout after 1 step
    assert torch.allclose(disc[:, 0], torch.tensor([0.0, 0.0, 0.25, 0.5, 0.5]))
    assert last[:, 0].tolist() == [1, 1, 3, 3, 4]
    one, d1, l1 = n_step_returns(r, term, trunc, gamma=0.5, n=1)
    assert torch.equal(one, r) and l1[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert torch.allclose(d1[:, 0], torch.tensor([0.5, 0.0, 0.5, 0.5, 0.5]))
