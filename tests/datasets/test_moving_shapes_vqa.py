"""`moving_shapes_vqa`: each answer is the clip's motion (it needs two frames), splits hold disjoint
(colour, shape, direction) combinations, samples are deterministic, mp4 output round-trips."""

import pytest
import torch

from mmrl.data import load_dataset


def centroid(frame: torch.Tensor) -> torch.Tensor:
    """(x, y) of the lit pixels of a uint8 [H, W, 3] frame on a black background."""
    ys, xs = frame.sum(-1).nonzero(as_tuple=True)
    return torch.stack([xs.float().mean(), ys.float().mean()])


def test_the_answer_is_the_motion_between_the_first_and_last_frames():
    d = load_dataset("moving_shapes_vqa", num_samples=40, tasks=["direction", "color"])
    vectors = {"right": (1, 0), "left": (-1, 0), "up": (0, -1), "down": (0, 1)}
    tasks = {m["task"] for m in d["meta"]}
    assert tasks == {"direction", "color"} and d["images"] == [[] for _ in d["prompt"]]
    for (video,), meta, prompt, sol in zip(d["videos"], d["meta"], d["prompt"], d["solution"]):
        frames = video["frames"]
        assert frames.shape == (8, 32, 32, 3) and frames.dtype == torch.uint8 and video["fps"] == 4.0
        assert sol == meta["answer"] and meta["shape"] in prompt
        move = centroid(frames[-1]) - centroid(frames[0])
        assert torch.dot(move, torch.tensor(vectors[meta["direction"]], dtype=torch.float)) >= 8  # 1/4 of 32 px
        if meta["task"] == "direction":
            assert sol == meta["direction"] and meta["color"] in prompt
            assert prompt.endswith("Answer left, right, up or down.")
        else:
            assert sol == meta["color"]


def test_splits_hold_disjoint_combinations_and_samples_are_deterministic():
    def combos(split):
        d = load_dataset("moving_shapes_vqa", num_samples=200, split=split)
        return {(m["color"], m["shape"], m["direction"]) for m in d["meta"]}

    train, validation, held_out = combos("train"), combos("validation"), combos("eval")
    assert not train & held_out and not train & validation and not validation & held_out
    assert (len(train), len(validation), len(held_out)) == (36, 12, 12)
    a = load_dataset("moving_shapes_vqa", num_samples=3, seed=1)
    b = load_dataset("moving_shapes_vqa", num_samples=5, seed=1)
    assert a["prompt"] == b["prompt"][:3]
    assert all(torch.equal(x[0]["frames"], y[0]["frames"]) for x, y in zip(a["videos"], b["videos"]))
    with pytest.raises(ValueError, match="split must be one of"):
        load_dataset("moving_shapes_vqa", num_samples=2, split="val")


def test_video_dir_writes_mp4_files_that_decode_to_the_clips(tmp_path):
    from mmrl.video import decode

    d = load_dataset("moving_shapes_vqa", num_samples=2, video_dir=str(tmp_path))
    frames_data = load_dataset("moving_shapes_vqa", num_samples=2)
    (path,) = d["videos"][1]
    assert path == str(tmp_path / "train_0_1.mp4")
    frames, fps = decode(path)
    ref = frames_data["videos"][1][0]["frames"]
    assert fps == 4.0 and frames.shape == ref.shape
    assert (frames.float() - ref.float()).abs().mean() < 8  # lossy, but the same clip
