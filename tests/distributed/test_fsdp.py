"""FSDP2 (``trainer.engine.backend: fsdp``, `torch.distributed.fsdp.fully_shard` per transformer
layer of the flow VLA) on 2 CPU ranks with gloo (issue 29): the same update as one process, and a
2-rank checkpoint (the whole model gathered to rank 0, the optimizer state as each rank's shards in
`torch.distributed.checkpoint` files) that resumes on 2 ranks bit-identically, and on 1 rank, FSDP2
or the plain torch engine, within float rounding."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

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


def test_fsdp_checkpoint_holds_each_ranks_optimizer_shards(fsdp):
    folder = fsdp / "two" / "checkpoints" / "iter_000001"
    listed = json.loads((folder / "COMPLETE").read_text())["files"]
    assert {"optimizer/.metadata", "optimizer/__0_0.distcp", "optimizer/__1_0.distcp"} <= set(listed)
    state = torch.load(folder / "state.pt", map_location="cpu", weights_only=False)
    assert state["optimizer"] == {"sharded_optimizer": "optimizer"}  # no Adam state gathered to rank 0


def test_fsdp_checkpoint_resumes_on_two_ranks_and_on_one(fsdp, tmp_path):
    torch_engine = ["trainer.engine.backend=torch"]
    for name, ranks, envs, engine in (("on_two", 2, 4, FSDP), ("on_one", 1, 8, FSDP), ("torch", 1, 8, torch_engine)):
        shutil.copytree(fsdp / "two", tmp_path / name)
        cut_to(tmp_path / name, 1)
        extra = [*engine, "trainer.accept_config_change=true"]  # sim.num_envs per rank changes with the ranks
        proc = run(train_cmd(tmp_path, name, ranks, envs, extra=extra))
        assert "resumed from checkpoint iter_000001" in proc.stdout + proc.stderr
    assert max_diff(weights(tmp_path, "on_two"), weights(fsdp, "two")) == 0.0
    for name in ("on_one", "torch"):
        diff = max_diff(weights(tmp_path, name), weights(fsdp, "two"))
        assert diff < TOL, f"a 2-rank FSDP2 checkpoint resumed on 1 rank ({name}) ends {diff:.3g} from the 2-rank run"
