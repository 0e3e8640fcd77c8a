"""`vlm_records` reads the user's video questions: a ``video_key`` column (default ``videos``, else
``video``) holding an mp4 path relative to the data file, an undecoded ``datasets.Video`` value
``{"path", "bytes"}`` (raw in parquet, base64 in JSONL), or one video as a list of frame image paths.
Sources are resolved and checked when the data loads and passed on undecoded (the policy decodes them
once per iteration, `mmrl.video`); a missing file is one error naming the file, row and column. A
JSONL of video questions trains through `configs/vlm_video_qa.yaml` and reaches the model's video
path. All files are written here; nothing is downloaded."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from mmrl.data import load_dataset
from mmrl.video import VideoOptions, load_clip

imageio = pytest.importorskip("imageio.v2")
pytest.importorskip("imageio_ffmpeg")
pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

FRAMES = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)


def _mp4(path: Path, frames=FRAMES, fps: float = 4.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(str(path), list(frames), fps=fps, format="ffmpeg", macro_block_size=1)
    return path


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """Run from another folder: relative video paths must resolve against the data file's folder."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_an_mp4_path_resolves_against_the_data_file_and_stays_undecoded(tmp_path, elsewhere):
    clip = _mp4(tmp_path / "data" / "clips" / "a.mp4")
    f = _jsonl(
        tmp_path / "data" / "train.jsonl",
        [{"question": "<video>\nWhich way does it move?", "clip": "clips/a.mp4", "answer": "left", "id": 7}],
    )
    d = load_dataset("vlm_records", path=str(f), prompt_key="question", video_key="clip")
    assert d["videos"] == [[str(clip)]]  # absolute, resolved against data/, not the working directory
    assert d["prompt"] == ["Which way does it move?"]  # the placeholder removed (videos go first)
    assert d["meta"] == [{"id": 7, "answer": "left"}] and d["images"] == [[]]
    assert load_clip(d["videos"][0][0], VideoOptions(fps=2.0)).frames.shape == (4, 32, 32, 3)  # 2 s at 2 fps

    # default column: `videos`, else `video`; a list is several videos
    _mp4(tmp_path / "data" / "b.mp4")
    g = _jsonl(
        tmp_path / "data" / "more.jsonl",
        [
            {"prompt": "Same motion?", "videos": ["clips/a.mp4", "b.mp4"], "answer": "yes"},
            {"prompt": "Which way?", "video": "b.mp4", "answer": "up"},
        ],
    )
    d = load_dataset("vlm_records", path=str(g))
    assert d["videos"] == [[str(clip), str(tmp_path / "data" / "b.mp4")], [str(tmp_path / "data" / "b.mp4")]]
    assert all("video" not in m and "videos" not in m for m in d["meta"])

    # data without videos: no videos column in the result (image-only recipes unchanged)
    h = _jsonl(tmp_path / "data" / "plain.jsonl", [{"prompt": "Hi?", "answer": "x"}])
    assert "videos" not in load_dataset("vlm_records", path=str(h))


def test_video_bytes_in_parquet_raw_and_in_jsonl_as_base64(tmp_path, elsewhere):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    raw = _mp4(tmp_path / "src.mp4").read_bytes()
    table = pa.table(
        {
            "prompt": ["Which way?"],
            "video": pa.array(
                [{"bytes": raw, "path": "clip.mp4"}], pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            ),
            "answer": ["left"],
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    d = load_dataset("vlm_records", path=str(tmp_path / "train.parquet"), video_key="video")
    (source,) = d["videos"][0]
    assert source == {"path": "clip.mp4", "bytes": raw}  # no file named clip.mp4 is needed: the bytes are the video
    assert load_clip(source, VideoOptions(fps=None)).frames.shape == (8, 32, 32, 3)

    f = _jsonl(
        tmp_path / "b64.jsonl",
        [{"prompt": "Which way?", "video": {"bytes": base64.b64encode(raw).decode(), "path": None}, "answer": "up"}],
    )
    d = load_dataset("vlm_records", path=str(f))
    assert d["videos"][0][0]["bytes"] == raw
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "Which way?", "video": {"bytes": "not base64!"}, "answer": "up"}])
    with pytest.raises(
        ValueError, match=r"bad\.jsonl, line 1, column 'video', video 0: \"bytes\" is a string but not valid base64"
    ):
        load_dataset("vlm_records", path=str(bad))


