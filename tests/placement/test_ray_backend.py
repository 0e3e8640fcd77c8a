"""The Ray backend: collect_pipelined over RaySimWorker actors collects the same episodes as
collect_episodes in this process; simulator errors come back as WorkerError, a killed actor is
restarted with its in-progress episodes counted as lost, a silent one is killed after timeout_s;
closing the workers removes their placement group.

One module-scoped local Ray cluster (2 CPUs) and one pair of workers (two stages of 4 envs) serve
every test: cluster start-up (~4 s) and actor start-up (a Ray worker importing torch) are the slow
parts. The crash test exhausts a worker's restarts, so it runs after the tests that need both.
"""

import functools
import os
import signal

import pytest
import torch

ray = pytest.importorskip("ray", reason="the Ray backend needs Ray: pip install 'mmrl[ray]'")

from mmrl.placement import (  # noqa: E402
    PlacementConfig,
    RaySimWorker,
    WorkerCrashed,
    WorkerError,
    close_workers,
    registered_sim,
    start_sim_workers,
)
from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy  # noqa: E402
from simulators.loaded import loaded_reach  # noqa: E402
from tests.placement.test_pipeline import (  # noqa: E402  (the local backend's reference helpers)
    EARLY,
    LONG,
    SIM,
    N,
    assert_same_episodes,
    assert_stage_one_lost_at_decision_two,
    pipelined,
    reference,
)


@pytest.fixture(scope="module", autouse=True)
def cluster(one_torch_thread):  # the main process infers while the actors simulate (2 cores)
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return FlowVLAPolicy(FlowVLAConfig(chunk_size=4, num_steps=4), action_dim=2, state_dim=2).eval()


@pytest.fixture(scope="module")
def stages():
    two = start_sim_workers(registered_sim("reach", **SIM), N, PlacementConfig(mode="hybrid", stages=2, backend="ray"))
    yield two
    close_workers(two)


def test_workers_are_ray_actors_in_one_placement_group(stages):
    assert all(isinstance(w, RaySimWorker) and w.is_alive() for w in stages)
    assert [w.num_envs for w in stages] == [4, 4] and stages[0].image_shape == (32, 32, 3)
    assert len({w.pid for w in stages} | {os.getpid()}) == 3  # each simulator in its own process
    table = ray.util.placement_group_table(stages[0].group.pg)
    assert table["strategy"] == "PACK" and table["state"] == "CREATED"
    assert table["bundles"] == {0: {"CPU": 0.01}, 1: {"CPU": 0.01}}
    assert [w.bundle for w in stages] == [0, 1]


@pytest.mark.parametrize("seeds", [EARLY, LONG], ids=["early_stop", "full_horizon"])
def test_hybrid_s2_on_ray_equals_collocated_in_eval_mode(policy, stages, seeds):
    ref = reference(policy, seeds, "eval")
    got = pipelined(policy, stages, seeds, "eval")
    assert ref[0]["valid"].shape == got[0]["valid"].shape  # same number of decisions
    assert_same_episodes(ref, got)  # actions, rewards, dones, success... on every valid row
    assert torch.equal(ref[2].get_state(), got[2].get_state())
    assert got[1]["lost_episodes"] == 0 and got[1]["worker_restarts"] == 0
    assert got[1]["sim_s"] > 0  # the actors report their simulation time (info["worker_s"])


def test_simulator_errors_come_back_without_a_restart(stages):
    w = stages[0]
    pid = w.pid
    with pytest.raises(WorkerError, match="actions must be"):
        w.step_chunk(torch.zeros(3, 1, 2))
    assert w.restarts == 0 and w.is_alive() and w.pid == pid
    obs = w.reset(list(range(w.num_envs)))
    assert obs.image.shape == (w.num_envs, 32, 32, 3) and obs.image.device.type == "cpu"
    res = w.step_chunk(torch.zeros(w.num_envs, 4, 2), with_final_obs=False)
    assert res.final_obs is None and res.info["worker_s"] > 0
    # a discarded answer is dropped, even an error: the next result is the next request's
    w.submit("step_chunk", torch.zeros(3, 1, 2), False, False)
    w.discard_pending()
    w.submit("get_state")
    assert isinstance(w.result(), dict)


def test_silent_actor_is_killed_after_timeout_and_restarted():
    slow = functools.partial(loaded_reach, num_envs=2, delay_s=1.0)  # 2 s per 1-step chunk
    with RaySimWorker(slow, name="slow", timeout_s=0.5) as w:  # no placement group: anywhere
        w.reset([0, 1])
        with pytest.raises(
            WorkerCrashed,
            match=r"was killed: silent for 0\.\d s on 'step_chunk', past "
            r"its limit of 0\.5 s \(placement\.step_timeout_s = 0\.5\)",
        ):
            w.step_chunk(torch.zeros(2, 1, 2))
        assert not w.is_alive()
        old = w.pid
        w.restart()
        assert w.restarts == 1 and w.is_alive() and w.pid != old
        assert w.reset([0, 1]).image.shape == (2, 32, 32, 3)
    assert not w.is_alive() and w.pid is None


