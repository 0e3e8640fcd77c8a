"""``warm_start.candidates``: several initialisations, each on its own batches and noise, the lowest loss
kept (issue 33: where the quickstart's warm start succeeds depends on its initial weights). The
kept candidate goes on exactly where it stood: picking the run's own weights gives the weights of
a run without candidates, bit for bit, and a kill during the candidates resumes to the same end."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from mmrl.config import ConfigError
from mmrl.errors import UserError
from mmrl.experiment import build_trainer
from mmrl.trainer import warm_start as warm_start_module
from mmrl.trainer.trainer import Trainer
from mmrl.trainer.warm_start import WarmStart, candidate_score
from tests.trainer.test_checkpoint_safety import same
from tests.trainer.test_trainer import params, tiny_cfg

WARM = ["warm_start.steps=9", "trainer.video_episodes=0", "trainer.iterations=0"]


def candidates(k: int, steps: int = 6) -> list[str]:
    return [f"warm_start.candidates={k}", f"warm_start.candidate_steps={steps}"]


def warm(tmp_path, *extra) -> Trainer:
    trainer = build_trainer(tiny_cfg(tmp_path, *WARM, *extra))
    trainer.run()
    return trainer


def forced(monkeypatch, scores: list[float]) -> None:
    """Make candidate k score ``scores[k]``, whatever its losses."""
    calls = iter(scores)
    monkeypatch.setattr(warm_start_module, "candidate_score", lambda losses: next(calls))


def test_the_score_is_the_mean_of_the_last_third_of_the_losses():
    assert candidate_score([9.0, 8.0, 7.0, 1.0, 2.0, 3.0]) == 2.5
    assert candidate_score([9.0, 8.0, 7.0, 6.0, 1.0, 2.0, 3.0]) == 2.5
    assert candidate_score([4.0]) == 4.0


def test_the_candidate_with_the_lowest_loss_is_kept(tmp_path):
    trainer = warm(tmp_path, *candidates(3))
    scores = trainer.state.warm_start_scores
    assert len(scores) == 3 and len(set(scores)) == 3  # three different initialisations
    assert trainer.state.warm_start_candidate == min(range(3), key=scores.__getitem__)
    logged = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    pick = [r for r in logged if "warm_start/candidate" in r]
    assert len(pick) == 1 and pick[0]["warm_start/candidate"] == trainer.state.warm_start_candidate
    assert {r["phase"] for r in logged if r["step"] < 0} == {
        "warm_start",
        "warm_start_candidate_0",
        "warm_start_candidate_1",
        "warm_start_candidate_2",
    }
    saved = torch.load(tmp_path / "t" / "checkpoints" / "iter_000000" / "state.pt", weights_only=False)
    assert saved["state"]["warm_start_scores"] == scores  # the choice is in the checkpoint


def test_keeping_the_run_s_own_weights_equals_a_run_without_candidates(tmp_path, monkeypatch):
    alone = params(warm(tmp_path / "alone", "warm_start.candidates=1").policy)
    forced(monkeypatch, [0.1, 0.5, 0.3])
    first = warm(tmp_path / "first", *candidates(3))
    assert first.state.warm_start_candidate == 0
    assert same(params(first.policy), alone)  # its weights, optimizer, batches and noise went on


def test_a_kept_candidate_goes_on_whatever_was_trained_after_it(tmp_path, monkeypatch):
    alone = params(warm(tmp_path / "alone", "warm_start.candidates=1").policy)
    forced(monkeypatch, [0.5, 0.1])
    two = warm(tmp_path / "two", *candidates(2))
    forced(monkeypatch, [0.5, 0.1, 0.3])
    three = warm(tmp_path / "three", *candidates(3))
    assert two.state.warm_start_candidate == three.state.warm_start_candidate == 1
    assert same(params(two.policy), params(three.policy))
    assert not same(params(two.policy), alone)


def test_each_candidate_draws_its_own_batches(tmp_path, monkeypatch):
    """The candidates share no path (batches, noise); candidate 0 keeps the run's own."""
    drawn: list[list[int]] = []
    real = warm_start_module.random_indices

    def recording(n, k, gen):
        idx = real(n, k, gen)
        drawn.append(idx.tolist())
        return idx

    monkeypatch.setattr(warm_start_module, "random_indices", recording)
    warm(tmp_path / "alone", "warm_start.candidates=1", "warm_start.num_episodes=20")
    alone, drawn[:] = drawn[:6], []
    warm(tmp_path / "three", *candidates(3), "warm_start.num_episodes=20")
    firsts = [drawn[0], drawn[6], drawn[12]]  # each candidate's first batch
    assert drawn[:6] == alone  # candidate 0 on the run's own stream
    assert firsts[0] != firsts[1] and firsts[1] != firsts[2] and firsts[0] != firsts[2]


