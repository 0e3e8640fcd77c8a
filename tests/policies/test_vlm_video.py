"""Video questions through the VLM policy: a tiny random-weight Qwen2.5-VL (real classes, its own
video path: ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``, 3D rope) gives the
logits the transformers model gives on the processor's outputs; rollout log-probs equal the
update-time recomputation (ratio 1); the input forms of a video (mp4 path, frames, an undecoded
``datasets.Video`` value) give the same processor tensors; the frame options change what the model
sees; the tiny SmolVLM (no video processor) sees the frames as images."""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from mmrl.policies.vlm import VLMConfig, VLMPolicy
from mmrl.video import VideoOptions, load_clip
from simulators.qa import QASim

KW = dict(dataset="moving_shapes_vqa", dataset_kwargs={"num_samples": 8, "num_frames": 8, "fps": 4.0})


@pytest.fixture(scope="module")
def sim():
    return QASim(num_envs=4, **KW)


@pytest.fixture(scope="module")
def clip_frames():
    """8 random uint8 frames of 32 x 48 px (a non-square video: rows and columns must not swap)."""
    return np.random.default_rng(0).integers(0, 256, (8, 32, 48, 3), dtype=np.uint8)


def make(model="tiny-qwen2.5-vl", **kw):
    torch.manual_seed(0)
    cfg = dict(model=model, max_new_tokens=5, max_prompt_tokens=256)
    return VLMPolicy(VLMConfig(**{**cfg, **kw}), action_dim=0)


def direct_logp(pol, text, frames, fps, completion):
    """log_softmax(logits / T) of ``completion`` [L] from the transformers model itself, called on
    the processor's outputs for (text, every frame at ``fps``) with the completion appended."""
    from transformers.video_utils import VideoMetadata

    n = len(frames)
    meta = VideoMetadata(total_num_frames=n, fps=fps, frames_indices=list(range(n)))
    enc = pol.processor(
        text=[text], videos=[frames], video_metadata=[meta], do_sample_frames=False, return_tensors="pt"
    )
    plen = enc["input_ids"].shape[1]
    ids = torch.cat([enc["input_ids"], completion[None]], 1)
    types = torch.cat([enc["mm_token_type_ids"], torch.zeros(1, len(completion), dtype=torch.long)], 1)
    kw = {k: enc[k] for k in ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")}
    with torch.no_grad():
        logits = pol.model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=types, **kw).logits
    logits = logits[0, plen - 1 : -1].float() / pol.cfg.temperature
    logits[:, pol.banned_ids] = float("-inf")
    return logits.log_softmax(-1).gather(-1, completion[:, None])[:, 0]


def test_policy_log_probs_equal_the_transformers_model_on_the_processor_outputs(clip_frames):
    pol = make(video_fps=None)  # every frame: the model sees exactly the frames given to the processor
    short = {"frames": list(clip_frames[:4]), "fps": 4.0}
    full = {"frames": list(clip_frames), "fps": 4.0}
    reqs = pol.requests(["Which way?", "Which direction does it move?"], [[], []], [[short], [full]])
    assert reqs[0].text.count("<|video_pad|>") == 1 and not reqs[0].images
    words = [pol.tokenizer(w, add_special_tokens=False)["input_ids"] for w in ("pick up the red cube", "left")]
    words[1].append(pol.stop_id)
    assert not set(words[0] + words[1]) & set(pol.banned_ids)
    completion = torch.zeros(2, len(words[0]), dtype=torch.long)
    mask = torch.zeros(2, len(words[0]), dtype=torch.bool)
    for i, w in enumerate(words):
        completion[i, : len(w)], mask[i, : len(w)] = torch.tensor(w), True
    assert mask[1].sum() < mask[0].sum()
    entries = pol.encode_unique(reqs)
    assert entries[0]["prompt_ids"].shape[0] < entries[1]["prompt_ids"].shape[0]  # left padding is exercised
    logp, _ = pol._forward_logp(entries, completion, mask)  # one padded batch
    for i, (req, v) in enumerate(zip(reqs, (short, full))):
        n = int(mask[i].sum())
        ref = direct_logp(pol, req.text, np.stack(v["frames"]), 4.0, completion[i, :n])
        assert torch.isfinite(ref).all() and torch.allclose(logp[i, :n], ref, atol=1e-5), (i, logp[i, :n] - ref)