@pytest.mark.timeout(60)
def test_silent_actor_is_killed_by_the_automatic_limit(monkeypatch):
    # placement.step_timeout_s null: a step never answered yet gets the floor (patched to 0.5 s);
    # the measured resets survive the restart
    from mmrl.placement import worker as worker_module

    monkeypatch.setattr(worker_module, "AUTO_TIMEOUT_FLOOR_S", 0.5)
    slow = functools.partial(loaded_reach, num_envs=2, delay_s=1.0)  # 2 s per 1-step chunk
    with RaySimWorker(slow, name="slow") as w:
        w.reset([0, 1])
        assert set(w.slowest_s) == {"reset"}
        with pytest.raises(
            WorkerCrashed,
            match=r"silent for 0\.\d s on 'step_chunk', past its limit "
            r"of 0\.5 s \(automatic limit: the 0\.5 s floor, no "
            r"'step_chunk' answered yet\); set placement\.step_timeout_s",
        ):
            w.step_chunk(torch.zeros(2, 1, 2))
        measured = dict(w.slowest_s)
        with pytest.warns(RuntimeWarning, match=r"restarting sim worker 'slow' .*silent for"):
            w.restart()
        assert w.restarts == 1 and w.is_alive() and w.slowest_s == measured
        w.reset([0, 1])
        assert w.slowest_s["reset"] >= measured["reset"]


class Kill:
    """Wraps a policy; on its ``at``-th call, ``kill(worker)`` once the worker has answered."""

    def __init__(self, policy, worker, at, kill):
        self.policy, self.worker, self.at, self.kill, self.calls = policy, worker, at, kill, 0
        self.cfg, self.chunk_size = policy.cfg, policy.chunk_size

    def rollout(self, obs, generator=None, mode="train"):
        self.calls += 1
        if self.calls == self.at:
            assert self.worker.poll(30)  # its answer is in: the kill is deterministic
            self.kill(self.worker)
        return self.policy.rollout(obs, generator=generator, mode=mode)


def sigkill(worker):
    os.kill(worker.pid, signal.SIGKILL)


def ray_kill(worker):
    ray.kill(worker.actor)


def test_killed_actor_is_restarted_and_lost_episodes_counted(policy, stages):
    ref = reference(policy, LONG, "eval")
    # calls: decision 0 -> stage 0, 1; decision 1 -> 3, 4; the 5th call (stage 0, decision 2)
    # kills stage 1's actor after it answered decision 1: decision 2 of stage 1 is lost
    old = stages[1].pid
    got = pipelined(Kill(policy, stages[1], 5, sigkill), stages, LONG, "eval")
    assert_stage_one_lost_at_decision_two(ref, got, stages[1])
    assert stages[1].pid != old and stages[1].bundle == 1  # a fresh actor in the same bundle

    # the restarted actor collects like before
    assert_same_episodes(ref, pipelined(policy, stages, LONG, "eval"))

    # an actor killed through Ray counts the same; past max_restarts the collection gives up
    got = pipelined(Kill(policy, stages[1], 5, ray_kill), stages, LONG, "eval")
    assert got[1]["worker_restarts"] == 1 and got[1]["lost_episodes"] == 3
    stages[1].max_restarts = 2
    with pytest.raises(WorkerCrashed, match="max_restarts=2"):
        pipelined(Kill(policy, stages[1], 5, ray_kill), stages, LONG, "eval")
    assert not stages[1].is_alive()


def test_closing_the_workers_removes_the_placement_group(stages):
    pg = stages[0].group.pg
    close_workers(stages)
    assert not any(w.is_alive() for w in stages)
    assert ray.util.placement_group_table(pg)["state"] == "REMOVED"


def test_quickstart_on_a_local_ray_cluster_survives_a_killed_rollout_worker(tmp_path):
    """The tiny quickstart with only ``placement.backend=ray`` changed: two sim actors (hybrid
    S = 2) on this machine's Ray cluster; one is SIGKILLed during iteration 2, restarted, and the
    run finishes with its in-progress episodes counted as lost."""
    import json

    from mmrl.experiment import build_trainer, load_experiment
    from tests.placement.test_trainer_placement import TINY

    cfg = load_experiment(
        "configs/quickstart.yaml",
        [
            f"run.output_dir={tmp_path}",
            "run.name=t",
            *TINY,
            "trainer.iterations=3",
            "placement.mode=hybrid",
            "placement.stages=2",
            "placement.backend=ray",
        ],
    )
    trainer = build_trainer(cfg)
    assert all(isinstance(w, RaySimWorker) for w in trainer.sim.workers)
    victim, rollout, calls = trainer.sim.workers[0], trainer.policy.rollout, []

    def kill_in_iteration_two(obs, **kw):
        calls.append(trainer.state.iteration)
        if calls.count(1) == 2 and calls[-1] == 1:  # stage 0 has sent decision 0: kill it mid-step
            os.kill(victim.pid, signal.SIGKILL)
        return rollout(obs, **kw)

    trainer.policy.rollout = kill_in_iteration_two
    results = trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines() if "train/success" in x]
    assert set(results) == {"start", "final"} and trainer.state.iteration == 3
    assert victim.restarts == 1 and trainer.state.lost_episodes == 4
    assert trainer.state.episodes == 3 * 8 - 4
    assert [r["train/worker_restarts"] for r in rows] == [0, 1, 0]
