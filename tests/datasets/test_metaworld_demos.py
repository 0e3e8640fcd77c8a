"""datasets/metaworld_demos: Meta-World's scripted experts recorded through `MetaWorldSim`.

Tiny builds (a few episodes, short time limits): the records' layout, episode i from reset seed
``seed + i`` whatever the batching, a recorded episode replayed through a fresh simulator gives the
same rewards and success, a degraded expert succeeds less, ``keep_failed=False``, and the dataset is
found by name with the simulator it records in.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("metaworld", reason="Meta-World is not installed (pip install 'mmrl[metaworld]')")

from mmrl.data import builder_module, declared_kwargs, load_dataset, recorded_in
from simulators.metaworld import INSTRUCTIONS, MetaWorldSim

TWO = ["reach-v3", "button-press-topdown-v3"]  # tasks rotate with the seed: episode i is TWO[(seed + i) % 2]
REACH = {"task": "reach-v3", "max_episode_steps": 80}  # the clean expert reaches in 34-54 steps
DEGRADED = {"expert_speed": 0.5, "expert_noise": 0.3}  # at 80 steps: episodes 1 and 3 of seed 0 succeed


@pytest.fixture(scope="module")
def mw():
    return builder_module("metaworld_demos")


@pytest.fixture(scope="module")
def two(mw):
    """3 episodes of two tasks from seed 5, noisy, batched 2 at a time, under a training config's
    kwargs (staggered first episodes, no termination): the builder records whole episodes anyway."""
    kw = {"task": TWO, "max_episode_steps": 24, "stagger_episodes": True, "terminate_on_success": False}
    return mw.build(3, seed=5, chunk_size=4, sim_kwargs=kw, expert_noise=0.1, batch_size=2)


@pytest.fixture(scope="module")
def clean(mw):
    return mw.build(4, seed=0, chunk_size=4, sim_kwargs=REACH)


@pytest.fixture(scope="module")
def degraded(mw):
    return mw.build(4, seed=0, chunk_size=4, sim_kwargs=REACH, **DEGRADED)


def test_layout(two):
    m, e = len(two["instruction"]), 3
    assert two["state"].shape == (m, 39) and two["state"].dtype == torch.float32
    assert two["image"].shape == (m, 64, 64, 3) and two["image"].dtype == torch.uint8 and not two["image"].any()
    assert two["actions"].shape == (m, 4, 4) and two["actions"].abs().max() <= 1.0
    for key in ("episode", "step", "rewards", "terminated", "truncated"):
        assert two[key].shape == (m,), key
    assert two["episode_success"].shape == (e,) and two["episode_length"].shape == (e,)
    assert two["final_state"].shape == (e, 39) and two["final_image"].shape == (e, 64, 64, 3)
    assert two["episode_task"] == [TWO[1], TWO[0], TWO[1]]  # seeds 5, 6, 7
    assert 0.0 <= two["success_rate"] <= 1.0 and two["meta"]["chunk_size"] == 4
    for ep in range(e):
        rows = (two["episode"] == ep).nonzero().flatten()
        assert two["step"][rows].tolist() == list(range(len(rows)))  # sorted, consecutive decisions
        assert {two["instruction"][i] for i in rows.tolist()} == {INSTRUCTIONS[two["episode_task"][ep]]}
        ends = two["terminated"][rows] | two["truncated"][rows]
        assert ends.tolist() == [False] * (len(rows) - 1) + [True]  # the episode ends on its last row
        # whole episodes: to success or the 24-step limit, never a staggered cut
        assert two["terminated"][rows[-1]] == two["episode_success"][ep]
        assert two["episode_success"][ep] or two["episode_length"][ep] == 24
        assert len(rows) == -(-int(two["episode_length"][ep]) // 4)


def test_episode_i_starts_from_seed_plus_i_whatever_the_batching(mw, two):
    sim = MetaWorldSim(num_envs=1, task=TWO, max_episode_steps=24)
    try:
        for ep in range(3):
            first = two["state"][(two["episode"] == ep).nonzero()[0, 0]]
            obs = sim.reset([5 + ep])
            assert torch.equal(first, obs.state[0]) and obs.meta[0]["task"] == two["episode_task"][ep]
    finally:
        sim.close()
    kw = {"task": TWO, "max_episode_steps": 24}
    one_by_one = mw.build(3, seed=5, chunk_size=4, sim_kwargs=kw, expert_noise=0.1, batch_size=1)
    for key in ("state", "actions", "rewards", "episode", "step", "episode_success", "final_state"):
        assert torch.equal(one_by_one[key], two[key]), key


def test_replaying_the_recorded_actions_reproduces_the_episode(clean, degraded):
    sim = MetaWorldSim(num_envs=1, terminate_on_success=True, **REACH)
    try:
        for data in (clean, degraded):
            for ep in (0, 1):
                rows = (data["episode"] == ep).nonzero().flatten()
                obs = sim.reset([ep])
                assert torch.equal(obs.state[0], data["state"][rows[0]])
                success = False
                for j, r in enumerate(rows.tolist()):
                    if j:
                        assert torch.equal(obs.state[0], data["state"][r])
                    res = sim.step_chunk(data["actions"][r][None])
                    assert res.reward[0].item() == data["rewards"][r].item()
                    assert bool(res.terminated[0]) == bool(data["terminated"][r])
                    assert bool(res.truncated[0]) == bool(data["truncated"][r])
                    success |= bool(res.success[0])
                    obs = res.obs
                assert success == bool(data["episode_success"][ep])
                assert torch.equal(res.final_obs.state[0], data["final_state"][ep])
    finally:
        sim.close()


def test_a_degraded_expert_succeeds_less(clean, degraded):
    assert clean["success_rate"] == 1.0
    assert degraded["success_rate"] < 1.0
    assert degraded["episode_length"].float().mean() > clean["episode_length"].float().mean()
    assert degraded["meta"]["expert_speed"] == 0.5 and degraded["meta"]["expert_noise"] == 0.3


def test_keep_failed_false_keeps_only_successful_episodes(mw, degraded):
    kept = mw.build(4, seed=0, chunk_size=4, sim_kwargs=REACH, keep_failed=False, **DEGRADED)
    ok = degraded["episode_success"]
    assert 0 < int(ok.sum()) < 4  # the check needs both kinds
    assert torch.equal(kept["episode_success"], ok)
    assert set(kept["episode"].tolist()) == set(ok.nonzero().flatten().tolist())
    rows = ok[degraded["episode"]]
    assert torch.equal(kept["actions"], degraded["actions"][rows])
    assert kept["instruction"] == [s for s, keep in zip(degraded["instruction"], rows.tolist()) if keep]


def test_found_by_name_with_its_simulator():
    assert recorded_in("metaworld_demos") == "metaworld"
    offered = dict(num_episodes=2, num_samples=2, seed=1, chunk_size=2, sim_kwargs={"task": "reach-v3"})
    assert declared_kwargs("metaworld_demos", **offered) == {
        k: offered[k] for k in ("num_episodes", "seed", "chunk_size", "sim_kwargs")
    }
    data = load_dataset("metaworld_demos", num_episodes=2, chunk_size=2, sim_kwargs={"max_episode_steps": 6})
    assert data["actions"].shape[1:] == (2, 4) and data["episode_task"] == ["reach-v3"] * 2
    assert data["episode_length"].tolist() == [6, 6]


def test_expert_action_degrades_as_documented(mw):
    """speed scales the clipped expert's hand displacement (not the gripper); noise is added after,
    then clipped to the simulator's [-1, 1]."""
    policy = mw.experts(["reach-v3"])["reach-v3"]
    sim = MetaWorldSim(num_envs=1, task="reach-v3", max_episode_steps=2)
    state = sim.reset([3]).state[0].double().numpy()
    sim.close()
    full = mw.expert_action(policy, state, 1.0, 0.0)
    assert full.dtype.name == "float32" and abs(full).max() <= 1.0 and abs(full[:3]).max() > 0.2
    slow = mw.expert_action(policy, state, 0.5, 0.0)
    assert slow[:3].tolist() == pytest.approx((0.5 * full[:3]).tolist()) and slow[3] == full[3]
    noisy = mw.expert_action(policy, state, 0.5, torch.tensor([0.1, -0.1, 5.0, 0.0]).numpy())
    assert noisy.tolist() == pytest.approx([slow[0] + 0.1, slow[1] - 0.1, 1.0, slow[3]])
