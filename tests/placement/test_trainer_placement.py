"""The quickstart runs unchanged in every placement mode, changing only the ``placement`` section:
collocated (in-process simulator), disaggregated (one sim worker process) and hybrid pipelined
(S sim workers). Disaggregated trains to exactly the collocated parameters; a sim worker killed
mid-run is restarted and the run finishes with the lost episodes counted and left out."""

import json
import os
import signal

import pytest
import torch

from mmrl.batch import Batch
from mmrl.config import ConfigError
from mmrl.experiment import build_trainer, load_experiment
from mmrl.placement import SimGroup
from tests.placement.stage_order import StageByStage
from tests.trainer.test_trainer import TINY as TRAINER_TINY

# later overrides win; a dense reward pays every decision, so any corrupted reward changes the update
TINY = [
    *TRAINER_TINY,
    "trainer.video_episodes=0",
    "run.threads=1",
    "sim.kwargs={max_episode_steps: 12, dense_reward: true}",
]
MODES = {
    "collocated": [],
    "disaggregated": ["placement.mode=disaggregated"],
    "hybrid_s2": ["placement.mode=hybrid", "placement.stages=2"],
    "hybrid_s4": ["placement.mode=hybrid", "placement.stages=4"],
}


def cfg(tmp_path, *extra):
    return load_experiment("configs/quickstart.yaml", [f"run.output_dir={tmp_path}", "run.name=t", *TINY, *extra])


def params(policy):
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def record_updates(trainer) -> list[Batch]:
    """The batch of every update of ``trainer`` (rewards, advantages, old log-probs, ...), copied."""
    seen, update = [], trainer.learner.update

    def recording(batch, gen):
        seen.append(Batch({k: v.clone() for k, v in batch.items()}))
        return update(batch, gen)

    trainer.learner.update = recording
    return seen


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every mode's run of the same tiny quickstart (parameters, results, logged rows, batches)."""
    out = {}
    for name, extra in MODES.items():
        d = tmp_path_factory.mktemp(name)
        trainer = build_trainer(cfg(d, *extra))
        assert isinstance(trainer.sim, SimGroup) == (name != "collocated")
        batches = record_updates(trainer)
        results = trainer.run()
        rows = [json.loads(x) for x in (d / "t" / "metrics.jsonl").read_text().splitlines()]
        out[name] = dict(
            params=params(trainer.policy),
            results=results,
            trainer=trainer,
            rows=[r for r in rows if "train/success" in r],
            batches=batches,
        )
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


# computed from the critic's values at time-limit cuts (where the batch has them): the pipeline
# evaluates them on a stage's cut rows, collocated on the whole batch's, and matmuls round
# differently with the rows they are given (~1e-7)
ROUNDED = ("bootstrap", "advantages", "returns")


@pytest.mark.parametrize("stages", [2, 4])
def test_hybrid_trains_on_the_batch_of_a_collocated_run_that_samples_stage_by_stage(runs, tmp_path, stages):
    # Flow-SDE train rollouts draw their noise per stage for S > 1, so hybrid and collocated are
    # equal in distribution, not bit for bit. A collocated run whose policy samples stage by stage
    # (the same draws in the pipeline's order, see stage_order.py) must hand its first update the
    # hybrid run's batch, every valid row bit for bit: any corruption of hybrid train-mode batches
    # (rewards, old log-probs, actions or chains of one stage) shows here. (Later iterations are
    # not compared: after an update that saw ROUNDED values the weights differ by rounding.)
    hybrid = runs[f"hybrid_s{stages}"]
    trainer = build_trainer(cfg(tmp_path, "trainer.iterations=1"))
    StageByStage.install(trainer.policy, stages)
    batches = record_updates(trainer)
    results = trainer.run()
    got, want = batches[0], hybrid["batches"][0]
    assert got.keys() == want.keys() and torch.equal(got["valid"], want["valid"])
    valid = want["valid"]
    for key in want:
        if key in ROUNDED:
            torch.testing.assert_close(
                got[key][valid], want[key][valid], atol=1e-6, rtol=0, msg=lambda m, key=key: f"{key}: {m}"
            )
        else:
            assert torch.equal(got[key][valid], want[key][valid]), key
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines() if "train/success" in x]
    for key in ("train/return", "train/success", "train/length", "train/env_steps"):
        assert rows[0][key] == hybrid["rows"][0][key], key
    assert results["start"]["success_rate"] == hybrid["results"]["start"]["success_rate"]  # in-process
    # the stage order matters: the plain collocated run drew other noise (equal in distribution)
    plain = runs["collocated"]["batches"][0]
    assert not torch.equal(plain["old_logp"][0], want["old_logp"][0])  # decision 0: every env


