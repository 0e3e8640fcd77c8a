"""The quickstart runs unchanged in every placement mode, changing only the ``placement`` section:
collocated (in-process simulator), disaggregated (one sim worker process) and hybrid pipelined
(S sim workers). Disaggregated trains to exactly the collocated parameters; a sim worker killed
mid-run is restarted and the run finishes with the lost episodes counted and left out."""

import json
import os
import signal

import pytest
import torch

from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.placement import SimGroup
from tests.trainer.test_trainer import TINY as TRAINER_TINY

TINY = [*TRAINER_TINY, "trainer.video_episodes=0", "run.threads=1"]  # later overrides win
MODES = {
    "collocated": [],
    "disaggregated": ["placement.mode=disaggregated"],
    "hybrid_s2": ["placement.mode=hybrid", "placement.stages=2"],
    "hybrid_s4": ["placement.mode=hybrid", "placement.stages=4"],
}


def cfg(tmp_path, *extra):
    return load_experiment("configs/quickstart.yaml",
                           [f"run.output_dir={tmp_path}", "run.name=t", *TINY, *extra])


def params(policy):
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every mode's run of the same tiny quickstart (parameters, results, logged rows)."""
    out = {}
    for name, extra in MODES.items():
        d = tmp_path_factory.mktemp(name)
        trainer = build_trainer(cfg(d, *extra))
        assert isinstance(trainer.sim, SimGroup) == (name != "collocated")
        results = trainer.run()
        rows = [json.loads(x) for x in (d / "t" / "metrics.jsonl").read_text().splitlines()]
        out[name] = dict(params=params(trainer.policy), results=results, trainer=trainer,
                         rows=[r for r in rows if "train/success" in r])
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_quickstart_runs_in_every_mode(runs, mode):
    run = runs[mode]
    assert set(run["results"]) == {"start", "final"}
    assert run["trainer"].state.iteration == 2 and run["trainer"].state.episodes == 16
    assert [r["step"] for r in run["rows"]] == [1, 2]
    if mode != "collocated":  # pipeline timings and worker health are logged
        assert all(r["train/policy_s"] > 0 and r["train/lost_episodes"] == 0 for r in run["rows"])
        assert not any(w.is_alive() for w in run["trainer"].sim.workers)  # closed at the end


def test_disaggregated_trains_to_the_collocated_parameters(runs):
    a, b = runs["collocated"]["params"], runs["disaggregated"]["params"]
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0, msg=f"parameter {k} differs")


def test_hybrid_collects_the_same_episodes_as_collocated_in_expectation(runs):
    # Flow-SDE train rollouts draw their noise per stage for S > 1: equal in distribution only.
    # Same environments, same number of decisions and updates; the parameters moved.
    for mode in ("hybrid_s2", "hybrid_s4"):
        start = runs[mode]["results"]["start"]["success_rate"]
        assert start == runs["collocated"]["results"]["start"]["success_rate"]  # eval is in-process
        moved = [k for k, v in runs[mode]["params"].items()
                 if not torch.equal(v, runs["collocated"]["params"][k])]
        assert moved  # a different noise draw gives a different (not a missing) update


def test_stages_that_do_not_divide_the_envs_fail_at_load(tmp_path):
    with pytest.raises(ConfigError, match="valid stages for 8 envs: 1, 2, 4, 8"):
        cfg(tmp_path, "placement.mode=hybrid", "placement.stages=3")


def test_killed_sim_worker_is_restarted_and_the_run_goes_on(tmp_path):
    trainer = build_trainer(cfg(tmp_path, "placement.mode=hybrid", "placement.stages=2",
                                "trainer.iterations=3"))
    victim = trainer.sim.workers[1]
    rollout, calls = trainer.policy.rollout, []

    def kill_in_iteration_two(obs, **kw):  # stage 1's worker dies with its episodes in flight
        calls.append(trainer.state.iteration)
        if calls.count(1) == 1 and calls[-1] == 1:
            os.kill(victim.pid, signal.SIGKILL)
        return rollout(obs, **kw)

    trainer.policy.rollout = kill_in_iteration_two
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()
            if "train/success" in x]
    assert trainer.state.iteration == 3 and victim.restarts == 1
    assert trainer.state.lost_episodes == 4  # stage 1 held 4 envs, all in their first decision
    assert trainer.state.episodes == 3 * 8 - 4  # lost episodes are not counted as trained on
    assert [r["train/lost_episodes"] for r in rows] == [0, 4, 4]
    assert [r["train/worker_restarts"] for r in rows] == [0, 1, 0]


def test_async_rollout_is_off_policy_by_exactly_the_bound(tmp_path):
    # N = 1: batch k is collected (in the background, during update k-1) by the weights of update
    # k-1; batch 0 by the initial weights. Two runs give the same parameters: the batch -> weights
    # mapping does not depend on timing.
    results = []
    for name in ("a", "b"):
        trainer = build_trainer(cfg(tmp_path / name, "trainer.async_staleness=1", "trainer.iterations=3"))
        trainer.run()
        rows = [json.loads(x) for x in (tmp_path / name / "t" / "metrics.jsonl").read_text().splitlines()
                if "train/success" in x]
        results.append(params(trainer.policy))
        assert [r["train/staleness"] for r in rows] == [0, 1, 1]
        assert trainer.state.episodes == 24
    for k in results[0]:
        torch.testing.assert_close(results[1][k], results[0][k], atol=0, rtol=0)
    sync = build_trainer(cfg(tmp_path / "sync", "trainer.iterations=3"))
    sync.run()
    assert any(not torch.equal(v, results[0][k]) for k, v in params(sync.policy).items())


def test_async_rollout_in_a_hybrid_placement(tmp_path):
    trainer = build_trainer(cfg(tmp_path, "trainer.async_staleness=2", "trainer.iterations=3",
                                "placement.mode=hybrid", "placement.stages=2"))
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()
            if "train/success" in x]
    assert [r["train/staleness"] for r in rows] == [0, 1, 2]
    assert trainer.state.episodes == 24


def test_async_is_refused_by_policies_that_cannot_roll_out_from_a_copy(tmp_path, monkeypatch):
    from mmrl.trainer.trainer import AsyncCollector

    trainer = build_trainer(cfg(tmp_path))
    monkeypatch.setattr(type(trainer.policy), "async_unsupported", "a test reason")
    with pytest.raises(ValueError, match="a test reason. Set trainer.async_staleness=0"):
        AsyncCollector(trainer, 1)


def test_interrupted_async_run_resumes_with_nothing_repeated_or_lost(tmp_path, killed_in_iteration):
    extra = ["trainer.async_staleness=1", "trainer.iterations=4", "trainer.checkpoint_every=2"]
    with killed_in_iteration(4):
        build_trainer(cfg(tmp_path, *extra)).run()
    resumed = build_trainer(cfg(tmp_path, *extra))
    resumed.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()
            if "train/success" in x]
    assert resumed.state.iteration == 4 and resumed.state.episodes == 32
    # batch 2 is re-collected after the resume by the weights of update 2 (fresher), batch 3 is one behind
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["train/staleness"] for r in rows] == [0, 1, 0, 1]
