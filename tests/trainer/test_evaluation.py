"""Suite evaluation: one bounded simulator per task, per-task rows, the episode-weighted overall,
and videos (several cameras side by side)."""

from __future__ import annotations

import imageio.v2 as imageio
import pytest
import torch

from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
from mmrl.rollout import evaluate_policy, write_video
from mmrl.trainer.evaluation import evaluate_suite, task_slug
from simulators.reach import ReachSim


def _policy():
    torch.manual_seed(0)
    return FlowVLAPolicy(FlowVLAConfig(dim=16, expert_dim=16, expert_layers=1), 2, 2)


def test_suite_builds_one_bounded_sim_per_task_and_weights_the_overall(tmp_path):
    made, closed = [], []

    class Tracked(ReachSim):
        def close(self):
            closed.append(self.num_envs)

    def make_sim(task, n):
        made.append((task, n))
        return Tracked(num_envs=n, num_objects={"two": 2, "four": 4}[task], max_episode_steps=12)

    policy = _policy()
    report = evaluate_suite(
        policy,
        make_sim,
        ["two", "four"],
        episodes=5,
        seed=7,
        generator=torch.Generator().manual_seed(3),
        video_dir=tmp_path,
        video_envs=2,
        max_envs=2,
    )
    assert made == [("two", 2), ("four", 2)] and closed == [2, 2]  # never more than max_envs at once
    rows = report["tasks"]
    assert [r["task"] for r in rows] == ["two", "four"] and report["episodes"] == 10
    assert report["success_rate"] == pytest.approx((rows[0]["success_rate"] + rows[1]["success_rate"]) / 2)
    assert report["length"] == pytest.approx((rows[0]["length"] + rows[1]["length"]) / 2)
    # a task's row is exactly what evaluate_policy gives on that task alone
    alone = evaluate_policy(
        policy, ReachSim(num_envs=2, num_objects=2, max_episode_steps=12), 5, 7, torch.Generator().manual_seed(3)
    )
    assert {k: rows[0][k] for k in alone} == alone
    assert (tmp_path / "eval_two.mp4").stat().st_size > 0 and rows[1]["video"] == str(tmp_path / "eval_four.mp4")


def test_suite_rejects_empty_input():
    with pytest.raises(ValueError, match="at least one task"):
        evaluate_suite(_policy(), lambda t, n: None, [], 4, 0)
    with pytest.raises(ValueError, match="episodes >= 1"):
        evaluate_suite(_policy(), lambda t, n: None, ["a"], 0, 0)


def test_task_slug():
    assert task_slug("PickCube-v1") == "PickCube-v1" and task_slug(3) == "3"
    assert task_slug("a b/c") == "a_b_c" and task_slug(None) == "None"


def test_video_tiles_episodes_and_cameras(tmp_path):
    t, e, v, h, w = 3, 2, 2, 8, 8
    frames = torch.zeros(t, e, v, h, w, 3, dtype=torch.uint8)
    frames[:, 0, 1] = 255  # episode 0, second camera: white
    path = tmp_path / "v.mp4"
    write_video(frames, path, success=torch.tensor([[False, False], [True, False], [True, True]]), scale=2)
    video = imageio.mimread(str(path))
    assert len(video) == t and video[0].shape == (h * 2, e * v * w * 2, 3)  # no captions given
    first = video[0].astype(int)
    assert first[6:10, 20:28].mean() > 200 and first[6:10, 4:12].mean() < 30  # camera 1 right of camera 0
    assert first[6:10, 36:44].mean() < 30  # episode 1 is dark
    assert video[1][8, 1, 1] > 150 and video[0][8, 1, 1] < 60  # green border once episode 0 succeeded


def test_grids_are_rows_of_tiles_of_a_sane_size(tmp_path):
    """Four 512 px images make a 2 x 2 grid of 256 px tiles (not one 8192 px row); 16 px frames are
    upscaled to 128 px; a caption band sits under every row."""
    big = torch.zeros(1, 4, 512, 512, 3, dtype=torch.uint8)
    big[:, 3] = 200  # the 4th image: bottom right
    write_video(big, tmp_path / "g.mp4", captions=["a", "b", "c", "d"])
    png = imageio.imread(str(tmp_path / "g.png"))
    assert png.shape == (2 * (256 + 14), 2 * 256, 3)
    assert png[270 + 100, 256 + 100].mean() > 150 and png[100, 100].mean() < 30
    small = torch.zeros(2, 3, 16, 16, 3, dtype=torch.uint8)
    write_video(small, tmp_path / "s.mp4")
    assert imageio.imread(str(tmp_path / "s.png")).shape == (2 * 128, 2 * 128, 3)


