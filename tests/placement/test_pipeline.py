"""collect_pipelined over sim worker processes: same seeds -> same episodes as collect_episodes
(collocated), and a killed sim worker is restarted with its in-progress episodes counted as lost.

One module-scoped pair of workers (two stages of 4 envs; stage 0 alone is a disaggregated sim of 4
envs) serves every test: worker start-up (a spawned process importing torch) is the slow part.
The crash test runs last because it finally exhausts a worker's restarts.
"""

import os
import signal

import pytest
import torch

from mmrl.placement import (
    PlacementConfig,
    WorkerCrashed,
    WorkerError,
    close_workers,
    collect_pipelined,
    registered_sim,
    start_sim_workers,
)
from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy
from mmrl.rollout import collect_episodes
from simulators.reach import ReachSim
from tests.placement.stage_order import StageByStage

N = 8
# a large success radius makes a random policy's episodes end at different decisions
SIM = dict(success_radius=0.7, max_episode_steps=40, min_separation=0.2)
EARLY = list(range(0, N))  # every episode ends by decision 2 (of 10): the pipeline stops early
LONG = list(range(200, 200 + N))  # lengths [10, 10, 1, 10, 10, 3, 10, 1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the main process infers while workers simulate


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return FlowVLAPolicy(FlowVLAConfig(backbone="tiny", chunk_size=4, num_steps=4), action_dim=2, state_dim=2).eval()


@pytest.fixture(scope="module")
def workers():
    two = start_sim_workers(registered_sim("reach", **SIM), N, PlacementConfig(mode="hybrid", stages=2))
    yield {"hybrid": two, "disaggregated": two[:1]}
    close_workers(two)


def reference(policy, seeds, mode, gen_seed=3):
    gen = torch.Generator().manual_seed(gen_seed)
    batch, info = collect_episodes(policy, ReachSim(num_envs=len(seeds), **SIM), seeds, gen, mode)
    return batch, info, gen


def pipelined(policy, workers, seeds, mode, gen_seed=3):
    gen = torch.Generator().manual_seed(gen_seed)
    batch, info = collect_pipelined(policy, workers, seeds, gen, mode)
    return batch, info, gen


def assert_same_episodes(ref, got, cols=slice(None), close=()):
    """Equal valid rows, bit for bit; keys in ``close`` within 1e-6 (a function of the observation
    alone, computed on other groups of rows: matmuls round differently with the batch's rows)."""
    (rb, ri, _), (gb, gi, _) = ref, got
    assert torch.equal(ri["length"][cols], gi["length"][cols])
    assert torch.equal(ri["return"][cols], gi["return"][cols])
    assert torch.equal(ri["success"][cols], gi["success"][cols])
    # the episodes' labels (reach: goal colour, cell, start distance), which the evaluation reports
    assert "breakdown" in ri and gi["breakdown"] == ri["breakdown"]
    valid = rb["valid"][:, cols]
    assert rb.keys() == gb.keys()
    for key in rb:
        a, b = rb[key][:, cols][valid], gb[key][:, cols][valid]
        if key in close:
            torch.testing.assert_close(b, a, atol=1e-6, rtol=0, msg=lambda m, key=key: f"{key}: {m}")
        else:
            assert torch.equal(a, b), key


def assert_stage_one_lost_at_decision_two(ref, got, worker):
    """Stage 1's worker died after answering decision 1 (on LONG seeds) and was restarted once:
    its 3 episodes still running at decision 2 are lost, every other episode is the reference's."""
    batch, info, _ = got
    in_progress = torch.zeros(N, dtype=torch.bool)
    in_progress[4:] = ref[1]["length"][4:] > 2  # stage 1's episodes still running at decision 2
    assert info["worker_restarts"] == 1 and worker.restarts == 1 and worker.is_alive()
    assert info["lost_episodes"] == int(in_progress.sum()) == 3
    assert torch.equal(info["lost"], in_progress)
    assert not batch["valid"][:, in_progress].any()
    assert info["length"][in_progress].eq(0).all()
    assert_same_episodes(ref, got, cols=~in_progress)  # stage 0 and stage 1's finished episode
    assert batch["valid"].shape[0] == ref[0]["valid"].shape[0]


