"""Video rewards (kind "video"): the contract and its checker, the frame / motion rewards against
hand-computed values, the moving-shapes reward against gold and corrupted videos, and the served
(HTTP) video reward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrl.checks.reward import check_reward
from mmrl.cli import main
from mmrl.data import builder_module
from mmrl.registry import REWARDS
from mmrl.reward import FunctionReward, Reward, WeightedSum, check_videos
from rewards.http import RemoteReward, RemoteRewardError, decode_videos, encode_videos
from rewards.jpeg import JpegCompressibility
from rewards.moving_shapes import (
    DIRECTIONS,
    MovingShapesReward,
    describe,
    parse_prompt,
    score_track,
    travel,
)
from rewards.shapes import COLORS, SHAPES
from rewards.video import (
    FrameJudge,
    FrameScore,
    MotionAmount,
    TemporalConsistency,
    frame_indices,
    frame_strip,
)

ROOT = Path(__file__).resolve().parents[2]
VIDEOS = torch.randint(0, 256, (3, 5, 16, 24, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
PROMPTS = ["a red square moving to the right", "a blue circle moving up", "a green triangle moving down"]


class Brightness(Reward):
    """A toy image reward: mean pixel value / 255."""

    name = "brightness"

    def score(self, images, prompts, meta):
        return images.float().mean(dim=(1, 2, 3)) / 255


class PromptAndMeta(Reward):
    """A toy image reward of the prompt and meta only: len(prompt) + 10 * meta["id"]."""

    name = "prompt_and_meta"

    def score(self, images, prompts, meta):
        return torch.tensor([len(p) + 10.0 * m["id"] for p, m in zip(prompts, meta)])


def ramp(values: list[int], size: int = 4) -> torch.Tensor:
    """One video [1, F, size, size, 3] whose frame t is flat at ``values[t]``."""
    return torch.tensor(values, dtype=torch.uint8).view(1, -1, 1, 1, 1).expand(1, len(values), size, size, 3).clone()


# ----------------------------------------------------------------------------- the contract
@pytest.mark.parametrize(
    "bad",
    [
        VIDEOS.float(),  # float
        VIDEOS[:, 0],  # an image batch: no frame dimension
        VIDEOS[..., :1].expand(-1, -1, -1, -1, 4).contiguous(),  # 4 channels
        VIDEOS[:, :0],  # no frames
        VIDEOS.numpy(),  # not a tensor
    ],
)
def test_bad_videos_are_one_line_value_errors(bad):
    with pytest.raises(ValueError, match=r"video rewards take uint8 videos \[B, F, H, W, 3\], got "):
        check_videos(bad, 3)
    with pytest.raises(ValueError, match="video rewards take uint8 videos"):
        MotionAmount()(bad, PROMPTS)


def test_batch_and_prompts_must_agree():
    with pytest.raises(ValueError, match="3 videos but 2 prompts"):
        MotionAmount()(VIDEOS, PROMPTS[:2])
    with pytest.raises(ValueError, match="2 meta entries but 3 prompts"):
        MotionAmount()(VIDEOS, PROMPTS, [{}, {}])


def test_function_rewards_take_videos():
    seen = []

    def frames_count(videos, prompts, **kwargs):
        seen.append((videos.dtype, tuple(videos.shape)))
        return [float(v.shape[0]) for v in videos]

    reward = FunctionReward(frames_count, "video")
    assert reward(VIDEOS, PROMPTS).tolist() == [5.0, 5.0, 5.0]
    assert seen[0] == (torch.uint8, (3, 5, 16, 24, 3))  # the uint8 video tensor itself
    assert "video_sizes" in check_reward(reward, kind="video")
    with pytest.raises(ValueError, match="kind must be one of 'image', 'video', 'text', got 'movie'"):
        FunctionReward(frames_count, "movie")


def test_weighted_sum_of_video_rewards_and_no_mixing():
    both = WeightedSum({"motion": MotionAmount(), "still": TemporalConsistency()}, [1.0, 2.0])
    assert both.kind == "video"
    motion = MotionAmount()(VIDEOS, PROMPTS)
    torch.testing.assert_close(both(VIDEOS, PROMPTS), motion + 2 * (1 - motion))
    with pytest.raises(ValueError, match=r"mixes reward kinds \['image', 'video'\]"):
        WeightedSum([MotionAmount(), JpegCompressibility()])


# ----------------------------------------------------------------------------- the checker
class BatchNormalisedMotion(MotionAmount):
    name = "batch_normalised_motion"

    def score(self, videos, prompts, meta):
        s = super().score(videos, prompts, meta)
        return s - s.mean()


class DuckVideo:
    """Scores any tensor (no validation): images slip through as "videos"."""

    name, kind = "duck_video", "video"

    def __call__(self, videos, prompts, meta=None):
        return videos.float().reshape(len(prompts), -1).mean(1)


class FirstFrameOnly(MotionAmount):
    name = "first_frame_only"

    def score(self, videos, prompts, meta):
        return videos[:, 1].float().mean((1, 2, 3))  # fails on single-frame videos


def test_checker_fails_broken_video_rewards_naming_the_check():
    with pytest.raises(AssertionError, match=r"check_reward\[batch_invariance\] batch_normalised_motion"):
        check_reward(BatchNormalisedMotion, kind="video")
    with pytest.raises(AssertionError, match=r"check_reward\[rejects_bad_input\] duck_video: float videos"):
        check_reward(DuckVideo(), kind="video")
    with pytest.raises(AssertionError, match=r"check_reward\[video_sizes\] first_frame_only: 1-frame 16x16"):
        check_reward(FirstFrameOnly, kind="video")
    with pytest.raises(AssertionError, match=r"check_reward\[attributes\].*kind is 'video', expected 'image'"):
        check_reward(MotionAmount)
    with pytest.raises(ValueError, match="kind must be one of 'image', 'video', 'text'"):
        check_reward(MotionAmount, kind="movie")


@pytest.fixture
def stub_judge():
    """generate_fn of a VLM judge: "yes" when the strip's left column is brighter than its right."""
    calls = []

    def generate(images, questions):
        calls.append((images, questions))
        return ["yes" if im.getpixel((0, 0))[0] > im.getpixel((im.width - 1, 0))[0] else "no" for im in images]

    generate.calls = calls
    return generate


