"""The VLM policy with ``engine: vllm`` (runs where vLLM is importable: ``.venv-vllm``): the trainer's
recomputed log-probs match the engine's, and after an update + `sync_rollout` the engine samples
from the updated weights (the mismatch stays at float noise instead of jumping); the engine continues
a multi-turn conversation whose context holds the image a tool returned (issue 35)."""

import pytest
import torch

vllm = pytest.importorskip(
    "vllm",
    reason="vLLM not installed here: bash scripts/setup_vllm.sh, then run this "
    "file with .venv-vllm/bin/python -m pytest",
)

from mmrl.policies.vlm import VLMConfig, VLMPolicy  # noqa: E402
from mmrl.simulator import Completions  # noqa: E402
from simulators.qa import QASim  # noqa: E402
from simulators.tool_env import ToolEnvSim  # noqa: E402

TOL = 1e-3
IMAGE_TOL = 5e-6  # the multi-turn test's: see there


def test_vllm_policy_recomputes_engine_logprobs_and_syncs_updates():
    sim = QASim(num_envs=4, dataset="shapes_vqa", dataset_kwargs={"num_samples": 8, "tasks": ["count"]})
    torch.manual_seed(0)
    pol = VLMPolicy(
        VLMConfig(model="tiny", engine="vllm", max_new_tokens=6, max_prompt_tokens=64), action_dim=sim.action_dim
    )
    assert pol.recompute
    batch = pol.rollout(sim.reset([0, 0, 1, 1]), torch.Generator().manual_seed(0)).batch
    m = batch["completion_mask"]
    assert not any(t in pol.banned_ids for t in batch["completion"][m].tolist())
    assert pol.rollout_stats()["logp_mismatch_max"] < TOL
    opt = torch.optim.SGD([p for p in pol.parameters() if p.requires_grad], lr=0.5)
    (-pol.evaluate(batch).logp[m].sum()).backward()
    opt.step()
    pol.rollout(sim.reset([2, 2, 3, 3]), torch.Generator().manual_seed(1))
    assert pol.rollout_stats()["logp_mismatch_max"] > 10 * TOL  # the engine still has the old weights
    pol.sync_rollout()  # pushes the updated weights into the engine
    pol.rollout(sim.reset([2, 2, 3, 3]), torch.Generator().manual_seed(1))
    assert pol.rollout_stats()["logp_mismatch_max"] < TOL


ZOOM = '<tool_call>\n{"name": "zoom", "arguments": {"x": 5, "y": 7}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen():
    """The tiny Qwen2.5-VL on vLLM, for both tests below (each engine start costs ~40 s here)."""
    torch.manual_seed(0)
    cfg = VLMConfig(model="tiny-qwen2.5-vl", engine="vllm", max_new_tokens=6, max_prompt_tokens=1000, video_fps=2.0)
    return VLMPolicy(cfg, action_dim=0)


def test_vllm_continues_a_multi_turn_context_with_a_tool_image(qwen):
    """Second turns of the zoom task (question image, a zoom call, the crop it returned) sampled by
    vLLM on the tiny Qwen2.5-VL: vLLM's prompt is the trainer's token for token, both images
    expanded, and its log-probs equal the trainer's recomputation."""
    sim = ToolEnvSim(num_envs=4, env="zoom", dataset="zoom_vqa", dataset_kwargs={"num_samples": 8})
    sim.reset([0, 0, 1, 1])
    obs = sim.step_chunk(Completions([ZOOM] * 4, [20] * 4)).obs
    pol = qwen
    req = pol.requests(list(obs.instruction), [[]] * 4, None, obs.messages, obs.tools)[0]
    assert len(req.images) == 2 and req.text.count("<|image_pad|>") == 2  # the question image, then the crop
    batch = pol.rollout(obs, torch.Generator().manual_seed(0)).batch
    entry = pol._cache[int(batch["uid"][0])]
    assert entry["image_grid_thw"].shape[0] == 2
    engine = pol.engine()
    out = engine.llm.generate(engine.prompt(req), vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    assert list(out[0].prompt_token_ids) == entry["prompt_ids"].tolist()  # both images expanded alike
    # The random tiny model barely looks at its images: measured on the 2-core machine, the right
    # images give 4.8e-7, the two images swapped 2.9e-5, both blank 1.2e-4; TOL (1e-3) would miss those
    assert pol.rollout_stats()["logp_mismatch_max"] < IMAGE_TOL
    m = batch["completion_mask"]
    assert torch.equal(pol.evaluate(batch).logp.cpu() * m, batch["old_logp"])  # ratio 1


def test_vllm_samples_video_questions_as_the_trainer_sees_them(qwen):
    """Video questions (8-frame clips at 4 fps, 2 chosen per second) sampled by vLLM on the tiny
    Qwen2.5-VL: vLLM's prompt is the trainer's token for token and its log-probs equal the trainer's
    recomputation (the frames and their timing reach both alike)."""
    sim = QASim(num_envs=4, dataset="moving_shapes_vqa", dataset_kwargs={"num_samples": 8, "num_frames": 8, "fps": 4.0})
    pol = qwen
    obs = sim.reset([0, 0, 1, 1])
    batch = pol.rollout(obs, torch.Generator().manual_seed(0)).batch
    entry = pol._cache[int(batch["uid"][0])]
    assert entry["video_grid_thw"].shape[0] == 1 and int(entry["video_grid_thw"][0, 0]) == 2  # 4 frames: 2 patches
    req = pol.requests(list(obs.instruction), pol._obs_images(obs), pol._obs_videos(obs))[0]
    engine = pol.engine()
    out = engine.llm.generate(engine.prompt(req), vllm.SamplingParams(max_tokens=1), use_tqdm=False)
    assert list(out[0].prompt_token_ids) == entry["prompt_ids"].tolist()
    # Measured on the 2-core machine: 2.2e-4 with the right clips; the frames reversed 1.4e-2, blank
    # 1.1e-2. vLLM gets the trainer's pixels (equal within 4e-7 after normalisation); the 2.2e-4 is the
    # text after the video starting one rope position later in vLLM 0.32 (past the video's temporal
    # positions) than in transformers 5.19 (past its spatial extent). TOL still catches wrong frames.
    assert pol.rollout_stats()["logp_mismatch_max"] < TOL
    m = batch["completion_mask"]
    assert torch.equal(pol.evaluate(batch).logp.cpu() * m, batch["old_logp"])  # ratio 1
