"""The GPU recipes of the pretrained-VLA family, built and trained here with tiny stand-ins.

``configs/libero_spatial_smolvla_flow_noise.yaml`` and ``configs/libero_pi05_flow_sde.yaml`` are
loaded as users run them, with only what a CPU test must change: the device, sizes, a tiny
checkpoint folder of the real class with the recipe's features (LIBERO's two cameras under the
recipe's ``camera_keys``, an 8-d state, 7-d actions) in place of the hub id, and LIBERO's stand-in
envs (tests/simulators/test_libero.py). The trainer is built from them and runs an RL iteration and
both evaluations (``configs/libero_spatial_smolvla_dsrl.yaml``: DSRL trains its actor and leaves
SmolVLA's weights as they were); the CPU config ``configs/reach_smolvla_flow_noise.yaml`` trains two iterations and
its run is exported to LeRobot's format, where LeRobot's own SmolVLA acts as mmrl's policy did.
Runs in the LeRobot venv (``bash scripts/setup_lerobot.sh``); skipped elsewhere.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("lerobot", reason="the LeRobot venv: bash scripts/setup_lerobot.sh")

from mmrl.experiment import build_trainer, load_experiment
from mmrl.policies.lerobot.policy import LeRobotVLAPolicy
from mmrl.tiny import tiny_lerobot

ROOT = Path(__file__).resolve().parents[2]
FAKE_LIBERO = f"{ROOT / 'tests' / 'simulators' / 'test_libero.py'}:FakeLiberoEnv"
LIBERO_KEYS = ["observation.images.image", "observation.images.image2"]


def tiny_libero_checkpoint(family: str, folder: Path, tokenizer: str | None) -> str:
    kw = dict(
        cameras=2,
        image_size=32,
        state_dim=8,
        action_dim=7,
        chunk_size=12,
        n_action_steps=10,
        num_steps=10,
        camera_keys=LIBERO_KEYS,
    )
    if family == "smolvla":
        kw["vlm_folder"] = tiny_lerobot.tiny_smolvlm_folder(folder / "vlm")
    stats = {
        "observation.state": {k: f(8) for k, f in STAT_FNS.items()},
        "action": {k: f(7) for k, f in STAT_FNS.items()},
    }
    return tiny_lerobot.save_tiny_lerobot_policy(family, folder / family, stats=stats, **kw)


def stand_ins(tmp_path: Path) -> list[str]:
    """What a CPU test changes in a LIBERO recipe besides the model: the device, the run folder, two
    stand-in LIBERO envs at 32 px with short episodes, evaluated without a sweep over the tasks."""
    return [
        "run.device=cpu",
        f"run.output_dir={tmp_path / 'runs'}",
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "sim.eval_tasks=null",
        f"sim.kwargs.env_factory={FAKE_LIBERO}",
        "sim.kwargs.image_size=32",
        "sim.kwargs.max_episode_steps=20",
        "sim.kwargs.num_noop_steps=1",
    ]


STAT_FNS = {
    "mean": torch.zeros,
    "std": torch.ones,
    "min": lambda n: -torch.ones(n),
    "max": torch.ones,
    "q01": lambda n: -torch.ones(n),
    "q99": torch.ones,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, family",
    [("configs/libero_spatial_smolvla_flow_noise.yaml", "smolvla"), ("configs/libero_pi05_flow_sde.yaml", "pi05")],
)
def test_libero_recipe_builds_and_trains_with_tiny_stand_ins(recipe, family, tmp_path, monkeypatch):
    pytest.importorskip("libero", reason="the LIBERO extra")
    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path / "libero_cfg"))
    tok = tiny_lerobot.tiny_gemma_tokenizer_folder(tmp_path / "tok") if family != "smolvla" else None
    variants = tiny_lerobot.TinyPiVariants(tok) if tok else contextlib.nullcontext()
    with variants:
        folder = tiny_libero_checkpoint(family, tmp_path, tok)
        over = [
            f"policy.model={folder}",
            *stand_ins(tmp_path),
            "trainer.iterations=1",
            "trainer.eval_episodes=2",
            "trainer.video_episodes=0",
            "algorithm.minibatch_size=8",
        ]
        if family != "smolvla":
            over += [f"policy.tokenizer={tok}", "algorithm.group_size=2"]
        cfg = load_experiment(ROOT / recipe, over)
        trainer = build_trainer(cfg)
    policy = trainer.policy
    assert isinstance(policy, LeRobotVLAPolicy) and policy.family.name == family
    assert policy.camera_keys == LIBERO_KEYS and policy.chunk_size == 10 and len(policy.grid) == 11
    assert type(policy.lerobot).__name__ == {"smolvla": "SmolVLAPolicy", "pi05": "PI05Policy"}[family]
    results = trainer.run()
    assert results["final"]["iteration"] == 1 and results["final"]["episodes"] == 2
    metrics = (tmp_path / "runs" / cfg.run.name / "metrics.jsonl").read_text()
    assert '"train/approx_kl"' in metrics


@pytest.mark.slow
def test_libero_dsrl_recipe_builds_and_trains_with_a_frozen_tiny_smolvla(tmp_path, monkeypatch):
    """configs/libero_spatial_smolvla_dsrl.yaml: SAC over SmolVLA's initial noise; SmolVLA's weights
    leave the run as they came in."""
    pytest.importorskip("libero", reason="the LIBERO extra")
    from mmrl.policies.dsrl import DSRLPolicy

    monkeypatch.setenv("LIBERO_CONFIG_PATH", str(tmp_path / "libero_cfg"))
    folder = tiny_libero_checkpoint("smolvla", tmp_path, None)
    cfg = load_experiment(
        ROOT / "configs/libero_spatial_smolvla_dsrl.yaml",
        [
            f"policy.base.model={folder}",
            "policy.hidden=16",
            *stand_ins(tmp_path),
            "algorithm.sac.learning_starts=4",
            "algorithm.sac.batch_size=8",
            "algorithm.sac.critic_hidden=16",
            "trainer.rollout_steps=2",
            "trainer.env_steps=12",
            "trainer.eval_every=0",
            "trainer.eval_episodes=2",
            "trainer.video_episodes=0",
        ],
    )
    trainer = build_trainer(cfg)
    policy = trainer.policy
    assert isinstance(policy, DSRLPolicy) and isinstance(policy.base, LeRobotVLAPolicy)
    assert policy.base.noise_shape == (12, 32) and policy.chunk_size == 10
    before = {k: v.clone() for k, v in policy.base.state_dict().items()}
    actor = [p.detach().clone() for p in policy.actor.parameters()]
    results = trainer.run()
    assert results["final"]["env_steps"] >= 12
    assert all(torch.equal(before[k], v) for k, v in policy.base.state_dict().items())  # frozen throughout
    assert any(not torch.equal(a, p) for a, p in zip(actor, policy.actor.parameters()))  # the actor learned
    metrics = (tmp_path / "runs" / cfg.run.name / "metrics.jsonl").read_text()
    assert '"train/critic_loss"' in metrics and '"train/actor_loss"' in metrics


@pytest.mark.slow
def test_cpu_config_trains_end_to_end(tmp_path):
    cfg = load_experiment(
        ROOT / "configs/reach_smolvla_flow_noise.yaml",
        [
            f"run.output_dir={tmp_path}",
            "sim.num_envs=8",
            "sim.eval_num_envs=8",
            "trainer.iterations=2",
            "trainer.eval_episodes=8",
            "trainer.video_episodes=0",
            "warm_start.num_episodes=20",
            "warm_start.steps=3",
            "warm_start.warmup_steps=1",
            "warm_start.batch_size=8",
            "algorithm.minibatch_size=16",
            "run.threads=1",
        ],
    )
    trainer = build_trainer(cfg)
    results = trainer.run()
    assert results["final"]["iteration"] == 2
    # the trained policy leaves mmrl in LeRobot's format, with no simulator built, and acts the same there
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    import mmrl

    folder = mmrl.export_policy(tmp_path / cfg.run.name, tmp_path / "export")
    theirs = SmolVLAPolicy.from_pretrained(folder).eval()
    pre, post = make_pre_post_processors(PreTrainedConfig.from_pretrained(folder), pretrained_path=folder)
    obs = trainer.eval_sim.reset(list(range(8)))
    policy = trainer.policy.eval()
    ours = policy.rollout(obs, torch.Generator().manual_seed(5), mode="eval").actions
    noise = torch.randn(8, policy.horizon, policy.max_action_dim, generator=torch.Generator().manual_seed(5))
    raw = {
        "observation.images.camera1": obs.image.permute(0, 3, 1, 2).float() / 255,
        "observation.state": obs.state,
        "task": obs.instruction,
    }
    chunk = theirs.predict_action_chunk(pre(raw), noise=noise)
    assert torch.allclose(post(chunk[:, : policy.chunk_size]), ours, atol=1e-5)
    # `mmrl export` writes the same format, with a model card, from the run folder
    from mmrl.cli import main

    assert main(["export", str(tmp_path / cfg.run.name), "--to", str(tmp_path / "cli_export")]) == 0
    again = SmolVLAPolicy.from_pretrained(tmp_path / "cli_export").eval()
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), theirs.state_dict().values()))
    card = (tmp_path / "cli_export" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: lerobot\n") and "base_model" not in card  # a tiny model is no hub id
