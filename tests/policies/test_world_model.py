"""The action-conditioned world model: its records, its loss, its samples, a run of the trainer that
trains it, its export, and the same weights played as a simulator that passes the contract check."""

from __future__ import annotations

import pytest
import torch

from mmrl.config import ConfigError
from mmrl.data import load_dataset
from mmrl.episodes import join_episodes, next_rows, transitions
from mmrl.policies.world_model import WorldModelConfig, WorldModelPolicy, history_rows, rollout_error

SIM = {"image_size": 16, "num_objects": 2, "max_episode_steps": 8}


def demos(n: int = 6, seed: int = 0, chunk: int = 1) -> dict:
    return load_dataset("reach_demos", num_episodes=n, seed=seed, chunk_size=chunk, sim_kwargs=SIM, expert_speed=0.5)


def model(**kw) -> WorldModelPolicy:
    torch.manual_seed(0)
    cfg = WorldModelConfig(image_size=16, ch=8, dim=16, mid_blocks=1, **kw)
    return WorldModelPolicy(cfg, action_dim=2, state_dim=2)


def test_transitions_pair_each_step_with_what_followed():
    d = demos()
    t = transitions(d)
    nxt = next_rows(d)
    inner = nxt >= 0
    assert torch.equal(t["next_image"][inner], d["image"][nxt[inner]])
    last = (~inner).nonzero().flatten()
    assert torch.equal(t["next_image"][last], d["final_image"][d["episode"][last]])
    # the gripper moves by the action: next state = state + 0.1 * action (the arena's max speed)
    moved = t["next_state"] - t["state"] - 0.1 * t["actions"][:, 0]
    assert moved.abs().max() < 1e-5
    assert int(t["success"].sum()) == int(d["episode_success"].sum())


def test_history_rows_stay_inside_the_episode():
    d = demos()
    rows = history_rows(d, 3)
    ep = d["episode"]
    assert torch.equal(rows[:, -1], torch.arange(len(ep)))
    assert bool((ep[rows] == ep[:, None]).all())
    starts = (d["step"] == 0).nonzero().flatten()
    assert bool((rows[starts] == starts[:, None]).all())  # an episode's first frame repeated before it


def test_join_episodes_renumbers_and_keeps_final_frames():
    a, b = demos(3, seed=0), demos(2, seed=50)
    j = join_episodes(a, b)
    assert int(j["episode"].max()) == 4 and j["final_image"].shape[0] == 5
    assert torch.equal(transitions(j)["next_image"][-len(b["episode"]) :], transitions(b)["next_image"])


def test_untrained_model_predicts_that_nothing_moves():
    m = model().eval()
    d = demos()
    batch = m.warm_start_batch(d)
    img, state = m.predict(batch["context"][:5], d["instruction"][:5], batch["actions"][:5], batch["state"][:5])
    assert torch.equal(img, d["image"][:5])  # x0 head starts at zero: the change is zero
    assert torch.allclose(state, batch["state"][:5])  # and so does the state head
    loss = m.supervised_loss(batch.index(torch.arange(8)))
    assert loss.shape == (8,) and bool(torch.isfinite(loss).all())