@pytest.mark.parametrize("recompute", [False, True])
def test_ratio_is_one_before_the_first_update_with_video_samples(sim, recompute):
    pol = make(recompute_logp=recompute)
    batch = pol.rollout(sim.reset([0, 0, 1, 1]), torch.Generator().manual_seed(0)).batch
    entry = pol._cache[int(batch["uid"][0])]
    assert {"pixel_values_videos", "video_grid_thw", "second_per_grid_ts", "mm_token_type_ids"} <= set(entry)
    out = pol.evaluate(batch)
    m = batch["completion_mask"]
    if recompute:  # the same forward pass over the same cached inputs: bit for bit
        assert torch.equal(out.logp.cpu() * m, batch["old_logp"])
        assert pol.rollout_stats()["logp_mismatch_max"] < 1e-4  # and generate's own log-probs agree
    else:  # generate's incremental decoding (KV cache, rope deltas) vs one teacher-forced pass
        assert ((out.logp - batch["old_logp"]).abs() * m).max() < 1e-4


def test_a_group_decodes_its_video_once_per_iteration(sim, monkeypatch):
    import mmrl.video

    obs = sim.reset([0, 0, 1, 1])  # before counting: the sim decodes a first frame per new question (thumbnails)
    calls = []
    decode = mmrl.video.decode
    monkeypatch.setattr(mmrl.video, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    pol = make()
    pol.rollout(obs, torch.Generator().manual_seed(0))
    assert len(calls) == 2 and len(pol._clips) == 2  # two questions, each shared by two answers
    pol.sync_rollout()
    assert len(pol._clips) == 0


def test_mp4_path_frames_pil_and_datasets_video_give_the_same_processor_tensors(tmp_path, clip_frames):
    import imageio.v2 as imageio
    from PIL import Image

    path = tmp_path / "clip.mp4"
    imageio.mimwrite(str(path), list(clip_frames), fps=4.0, format="ffmpeg", macro_block_size=1)
    reader = imageio.get_reader(str(path), format="ffmpeg")
    decoded = np.stack(list(reader.iter_data()))  # mp4 is lossy: compare against what the file holds
    reader.close()
    forms = {
        "path": str(path),
        "frames": {"frames": list(decoded), "fps": 4.0},
        "array": {"frames": decoded, "fps": 4.0},
        "pil": {"frames": [Image.fromarray(f) for f in decoded], "fps": 4.0},
        "video_bytes": {"path": "clip.mp4", "bytes": path.read_bytes()},
    }
    datasets = pytest.importorskip("datasets")
    column = datasets.Dataset.from_dict({"video": [str(path)]}).cast_column("video", datasets.Video(decode=False))
    forms["datasets.Video"] = column[0]["video"]
    pol = make()
    encoded = {}
    for name, source in forms.items():
        (req,) = pol.requests(["Which way?"], [[]], [[source]])
        encoded[name] = pol.encode_one(req)
    ref = encoded["path"]
    # 8 frames at 4 fps, 2 fps kept: 4 frames, 2 temporal patches of 4 x 6 (32 x 48 px, 8 px patches)
    assert ref["video_grid_thw"].tolist() == [[2, 4, 6]]
    for name, enc in encoded.items():
        assert set(enc) == set(ref), name
        assert all(torch.equal(enc[k], ref[k]) for k in ref), name


def test_frame_options_change_what_the_model_sees(clip_frames):
    source = {"frames": list(clip_frames), "fps": 4.0}  # 2 s
    seen = {}
    for name, kw in {
        "default": {},  # 2 fps -> 4 frames
        "fps4": {"video_fps": 4.0},  # 8 frames
        "fps1": {"video_fps": 1.0},  # 2 frames
        "max2": {"video_fps": None, "video_max_frames": 2},
        "pixels": {"video_max_pixels": 16 * 24},
    }.items():
        pol = make(**kw)
        clip = pol._clips.get(source)
        enc = pol.encode_one(pol.requests(["q"], [[]], [[source]])[0])
        seen[name] = (len(clip.indices), enc["video_grid_thw"][0].tolist(), float(enc["second_per_grid_ts"][0]))
        seen[name + "_hw"] = tuple(clip.frames.shape[1:3])
    assert seen["default"] == (4, [2, 4, 6], 1.0)  # temporal patch of 2 frames at 2 fps: 1 s
    assert seen["fps4"] == (8, [4, 4, 6], 0.5)
    assert seen["fps1"] == (2, [1, 4, 6], 2.0)
    assert seen["max2"][0] == 2 and seen["max2"][1][0] == 1
    assert seen["default_hw"] == (32, 48) and seen["pixels_hw"] == (16, 24)
    assert load_clip(source, VideoOptions(fps=2.0)).indices == [0, 2, 5, 7]  # evenly spaced, ends included


def test_smolvlm_without_a_video_processor_sees_the_frames_as_images(sim):
    pol = make(model="tiny")
    assert not pol.video_path
    obs = sim.reset([0, 0, 1, 1])
    (req,) = pol.requests(obs.instruction[:1], [[]], obs.videos[:1])
    assert len(req.images) == 4 and not req.videos  # 8 frames at 4 fps, 2 fps kept
    batch = pol.rollout(obs, torch.Generator().manual_seed(0)).batch
    assert pol._cache[int(batch["uid"][0])]["pixel_values"].shape[:2] == (1, 4)
    m = batch["completion_mask"]
    assert ((pol.evaluate(batch).logp - batch["old_logp"]).abs() * m).max() < 1e-4


def test_smolvlm2_sees_its_own_video_prompt_and_the_transformers_logits(sim, clip_frames):
    """SmolVLM2's video path (tiny random SmolVLM2, `mmrl.tiny.tiny_smolvlm2`): its processor writes
    the video's text (frame count, duration, one timestamp per chosen frame) around the frames' image
    tokens; the policy's log-probs equal the transformers model's on the processor's outputs, and the
    rollout's its recomputation (ratio 1)."""
    pytest.importorskip("num2words", reason="SmolVLM2's processor writes its timestamps with num2words")
    pol = make(model="tiny-smolvlm2", max_prompt_tokens=512)  # (patches torchvision before transformers' video code)
    from transformers.video_utils import VideoMetadata

    assert pol.video_path
    source = {"frames": list(clip_frames[:, :, :32]), "fps": 4.0}  # 8 square frames, 2 s at 4 fps
    (req,) = pol.requests(["Which way?"], [[]], [[source]])
    assert req.text.count("<video>") == 1 and not req.images
    entry = pol.encode_one(req)
    text = pol.tokenizer.decode(entry["prompt_ids"])
    # 2 fps kept: frames 0, 2, 5, 7 of 8 at 4 fps -> 0 s, 0.5 s, 1.25 s, 1.75 s (SmolVLM shows whole seconds)
    assert "series of four frames from a 0:00:02 [H:MM:SS] video" in text, text
    assert [line.split(":<")[0] for line in text.split("\n") if line.startswith("Frame from")] == [
        "Frame from 00:00",
        "Frame from 00:00",
        "Frame from 00:01",
        "Frame from 00:01",
    ]
    assert entry["pixel_values"].shape[:2] == (1, 4)
    words = pol.tokenizer("left", add_special_tokens=False)["input_ids"] + [pol.stop_id]
    completion, mask = torch.tensor([words]), torch.ones(1, len(words), dtype=torch.bool)
    logp, _ = pol._forward_logp([entry], completion, mask)
    frames = np.stack(source["frames"])[[0, 2, 5, 7]]
    meta = VideoMetadata(total_num_frames=8, fps=4.0, frames_indices=[0, 2, 5, 7], duration=2.0)
    enc = pol.processor(
        text=[req.text], videos=[[frames]], video_metadata=[meta], do_sample_frames=False, return_tensors="pt"
    )
    assert torch.equal(enc["input_ids"][0], entry["prompt_ids"])
    ids = torch.cat([enc["input_ids"], completion], 1)
    with torch.no_grad():
        logits = pol.model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=enc["pixel_values"],
            pixel_attention_mask=enc["pixel_attention_mask"],
        ).logits
    logits = logits[0, enc["input_ids"].shape[1] - 1 : -1].float() / pol.cfg.temperature
    logits[:, pol.banned_ids] = float("-inf")
    ref = logits.log_softmax(-1).gather(-1, completion[0, :, None])[:, 0]
    assert torch.allclose(logp[0], ref, atol=1e-5), logp[0] - ref
    batch = pol.rollout(sim.reset([0, 0, 1, 1]), torch.Generator().manual_seed(0)).batch
    m = batch["completion_mask"]
    assert ((pol.evaluate(batch).logp - batch["old_logp"]).abs() * m).max() < 1e-4


