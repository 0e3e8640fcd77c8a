"""What a PPO user expects from the trainer: early stopping on KL, a linear learning-rate decay, the
KL-adaptive learning rate (rsl_rl's), reward scaling, the standard diagnostics, and the task's own
headline metric (return where the task defines no success), all on a tiny Pendulum run."""

import json

import pytest
import torch
import yaml

pytest.importorskip("gymnasium", reason='the "gym" simulator needs gymnasium: pip install "mmrl[gym]"')

from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.trainer.trainer import kl_adaptive_scale

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
    _, rows = run(tmp_path / "a", "algorithm.target_kl=null")  # the config's cap (0.2) off: every epoch
    assert [r["train/epochs"] for r in rows] == [3, 3, 3]
    _, rows = run(tmp_path / "b", "algorithm.target_kl=1e-12")
    assert [r["train/epochs"] for r in rows] == [1, 1, 1]


def test_linear_lr_decay_over_the_env_step_budget(tmp_path):
    _, rows = run(tmp_path, "trainer.lr_schedule=linear", "trainer.lr=0.003")
    # iterations start at 0, 16 and 32 of 48 env steps
    assert [r["train/lr"] for r in rows] == pytest.approx([0.003, 0.002, 0.001])


def test_kl_adaptive_scale_by_hand():
    # rsl_rl's rule around desired 0.01: above 0.02 divide by 1.5, below 0.005 (and above 0) multiply
    assert kl_adaptive_scale(1.0, 0.03, 0.01) == pytest.approx(1 / 1.5)
    assert kl_adaptive_scale(1.0, 0.004, 0.01) == pytest.approx(1.5)
    for kl in (0.0, 0.005, 0.01, 0.02):  # no KL measured yet (ratio exactly 1), or inside the band
        assert kl_adaptive_scale(0.7, kl, 0.01) == 0.7
    assert kl_adaptive_scale(9.0, 0.0001, 0.01) == 10.0  # bounded: lr / 100 .. 10 x lr
    assert kl_adaptive_scale(0.012, 1.0, 0.01) == 0.01


@pytest.mark.parametrize(("desired", "scale"), [(1e3, 10.0), (1e-12, 0.01)])
def test_adaptive_lr_follows_the_update_kl(tmp_path, desired, scale):
    # every KL is far below (above) the target: the rate climbs (falls) to its bound and stays there
    trainer, rows = run(tmp_path, "trainer.lr_schedule=adaptive", f"trainer.desired_kl={desired}", "trainer.lr=0.001")
    assert trainer.state.lr_scale == scale
    assert rows[-1]["train/lr"] == pytest.approx(0.001 * scale)
    assert rows[0]["train/lr"] != pytest.approx(0.001)  # the first update already moved it


@pytest.mark.parametrize(("schedule", "refused"), [("constant", False), ("adaptive", False), ("linear", True)])
def test_a_longer_run_resumes_unless_the_rate_decays_over_its_length(schedule, refused):
    from mmrl.trainer.run_folder import config_changes

    saved = {"trainer": {"lr_schedule": schedule, "env_steps": 1000}}
    longer = {"trainer": {"lr_schedule": schedule, "env_steps": 2000}}
    assert bool(config_changes(saved, longer)) == refused


def test_adaptive_lr_needs_ppo(tmp_path):
    with pytest.raises(ConfigError, match="'trainer.lr_schedule' = 'adaptive'"):
        load_experiment("configs/quickstart.yaml", ["trainer.lr_schedule=adaptive", "algorithm.objective=awm"])


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
    assert trainer.learner.reward_scaler.rms.var.item() > 1.0
    assert abs(trainer.policy.value(trainer.collector.rollout.obs)).max().item() < 50


def advantages_seen(monkeypatch, tmp_path, *extra) -> list:
    """The advantages of every minibatch the objective was given during a tiny run."""
    from mmrl.registry import OBJECTIVES

    seen, get = [], OBJECTIVES.get

    def spy(name):
        objective = get(name)

        def wrapped(policy, mb, algo):
            seen.append(mb["advantages"].detach().clone())
            return objective(policy, mb, algo)

        wrapped.needs = objective.needs  # what the config check reads
        return wrapped

    monkeypatch.setattr(OBJECTIVES, "get", spy)
    run(tmp_path, *extra)
    return seen


def test_advantages_whitened_per_minibatch_or_over_the_rollout(monkeypatch, tmp_path):
    per_mb = advantages_seen(monkeypatch, tmp_path / "mb", "algorithm.advantage_norm_scope=minibatch")
    assert len(per_mb) == 3 * 3 * 2  # iterations x epochs x minibatches of 8 of the 16 decisions
    for a in per_mb:
        assert float(a.mean()) == pytest.approx(0.0, abs=1e-5) and float(a.std()) == pytest.approx(1.0, abs=1e-4)
    whole = advantages_seen(monkeypatch, tmp_path / "all")  # default: once over the rollout's 16
    assert max(abs(float(a.mean())) for a in whole) > 0.05
    for i in range(0, len(whole), 2):  # an epoch's two minibatches are the rollout's 16, whitened together
        a = torch.cat(whole[i : i + 2])
        assert float(a.mean()) == pytest.approx(0.0, abs=1e-5) and float(a.std()) == pytest.approx(1.0, abs=1e-4)


def test_adam_eps_reaches_the_optimizer(tmp_path):
    trainer, _ = run(tmp_path, "trainer.engine.adam_eps=1e-5")
    assert {g["eps"] for g in trainer.optimizer.param_groups} == {1e-5}