def test_a_kill_during_the_candidates_resumes_to_the_same_weights(tmp_path, monkeypatch):
    extra = [*candidates(3), "trainer.iterations=1"]
    straight = params(warm(tmp_path / "straight", *extra).policy)
    real = WarmStart.supervised_steps

    def dies(self, batch, ws, run, end, phase, phase_offset):
        if phase == "warm_start_candidate_1":
            raise KeyboardInterrupt("killed during the second candidate")
        return real(self, batch, ws, run, end, phase, phase_offset)

    monkeypatch.setattr(WarmStart, "supervised_steps", dies)
    with pytest.raises(KeyboardInterrupt):
        warm(tmp_path / "killed", *extra)
    monkeypatch.setattr(WarmStart, "supervised_steps", real)
    resumed = warm(tmp_path / "killed", *extra)
    assert same(params(resumed.policy), straight)
    rows = (tmp_path / "killed" / "t" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == len(set(rows)), "a metrics row was logged twice"


def test_candidate_steps_default_to_three_eighths_and_must_fit_the_warm_start(tmp_path):
    assert tiny_cfg(tmp_path, "warm_start.steps=800").warm_start.steps_per_candidate() == 300
    assert tiny_cfg(tmp_path, "warm_start.steps=2").warm_start.steps_per_candidate() == 1
    with pytest.raises(ConfigError, match=r"'candidate_steps' = 10: .* 1 <= candidate_steps <= steps"):
        tiny_cfg(tmp_path, *WARM, "warm_start.candidates=3", "warm_start.candidate_steps=10")


def pretrained(trainer: Trainer) -> Trainer:
    """``trainer`` whose policy factory gives the same weights again, as a pretrained checkpoint does."""
    built = copy.deepcopy(trainer.policy)
    trainer.policy_factory = lambda: copy.deepcopy(built)
    return trainer


def test_a_policy_that_builds_the_same_weights_under_every_seed_is_refused(tmp_path):
    trainer = pretrained(build_trainer(tiny_cfg(tmp_path, *WARM, *candidates(3))))
    with pytest.raises(UserError, match="same trainable weights under every seed.*held_in.*warm_start.candidates=1"):
        trainer.run()
    assert not any("candidate" in line for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines())


HELD = "warm_start.held_in=6"


def test_held_in_examples_are_fresh_and_outside_the_training_rows(tmp_path):
    trainer = build_trainer(tiny_cfg(tmp_path, *WARM, HELD))
    ws, stage = trainer.cfg.warm_start, WarmStart(trainer)
    train = stage.load_records(ws.dataset, ws.num_episodes, ws.kwargs)
    held = stage.held_in_records(ws)
    assert len(held["episode_success"]) == 6 and len(train["episode_success"]) == ws.num_episodes == 4
    assert not any(torch.equal(a, b) for a in held["image"] for b in train["image"])  # other scenes
    batch, rows = stage.warm_start_batches(train, ws)
    assert batch.size == len(train["actions"]) and rows is not None and rows.size == len(held["actions"])
    assert torch.equal(batch["actions"], train["actions"].float())
    assert torch.equal(rows["actions"], held["actions"].float())


def test_candidates_are_scored_by_their_held_in_loss(tmp_path, monkeypatch):
    monkeypatch.setattr(warm_start_module, "candidate_score", lambda losses: pytest.fail("scored by the training loss"))
    seen: list[float] = []
    real = WarmStart.held_in_loss

    def recording(self, held, ws):
        seen.append(real(self, held, ws))
        return seen[-1]

    monkeypatch.setattr(WarmStart, "held_in_loss", recording)
    trainer = warm(tmp_path, *candidates(3), HELD)
    scores = trainer.state.warm_start_scores
    assert scores == seen[:3] and len(set(scores)) == 3  # then once more: the final held-in loss
    assert trainer.state.warm_start_candidate == min(range(3), key=scores.__getitem__)
    logged = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    final = [r["warm_start/held_in_loss"] for r in logged if "warm_start/held_in_loss" in r]
    assert final == [seen[3]] and len(seen) == 4


def test_a_pretrained_policy_s_candidates_differ_in_their_batches_when_scored_held_in(tmp_path, capsys):
    trainer = pretrained(build_trainer(tiny_cfg(tmp_path, *WARM, *candidates(3), HELD)))
    start = params(trainer.policy)
    trainer.run()
    scores = trainer.state.warm_start_scores
    assert "warm start: kept candidate" in capsys.readouterr().out  # the same weights, said so
    assert len(set(scores)) == 3  # same start, other batches: other ends
    assert not same(params(trainer.policy), start)


def test_held_in_needs_a_seed_it_can_vary(tmp_path):
    with pytest.raises(ConfigError, match="'held_in' = 6 .* fixes 'seed'"):
        tiny_cfg(tmp_path, *WARM, HELD, "warm_start.kwargs={seed: 3}")
    # warm_start.dataset=null (the trainer's advice to skip the warm start) leaves held_in nothing to do
    assert tiny_cfg(tmp_path, *WARM, HELD, "warm_start.dataset=null").warm_start.held_in == 6


def test_held_in_examples_take_their_own_builder_arguments(tmp_path):
    """``held_in_kwargs`` over ``kwargs``: e.g. the demonstrator RL is to reach, where the trained one is sloppy."""
    same_demonstrator = build_trainer(tiny_cfg(tmp_path / "a", *WARM, HELD))
    faster = build_trainer(tiny_cfg(tmp_path / "b", *WARM, HELD, "warm_start.held_in_kwargs={expert_speed: 1.0}"))
    assert faster.cfg.warm_start.kwargs == same_demonstrator.cfg.warm_start.kwargs  # training rows unchanged
    slow = WarmStart(same_demonstrator).held_in_records(same_demonstrator.cfg.warm_start)["actions"]
    fast = WarmStart(faster).held_in_records(faster.cfg.warm_start)["actions"]
    assert slow.abs().mean() < fast.abs().mean()  # the first actions of a demonstrator at full speed are larger
    with pytest.raises(ConfigError, match="'held_in_kwargs' builds the held-in examples, but held_in = 0"):
        tiny_cfg(tmp_path, *WARM, "warm_start.held_in_kwargs={expert_speed: 1.0}")
    with pytest.raises(ConfigError, match="expert_sped"):
        tiny_cfg(tmp_path, *WARM, HELD, "warm_start.held_in_kwargs={expert_sped: 1.0}")