def test_mp4_paths_from_the_dataset_run_and_a_missing_file_is_named(tmp_path, monkeypatch):
    kw = {"num_samples": 2, "video_dir": str(tmp_path)}
    sim = QASim(num_envs=2, dataset="moving_shapes_vqa", dataset_kwargs=kw)
    assert isinstance(sim.videos[0][0], str) and sim.reset([0, 1]).image.shape == (2, 64, 64, 3)
    pol = make()
    batch = pol.rollout(sim.reset([0, 1]), torch.Generator().manual_seed(0)).batch
    assert pol._cache[int(batch["uid"][0])]["video_grid_thw"].tolist() == [[2, 4, 4]]  # 4 of 8 32 px frames
    import mmrl.data

    data = mmrl.data.load_dataset("moving_shapes_vqa", **kw)
    data["videos"][1] = [str(tmp_path / "missing.mp4")]
    monkeypatch.setattr(mmrl.data, "load_dataset", lambda name, **kw: data)
    with pytest.raises(FileNotFoundError, match=r"question 1 of 'moving_shapes_vqa' \(train\): video file .*missing"):
        QASim(num_envs=2, dataset="moving_shapes_vqa", dataset_kwargs=kw)
    with pytest.raises(FileNotFoundError, match="video file nowhere.mp4 does not exist"):
        load_clip("nowhere.mp4", VideoOptions())
    with pytest.raises(TypeError, match=r"cast the column with Video\(decode=False\)"):
        load_clip(object(), VideoOptions())  # e.g. a torchcodec decoder from datasets.Video(decode=True)