@pytest.mark.parametrize("seeds", [EARLY, LONG], ids=["early_stop", "full_horizon"])
def test_hybrid_s2_equals_collocated_in_eval_mode(policy, workers, seeds):
    ref = reference(policy, seeds, "eval")
    got = pipelined(policy, workers["hybrid"], seeds, "eval")
    assert ref[0]["valid"].shape == got[0]["valid"].shape  # same number of decisions
    assert_same_episodes(ref, got)
    # the generator ends where collocated leaves it (speculative draws are undone)
    assert torch.equal(ref[2].get_state(), got[2].get_state())
    assert got[1]["lost_episodes"] == 0 and got[1]["worker_restarts"] == 0
    if seeds is EARLY:
        assert ref[0]["valid"].shape[0] < 10  # the early-stop path was exercised


def test_disaggregated_equals_collocated_even_in_train_mode(policy, workers):
    # one stage draws the generator exactly like collocated, Flow-SDE noise included
    # (with S = 2, Flow-SDE's several draws per call interleave differently across the stages:
    # equal in distribution only, see mmrl/placement/pipeline.py)
    seeds = LONG[: N // 2]
    ref = reference(policy, seeds, "train")
    got = pipelined(policy, workers["disaggregated"], seeds, "train")
    assert_same_episodes(ref, got)
    assert torch.equal(ref[2].get_state(), got[2].get_state())


@pytest.mark.parametrize("seeds", [EARLY, LONG], ids=["early_stop", "full_horizon"])
def test_hybrid_s2_train_mode_equals_collocated_sampling_stage_by_stage(policy, workers, seeds):
    # Flow-SDE train rollouts: the reference samples the same N(0, 1) draws in the pipeline's order
    # (stage 0 then stage 1 per decision; see stage_order.py), so every valid row must match bit
    # for bit: rewards, actions, chains, old log-probs, values, dones, success.
    ref = reference(StageByStage(policy, 2), seeds, "train")
    got = pipelined(policy, workers["hybrid"], seeds, "train")
    assert ref[0]["valid"].shape == got[0]["valid"].shape
    # (the critic's value at a time-limit cut, where the batch has one, is computed on the cut rows
    # of a stage in the pipeline, of the whole batch here: equal up to rounding)
    assert_same_episodes(ref, got, close=("bootstrap",))
    assert torch.equal(ref[2].get_state(), got[2].get_state())
    # the stage order matters: one full-batch call gives other draws (equal in distribution only)
    plain = reference(policy, seeds, "train")
    assert not torch.equal(plain[0]["old_logp"][:1], got[0]["old_logp"][:1])


def test_simulator_errors_come_back_without_a_restart(workers):
    w = workers["disaggregated"][0]
    with pytest.raises(WorkerError, match="actions must be"):
        w.step_chunk(torch.zeros(3, 1, 2))
    assert w.restarts == 0 and w.is_alive()
    assert w.reset(list(range(w.num_envs))).image.shape == (w.num_envs, 32, 32, 3)


class KillWorker:
    """Wraps a policy; on its ``at``-th call, SIGKILLs ``worker`` once it has answered."""

    def __init__(self, policy, worker, at):
        self.policy, self.worker, self.at, self.calls = policy, worker, at, 0
        self.cfg, self.chunk_size = policy.cfg, policy.chunk_size

    def rollout(self, obs, generator=None, mode="train"):
        self.calls += 1
        if self.calls == self.at:
            assert self.worker.poll(30)  # its answer is in the pipe: the kill is deterministic
            os.kill(self.worker.pid, signal.SIGKILL)
        return self.policy.rollout(obs, generator=generator, mode=mode)


def test_killed_worker_is_restarted_and_lost_episodes_counted(policy, workers):
    stages = workers["hybrid"]
    ref = reference(policy, LONG, "eval")
    # calls: decision 0 -> stage 0, 1; decision 1 -> 3, 4; the 5th call (stage 0, decision 2)
    # kills stage 1's worker after it answered decision 1: decision 2 of stage 1 is lost
    killer = KillWorker(policy, stages[1], at=5)
    got = pipelined(killer, stages, LONG, "eval")
    assert_stage_one_lost_at_decision_two(ref, got, stages[1])

    # the restarted worker collects like before
    assert_same_episodes(ref, pipelined(policy, stages, LONG, "eval"))

    # past max_restarts the collection gives up with a clear error
    stages[1].max_restarts = 1
    with pytest.raises(WorkerCrashed, match="max_restarts=1"):
        pipelined(KillWorker(policy, stages[1], at=5), stages, LONG, "eval")
