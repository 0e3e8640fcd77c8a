"""Training ranks placed by Ray (``placement.backend=ray placement.train_ranks=2``: Ray Train's
`TorchTrainer` starts the ranks and their gloo group, issue 29): they train what ``torchrun``'s 2
ranks train, bit for bit; a rank killed mid-checkpoint ends the run with one line naming it, and the
same command resumes from the newest complete checkpoint."""

from __future__ import annotations

import subprocess

import pytest

from tests.distributed.launch import ROOT, TOL, env, max_diff, run, train_cmd, weights

pytest.importorskip("ray.train", reason="Ray-placed training needs Ray Train: pip install 'mmrl[ray]'")
pytestmark = pytest.mark.slow

RAY = ["placement.backend=ray", "placement.train_ranks=2"]


def test_ray_placed_ranks_train_what_torchrun_trains(runs, tmp_path):
    proc = run(train_cmd(tmp_path, "ray", 1, 4, extra=RAY), timeout=600)  # no launcher: Ray starts the ranks
    assert '"final"' in proc.stdout.splitlines()[-1]  # the driver prints rank 0's results
    assert max_diff(weights(tmp_path, "ray"), weights(runs, "two")) == 0.0


def test_a_dead_ray_rank_is_named_and_the_same_command_resumes(runs, tmp_path):
    cmd = train_cmd(tmp_path, "ray", 1, 4, extra=[*RAY, "trainer.engine.backend=fsdp"])
    # rank 1 killed halfway through its optimizer shards of iter_000002 (the warm start's iter_000000 has none)
    faulty = {**env(), "MMRL_FAULT": "ckpt.mid_shard:2@1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=faulty, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: training on Ray failed: rank 1: ") and "process died" in last, last
    assert "newest complete checkpoint: iter_000001; run the same command to resume" in last, last
    proc = run(cmd, timeout=600)
    assert "resumed from checkpoint iter_000001" in proc.stdout + proc.stderr
    diff = max_diff(weights(tmp_path, "ray"), weights(runs, "one"))
    assert diff < TOL, f"the resumed Ray-placed FSDP2 run ends {diff:.3g} from the one-process run"