def test_a_video_prompt_that_would_be_truncated_fails_at_load(sim):
    pol = make(max_prompt_tokens=40)
    with pytest.raises(ValueError, match=r"question 0 of 'moving_shapes_vqa' \(train\) needs \d+ prompt tokens"):
        pol.check_simulator(sim)


def test_bad_video_options_fail_at_config_load():
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match="policy.video_fps must be > 0"):
        VLMConfig(model="tiny", video_fps=0.0).validate()
    with pytest.raises(ConfigError, match="policy.video_max_frames must be >= 1"):
        VLMConfig(model="tiny", video_max_frames=0).validate()


def test_the_video_qa_config_trains_through_the_one_trainer(tmp_path):
    import json

    from mmrl.experiment import build_trainer, load_experiment

    overrides = [
        f"run.output_dir={tmp_path}",
        "run.name=v",
        "sim.num_envs=8",
        "sim.eval_num_envs=8",
        "sim.kwargs.dataset_kwargs={num_samples: 32}",
        "warm_start.num_episodes=8",
        "warm_start.steps=2",
        "warm_start.warmup_steps=0",
        "warm_start.batch_size=4",
        "algorithm.minibatch_size=8",
        "trainer.eval_episodes=8",
        "trainer.iterations=2",
        "policy.recompute_logp=true",
    ]
    results = build_trainer(load_experiment("configs/vlm_video_qa.yaml", overrides)).run()
    assert results["final"]["iteration"] == 2
    rows = [json.loads(x) for x in (tmp_path / "v" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/policy_loss" in r]
    assert len(train) == 2 and all(r["train/logp_mismatch_max"] < 1e-4 for r in train)


def test_a_saved_tiny_qwen_folder_loads_through_from_pretrained_like_a_hub_id(tmp_path, sim):
    from mmrl.tiny.tiny_qwen_vl import tiny_qwen_vl_model

    tiny_qwen_vl_model(tmp_path / "qwen", seed=0)
    built, loaded = make(), make(model=str(tmp_path / "qwen"))
    assert type(loaded.processor).__name__ == "Qwen2_5_VLProcessor" and loaded.video_path
    obs = sim.reset([0, 1, 2, 3])
    a = built.rollout(obs, torch.Generator().manual_seed(0)).batch
    b = loaded.rollout(obs, torch.Generator().manual_seed(0)).batch
    assert torch.equal(a["completion"], b["completion"]) and torch.allclose(a["old_logp"], b["old_logp"])
    ea, eb = built._cache[int(a["uid"][0])], loaded._cache[int(b["uid"][0])]
    assert set(ea) == set(eb) and all(torch.equal(ea[k], eb[k]) for k in ea)
