"""ReachSim: contract, expert, rendering, determinism, chunk semantics, demo builder."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mmrl.registry import SIMULATORS
from simulators import Simulator, check_simulator
from simulators.reach import PALETTE, ReachSim

ROOT = Path(__file__).resolve().parents[2]


class BaseChunkReach(ReachSim):
    """ReachSim driven through the generic `Simulator.step_chunk` + `_step_masked`."""

    step_chunk = Simulator.step_chunk


@pytest.mark.parametrize(
    "factory, chunk_size",
    [
        (lambda: ReachSim(num_envs=1), 3),
        (lambda: ReachSim(num_envs=16), 3),
        (lambda: ReachSim(num_envs=16, max_episode_steps=12, image_size=24), 5),
        (
            lambda: ReachSim(
                num_envs=8,
                dense_reward=True,
                wrong_penalty=0.1,
                wrong_terminates=True,
                state_mode="full",
                instruction_templates=4,
                num_objects=4,
            ),
            4,
        ),
        (lambda: BaseChunkReach(num_envs=8, max_episode_steps=10), 4),
    ],
    ids=["n1", "n16", "short-chunk5", "options", "base-step_chunk"],
)
def test_contract_checker_passes(factory, chunk_size):
    passed = check_simulator(factory, chunk_size=chunk_size, verbose=False)
    for name in (
        "reset_seed_list",
        "step_chunk",
        "truncation",
        "chunk_mid_episode_end",
        "auto_reset",
        "action_bounds",
        "state_roundtrip",
    ):
        assert name in passed
    assert passed.action_bounds == "clipped"


def test_registered():
    sim = SIMULATORS.build("reach", num_envs=2)
    assert isinstance(sim, ReachSim) and sim.num_envs == 2
    assert "reach" in dict(SIMULATORS.describe())


def _run_expert(sim: ReachSim, chunk: int | None = None, noise: float = 0.0, speed: float = 1.0) -> torch.Tensor:
    sim.reset(0)
    n = sim.num_envs
    done = torch.zeros(n, dtype=torch.bool)
    success = torch.zeros(n, dtype=torch.bool)
    while not done.all():
        if chunk is None:
            res = sim.step(sim.expert_action(noise=noise, speed=speed))
        else:
            res = sim.step_chunk(sim.expert_chunk(chunk, noise=noise, speed=speed))
        success |= res.success & ~done
        done |= res.done
    return success


def test_expert_success():
    sim = ReachSim(num_envs=200)
    assert _run_expert(sim).float().mean() >= 0.98
    assert _run_expert(sim, chunk=4).float().mean() >= 0.98
    assert _run_expert(sim, noise=0.3).float().mean() >= 0.9


def test_slow_expert_moves_at_its_speed_and_times_out_on_far_targets():
    sim = ReachSim(num_envs=256, max_episode_steps=20)
    sim.reset(7)
    far = (sim.gripper - sim.goal_position()).norm(dim=-1) > 0.5
    a = sim.expert_action(speed=0.4)
    assert torch.allclose(a[far].abs().amax(-1), torch.full((int(far.sum()),), 0.4))
    assert torch.allclose(sim.expert_chunk(3, speed=0.4)[:, 0], a)
    full = _run_expert(ReachSim(num_envs=256, max_episode_steps=20))
    slow = _run_expert(ReachSim(num_envs=256, max_episode_steps=20), chunk=4, speed=0.4)
    assert full.float().mean() == 1.0 and 0.3 < slow.float().mean() < 0.8


def test_render_named_colour_at_target():
    sim = ReachSim(num_envs=32, instruction_templates=4)
    obs = sim.reset(3)
    row, col = sim.pixel_of(sim.goal_position())
    grow, gcol = sim.pixel_of(sim.gripper)
    for i, text in enumerate(obs.instruction):
        colour = next(w for w in text.split() if w in PALETTE)
        assert tuple(obs.image[i, row[i], col[i]].tolist()) == PALETTE[colour], text
        assert tuple(obs.image[i, grow[i], gcol[i]].tolist()) == (255, 255, 255)
        assert tuple(obs.image[i, 0, 0].tolist()) == (40, 40, 40)  # background corner
        # the named colour appears exactly once among the discs
        names = [sim.color_names[c] for c in sim.colors[i].tolist()]
        assert names.count(colour) == 1 and names[sim.target[i]] == colour


def test_seed_determinism_across_batches_and_history():
    a = ReachSim(num_envs=4, seed=1)
    b = ReachSim(num_envs=1, seed=2)
    oa = a.reset([7, 7, 8, 9])
    ob = b.reset(7)
    assert torch.equal(oa.image[0], oa.image[1]) and torch.equal(oa.image[0], ob.image[0])
    assert not torch.equal(oa.image[2], oa.image[3])
    # after reset(seed) the whole rollout (auto resets included) is reproducible
    c, d = ReachSim(num_envs=6, max_episode_steps=5), ReachSim(num_envs=6, max_episode_steps=5)
    for _ in range(3):
        d.step(torch.rand(6, 2) * 2 - 1)  # different history
    c.reset(11), d.reset(11)
    g = torch.Generator().manual_seed(0)
    for _ in range(12):
        act = torch.rand(6, 2, generator=g) * 2 - 1
        rc, rd = c.step(act), d.step(act)
        assert torch.equal(rc.obs.image, rd.obs.image) and rc.obs.instruction == rd.obs.instruction
        assert torch.equal(rc.reward, rd.reward)
    # colours, targets and templates are spread over the palette
    e = ReachSim(num_envs=256, instruction_templates=4)
    e.reset(0)
    assert set(e.target.tolist()) == {0, 1, 2}
    assert len(set(e.colors.flatten().tolist())) == e.num_colors
    assert len(set(e.template.tolist())) == 4


def test_chunk_stops_at_success_and_auto_resets():
    sim = ReachSim(num_envs=2)
    sim.reset(0)
    goal = sim.goal_position()
    st = sim.get_state()
    # env 0: 1.5 steps right of its goal; env 1: in a corner, far from every disc
    st["gripper"] = torch.stack([goal[0] + torch.tensor([0.15, 0.0]), torch.tensor([0.95, -0.95])])
    sim.set_state(st)
    toward = (goal[0] - st["gripper"][0]) / sim.max_speed
    chunk = torch.zeros(2, 3, 2)
    chunk[0, 0] = toward.clamp(-1, 1)
    chunk[0, 1:] = torch.tensor([1.0, 1.0])  # would leave the target: must be ignored
    res = sim.step_chunk(chunk)
    assert res.success.tolist()[0] and res.terminated.tolist()[0] and not res.truncated.any()
    assert res.reward[0] == 1.0 and res.info["num_steps"].tolist() == [1, 3]
    assert (res.final_obs.state[0] - goal[0]).norm() <= sim.success_radius
    assert sim.elapsed.tolist() == [0, 3]  # env 0 already started its next episode
    assert torch.equal(res.obs.state[0], sim.gripper[0]) and res.obs.instruction[0] == sim._instructions[0]


def test_truncation_and_action_handling():
    sim = ReachSim(num_envs=3, max_episode_steps=5)
    sim.reset(0)
    for t in range(1, 6):
        res = sim.step(torch.zeros(3, 2))
        assert res.truncated.all() == (t == 5) and not res.terminated.any()
    assert res.final_obs is not None and sim.elapsed.tolist() == [0, 0, 0]
    before = sim.gripper.clone()
    sim.step(torch.full((3, 2), 7.0))  # clipped to 1 -> moves max_speed per axis
    assert torch.allclose(sim.gripper, (before + sim.max_speed).clamp(-1, 1))
    with pytest.raises(ValueError):
        sim.step(torch.full((3, 2), float("nan")))
    with pytest.raises(ValueError):
        sim.step_chunk(torch.zeros(3, 2, 3))


def test_reward_options():
    sim = ReachSim(num_envs=1, dense_reward=True)
    sim.reset(0)
    res = sim.step(sim.expert_action())
    assert 0 < res.reward.item() <= sim.max_speed * 2**0.5 + 1e-6
    sim = ReachSim(num_envs=1, wrong_penalty=0.5, wrong_terminates=True)
    sim.reset(0)
    wrong = (sim.target + 1) % sim.num_objects
    st = sim.get_state()
    st["gripper"] = sim.objects[:, wrong[0]].clone()
    sim.set_state(st)
    res = sim.step(torch.zeros(1, 2))
    assert res.terminated.item() and not res.success.item() and res.reward.item() == -0.5


def test_instruction_vocab_and_observation_layout():
    sim = ReachSim(num_envs=64, instruction_templates=4, state_mode="full", image_size=40)
    obs = sim.reset(0)
    vocab = set(sim.instruction_vocab())
    assert all(set(s.split()) <= vocab for s in obs.instruction)
    assert obs.image.shape == (64, 40, 40, 3) and obs.state.shape == (64, sim.state_dim) == (64, 11)
    assert sim.image_shape == (40, 40, 3) and sim.action_dim == 2


def _load_builder():
    spec = importlib.util.spec_from_file_location(
        "reach_demos_builder", ROOT / "datasets" / "reach_demos" / "builder.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_builder_shapes_and_determinism():
    assert not list((ROOT / "datasets").rglob("__init__.py"))
    build = _load_builder().build
    data = build(20, seed=3, chunk_size=3)
    m = len(data["instruction"])
    assert data["image"].shape == (m, 32, 32, 3) and data["image"].dtype == torch.uint8
    assert data["state"].shape == (m, 2) and data["actions"].shape == (m, 3, 2)
    assert data["episode"].shape == (m,) and data["episode"].dtype == torch.long
    assert set(data["episode"].tolist()) == set(range(20)) and data["success_rate"] == 1.0
    assert data["actions"].abs().max() <= 1.0
    first = data["step"] == 0
    assert first.sum() == 20 and torch.equal(data["episode"][first], torch.arange(20))
    # the first observation of episode i is reset(seed + i), whatever the batching
    again = build(20, seed=3, chunk_size=3, batch_size=7)
    assert torch.equal(again["image"], data["image"]) and torch.equal(again["actions"], data["actions"])
    assert torch.equal(data["image"][first][5], ReachSim(num_envs=1).reset(8).image[0])
    noisy = build(30, seed=0, chunk_size=4, expert_noise=0.5, sim_kwargs={"image_size": 16})
    assert noisy["image"].shape[1:] == (16, 16, 3) and noisy["success_rate"] > 0.8