def video_rewards(stub_judge) -> dict:
    return {
        "temporal_consistency": lambda: REWARDS.build("temporal_consistency"),
        "temporal_consistency_max": lambda: REWARDS.build("temporal_consistency", reduce="max"),
        "motion_amount": lambda: REWARDS.build("motion_amount"),
        "moving_shapes": lambda: REWARDS.build("moving_shapes"),
        "frame_score": lambda: REWARDS.build("frame_score", reward=Brightness(), frames=3, reduce="min"),
        "frame_score_by_name": lambda: REWARDS.build(
            "frame_score", reward="jpeg_compressibility", reward_kwargs={"quality": 80}
        ),
        "frame_judge": lambda: REWARDS.build("frame_judge", judge_kwargs={"generate_fn": stub_judge}),
    }


@pytest.mark.parametrize(
    "name",
    [
        "temporal_consistency",
        "temporal_consistency_max",
        "motion_amount",
        "moving_shapes",
        "frame_score",
        "frame_score_by_name",
        "frame_judge",
    ],
)
def test_video_rewards_pass_the_checker(name, stub_judge):
    factory = video_rewards(stub_judge)[name]
    assert factory().kind == "video"
    passed = check_reward(factory, kind="video")
    assert passed[-2:] == ["video_sizes", "rejects_bad_input"] and "batch_invariance" in passed


def test_mmrl_check_reward_runs_video_rewards(capsys, tmp_path):
    assert main(["check", "reward", "motion_amount"]) == 0
    assert "reward 'motion_amount' passed" in capsys.readouterr().out
    assert main(["check", "reward", "frame_score", "reward=jpeg_compressibility", "frames=2"]) == 0
    assert main(["check", "reward", "frame_score", "reward=jpeg_compressibility", "quality=80"]) == 2
    assert "reward_kwargs" in capsys.readouterr().err  # where the wrapped reward's arguments go
    (tmp_path / "my_video.py").write_text("def still(videos, **kw):\n    return [float(v.shape[0]) for v in videos]\n")
    assert main(["check", "reward", f"{tmp_path / 'my_video.py'}:still", "kind=video"]) == 0
    assert main(["check", "reward", f"{tmp_path / 'my_video.py'}:still", "kind=movie"]) == 2