def test_long_work_shows_progress(capsys, monkeypatch):
    """Issue 31: no silent stretch: generating demonstrations and evaluating show progress bars.
    The evaluation bar is transient (leave=False) and tqdm redraws at most every 0.1 s, so on a fast
    machine an 8-episode evaluation never drew its 100% before it cleared (stop 43's CI): here the
    bar draws every update (tqdm reads TQDM_MININTERVAL at import, too late for a test)."""
    import functools

    import mmrl.rollout
    from mmrl.data import load_dataset

    monkeypatch.setattr(mmrl.rollout, "tqdm", functools.partial(mmrl.rollout.tqdm, mininterval=0))

    load_dataset("reach_demos", num_episodes=6, batch_size=4)
    assert "demonstrations: 100%" in capsys.readouterr().err
    torch.manual_seed(0)
    policy = FlowVLAPolicy(FlowVLAConfig(chunk_size=4, num_steps=2), action_dim=2, state_dim=2)
    evaluate_policy(policy, ReachSim(num_envs=4, seed=0), num_episodes=8, seed=100)
    assert "eval: 100%" in capsys.readouterr().err


def test_video_without_imageio_ffmpeg_is_a_gif(tmp_path, monkeypatch, capsys):
    """Issue 30's GPU machine had imageio without its ffmpeg backend: imageio gave ".mp4" to its TIFF
    plugin, which failed on `fps` and killed the run at its first evaluation. Now the video is a
    GIF (PIL, always there), said once per file on stderr."""
    import sys

    import mmrl.rollout

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # absent, as `find_spec` sees it
    monkeypatch.setattr(mmrl.rollout, "_GIF_WARNED", set())
    frames = torch.zeros(3, 2, 8, 8, 3, dtype=torch.uint8)
    frames[1], frames[2] = 100, 200
    for _ in range(2):
        write_video(frames, tmp_path / "v.mp4", captions=["a", "b"])
    assert not (tmp_path / "v.mp4").exists() and (tmp_path / "v.png").exists()
    gif = imageio.mimread(str(tmp_path / "v.gif"))
    assert len(gif) == 3 and gif[0][..., :3].mean() < 30 and gif[2][2:10, 2:10, :3].mean() > 150
    assert capsys.readouterr().err.count("imageio-ffmpeg is not installed") == 1


def test_the_report_says_where_a_policy_fails(tmp_path):
    """A policy that reaches every colour but red: the report's goal row for red is 0, the others
    near 1, and every other dimension (goal cell, start distance) sums to the same episodes."""
    sim = ReachSim(num_envs=6, max_episode_steps=40)

    class ColourBlind(FlowVLAPolicy):
        def rollout(self, obs, generator=None, mode="train"):
            batch, _ = super().rollout(obs, generator, mode)
            chunk = sim.expert_chunk(self.cfg.chunk_size)
            red = torch.tensor(["red" in s for s in obs.instruction])
            chunk[red] = -sim.expert_chunk(self.cfg.chunk_size)[red]  # away from red, never to it
            return batch, chunk

    torch.manual_seed(0)
    policy = ColourBlind(FlowVLAConfig(dim=16, expert_dim=16, expert_layers=1), 2, 2)
    res = evaluate_policy(policy, sim, 60, seed=11, generator=torch.Generator().manual_seed(0))
    goal = res["breakdown"]["goal"]
    assert goal["red"]["episodes"] > 0 and goal["red"]["success_rate"] == 0.0
    assert all(r["success_rate"] > 0.9 for c, r in goal.items() if c != "red")
    assert set(res["breakdown"]) == {"goal", "goal_cell", "start_distance"}
    for rows in res["breakdown"].values():
        assert sum(r["episodes"] for r in rows.values()) == 60
        overall = sum(r["success_rate"] * r["episodes"] for r in rows.values()) / 60
        assert overall == pytest.approx(res["success_rate"])
    # a suite report carries it (episode-weighted over tasks), and so does `mmrl eval`'s printout
    report = evaluate_suite(policy, lambda task, n: sim, [None], 60, 11, torch.Generator().manual_seed(0), max_envs=6)
    assert report["breakdown"]["goal"] == goal


def test_reach_labels_follow_the_episode_through_auto_resets_and_snapshots():
    sim = ReachSim(num_envs=4, max_episode_steps=3)
    obs = sim.reset(5)
    first = [m["breakdown"] for m in obs.meta]
    colours = [s.split()[-2] for s in obs.instruction]  # "reach the <colour> target"
    assert [b["goal"] for b in first] == colours
    state = sim.get_state()
    res = sim.step_chunk(torch.zeros(4, 3, 2))  # the time limit: every env auto-resets
    assert res.done.all() and [m["breakdown"] for m in res.final_obs.meta] == first
    assert [m["breakdown"]["goal"] for m in res.obs.meta] == [s.split()[-2] for s in res.obs.instruction]
    sim.set_state(state)
    assert [m["breakdown"] for m in sim._observe().meta] == first
