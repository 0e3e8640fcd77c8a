"""The training loop end to end on tiny settings: every variant runs, logs are written, NaN steps are
skipped and counted, and an interrupted run resumes to exactly the parameters of an uninterrupted one."""

import json

import pytest
import torch

from mmrl.experiment import build_trainer, load_experiment
from mmrl.trainer.warm_start import WarmStart

TINY = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs={max_episode_steps: 12}",
    "policy.dim=16",
    "policy.expert_dim=16",
    "policy.expert_layers=1",
    "policy.num_steps=3",
    "warm_start.num_episodes=4",
    "warm_start.steps=3",
    "warm_start.batch_size=8",
    "algorithm.minibatch_size=16",
    "algorithm.epochs=1",
    "trainer.iterations=2",
    "trainer.eval_episodes=8",
    "trainer.video_episodes=2",
    "trainer.checkpoint_every=1",
]


def tiny_cfg(tmp_path, *extra):
    return load_experiment("configs/quickstart.yaml", [f"run.output_dir={tmp_path}", "run.name=t", *TINY, *extra])


def params(policy):
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["policy.method=noise", "policy.logp_level=dim"],
        ["policy.method=cps", "policy.stochastic=one"],
        ["algorithm.advantage=grpo", "algorithm.group_size=4", "policy.critic=false"],
        ["algorithm.advantage=rloo", "algorithm.group_size=2", "algorithm.objective=awm"],
    ],
)
def test_variants_train_and_log(tmp_path, extra):
    cfg = tiny_cfg(tmp_path, *extra)
    results = build_trainer(cfg).run()
    out = tmp_path / "t"
    assert set(results) == {"start", "final"} and results["final"]["episodes"] == 8
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/success" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    loss_key = "train/awm_loss" if "algorithm.objective=awm" in extra else "train/policy_loss"
    assert all(loss_key in r for r in train_rows)
    assert (out / "videos" / "final.mp4").stat().st_size > 0
    assert any((out / "tb").iterdir())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    images = EventAccumulator(str(out / "tb"), size_guidance={"images": 0}).Reload().Tags()["images"]
    assert {"eval/start", "eval/final"} <= set(images)  # the evaluation grids, where people look
    assert (out / "checkpoints" / "latest").read_text() == "iter_000002"
    saved = load_experiment(out / "checkpoints" / "iter_000002" / "config.yaml")
    assert saved == cfg


def test_non_finite_loss_skips_step_and_counts(tmp_path):
    trainer = build_trainer(tiny_cfg(tmp_path))
    before = params(trainer.policy)
    w = next(trainer.policy.parameters())
    assert not trainer.optimizer_step(trainer.optimizer, w.sum() * float("nan"))
    assert not trainer.optimizer_step(trainer.optimizer, w.sum() * float("inf"))
    assert trainer.state.skipped_steps == 2
    for k, v in params(trainer.policy).items():
        torch.testing.assert_close(v, before[k])
    assert trainer.optimizer_step(trainer.optimizer, (w**2).sum())
    assert trainer.state.skipped_steps == 2


def test_interrupted_run_resumes_to_identical_parameters(tmp_path, killed_in_iteration):
    extra = ["trainer.iterations=4", "trainer.checkpoint_every=2", "trainer.video_episodes=0"]
    straight = build_trainer(tiny_cfg(tmp_path / "a", *extra))
    straight.run()

    # Run 2: killed during iteration 4 (after the checkpoint at iteration 2 and a finished 3rd).
    with killed_in_iteration(4):
        build_trainer(tiny_cfg(tmp_path / "b", *extra)).run()
    out = tmp_path / "b" / "t"
    assert (out / "checkpoints" / "latest").read_text() == "iter_000002"

    resumed = build_trainer(tiny_cfg(tmp_path / "b", *extra))
    resumed.run()
    assert resumed.state.iteration == 4
    assert resumed.state.episodes == straight.state.episodes  # nothing repeated or lost
    a, b = params(straight.policy), params(resumed.policy)
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0, msg=f"parameter {k} differs")
    # iteration 3 of the killed run was logged, then redone after the resume: the log keeps it once
    steps = [
        json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if "train/success" in line
    ]
    assert steps == [1, 2, 3, 4]


def test_trains_with_a_transformers_backbone_loaded_by_path(tmp_path):
    pytest.importorskip("transformers")
    from mmrl.tiny.tiny_models import tiny_image_text_model

    tiny_image_text_model(tmp_path / "vlm")  # saved like a hub checkpoint; loaded by from_pretrained
    cfg = tiny_cfg(tmp_path, f"policy.backbone={tmp_path / 'vlm'}", "trainer.iterations=1", "trainer.video_episodes=0")
    trainer = build_trainer(cfg)
    assert type(trainer.policy.backbone).__name__ == "HFImageTextBackbone"
    results = trainer.run()
    assert results["final"]["episodes"] == 8 and trainer.state.skipped_steps == 0


def test_resume_false_starts_over_with_a_clean_log(tmp_path):
    extra = ["trainer.iterations=1", "trainer.video_episodes=0"]
    build_trainer(tiny_cfg(tmp_path, *extra)).run()
    again = build_trainer(tiny_cfg(tmp_path, *extra, "trainer.resume=false"))
    again.run()
    assert again.state.iteration == 1 and again.state.episodes == 8  # not resumed
    rows = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/success" in r] == [1]


def test_demonstrations_are_recorded_in_the_configured_simulator(tmp_path, monkeypatch):
    """sim.kwargs reach the warm start's demonstrations: 16 px RL gets 16 px demos, and a slower
    demonstrator (warm_start.kwargs) is honoured on top."""
    seen = {}
    monkeypatch.setattr(WarmStart, "supervised", lambda self, data, ws: seen.update(data))
    cfg = tiny_cfg(
        tmp_path,
        "sim.kwargs={max_episode_steps: 12, image_size: 16}",
        "warm_start.kwargs={expert_speed: 0.5}",
        "trainer.iterations=0",
    )
    build_trainer(cfg).warm_start()
    assert tuple(seen["image"].shape[1:]) == (16, 16, 3)
    assert seen["meta"]["sim_kwargs"] == {"max_episode_steps": 12, "image_size": 16}
    assert seen["meta"]["expert_speed"] == 0.5


def test_warm_start_lr_factor_by_hand():
    from mmrl.trainer.trainer import warm_start_lr_factor as f

    assert [f(s, 10, "constant") for s in (0, 9)] == [1.0, 1.0]
    assert [f(s, 10, "cosine") for s in (0, 5)] == [1.0, pytest.approx(0.5)]
    # 3 warm-up steps: 1/4, 2/4, 3/4, then the cosine over the 7 steps left starts at 1
    assert [f(s, 10, "cosine", 3) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(3 + 7 / 2, 10, "cosine", 3) == pytest.approx(0.5)
    assert [f(s, 10, "constant", 2) for s in (0, 1, 2, 9)] == [1 / 3, 2 / 3, 1.0, 1.0]
