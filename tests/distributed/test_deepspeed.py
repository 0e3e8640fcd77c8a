"""DeepSpeed ZeRO-3 (``trainer.engine.backend: deepspeed``) on 2 CPU ranks with gloo (issue 29): the
same update as one process, and a checkpoint that holds the whole model (gathered to rank 0) and
each rank's optimizer partition in its own file, which every rank writes before rank 0 completes
the checkpoint: a rank killed halfway through its file leaves the previous checkpoint the newest
complete one, one rank is refused the two partitions in one line, and the same command resumes on
2 ranks bit-identically."""

from __future__ import annotations

import subprocess

import pytest

from mmrl.trainer import checkpoint
from tests.distributed.launch import (
    ROOT,
    assert_trains_like_one_process,
    env,
    max_diff,
    run,
    train_cmd,
    two_ranks,
    weights,
)

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed")  # the `deepspeed` extra

ZERO3 = ["trainer.engine.backend=deepspeed", "trainer.engine.zero_stage=3"]


@pytest.fixture(scope="module")
def zero3(runs, tmp_path_factory):
    return two_ranks(tmp_path_factory.mktemp("zero3"), ZERO3)


def test_zero3_on_two_ranks_trains_what_one_process_trains(runs, zero3):
    assert_trains_like_one_process(runs, zero3, "ZeRO-3")
    files = {p.name for p in (zero3 / "two" / "checkpoints" / "iter_000003").iterdir()}
    assert {"optimizer.rank00000.pt", "optimizer.rank00001.pt"} <= files


def test_a_rank_killed_writing_its_partition_leaves_the_previous_checkpoint(zero3, tmp_path):
    cmd = train_cmd(tmp_path, "killed", 2, 4, extra=ZERO3)
    # rank 1, halfway through its file of iter_000002 (the 4th save: iter_000000 is saved twice)
    faulty = {**env(), "MMRL_FAULT": "ckpt.mid_shard:4@1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=faulty, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, "the run went on after a rank was killed"
    ckpts = tmp_path / "killed" / "checkpoints"
    assert checkpoint.verify(ckpts / "iter_000002") is not None, "iter_000002 is complete without rank 1's file"
    assert checkpoint.latest_path(tmp_path / "killed") == ckpts / "iter_000001"

    one = train_cmd(tmp_path, "killed", 1, 8, extra=[*ZERO3, "trainer.accept_config_change=true"])
    refused = subprocess.run(one, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and "optimizer partitions of 2 rank(s), and this run has 1" in last, last

    resumed = run(cmd)
    assert "resumed from checkpoint iter_000001" in resumed.stdout + resumed.stderr
    assert max_diff(weights(tmp_path, "killed"), weights(zero3, "two")) == 0.0
