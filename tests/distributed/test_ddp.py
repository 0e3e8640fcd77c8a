"""N ranks on this CPU with gloo (issue 29): ``torchrun --nproc_per_node 2 -m mmrl train CONFIG`` with
``sim.num_envs = N`` must train to the parameters of one process with ``2N`` envs, resume a 2-rank
checkpoint on 1 rank and on 2, survive ``kill -9`` of one rank, and rendezvous across two launchers
(``--nnodes 2``) as two machines would.

Why the tolerance: the ranks gather the collected batch, so advantages, whitening and GRPO baselines
are those of the global batch; each rank computes the loss of its half of every minibatch and DDP
averages the two gradients. One process sums the same per-sample terms in another order, so the
parameters differ by float rounding (about 1e-6 after 3 iterations of Adam), not by an algorithm.
A run that trains on its own half only (no gather) differs by 1e-2 or more, as the checks below
measure against the parameter change the run itself makes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed.launch import (
    ROOT,
    TOL,
    assert_trains_like_one_process,
    cut_to,
    env,
    max_diff,
    results,
    run,
    torchrun,
    train_cmd,
    weights,
)

pytestmark = pytest.mark.slow


def test_two_ranks_train_what_one_process_trains(runs):
    assert_trains_like_one_process(runs, runs, "DDP")


def test_two_ranks_evaluate_what_one_process_evaluates(runs):
    """8 held-out episodes, 4 on each rank, gathered: the one-process evaluation with 8 envs."""
    one, two = results(runs, "one"), results(runs, "two")
    assert one["start"] == two["start"]  # the same weights: the same episodes, bit for bit
    for key in ("success_rate", "length", "episodes"):
        assert one["final"][key] == two["final"][key], key
    assert abs(one["final"]["return"] - two["final"]["return"]) < 1e-4


def test_grpo_groups_stay_whole_on_a_rank(tmp_path):
    """Groups of 4 (2 per rank): a group's baseline is its own 4 episodes, wherever they ran."""
    grpo = ["algorithm.group_size=4"]
    run(train_cmd(tmp_path, "one", 1, 16, "quickstart_grpo", grpo))
    run(train_cmd(tmp_path, "two", 2, 8, "quickstart_grpo", grpo))
    moved = max_diff(weights(tmp_path, "one", 3), weights(tmp_path, "one", 2))
    diff = max_diff(weights(tmp_path, "one"), weights(tmp_path, "two"))
    assert diff < TOL, f"GRPO, 2 ranks x 8 envs vs 1 process x 16 envs: max parameter difference {diff:.3g}"
    assert moved > 1000 * diff, f"the runs hardly train (one iteration moves the weights by {moved:.3g})"


def test_two_rank_checkpoint_resumes_on_one_rank_and_on_two(runs, tmp_path):
    for name, ranks, envs in (("on_one", 1, 8), ("on_two", 2, 4)):
        shutil.copytree(runs / "two", tmp_path / name)
        cut_to(tmp_path / name, 1)
        # the global batch stays 8 envs; per-rank sim.num_envs is a config change the resume accepts
        proc = run(train_cmd(tmp_path, name, ranks, envs, extra=["trainer.accept_config_change=true"]))
        assert "resumed from checkpoint iter_000001" in proc.stdout + proc.stderr
    assert max_diff(weights(tmp_path, "on_two"), weights(runs, "two")) == 0.0  # the same ranks: bit-identical
    diff = max_diff(weights(tmp_path, "on_one"), weights(runs, "two"))
    assert diff < TOL, f"a 2-rank checkpoint resumed on 1 rank ends {diff:.3g} away from the 2-rank run"


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    """The pid of the worker with ``RANK=rank`` among the launcher's children."""
    for pid in subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def test_kill_9_of_one_rank_stops_the_job_and_the_same_command_resumes(runs, tmp_path):
    cmd = train_cmd(tmp_path, "killed", 2, 4)
    launcher = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = tmp_path / "killed" / "checkpoints" / "iter_000001"
    deadline = time.time() + 240
    while not first.exists() and launcher.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    pid = _rank_pid(launcher, 1)
    assert pid is not None and launcher.poll() is None, "the run ended before a rank could be killed"
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    output, _ = launcher.communicate(timeout=120)
    took = time.time() - killed_at
    assert launcher.returncode != 0, output[-2000:]
    assert took < 60, f"the job took {took:.0f} s to stop after kill -9 of rank 1"
    # torchrun's report names the rank that failed and how
    assert re.search(r"rank\s*:\s*1\b", output) and "SIGKILL" in output, output[-2000:]
    proc = run(cmd)  # the same command resumes
    assert "resumed from checkpoint" in proc.stdout + proc.stderr
    assert max_diff(weights(tmp_path, "killed"), weights(runs, "two")) == 0.0


def test_two_launchers_rendezvous_as_two_nodes(runs, tmp_path):
    """``torchrun --nnodes 2`` twice on this machine (as two machines would, with HOST:PORT the
    first's address): the run equals the single-launcher 2-rank run, and resumes."""
    from mmrl.distributed import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    _, *args = train_cmd(tmp_path, "nodes", 1, 4)  # -m mmrl train ...: the launcher gets the same
    node = torchrun("--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", *args)

    def both() -> list[str]:
        procs = [
            subprocess.Popen(node, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=300)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
        return outs

    both()
    assert max_diff(weights(tmp_path, "nodes"), weights(runs, "two")) == 0.0
    cut_to(tmp_path / "nodes", 2)
    assert any("resumed from checkpoint iter_000002" in o for o in both())
    assert max_diff(weights(tmp_path, "nodes"), weights(runs, "two")) == 0.0


#: ``accelerate launch`` as its CLI runs it; this machine's torchvision wheel (a CUDA build on CPU
#: torch, docs/getting-started/install.md) breaks the CLI's imports unless mmrl's workaround comes first
ACCELERATE = (
    "import sys; from mmrl.utils.compat import patch_torchvision; patch_torchvision(); "
    "from accelerate.commands.accelerate_cli import main; sys.argv[0] = 'accelerate'; main()"
)


def test_accelerate_launch_runs_the_same_ranks(runs, tmp_path):
    """``accelerate launch --multi_gpu --num_processes 2`` (its torchrun path; on CPU as well) trains
    what ``torchrun`` trains, bit for bit."""
    pytest.importorskip("accelerate")
    _, *args = train_cmd(tmp_path, "accelerate", 1, 4)
    launch = ["launch", "--multi_gpu", "--num_processes=2", "--num_machines=1", "--mixed_precision=no"]
    run([sys.executable, "-c", ACCELERATE, *launch, "--dynamo_backend=no", *args])
    assert max_diff(weights(tmp_path, "accelerate"), weights(runs, "two")) == 0.0
