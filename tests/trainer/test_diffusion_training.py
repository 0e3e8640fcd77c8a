"""Diffusion alignment on the shared trainer: PromptSim (prompt -> image -> reward), Flow-GRPO and
AWM smoke runs with a tiny random-weight diffusers SD3 pipeline + LoRA and with the built-in tiny
generator, and a reward that fails mid-run (clear error, last checkpoint intact)."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.experiment import build_trainer, load_experiment
from mmrl.registry import REWARDS
from mmrl.reward import RewardError
from mmrl.trainer.checkpoint import latest_path, load_policy
from mmrl.trainer.reward_stage import RewardStage
from simulators.prompts import PromptSim

SIM = [
    "sim.type=prompts",
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs={dataset: shapes_prompts, image_size: 16}",
    "reward={type: shapes, success_threshold: 0.9}",
]
TINY_GEN = [
    "policy.type=diffusion",
    "policy.image_size=16",
    "policy.width=16",
    "policy.num_steps=3",
    "policy.eval_num_steps=3",
]
ALGO = [
    "algorithm.advantage=grpo_global_std",
    "algorithm.group_size=4",
    "algorithm.normalize_advantages=false",
    "algorithm.adv_clip=5",
    "algorithm.clip_low=0.0001",
    "algorithm.minibatch_size=8",
    "algorithm.epochs=1",
]
RUN = ["trainer.iterations=2", "trainer.eval_episodes=8", "trainer.video_episodes=4", "trainer.checkpoint_every=1"]


def cfg(tmp_path, *extra):
    return load_experiment(None, [f"run.output_dir={tmp_path}", "run.name=d", *SIM, *TINY_GEN, *ALGO, *RUN, *extra])


def test_prompt_sim_images_rewards_and_splits():
    sim = PromptSim(num_envs=4, image_size=4)
    obs = sim.reset([5, 5, 6, 7])
    assert obs.instruction[0] == obs.instruction[1] and obs.image.shape == (4, 4, 4, 3) and obs.state is None
    assert sim.reset([5, 9, 9, 9]).instruction[0] == obs.instruction[0]  # a seed's prompt, any batch
    images = torch.zeros(4, 4, 4, 3, dtype=torch.uint8)
    images[0, 0, 0] = torch.tensor([255, 128, 0], dtype=torch.uint8)  # pixel (0, 0) of env 0
    res = sim.step_chunk(images)
    assert res.terminated.all() and not res.truncated.any() and res.final_obs is not None
    assert torch.equal(res.final_obs.image, images)  # videos and grids show the generated images
    assert res.reward.tolist() == [0.0] * 4 and not res.success.any()  # the reward stage scores them
    meta = [sim.meta[i] for i in sim.prompt_index([5, 5, 6, 7])]
    assert obs.meta == meta  # the ground truth the reward stage hands the reward model
    model = REWARDS.build("shapes")
    scored = RewardStage(model, "image", success_threshold=0.5)(res, obs, images, torch.ones(4, dtype=torch.bool))
    assert torch.equal(scored.reward, model(images, obs.instruction, meta))
    assert torch.equal(scored.success, scored.reward >= 0.5)
    assert (res.obs.image == 0).all()  # auto reset: a fresh (blank) episode
    eval_prompts = set(PromptSim(num_envs=1, split="eval").prompts)
    assert eval_prompts and not eval_prompts & set(sim.prompts)
    with pytest.raises(ValueError, match=r"takes uint8 images \[2, 8, 8, 3\]"):
        PromptSim(num_envs=2, image_size=8).step_chunk(torch.zeros(2, 1, 5))


def test_prompt_sim_deals_eval_prompts_in_cycles_and_train_prompts_at_random():
    from collections import Counter

    from simulators.reach import hash_uniform

    ev = PromptSim(num_envs=5, **PromptSim.eval_kwargs)
    p = len(ev.prompts)
    seeds = [10**9 + 7 + e for e in range(2 * p)]  # any run of consecutive seeds
    assert Counter(ev.prompt_index(seeds).tolist()) == {i: 2 for i in range(p)}
    assert ev.reset(seeds[:5]).instruction == [ev.prompts[s % p] for s in seeds[:5]]
    assert ev.evaluation_rounds(2 * p) == 2
    for bad in (p - 1, p + 2, 0):
        with pytest.raises(ValueError, match=f"multiple of {p}"):
            ev.evaluation_rounds(bad)
    train = PromptSim(num_envs=5)  # training: with replacement, by a hash of the seed (unchanged)
    u = hash_uniform(torch.tensor(seeds), 1)[:, 0]
    assert train.prompt_index(seeds).tolist() == (u * len(train.prompts)).long().tolist()
    assert len(set(train.prompt_index(seeds[:p]).tolist())) < p  # draws repeat prompts
    with pytest.raises(ValueError, match="deal='cycle'"):
        train.evaluation_rounds(len(train.prompts))
    with pytest.raises(ValueError, match="deal must be one of"):
        PromptSim(num_envs=1, deal="shuffle")


@pytest.mark.parametrize(
    "extra",
    [
        [],  # Flow-GRPO: per-step ratios
        ["policy.kl_reference=true", "algorithm.kl_coef=0.04", "policy.stochastic=window", "policy.window=[0, 2]"],
        ["algorithm.objective=awm", "policy.awm_ema_coef=0.1", "policy.awm_ref_coef=0.1", "policy.noise_level=0.0"],
    ],
)
def test_tiny_generator_trains(tmp_path, extra):
    results = build_trainer(cfg(tmp_path, *extra)).run()
    assert set(results) == {"start", "final"} and results["final"]["episodes"] == 8
    rows = [json.loads(x) for x in (tmp_path / "d" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/return" in r]
    key = "train/awm_loss" if "algorithm.objective=awm" in extra else "train/policy_loss"
    assert len(train) == 2 and all(key in r for r in train)
    if "algorithm.kl_coef=0.04" in extra:
        assert all(r["train/kl"] >= 0 for r in train)
    assert (tmp_path / "d" / "videos" / "final.png").stat().st_size > 0  # the sample grid


def test_kl_needs_the_reference(tmp_path):
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match="kl_reference"):
        cfg(tmp_path, "algorithm.kl_coef=0.04")


@pytest.fixture(scope="module")
def tiny_sd3(tmp_path_factory):
    from mmrl.utils.compat import patch_torchvision

    patch_torchvision()
    pytest.importorskip("diffusers")
    pytest.importorskip("peft")
    from mmrl.tiny.tiny_diffusers import tiny_sd3_pipeline

    return tiny_sd3_pipeline(tmp_path_factory.mktemp("sd3"))


@pytest.mark.parametrize("objective", ["ppo", "awm"])
def test_sd3_lora_flow_grpo_and_awm_smoke(tmp_path, tiny_sd3, objective):
    c = cfg(
        tmp_path,
        f"policy.model={tiny_sd3}",
        "policy.lora_rank=4",
        "policy.lora_alpha=8",
        "policy.guidance_scale=1.0",
        f"algorithm.objective={objective}",
        # random weights draw nothing the shapes reward scores; JPEG size varies per image
        "sim.kwargs={dataset: shapes_prompts, image_size: 16}",
        "reward={type: jpeg_compressibility}",
    )
    trainer = build_trainer(c)
    lora = {k: v.clone() for k, v in trainer.policy.state_dict().items() if "lora_B" in k}
    frozen = {k: v.clone() for k, v in trainer.policy.state_dict().items() if "lora" not in k and "transformer" in k}
    results = trainer.run()
    assert results["final"]["iteration"] == 2
    after = trainer.policy.state_dict()
    assert any(not torch.equal(after[k], v) for k, v in lora.items())  # the adapter trained
    assert all(torch.equal(after[k], v) for k, v in frozen.items())  # the base transformer did not


def test_failing_reward_raises_and_keeps_the_checkpoint(tmp_path):
    trainer = build_trainer(cfg(tmp_path, "trainer.iterations=3"))
    real = trainer.reward_stage.model  # scores training and evaluation rollouts
    calls = {"n": 0}

    class Flaky:
        kind, name = "image", "flaky"

        def __call__(self, images, prompts, meta=None):
            calls["n"] += 1
            if calls["n"] > 3:  # the start's evaluation and iterations 1 and 2 score, the 3rd fails
                raise ConnectionError("reward server went away")
            return real(images, prompts, meta)

    trainer.reward_stage.model = Flaky()
    with pytest.raises(RewardError, match="reward server went away"):
        trainer.run()
    path = latest_path(tmp_path / "d")
    assert path is not None and path.name == "iter_000002"
    state = load_policy(path, build_trainer(cfg(tmp_path)).policy)  # loads cleanly
    assert state["state"]["iteration"] == 2


class Brightness:
    """Mean pixel value in [0, 1]: a reward any working policy gradient climbs at once."""

    kind, name = "image", "brightness"

    def __call__(self, images, prompts, meta=None):
        return images.float().mean((1, 2, 3)) / 255.0


@pytest.mark.slow
def test_flow_grpo_climbs_a_simple_reward(tmp_path):
    """The sign check of the whole pipeline (sampler log-probs, group advantages, per-step PPO):
    from a random generator, 10 Flow-GRPO iterations raise the mean brightness of the samples."""
    c = load_experiment(
        "configs/diffusion_shapes_flow_grpo.yaml",
        [
            f"run.output_dir={tmp_path}",
            "run.name=b",
            "warm_start.dataset=null",
            "trainer.iterations=10",
            "trainer.eval_episodes=8",
            "trainer.video_episodes=0",
            "trainer.checkpoint_every=10",
            "sim.num_envs=32",
            "sim.eval_num_envs=8",
            "policy.width=16",
            "policy.num_steps=4",
            # a random generator and a global reward: larger steps than the demo's fine-tuning settings
            "trainer.lr=3e-4",
            "algorithm.clip_low=1e-3",
            "algorithm.epochs=2",
        ],
    )
    trainer = build_trainer(c)
    trainer.reward_stage.model = Brightness()  # scores training and evaluation rollouts
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    ret = [r["train/return"] for r in rows if "train/return" in r]
    assert sum(ret[-3:]) / 3 > ret[0] + 0.02, ret


def test_the_summary_speaks_the_generator_metric(tmp_path, capsys):
    """Without a success threshold a generator is judged by its mean reward, said as such, with the
    run folder; runs without a warm start say 'before RL'."""
    from mmrl.experiment import build_trainer

    build_trainer(cfg(tmp_path, "reward={type: shapes}", "trainer.iterations=1", "trainer.video_episodes=0")).run()
    last = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("held-out")][-1]
    assert last.startswith("held-out mean reward: ") and f"run folder: {tmp_path / 'd'}" in last
    assert "(before RL)" in last or "(warm start)" in last