def test_the_reward_stage_scores_videos_with_video_rewards():
    from mmrl.trainer.reward_stage import KINDS, RewardStage

    assert KINDS["video"] == "video"
    RewardStage(MotionAmount(), "video")
    with pytest.raises(ValueError, match="actions are videos: use a reward of kind 'video'"):
        RewardStage(JpegCompressibility(), "video")


# ----------------------------------------------------------------------------- frames and motion
def test_frame_indices_are_evenly_spaced():
    assert frame_indices(8, 4).tolist() == [0, 2, 5, 7]  # round(k * 7 / 3)
    assert frame_indices(8, 2).tolist() == [0, 7]
    assert frame_indices(8, 1).tolist() == [3]  # the middle frame
    assert frame_indices(8, None).tolist() == list(range(8))
    assert frame_indices(3, 5).tolist() == [0, 1, 2]  # never more than there are
    assert frame_indices(81, 81).tolist() == list(range(81))


def test_frame_score_reduces_sampled_frames_by_mean_and_min():
    video = ramp([0, 10, 20, 30, 40, 50, 60, 70])  # frame t is flat at 10 t
    mean = FrameScore(reward=Brightness(), frames=4)(video, ["p"])
    low = FrameScore(reward=Brightness(), frames=4, reduce="min")(video, ["p"])
    torch.testing.assert_close(mean, torch.tensor([(0 + 20 + 50 + 70) / 4 / 255]))  # frames 0, 2, 5, 7
    torch.testing.assert_close(low, torch.tensor([0.0]))
    every = FrameScore(reward=Brightness(), frames=None)(VIDEOS, PROMPTS)
    least = FrameScore(reward=Brightness(), frames=None, reduce="min")(VIDEOS, PROMPTS)
    assert (least <= every).all() and (least < every).any()
    own = FrameScore(reward=PromptAndMeta(), frames=None)(VIDEOS, ["a", "bb", "ccc"], [{"id": 3}, {"id": 2}, {"id": 1}])
    assert own.tolist() == [31.0, 22.0, 13.0]  # every frame scored with its own video's prompt and meta
    per_frame = torch.stack([Brightness()(VIDEOS[:, t], PROMPTS) for t in range(5)], 1)
    torch.testing.assert_close(every, per_frame.mean(1))
    torch.testing.assert_close(least, per_frame.amin(1))


def test_frame_score_builds_registered_image_rewards_by_name():
    by_name = REWARDS.build("frame_score", reward="jpeg_compressibility", reward_kwargs={"quality": 80}, frames=2)
    jpeg = JpegCompressibility(quality=80)
    expected = (jpeg(VIDEOS[:, 0], PROMPTS) + jpeg(VIDEOS[:, 4], PROMPTS)) / 2
    torch.testing.assert_close(by_name(VIDEOS, PROMPTS), expected)
    with pytest.raises(ValueError, match="image reward"):
        FrameScore(reward=MotionAmount())
    with pytest.raises(ValueError, match="reduce must be one of"):
        FrameScore(reward=Brightness(), reduce="max")
    with pytest.raises(ValueError, match="frames must be"):
        FrameScore(reward=Brightness(), frames=0)


def test_motion_and_consistency_by_hand():
    video = ramp([0, 255, 255])  # d = [1, 0]
    assert MotionAmount()(video, ["p"]).tolist() == [0.5]
    assert TemporalConsistency()(video, ["p"]).tolist() == [0.5]
    assert TemporalConsistency(reduce="max")(video, ["p"]).tolist() == [0.0]  # the worst step
    still = ramp([90, 90, 90, 90])
    assert MotionAmount()(still, ["p"]).tolist() == [0.0] and TemporalConsistency()(still, ["p"]).tolist() == [1.0]
    single = ramp([7])
    assert MotionAmount()(single, ["p"]).tolist() == [0.0] and TemporalConsistency()(single, ["p"]).tolist() == [1.0]
    half = video.clone()
    half[..., :2, :] = 0  # the left half of each frame stays black: d = [1/2, 0]
    assert MotionAmount()(half, ["p"]).tolist() == [0.25]


