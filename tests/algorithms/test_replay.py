"""The off-policy replay buffer (issue 36): the ring keeps the newest transitions, sampling is
reproducible from a generator, a checkpoint round trip resumes it exactly, and RLPD's mixing takes
its fixed share of demonstrations."""

from __future__ import annotations

import pytest
import torch

from mmrl.algorithms.replay import ReplayBuffer, mixed_sample


def rows(start: int, n: int) -> dict:
    i = torch.arange(start, start + n)
    return {"obs": i.float()[:, None].repeat(1, 3), "action": i % 2 == 0, "reward": i.float()}


def test_the_ring_keeps_the_newest_transitions():
    buf = ReplayBuffer(5)
    buf.add(rows(0, 3))
    buf.add(rows(3, 4))  # 7 in all: 0 and 1 are overwritten
    assert len(buf) == 5 and sorted(buf.data["reward"].tolist()) == [2.0, 3.0, 4.0, 5.0, 6.0]
    buf.add(rows(7, 12))  # more than the capacity at once: its newest 5
    assert sorted(buf.data["reward"].tolist()) == [14.0, 15.0, 16.0, 17.0, 18.0]
    got = buf.sample(64, torch.Generator().manual_seed(0))
    assert got["obs"].shape == (64, 3) and got["action"].dtype == torch.bool
    assert torch.equal(got["obs"][:, 0], got["reward"])  # rows stay whole
    with pytest.raises(ValueError, match="differ from the buffer's"):
        buf.add({"obs": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match="empty replay buffer"):
        ReplayBuffer(3).sample(1)


def test_a_checkpoint_round_trip_resumes_the_buffer_exactly():
    buf = ReplayBuffer(8)
    buf.add(rows(0, 5))
    buf.add(rows(5, 6))  # 11 rows: the ring has wrapped, its next row is 3
    state = buf.state_dict()
    again = ReplayBuffer(8)
    again.load_state_dict(state)
    for b in (buf, again):  # the same next writes and the same draws
        b.add(rows(100, 3))
    a, c = buf.sample(32, torch.Generator().manual_seed(5)), again.sample(32, torch.Generator().manual_seed(5))
    assert all(torch.equal(a[k], c[k]) for k in a)
    assert (again.pos, again.size) == (buf.pos, buf.size) == (6, 8)
    with pytest.raises(ValueError, match="same capacity"):
        ReplayBuffer(4).load_state_dict(state)


@pytest.mark.parametrize("fraction,demos", [(0.5, 16), (0.25, 8), (0.0, 0)])
def test_rlpd_mixes_a_fixed_share_of_demonstrations(fraction, demos):
    online, demo = ReplayBuffer(10), ReplayBuffer(10)
    online.add(rows(0, 10))
    demo.add({k: -v if v.is_floating_point() else v for k, v in rows(1, 10).items()})  # negative rewards
    batch = mixed_sample(online, demo, 32, fraction, torch.Generator().manual_seed(0))
    assert batch["reward"].shape == (32,) and int(batch["is_demo"].sum()) == demos
    assert (batch["reward"][batch["is_demo"]] < 0).all() and (batch["reward"][~batch["is_demo"]] >= 0).all()
