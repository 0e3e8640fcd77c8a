"""The reward audit in a real run (tiny quickstart, a frame reward given as a Python function): every
evaluation's results hold how the trained reward tracked success and a held-out reward on the same
episodes, and a run whose trained reward rises while the held-out one falls warns in one line."""

import json

import pytest

from mmrl.experiment import build_trainer, load_experiment

TINY = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs={max_episode_steps: 8, success_radius: 0.5}",  # an untrained policy succeeds often
    "policy.dim=16",
    "policy.expert_dim=16",
    "policy.expert_layers=1",
    "policy.num_steps=2",
    "warm_start.num_episodes=4",
    "warm_start.steps=2",
    "warm_start.batch_size=8",
    "warm_start.candidates=1",
    "algorithm.minibatch_size=16",
    "algorithm.epochs=1",
    "trainer.iterations=2",
    "trainer.eval_every=1",
    "trainer.eval_episodes=16",
    "trainer.video_episodes=0",
    "trainer.checkpoint_every=1",
]

REWARDS = """
calls = {"rising": 0, "falling": 0}


def rising(images, prompts, **columns):  # a reward that climbs whatever the policy does
    calls["rising"] += 1
    return [float(calls["rising"])] * len(images)


def falling(images, prompts, **columns):  # a held-out measure that drops meanwhile
    calls["falling"] += 1
    return [-float(calls["falling"])] * len(images)


def brightness(images, prompts, **columns):
    return [float(im.float().mean()) / 255.0 for im in images]
"""


def run(tmp_path, trained, heldout=None, *extra):
    file = tmp_path / "audit_rewards.py"
    file.write_text(REWARDS)
    over = [f"run.output_dir={tmp_path}", "run.name=a", *TINY, f"reward={{type: {file}:{trained}}}"]
    if heldout:
        over += [f"reward.audit.heldout={file}:{heldout}", "reward.audit.patience=2"]
    trainer = build_trainer(load_experiment("configs/quickstart.yaml", over + list(extra)))
    results = trainer.run()
    return results, [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]


def test_every_evaluation_is_audited_against_success_on_the_same_episodes(tmp_path, capsys):
    results, rows = run(tmp_path, "brightness", "brightness")
    assert [k for k in results if "reward_audit" in results[k]] == list(results)  # start, iter_1, ..., final
    for res in results.values():
        audit = res["reward_audit"]
        # episode_end scoring: one score per held-out episode, its label that episode's success
        assert audit["n"] == res["episodes"] == 16
        assert audit["success_share"] == res["success_rate"]
        assert audit["reward"] == "brightness" and audit["heldout"] == "brightness" and audit["gap"] == 0.0
        assert audit["corr_heldout"] == pytest.approx(1.0)
    assert 0 < results["start"]["success_rate"] < 1  # both classes present: the labels are a real check
    logged = [r for r in rows if "eval/reward_audit/mean" in r]
    assert len(logged) == len(results) and all("eval/reward_audit/success_share" in r for r in logged)
    assert "reward hacking" not in capsys.readouterr().out  # the same reward on both sides: no warning


def test_a_reward_rising_while_the_heldout_one_falls_warns_once_in_one_line(tmp_path, capsys):
    results, _ = run(tmp_path, "rising", "falling")
    means = [r["reward_audit"]["mean"] for r in results.values()]
    held = [r["reward_audit"]["heldout_mean"] for r in results.values()]
    assert means == sorted(means) and held == sorted(held, reverse=True)  # they part at every evaluation
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "reward hacking" in ln]
    assert len(lines) == 1 and "'rising' rose" in lines[0] and "held-out 'falling' fell" in lines[0]
    assert "at final" in lines[0]  # start -> iter_1 -> final (iteration 2): two partings, patience 2


def test_the_audit_can_be_switched_off(tmp_path):
    results, rows = run(tmp_path, "brightness", None, "reward.audit.enabled=false")
    assert not any("reward_audit" in r for r in results.values())
    assert not any(k.startswith("eval/reward_audit") for r in rows for k in r)


def test_mmrl_eval_reports_the_audit_the_run_saw(tmp_path, capsys):
    # `mmrl eval` of the final checkpoint draws what the run's final evaluation drew: the same audit
    from mmrl.cli import main

    results, _ = run(tmp_path, "brightness", "brightness")
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["reward_audit"] == pytest.approx(results["final"]["reward_audit"])
    assert "reward 'brightness' mean" in out and "AUC" in out and "held-out 'brightness'" in out
