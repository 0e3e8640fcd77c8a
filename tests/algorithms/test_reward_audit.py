"""The reward audit's math (mmrl.algorithms.reward_audit): correlation and AUC against success
checked against their definitions, labels kept aligned with their scores, and the hacking watch
warning exactly when the trained reward rises while the held-out measure falls."""

import itertools
import math

import pytest
import torch

from mmrl.algorithms.reward_audit import HackingWatch, auc, audit_logs, audit_scores, pearson


def brute_auc(score, label):
    """P(score of a positive > score of a negative), ties one half, over every pair."""
    pos = [s for s, y in zip(score, label) if y]
    neg = [s for s, y in zip(score, label) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_and_pearson_match_their_definitions():
    g = torch.Generator().manual_seed(0)
    score = torch.randint(0, 5, (40,), generator=g).float()  # many ties
    label = torch.rand(40, generator=g) < 0.4
    assert auc(score, label) == pytest.approx(brute_auc(score.tolist(), label.tolist()))
    x, y = torch.randn(50, generator=g), torch.randn(50, generator=g)
    expected = float(torch.corrcoef(torch.stack([x, y]).double())[0, 1])
    assert pearson(x, y) == pytest.approx(expected, abs=1e-9)
    assert pearson(torch.ones(5), y[:5]) == 0.0  # a constant reward says nothing
    assert math.isnan(auc(score, torch.zeros(40, dtype=torch.bool)))  # one class: no AUC


def test_a_faithful_reward_audits_as_one_and_an_inverted_one_as_zero():
    success = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0], dtype=torch.bool)
    faithful = audit_scores(success.float() + 0.1, success)
    assert faithful["auc_success"] == 1.0 and faithful["corr_success"] == pytest.approx(1.0)
    assert faithful["mean_success"] == pytest.approx(1.1) and faithful["mean_failure"] == pytest.approx(0.1)
    inverted = audit_scores(-success.float(), success)
    assert inverted["auc_success"] == 0.0 and inverted["corr_success"] == pytest.approx(-1.0)


def test_nonfinite_scores_leave_with_their_own_labels():
    # a NaN score drops its sample and its label together: the rest stays perfectly aligned
    score = torch.tensor([1.0, float("nan"), 0.0, 1.0, float("inf"), 0.0])
    success = torch.tensor([1, 0, 0, 1, 0, 0], dtype=torch.bool)
    task = torch.tensor([2.0, 9.0, 0.0, 2.0, 9.0, 0.0])
    out = audit_scores(score, success, task=task, heldout=score * 0.5)
    assert out["n"] == 4 and out["nonfinite"] == 2
    assert out["auc_success"] == 1.0 and out["corr_task"] == pytest.approx(1.0)
    assert out["heldout_mean"] == pytest.approx(0.25) and out["gap"] == pytest.approx(0.25)
    # standard errors of the kept scores [1, 0, 1, 0] and held-out [0.5, 0, 0.5, 0]: std / sqrt(4)
    assert out["sem"] == pytest.approx(math.sqrt(1 / 3) / 2) and out["heldout_sem"] == pytest.approx(
        math.sqrt(1 / 12) / 2
    )
    logs = audit_logs("eval/reward_audit", out)
    assert logs["eval/reward_audit/auc_success"] == 1.0 and all(math.isfinite(v) for v in logs.values())


def test_the_watch_warns_when_the_trained_reward_rises_and_the_heldout_falls():
    watch = HackingWatch("rising", "success", patience=3)
    lines = [watch.update(t, h, where=f"iter_{i}") for i, (t, h) in enumerate([(0.1, 0.5), (0.2, 0.4), (0.3, 0.3)])]
    assert lines == [None, None, None]  # two partings so far: not yet
    line = watch.update(0.4, 0.2, where="iter_3")
    assert line is not None and "'rising' rose 0.1 -> 0.4" in line and "'success' fell 0.5 -> 0.2" in line
    assert "iter_3" in line and line.count("\n") == 0
    assert watch.update(0.5, 0.1) is None  # the count starts over after a warning


def test_the_watch_stays_quiet_for_a_faithful_reward_and_a_broken_streak():
    faithful = HackingWatch("r", "success", patience=2)
    assert all(faithful.update(0.1 * i, 0.1 * i) is None for i in range(10))  # both rise together
    broken = HackingWatch("r", "success", patience=2)
    seq = [(0.1, 0.5), (0.2, 0.4), (0.3, 0.45), (0.4, 0.4)]  # the held-out measure rose once in between
    assert all(broken.update(t, h) is None for t, h in seq)
    tolerant = HackingWatch("r", "success", patience=1, tolerance=0.05)
    assert tolerant.update(0.1, 0.5) is None and tolerant.update(0.12, 0.49) is None  # within the noise


def test_the_watch_state_round_trips_and_bad_settings_are_named():
    a = HackingWatch("r", "h", patience=2)
    a.update(0.1, 0.5)
    a.update(0.2, 0.4)
    b = HackingWatch("r", "h", patience=2)
    b.load_state_dict(a.state_dict())
    assert a.update(0.3, 0.3) == b.update(0.3, 0.3) is not None
    with pytest.raises(ValueError, match="patience"):
        HackingWatch("r", "h", patience=0)


def _trainer(has_success: bool, patience: int = 2):
    from types import SimpleNamespace

    audit = SimpleNamespace(patience=patience, tolerance=0.0)
    return SimpleNamespace(
        cfg=SimpleNamespace(reward=SimpleNamespace(audit=audit)), eval_sim=SimpleNamespace(has_success=has_success)
    )


def _results(pairs):
    return {
        f"iter_{i}": {"success_rate": h, "reward_audit": {"mean": t, "reward": "r"}} for i, (t, h) in enumerate(pairs)
    }


def test_the_run_warning_is_replayed_from_the_saved_results():
    from mmrl.trainer.audit import hacking_warning

    parting = _results([(0.1, 0.5), (0.2, 0.4), (0.3, 0.3)])
    line = hacking_warning(_trainer(True), parting)
    assert line is not None and "at iter_2" in line and "held-out 'success'" in line
    # the same results, replayed again (a resumed run): the same line; one more evaluation that does
    # not part: none
    assert hacking_warning(_trainer(True), parting) == line
    assert (
        hacking_warning(
            _trainer(True), {**parting, "iter_3": {"success_rate": 0.35, "reward_audit": {"mean": 0.4, "reward": "r"}}}
        )
        is None
    )
    # success that only the trained reward's threshold defines is no held-out measure: no warning
    assert hacking_warning(_trainer(False), parting) is None