def test_stages_that_do_not_divide_the_envs_fail_at_load(tmp_path):
    with pytest.raises(ConfigError, match="valid stages for 8 envs: 1, 2, 4, 8"):
        cfg(tmp_path, "placement.mode=hybrid", "placement.stages=3")


def test_killed_sim_worker_is_restarted_and_the_run_goes_on(tmp_path):
    trainer = build_trainer(cfg(tmp_path, "placement.mode=hybrid", "placement.stages=2", "trainer.iterations=3"))
    victim = trainer.sim.workers[1]
    rollout, calls = trainer.policy.rollout, []

    def kill_in_iteration_two(obs, **kw):  # stage 1's worker dies with its episodes in flight
        calls.append(trainer.state.iteration)
        if calls.count(1) == 1 and calls[-1] == 1:
            os.kill(victim.pid, signal.SIGKILL)
        return rollout(obs, **kw)

    trainer.policy.rollout = kill_in_iteration_two
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines() if "train/success" in x]
    assert trainer.state.iteration == 3 and victim.restarts == 1
    assert trainer.state.lost_episodes == 4  # stage 1 held 4 envs, all in their first decision
    assert trainer.state.episodes == 3 * 8 - 4  # lost episodes are not counted as trained on
    assert [r["train/lost_episodes"] for r in rows] == [0, 4, 4]
    assert [r["train/worker_restarts"] for r in rows] == [0, 1, 0]


@pytest.mark.timeout(120)  # a broken automatic limit waits forever on the stopped worker: fail instead
def test_stopped_sim_worker_is_killed_by_the_automatic_timeout_and_the_run_goes_on(tmp_path, monkeypatch):
    # placement.step_timeout_s is left null (automatic); the floor is patched from 120 s to 1 s (the
    # tiny simulator's steps take milliseconds, so 20 x the slowest is below it)
    from mmrl.placement import worker as worker_module

    monkeypatch.setattr(worker_module, "AUTO_TIMEOUT_FLOOR_S", 1.0)
    trainer = build_trainer(cfg(tmp_path, "placement.mode=hybrid", "placement.stages=2", "trainer.iterations=3"))
    try:
        victim = trainer.sim.workers[1]
        assert victim.timeout_s is None
        rollout, calls = trainer.policy.rollout, []

        def stop_in_iteration_two(obs, **kw):  # stage 1's worker stops (alive, silent) after its reset
            calls.append(trainer.state.iteration)
            if calls.count(1) == 1 and calls[-1] == 1:
                assert victim.slowest_s["step_chunk"] < 0.05  # iteration 1's steps were measured
                os.kill(victim.pid, signal.SIGSTOP)
            return rollout(obs, **kw)

        trainer.policy.rollout = stop_in_iteration_two
        with pytest.warns(
            RuntimeWarning,
            match=r"restarting sim worker 'sim1' .*silent for 1\.\d s on "
            r"'step_chunk', past its limit of 1 s \(automatic limit",
        ):
            trainer.run()
    finally:
        trainer.sim.close()  # (a stopped worker that was never killed is killed here)
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines() if "train/success" in x]
    assert trainer.state.iteration == 3 and victim.restarts == 1
    assert trainer.state.lost_episodes == 4  # stage 1 held 4 envs, all in their first decision
    assert trainer.state.episodes == 3 * 8 - 4
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
        rows = [
            json.loads(x)
            for x in (tmp_path / name / "t" / "metrics.jsonl").read_text().splitlines()
            if "train/success" in x
        ]
        results.append(params(trainer.policy))
        assert [r["train/staleness"] for r in rows] == [0, 1, 1]
        assert trainer.state.episodes == 24
    for k in results[0]:
        torch.testing.assert_close(results[1][k], results[0][k], atol=0, rtol=0)
    sync = build_trainer(cfg(tmp_path / "sync", "trainer.iterations=3"))
    sync.run()
    assert any(not torch.equal(v, results[0][k]) for k, v in params(sync.policy).items())