def test_frame_judge_asks_about_a_strip_of_frames_in_time_order(stub_judge):
    video = ramp([250, 200, 150, 100, 50, 0], size=4)  # darker over time
    assert frame_strip(video[:, [0, 5]], gap=1)[0, 0, :, 0].tolist() == [250] * 4 + [255] + [0] * 4
    judge = FrameJudge(judge_kwargs={"generate_fn": stub_judge}, frames=3, gap=2)
    assert judge(torch.cat([video, video.flip(1)]), ["p", "q"]).tolist() == [1.0, 0.0]
    images, questions = stub_judge.calls[-1]
    assert images[0].size == (3 * 4 + 2 * 2, 4)  # three frames side by side (width, height)
    assert questions[0].startswith("The image shows frames of a video in time order") and "Task: p." in questions[0]
    assert judge.strips(video)[0, 0, :, 0].tolist() == [250] * 4 + [255] * 2 + [150] * 4 + [255] * 2 + [0] * 4
    scored = FrameJudge(judge_kwargs={"generate_fn": lambda ims, qs: ["7"] * len(ims), "mode": "score"})
    assert scored(video, ["p"]).tolist() == pytest.approx([0.7])
    assert "Rate from 0 to 10" in scored.judge.question("p")
    with pytest.raises(ValueError, match="exactly one of judge"):
        FrameJudge()


# ----------------------------------------------------------------------------- moving shapes
@pytest.fixture(scope="module")
def moving():
    return builder_module("moving_shapes")


def test_prompts_parse_back_to_their_meta():
    for c in COLORS:
        for s in SHAPES:
            for d in DIRECTIONS:
                assert parse_prompt(describe(c, s, d)) == {"color": c, "shape": s, "direction": d}
    assert parse_prompt("A Red Square moving to the right.") == {
        "color": "red",
        "shape": "square",
        "direction": "right",
    }
    for bad in ("a red square", "a pink square moving up", "a red square moving sideways", "two red squares moving up"):
        with pytest.raises(ValueError, match="cannot parse moving shapes prompt"):
            parse_prompt(bad)


def corrupt(metas: list[dict], key: str, values) -> list[dict]:
    """The metas with ``key`` replaced by the next value of ``values`` (cyclically)."""
    values = list(values)
    return [{**m, key: values[(values.index(m[key]) + 1) % len(values)]} for m in metas]


def test_gold_videos_score_one_and_each_corruption_clearly_less(moving):
    data = moving.build(48, seed=3, split="all")
    reward = MovingShapesReward()
    prompts, metas = data["prompt"], data["meta"]
    gold = reward(data["video"], prompts, metas)
    assert gold.min().item() >= 0.95
    # same prompts, videos drawn with one attribute changed (the same motion otherwise)
    opposite = {"right": "left", "left": "right", "up": "down", "down": "up"}
    cases = {
        "wrong direction (opposite)": moving.draw(
            [{**m, "direction": opposite[m["direction"]]} for m in metas], seed=3
        ),
        "wrong direction (turned)": moving.draw(corrupt(metas, "direction", ["right", "up", "left", "down"]), seed=3),
        "wrong colour": moving.draw(corrupt(metas, "color", COLORS), seed=3),
        "wrong shape": moving.draw(corrupt(metas, "shape", SHAPES), seed=3),
        "no motion": data["video"][:, :1].expand_as(data["video"]).contiguous(),
        "played backwards": data["video"].flip(1),
    }
    for what, videos in cases.items():
        scores = reward(videos, prompts, metas)
        assert (scores <= gold - 0.25).all(), (what, scores.max().item())
    # each corruption shows in its own component
    wrong = {"color": "wrong colour", "shape": "wrong shape", "direction": "wrong direction (opposite)"}
    for part, what in wrong.items():
        comps = reward.components(cases[what], prompts, metas)
        assert comps[part].max().item() == 0.0, (what, comps)
    assert MovingShapesReward(use_purity=False)(cases["wrong colour"], prompts, metas).max().item() == 0.0
    # the prompt alone (no meta) is parsed: the same scores
    torch.testing.assert_close(reward(data["video"], prompts), gold)


