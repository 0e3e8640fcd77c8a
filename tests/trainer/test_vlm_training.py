"""The VLM quickstart through the one trainer on tiny settings: it trains and logs, a resumed run
continues the question order exactly (nothing repeated or skipped), and DAPO dynamic sampling keeps
only groups whose rewards differ."""

import json

import pytest

pytest.importorskip("transformers")

from mmrl.experiment import build_reward, build_trainer, load_experiment

TINY = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=8",
    "sim.kwargs.dataset_kwargs={num_samples: 64, tasks: [count]}",
    "warm_start.num_episodes=16",
    "warm_start.steps=2",
    "warm_start.batch_size=4",
    "trainer.eval_episodes=8",
    "trainer.checkpoint_every=1",
    "trainer.iterations=2",
]


def cfg(tmp_path, *extra):
    return load_experiment("configs/vlm_quickstart.yaml", [f"run.output_dir={tmp_path}", "run.name=v", *TINY, *extra])


def test_vlm_grpo_trains_and_logs(tmp_path):
    results = build_trainer(cfg(tmp_path, "policy.recompute_logp=true", "algorithm.ratio=sequence")).run()
    assert results["final"]["episodes"] == 8 and results["final"]["iteration"] == 2
    rows = [json.loads(x) for x in (tmp_path / "v" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/policy_loss" in r]
    assert len(train) == 2 and all(r["train/logp_mismatch_max"] < 1e-4 for r in train)


def _record_questions(monkeypatch):
    from mmrl.trainer import collectors

    seen = []
    original = collectors.EpisodeCollector.collect

    def collect(self, policy, round, generator):
        batch, info = original(self, policy, round, generator)
        seen.append(self.sim.question_index(collectors.EpisodeCollector.sim_seeds).tolist())
        return batch, info

    original_seeds = collectors.episode_seeds

    def episode_seeds(base, n, g=1):
        seeds = original_seeds(base, n, g)
        collectors.EpisodeCollector.sim_seeds = seeds
        return seeds

    monkeypatch.setattr(collectors, "episode_seeds", episode_seeds)
    monkeypatch.setattr(collectors.EpisodeCollector, "collect", collect)
    return seen


def test_resume_continues_the_question_order_exactly(tmp_path, monkeypatch):
    seen = _record_questions(monkeypatch)
    build_trainer(cfg(tmp_path / "a", "trainer.iterations=4")).run()
    straight = list(seen)
    seen.clear()
    build_trainer(cfg(tmp_path / "b", "trainer.iterations=2")).run()  # "interrupted" after iteration 2
    build_trainer(cfg(tmp_path / "b", "trainer.iterations=4")).run()  # resumed from its checkpoint
    assert seen == straight and len(straight) == 4
    questions = [q for it in straight for q in it[::4]]  # one question per group of 4
    assert len(questions) == 8 and len(set(questions)) == 8  # within an epoch: none repeated
    assert all(it[i] == it[i - i % 4] for it in straight for i in range(8))  # groups share a question


def test_dynamic_sampling_keeps_groups_whose_rewards_differ(tmp_path):
    # after a short SFT the answers are digits, right for some samples of a group and not others
    t = build_trainer(
        cfg(
            tmp_path,
            "algorithm.dynamic_sampling=true",
            "algorithm.max_sampling_rounds=4",
            "warm_start.steps=40",
            "warm_start.batch_size=16",
            "warm_start.num_episodes=64",
        )
    )
    t.warm_start()
    batch, info = t.collect(0, t.generator("rl", 0))
    groups = batch["group"][0]
    assert info["kept_groups"] == 2 and groups.unique().numel() == 2 and batch["valid"].shape[1] == 8
    for g in groups.unique():
        r = batch["rewards"][0][groups == g]
        assert r.max() > r.min()
    # an untrained model never answers a count right: every group constant, all rounds used
    t = build_trainer(cfg(tmp_path / "c", "algorithm.dynamic_sampling=true", "algorithm.max_sampling_rounds=2"))
    _, info = t.collect(0, t.generator("rl", 0))
    assert info["kept_groups"] == 0 and info["sampling_rounds"] == 2


def test_quickstart_reward_scores_the_gold_answer_of_every_task_and_split(tmp_path):
    # the demo trains and evaluates count and colour questions: its reward must score a bare word ("red")
    # as well as a number, or the colour half of its benchmark could never be answered right
    from mmrl.registry import SIMULATORS

    c = load_experiment(
        "configs/vlm_quickstart.yaml", [f"run.output_dir={tmp_path}", "sim.kwargs.dataset_kwargs.num_samples=60"]
    )
    tasks = set(c.sim.kwargs["dataset_kwargs"]["tasks"])
    assert tasks == {"count", "color"} and set(c.warm_start.kwargs["tasks"]) == tasks
    reward = build_reward(c)
    for split in ("train", "val", "eval"):
        sim = SIMULATORS.build(c.sim.type, num_envs=4, **{**c.sim.kwargs, "split": split})
        assert {m["task"] for m in sim.meta} == tasks
        assert reward.model(sim.solutions, sim.prompts, sim.meta).tolist() == [1.0] * 60, split


def test_a_tool_run_logs_its_tool_counters_per_episode(tmp_path):
    """The tool simulator's episode counters reach the training log (``train/tool_calls``, ...); the
    config's warm start (SFT on zoom_vqa's two-turn demonstrations) runs through the trainer."""
    over = [f"run.output_dir={tmp_path}", "run.name=t", "trainer.iterations=1", "trainer.eval_episodes=8"]
    over += ["warm_start.num_episodes=4", "warm_start.steps=2", "warm_start.warmup_steps=0", "warm_start.batch_size=8"]
    over += ["sim.num_envs=8", "sim.eval_num_envs=8", "algorithm.group_size=4", "algorithm.minibatch_size=8"]
    build_trainer(load_experiment("configs/vlm_zoom_tools.yaml", over)).run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    assert any("warm_start/loss" in r for r in rows)
    train = [r for r in rows if "train/policy_loss" in r]
    assert train and all(f"train/{k}" in train[0] for k in ("tool_calls", "tool_errors", "env_errors", "capped"))
