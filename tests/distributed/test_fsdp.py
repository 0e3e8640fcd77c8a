"""FSDP2 (``trainer.engine.backend: fsdp``, `torch.distributed.fsdp.fully_shard` per transformer
layer of the flow VLA) on 2 CPU ranks with gloo (issue 29): the same update as one process, and a
2-rank checkpoint (the whole model and optimizer, gathered to rank 0) that resumes on 2 ranks
bit-identically and on 1 rank within float rounding."""

from __future__ import annotations

import shutil

import pytest

from tests.distributed.launch import (
    TOL,
    assert_trains_like_one_process,
    cut_to,
    max_diff,
    run,
    train_cmd,
    two_ranks,
    weights,
)

pytestmark = pytest.mark.slow

FSDP = ["trainer.engine.backend=fsdp"]


@pytest.fixture(scope="module")
def fsdp(runs, tmp_path_factory):
    return two_ranks(tmp_path_factory.mktemp("fsdp"), FSDP)


def test_fsdp_on_two_ranks_trains_what_one_process_trains(runs, fsdp):
    assert_trains_like_one_process(runs, fsdp, "FSDP2")


def test_fsdp_checkpoint_resumes_on_two_ranks_and_on_one(fsdp, tmp_path):
    for name, ranks, envs in (("on_two", 2, 4), ("on_one", 1, 8)):
        shutil.copytree(fsdp / "two", tmp_path / name)
        cut_to(tmp_path / name, 1)
        extra = [*FSDP, "trainer.accept_config_change=true"]  # sim.num_envs per rank changes with the ranks
        proc = run(train_cmd(tmp_path, name, ranks, envs, extra=extra))
        assert "resumed from checkpoint iter_000001" in proc.stdout + proc.stderr
    assert max_diff(weights(tmp_path, "on_two"), weights(fsdp, "two")) == 0.0
    diff = max_diff(weights(tmp_path, "on_one"), weights(fsdp, "two"))
    assert diff < TOL, f"a 2-rank FSDP2 checkpoint resumed on 1 rank ends {diff:.3g} away from the 2-rank run"