def recompute_logp(policy, weights: dict, batch) -> torch.Tensor:
    """Log-probs of ``batch``'s valid decisions (chains, actions) under ``weights``."""
    import copy

    model = copy.deepcopy(policy)
    model.load_state_dict(weights)
    valid = batch["valid"]
    with torch.no_grad():
        return model.evaluate(Batch({k: v[valid] for k, v in batch.items()})).logp


def test_async_batches_hold_the_log_probs_of_the_weights_they_claim(tmp_path, monkeypatch):
    # Every background batch says which weight version collected it (info["policy_version"]);
    # the old log-probs PPO's ratio divides by must be that version's, exactly (up to the sampler
    # vs replay rounding), and not the fresher weights the update starts from. A behaviour copy
    # that stops loading new weights (unbounded staleness) or a wrong version label fails here.
    from mmrl.trainer import trainer as trainer_module

    seen, versions = [], {}

    class Recording(trainer_module.AsyncCollector):
        def result(self, it):
            batch, info = super().result(it)
            seen.append((it, Batch({k: v.clone() for k, v in batch.items()}), info))
            versions[it] = params(self.policy)  # = the weights after `it` updates
            return batch, info

    monkeypatch.setattr(trainer_module, "AsyncCollector", Recording)
    trainer = build_trainer(cfg(tmp_path, "trainer.async_staleness=1", "trainer.iterations=4"))
    trainer.run()
    assert [(it, info["policy_version"]) for it, _, info in seen] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    for it, batch, info in seen:
        claimed = recompute_logp(trainer.policy, versions[info["policy_version"]], batch)
        torch.testing.assert_close(
            claimed,
            batch["old_logp"][batch["valid"]],
            atol=1e-4,
            rtol=0,
            msg=lambda m, it=it, info=info: f"batch {it}, version {info['policy_version']}: {m}",
        )
        for v, weights in versions.items():  # every other version's log-probs are far from them
            if v != info["policy_version"]:
                gap = (recompute_logp(trainer.policy, weights, batch) - batch["old_logp"][batch["valid"]]).abs()
                assert gap.max() > 1e-2, (it, v, gap.max())


def test_async_rollout_in_a_hybrid_placement(tmp_path):
    trainer = build_trainer(
        cfg(
            tmp_path, "trainer.async_staleness=2", "trainer.iterations=3", "placement.mode=hybrid", "placement.stages=2"
        )
    )
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines() if "train/success" in x]
    assert [r["train/staleness"] for r in rows] == [0, 1, 2]
    assert trainer.state.episodes == 24


def test_async_is_refused_by_policies_that_cannot_roll_out_from_a_copy(tmp_path, monkeypatch):
    """A policy that declares no background rollout (`Policy.capabilities`) is refused when the
    config loads, with its own fix, and by the collector itself when built by hand."""
    import dataclasses

    from mmrl.config import ConfigError
    from mmrl.policies.flow_vla import FlowVLAPolicy
    from mmrl.trainer.collectors import AsyncCollector

    trainer = build_trainer(cfg(tmp_path))
    real = FlowVLAPolicy.capabilities
    monkeypatch.setattr(
        FlowVLAPolicy,
        "capabilities",
        classmethod(
            lambda c, conf: dataclasses.replace(
                real.__func__(c, conf), asynchronous=False, fixes={"asynchronous": "a test reason"}
            )
        ),
    )
    with pytest.raises(
        ConfigError,
        match="'trainer.async_staleness' = 1 rolls out with a background copy of the "
        "policy, which policy 'flow_vla' cannot do: a test reason",
    ):
        cfg(tmp_path, "trainer.async_staleness=1")
    with pytest.raises(ValueError, match="not supported by policy 'flow_vla': a test reason"):
        AsyncCollector(trainer.collector, trainer.policy, 1, lambda j: None, trainer.autocast)
    trainer.close()


def test_interrupted_async_run_resumes_with_nothing_repeated_or_lost(tmp_path, killed_in_iteration):
    extra = ["trainer.async_staleness=1", "trainer.iterations=4", "trainer.checkpoint_every=2"]
    with killed_in_iteration(4):
        build_trainer(cfg(tmp_path, *extra)).run()
    resumed = build_trainer(cfg(tmp_path, *extra))
    resumed.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines() if "train/success" in x]
    assert resumed.state.iteration == 4 and resumed.state.episodes == 32
    # batch 2 is re-collected after the resume by the weights of update 2 (fresher), batch 3 is one behind
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["train/staleness"] for r in rows] == [0, 1, 0, 1]
