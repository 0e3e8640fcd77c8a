"""Evaluation media in TensorBoard: the video as an animated image beside the still grid."""

import io

import torch
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mmrl.rollout import write_video
from mmrl.trainer.logging import GIF_FRAMES, RunLogger


def test_tensorboard_gets_the_evaluation_video_as_an_animated_image(tmp_path):
    frames = torch.zeros(6, 4, 16, 16, 3, dtype=torch.uint8)
    for t in range(6):
        frames[t, :, :, t * 2 : t * 2 + 3] = 255  # a bar moving right
    write_video(frames, tmp_path / "videos" / "v.mp4", captions=["a"] * 4)
    logger = RunLogger(tmp_path)
    logger.media(3, "eval/final", tmp_path / "videos" / "v.mp4")
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0}).Reload()
    assert {"eval/final", "eval/final/video"} <= set(events.Tags()["images"])
    (shown,) = events.Images("eval/final/video")
    gif = Image.open(io.BytesIO(shown.encoded_image_string))
    assert shown.step == 3 and gif.format == "GIF" and gif.n_frames == 6  # every frame, animated


def test_a_long_video_is_previewed_with_evenly_spaced_frames(tmp_path):
    frames = (torch.arange(100) * 2).to(torch.uint8).view(100, 1, 1, 1, 1).expand(100, 1, 8, 8, 3)
    write_video(frames.contiguous(), tmp_path / "long.mp4", fps=30)  # every frame another grey
    logger = RunLogger(tmp_path)
    logger.media(1, "eval/x", tmp_path / "long.mp4")
    logger.close()
    (shown,) = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0}).Reload().Images("eval/x/video")
    assert Image.open(io.BytesIO(shown.encoded_image_string)).n_frames == GIF_FRAMES