def test_partial_credit_is_graded(moving):
    data = moving.build(16, seed=5)
    reward = MovingShapesReward()
    video, prompts, metas = data["video"], data["prompt"], data["meta"]
    parts = reward.parts(video, prompts, metas)
    assert set(parts) == {f"moving_shapes{k}" for k in ("", "/color", "/shape", "/direction", "/purity")}
    # the shape gone from the second half of the frames: colour and shape credit halve
    gone = video.clone()
    gone[:, 4:] = 0
    comps = reward.components(gone, prompts, metas)
    assert comps["color"].tolist() == [0.5] * 16 and comps["shape"].tolist() == [0.5] * 16
    # a stray blob of another colour (away from the shape) costs purity, not the rest
    i = next(i for i in range(16) if not video[i, :, :4, :4].any())
    stray = video[i : i + 1].clone()
    stray[:, :, :3, :3] = torch.tensor(COLORS["red" if metas[i]["color"] != "red" else "blue"], dtype=torch.uint8)
    comps = reward.components(stray, prompts[i : i + 1], metas[i : i + 1])
    assert 0.0 < comps["purity"].item() < 1.0
    assert comps["color"].item() == comps["shape"].item() == comps["direction"].item() == 1.0


def test_direction_credit_by_hand():
    # a blob at x = 2 in frame 0, x = 4 in frame 2 (absent in frame 1) of a 16 px frame: travel 2/16
    centroid = torch.tensor([[[2.0, 5.0], [9.0, 9.0], [4.0, 5.0]]])  # frame 1's centroid is not used
    present = torch.tensor([[True, False, True]])
    right, up = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, -1.0]])
    assert travel(centroid, present, right, (16, 16)).tolist() == [0.125]
    assert travel(centroid, present, -right, (16, 16)).tolist() == [-0.125]
    assert travel(centroid, present, up, (16, 16)).tolist() == [0.0]
    assert travel(centroid, torch.tensor([[True, False, False]]), right, (16, 16)).tolist() == [0.0]
    assert travel(centroid, torch.tensor([[False, False, False]]), right, (16, 16)).tolist() == [0.0]
    tracked = {"present": present, "shape": torch.tensor([[1, 0, 1]]), "centroid": centroid, "purity": torch.ones(1, 3)}
    comps = score_track(tracked, torch.tensor([1]), right, (16, 16), min_travel=0.25)
    assert comps["direction"].tolist() == [0.5]  # 0.125 of the frame of the 0.25 that earns full credit
    assert comps["color"].tolist() == pytest.approx([2 / 3]) and comps["shape"].tolist() == pytest.approx([2 / 3])
    assert comps["score"].tolist() == pytest.approx([(2 / 3 + 2 / 3 + 0.5) / 3])


# ----------------------------------------------------------------------------- served over HTTP
@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_videos_roundtrip_losslessly(encoding):
    payload = json.loads(json.dumps(encode_videos(VIDEOS, encoding)))
    assert payload["frames"] == 5 and torch.equal(decode_videos(payload), VIDEOS)
    with pytest.raises(ValueError, match="malformed videos payload"):
        decode_videos({**payload, "frames": 4})  # 15 frames do not split into videos of 4
    with pytest.raises(ValueError, match="'frames' must be an integer"):
        decode_videos({k: v for k, v in payload.items() if k != "frames"})


@pytest.mark.parametrize("encoding", ["raw", "png"])
def test_remote_video_reward_scores_as_local(serve, moving, encoding):
    data = moving.build(6, seed=1)
    local = MovingShapesReward()
    server = serve(local)
    remote = RemoteReward(url=server.url, kind="video", encoding=encoding)
    assert remote.info() == {"name": "moving_shapes", "kind": "video"}
    remote.preflight()
    torch.testing.assert_close(remote(data["video"], data["prompt"]), local(data["video"], data["prompt"]))
    assert "video_sizes" in check_reward(remote, kind="video", prompts=MovingShapesReward.example_prompts)
    with pytest.raises(RemoteRewardError, match="serves a 'video' reward but this client was configured with kind"):
        RemoteReward(url=server.url).preflight()
    with pytest.raises(ValueError, match="answered 400: .*video reward needs 'samples' as an encoded video batch"):
        RemoteReward(url=server.url, kind="text")(["a"], ["a red square moving up"])


def test_python_m_rewards_http_serves_a_video_reward():
    command = [sys.executable, "-m", "rewards.http", "motion_amount", "--port", "0"]
    with subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        try:
            line = proc.stdout.readline()
            assert line.startswith("serving reward 'motion_amount' at http://"), line
            remote = RemoteReward(url=line.split(" at ")[1].strip(), kind="video", timeout=30)
            torch.testing.assert_close(remote(VIDEOS, PROMPTS), MotionAmount()(VIDEOS, PROMPTS))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