def test_it_fits_a_batch_of_transitions():
    m = model()
    batch = m.warm_start_batch(demos(12))
    rows = batch.index(torch.arange(0, batch.size, max(1, batch.size // 32))[:32])
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)

    def loss() -> torch.Tensor:
        torch.manual_seed(1)  # the same flow times and noise each time
        return m.supervised_loss(rows).mean()

    first = loss().item()
    for _ in range(60):
        value = loss()
        opt.zero_grad()
        value.backward()
        opt.step()
    assert loss().item() < 0.5 * first


def test_rollout_error_reports_the_copy_baseline():
    m = model().eval()
    out = rollout_error(m, demos(4, seed=7), horizon=4)
    assert [s["step"] for s in out["steps"]] == list(range(1, len(out["steps"]) + 1))
    # the untrained model is the "nothing moves" predictor: the same error as copying the first frame
    assert out["frame_mae"] == pytest.approx(out["copy_mae"], rel=1e-5)


def test_records_of_other_chunks_are_refused():
    with pytest.raises(ValueError, match="chunk_size 1"):
        model().warm_start_batch(demos(2, chunk=4))


def test_a_world_model_run_is_its_warm_start_alone():
    from mmrl.experiment import load_experiment

    with pytest.raises(ConfigError, match="trainer.iterations=0"):
        load_experiment("configs/reach_world_model.yaml", ["trainer.iterations=3"])


def tiny_run(tmp_path) -> tuple:
    from mmrl.experiment import build_trainer, load_experiment

    over = [
        f"run.output_dir={tmp_path}",
        "run.threads=1",
        "sim.kwargs={image_size: 16, num_objects: 2, max_episode_steps: 8}",
        "policy.ch=8",
        "policy.dim=16",
        "policy.mid_blocks=1",
        "warm_start.num_episodes=4",
        "warm_start.steps=3",
        "warm_start.batch_size=8",
    ]
    cfg = load_experiment("configs/reach_world_model.yaml", over)
    build_trainer(cfg).run()
    return tmp_path / "reach_world_model", cfg


def played(tmp_path, num_envs: int, max_episode_steps: int):
    """A factory of ``sim.type: world_model`` playing the checkpoint exported to ``tmp_path / "export"``,
    from recorded start frames, its success judged by an untrained detector (also used by the Wan
    world model's test)."""
    from mmrl.registry import SIMULATORS
    from rewards.success_detector import SuccessDetector

    SuccessDetector.untrained(16).save(tmp_path / "detector")
    starts = tmp_path / "starts.pt"
    torch.save(demos(5, seed=3), starts)

    def make():
        return SIMULATORS.build(
            "world_model",
            checkpoint=str(tmp_path / "export"),
            reward_kwargs={"path": str(tmp_path / "detector")},
            starts=str(starts),
            num_envs=num_envs,
            max_episode_steps=max_episode_steps,
            seed=0,
        )

    return make


def test_trained_checkpoint_exports_and_plays_as_a_checked_simulator(tmp_path):
    from mmrl.api import load_policy
    from mmrl.checks.simulator import check_simulator

    run, _ = tiny_run(tmp_path)
    trained = load_policy(run)
    assert isinstance(trained, WorldModelPolicy)
    trained.export_pretrained(tmp_path / "export")
    exported = load_policy(tmp_path / "export")
    for a, b in zip(trained.state_dict().values(), exported.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    make = played(tmp_path, num_envs=3, max_episode_steps=6)
    passed = check_simulator(make(), chunk_size=3)
    assert {"reset", "step", "step_chunk", "episode", "truncation"} <= set(passed)
    sim = make()
    obs = sim.reset(0)
    assert obs.image.shape == (3, 16, 16, 3) and obs.state.shape == (3, 2)
    res = sim.step_chunk(torch.zeros(3, 2, 2))
    assert sim.imagined_steps == 6 and res.reward.shape == (3,)


def test_simulator_judges_success_by_its_reward_model():
    from mmrl.registry import SIMULATORS

    class Always:
        kind = "image"

        def __call__(self, frames, prompts, meta=None):
            return torch.ones(len(prompts))

    sim = SIMULATORS.build(
        "world_model", model=model(), reward_model=Always(), start_records=demos(3), num_envs=2, max_episode_steps=5
    )
    sim.reset(0)
    res = sim.step(torch.zeros(2, 2))
    assert bool(res.success.all()) and bool(res.terminated.all()) and torch.equal(res.reward, torch.ones(2))
    assert res.final_obs is not None


def test_simulator_refuses_a_chunked_world_model():
    from mmrl.registry import SIMULATORS

    with pytest.raises(ValueError, match="chunk_size=1"):
        SIMULATORS.build("world_model", model=model(chunk_size=4), reward_model=object(), start_records=demos(2))


def test_keypoints_start_where_the_frames_change():
    from mmrl.policies.tiny_world_model import fit_keypoint

    d = load_dataset("reach_demos", num_episodes=40, seed=0, chunk_size=1, sim_kwargs=SIM, expert_speed=1.0)
    t = transitions(d)
    w, b = fit_keypoint(d["image"], t["next_image"], t["state"], t["next_state"])
    # the gripper's xy is drawn at column x, row -y (image rows go down)
    assert torch.allclose(w, torch.tensor([[1.0, 0.0], [0.0, -1.0]]), atol=0.1)
    assert b.abs().max() < 0.1
    m = model()
    m.update_statistics(m.warm_start_batch(d))
    assert torch.allclose(m.net.keypoint.weight[:2], w)
