"""Video generator alignment on the shared trainer (issue 34): VideoPromptSim (prompt -> clip ->
video reward), two-iteration runs of Flow-GRPO, AWM and DiffusionNFT with the built-in tiny video
generator and with a tiny random-weight diffusers Wan pipeline + LoRA, the evaluation video of
generated clips, and a resume."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.experiment import build_trainer, load_experiment
from mmrl.rollout import collect_episodes

FRAMES, SIZE = 4, 8
SIM = [
    "sim.type=video_prompts",
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    f"sim.kwargs={{dataset: moving_shapes_prompts, image_size: {SIZE}, num_frames: {FRAMES}}}",
    "reward={type: motion_amount}",
]
TINY = [
    "policy.type=diffusion",
    f"policy.image_size={SIZE}",
    f"policy.num_frames={FRAMES}",
    "policy.width=16",
    "policy.num_steps=3",
    "policy.eval_num_steps=3",
]
ALGO = [
    "algorithm.advantage=grpo_global_std",
    "algorithm.group_size=4",
    "algorithm.normalize_advantages=false",
    "algorithm.adv_clip=5",
    "algorithm.minibatch_size=8",
    "algorithm.epochs=1",
]
RUN = ["trainer.iterations=2", "trainer.eval_episodes=8", "trainer.video_episodes=4", "trainer.checkpoint_every=1"]
OBJECTIVES = {
    "ppo": [],  # Flow-GRPO on Flow-SDE rollouts
    "dancegrpo": ["policy.shared_noise=true", "policy.timestep_fraction=0.5"],  # DanceGRPO's options
    "awm": ["algorithm.objective=awm", "policy.noise_level=0.0"],
    "nft": ["algorithm.objective=nft", "policy.noise_level=0.0", "policy.nft_timesteps=2"],
}
LOSS = {"ppo": "train/policy_loss", "dancegrpo": "train/policy_loss", "awm": "train/awm_loss", "nft": "train/nft_loss"}


def cfg(tmp_path, *extra):
    return load_experiment(None, [f"run.output_dir={tmp_path}", "run.name=v", *SIM, *TINY, *ALGO, *RUN, *extra])


def _rows(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "v" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_tiny_video_generator_trains(tmp_path, objective):
    trainer = build_trainer(cfg(tmp_path, *OBJECTIVES[objective]))
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    results = trainer.run()
    assert results["final"]["iteration"] == 2 and results["final"]["episodes"] == 8
    train = [r for r in _rows(tmp_path) if "train/return" in r]
    assert len(train) == 2 and all(LOSS[objective] in r for r in train)
    after = trainer.policy.state_dict()
    assert any(not torch.equal(after[k], v) for k, v in before.items() if v.is_floating_point())
    videos = [p for p in (tmp_path / "v" / "videos").glob("final.*") if p.suffix in (".mp4", ".gif")]
    assert len(videos) == 1 and videos[0].stat().st_size > 0


def test_evaluation_video_plays_the_generated_clips(tmp_path):
    trainer = build_trainer(cfg(tmp_path))
    sim = trainer.eval_sim
    _, info = collect_episodes(trainer.policy, sim, list(range(8)), torch.Generator().manual_seed(0), "eval", 4)
    frames = info["frames"]
    assert frames.shape == (FRAMES, 4, SIZE, SIZE, 3) and info["frame_success"].shape == (FRAMES, 4)
    decision = trainer.policy.rollout(sim.reset(list(range(8))), torch.Generator().manual_seed(0), mode="eval")
    assert torch.equal(frames[:, 0], decision.actions[0])  # time is the clip's frames, episode 0's clip


def test_a_resumed_video_run_ends_with_the_uninterrupted_weights(tmp_path):
    whole = build_trainer(cfg(tmp_path / "whole"))
    whole.run()
    build_trainer(cfg(tmp_path / "split", "trainer.iterations=1")).run()
    resumed = build_trainer(cfg(tmp_path / "split"))
    assert resumed.run()["final"]["iteration"] == 2
    a, b = whole.policy.state_dict(), resumed.policy.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
def test_wan_lora_smoke(tmp_path, tiny_wan, objective):
    c = cfg(
        tmp_path,
        f"policy.model={tiny_wan}",
        "policy.image_size=16",
        "policy.num_frames=5",
        "policy.lora_rank=4",
        "policy.lora_alpha=8",
        "policy.max_sequence_length=16",
        "sim.kwargs={dataset: moving_shapes_prompts, image_size: 16, num_frames: 5}",
        *OBJECTIVES[objective],
    )
    trainer = build_trainer(c)
    state = trainer.policy.state_dict()
    lora = {k: v.clone() for k, v in state.items() if "lora_B" in k}
    frozen = {k: v.clone() for k, v in state.items() if "lora" not in k and "transformer" in k}
    results = trainer.run()
    assert results["final"]["iteration"] == 2
    after = trainer.policy.state_dict()
    assert lora and any(not torch.equal(after[k], v) for k, v in lora.items())  # the adapter trained
    assert frozen and all(torch.equal(after[k], v) for k, v in frozen.items())  # the base did not