def test_a_list_of_frame_images_is_one_video(tmp_path, elsewhere):
    (tmp_path / "frames").mkdir()
    for i in range(3):
        Image.fromarray(FRAMES[i]).save(tmp_path / "frames" / f"{i}.png")  # lossless
    names = [f"frames/{i}.png" for i in range(3)]
    f = _jsonl(
        tmp_path / "train.jsonl",
        [
            {"prompt": "Which way?", "frames": names, "answer": "left"},
            {"prompt": "Which way?", "frames": {"frames": names[:2], "fps": 1.0}, "answer": "up"},
        ],
    )
    d = load_dataset("vlm_records", path=str(f), video_key="frames")
    assert d["videos"][0] == [[str(tmp_path / p) for p in names]]  # one video of three frames
    assert d["videos"][1] == [{"frames": [str(tmp_path / p) for p in names[:2]], "fps": 1.0}]
    clip = load_clip(d["videos"][0][0], VideoOptions(fps=None, frames_fps=2.0))
    assert np.array_equal(clip.frames.numpy(), FRAMES[:3]) and clip.source_fps == 2.0
    assert load_clip(d["videos"][1][0], VideoOptions(fps=None)).source_fps == 1.0


def test_a_missing_video_fails_at_load_naming_the_file_row_and_column(tmp_path, elsewhere):
    _mp4(tmp_path / "ok.mp4")
    f = _jsonl(
        tmp_path / "train.jsonl",
        [
            {"question": "Which way?", "clip": "ok.mp4", "answer": "left"},
            {"question": "Which way?", "clip": "clips/gone.mp4", "answer": "up"},
        ],
    )
    with pytest.raises(
        FileNotFoundError,
        match=rf"train\.jsonl, line 2, column 'clip', video 0: video file not found: {tmp_path}/clips/gone\.mp4 "
        rf"\(relative paths are resolved against {tmp_path}\)",
    ):
        load_dataset("vlm_records", path=str(f), prompt_key="question", video_key="clip")
    g = _jsonl(tmp_path / "frames.jsonl", [{"prompt": "Which way?", "video": ["a.png", "b.png"], "answer": "up"}])
    with pytest.raises(FileNotFoundError, match=r"line 1, column 'video', video 0, frame 0: frame image not found"):
        load_dataset("vlm_records", path=str(g))
    # a named column the rows lack, and placeholders that do not match the videos
    with pytest.raises(
        ValueError, match=r"no 'movie' column .* set video_key: <the video column>, e.g. video_key: clip"
    ):
        load_dataset("vlm_records", path=str(f), prompt_key="question", video_key="movie")
    h = _jsonl(tmp_path / "slots.jsonl", [{"prompt": "<video><video> Same?", "video": "ok.mp4", "answer": "up"}])
    with pytest.raises(ValueError, match=r'the prompt has 2 "<video>" placeholder\(s\) but the record has 1 video'):
        load_dataset("vlm_records", path=str(h))


def test_chat_messages_with_video_parts(tmp_path, elsewhere):
    _mp4(tmp_path / "a.mp4")
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "video", "path": "a.mp4"}, {"type": "text", "text": "Which way?"}]},
    ]
    f = _jsonl(tmp_path / "train.jsonl", [{"messages": messages, "answer": "left"}])
    d = load_dataset("vlm_records", path=str(f))
    assert d["prompt"] == ["Which way?"] and d["videos"] == [[str(tmp_path / "a.mp4")]]
    assert d["meta"][0]["messages"][1]["content"][0] == {"type": "video"}


def test_a_jsonl_of_video_questions_trains_through_the_video_qa_config(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from mmrl.experiment import build_trainer, load_experiment
    from mmrl.policies.vlm import VLMPolicy

    rows = []
    for i, (direction, frames) in enumerate([("right", FRAMES), ("left", FRAMES[::-1].copy())] * 2):
        _mp4(tmp_path / "data" / "clips" / f"{i}.mp4", frames)
        split = "eval" if i == 3 else "train"
        rows.append(
            {"question": "Which way does it move?", "clip": f"clips/{i}.mp4", "answer": direction, "split": split}
        )
    data = _jsonl(tmp_path / "data" / "video_qa.jsonl", rows)
    seen = []
    encode_one = VLMPolicy.encode_one
    monkeypatch.setattr(VLMPolicy, "encode_one", lambda self, req: seen.append(encode_one(self, req)) or seen[-1])
    overrides = [
        f"run.output_dir={tmp_path}",
        "run.name=v",
        "sim.num_envs=4",
        "sim.eval_num_envs=2",
        "sim.kwargs.dataset=vlm_records",
        f"sim.kwargs.dataset_kwargs={{path: {data}, prompt_key: question, video_key: clip}}",
        "warm_start.dataset=null",
        "algorithm.group_size=2",
        "algorithm.minibatch_size=4",
        "algorithm.epochs=1",
        "trainer.iterations=1",
        "trainer.eval_every=1",
        "trainer.eval_episodes=2",
        "trainer.checkpoint_every=1",
    ]
    results = build_trainer(load_experiment("configs/vlm_video_qa.yaml", overrides)).run()
    assert results["final"]["iteration"] == 1
    assert seen and all({"pixel_values_videos", "video_grid_thw"} <= set(e) for e in seen)
    # 8 frames at 4 fps, 2 fps kept: 4 frames, 2 temporal patches of 32 x 32 px (4 x 4 patches of 8 px)
    assert all(e["video_grid_thw"].tolist() == [[2, 4, 4]] for e in seen)
