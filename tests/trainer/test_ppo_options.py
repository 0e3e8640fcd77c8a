"""What a PPO user expects from the trainer: early stopping on KL, a linear learning-rate decay,
reward scaling, the standard diagnostics, and the task's own headline metric (return where the
task defines no success), all on a tiny Pendulum run."""

import json

import pytest
import yaml

pytest.importorskip("gymnasium", reason='the "gym" simulator needs gymnasium: pip install "mmrl[gym]"')

from mmrl.experiment import build_trainer, load_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = [
    "sim.num_envs=2",
    "sim.eval_num_envs=2",
    "sim.kwargs={env_id: Pendulum-v1, render_images: false}",
    "algorithm.epochs=3",
    "algorithm.minibatch_size=8",
    "trainer.rollout_steps=8",
    "trainer.env_steps=48",
    "trainer.eval_episodes=2",
    "trainer.checkpoint_every=10",
]


def run(tmp_path, *extra):
    data = yaml.safe_load(open("configs/gym_pendulum.yaml"))
    data["policy"] = {"type": "gaussian"}
    trainer = build_trainer(load_experiment(data, [f"run.output_dir={tmp_path}", "run.name=o", *TINY, *extra]))
    trainer.run()
    rows = [json.loads(line) for line in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines()]
    return trainer, [r for r in rows if "train/epochs" in r]


def test_target_kl_stops_the_update_after_the_first_epoch(tmp_path):
    _, rows = run(tmp_path / "a")
    assert [r["train/epochs"] for r in rows] == [3, 3, 3]
    _, rows = run(tmp_path / "b", "algorithm.target_kl=1e-12")
    assert [r["train/epochs"] for r in rows] == [1, 1, 1]


def test_linear_lr_decay_over_the_env_step_budget(tmp_path):
    _, rows = run(tmp_path, "trainer.lr_schedule=linear", "trainer.lr=0.003")
    # iterations start at 0, 16 and 32 of 48 env steps
    assert [r["train/lr"] for r in rows] == pytest.approx([0.003, 0.002, 0.001])


def test_diagnostics_and_return_as_the_headline(tmp_path, capsys):
    trainer, rows = run(tmp_path, "algorithm.reward_norm=true")
    for key in ("train/explained_variance", "train/clip_frac", "train/approx_kl", "train/entropy", "train/value_loss"):
        assert all(key in r for r in rows), key
    assert "train/success" not in rows[0] and not trainer.sim.has_success  # Pendulum defines no success
    out = capsys.readouterr().out
    assert "held-out return:" in out and "held-out success" not in out
    assert str(tmp_path / "o") in out  # the summary names the run folder
    # reward scaling: the critic learns returns in units of the discounted return's std (~1), not
    # Pendulum's raw returns of about -1000
    assert trainer.reward_scaler.rms.var.item() > 1.0
    assert abs(trainer.policy.value(trainer.collector.rollout.obs)).max().item() < 50
