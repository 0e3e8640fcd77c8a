"""The ranks of one job agree, and a checkpoint resumes at another size only when asked.

Before the fixes: two ranks started with another ``run.seed`` (or ``sim.num_envs``) trained to exit
status 0, another ``trainer.iterations`` paired the ranks' collectives wrongly (rank 0 died with
``KeyError: 0``), and a 2-rank checkpoint resumed by one process silently halved the global batch.
Now every rank's config is compared with rank 0's before any work (one line naming the keys), and
the checkpoint records the number of ranks that trained it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mmrl.distributed import free_port
from mmrl.trainer.run_folder import GLOBAL_BATCH, global_batch_changes, rank_config_differences
from tests.distributed.launch import ROOT, SHORT, cut_to, run, train_cmd

pytestmark = pytest.mark.slow


def two_processes(tmp_path, per_rank: list[list[str]], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Two ranks started by hand (as two launchers or a cluster's scheduler would), rank r with the
    overrides ``per_rank[r]``; both waited for."""
    port = str(free_port())
    procs = []
    for rank, extra in enumerate(per_rank):
        cmd = [sys.executable, "-m", "mmrl", "train", str(ROOT / "configs" / "quickstart.yaml"), *SHORT]
        cmd += ["trainer.iterations=1", "sim.num_envs=4", "sim.eval_num_envs=4", f"run.output_dir={tmp_path}"]
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        procs.append(subprocess.Popen(cmd + extra, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout.decode(), stderr.decode()))
    return out


@pytest.mark.parametrize("key,values", [("run.seed", (0, 1)), ("trainer.iterations", (1, 2))])
def test_ranks_with_different_configs_stop_before_any_work(tmp_path, key, values):
    results = two_processes(tmp_path, [[f"{key}={v}"] for v in values])
    for res in results:
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
        assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert len(lines) == 1 and "different configs" in lines[0] and key in lines[0], res.stderr[-3000:]
        assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert not list(tmp_path.rglob("state.pt"))  # nothing trained


def test_rank_config_differences_names_each_key():
    a = {"run": {"seed": 0}, "sim": {"num_envs": 4}, "policy": {"dim": 64}}
    b = {"run": {"seed": 0}, "sim": {"num_envs": 8}, "policy": {"dim": 32}}
    assert rank_config_differences([a, a]) == []
    assert rank_config_differences([a, b]) == [(1, "policy.dim", 64, 32), (1, "sim.num_envs", 4, 8)]
    assert rank_config_differences([a, {**a, "sim": {"num_envs": 4.0}}]) == []  # 4 and 4.0 are one value


def test_global_batch_changes():
    saved, same = {"sim": {"num_envs": 4}}, [("sim.num_envs", 4, 8)]
    assert global_batch_changes(saved, 2, {"sim": {"num_envs": 8}}, 1, same) == []  # 2 x 4 = 1 x 8
    halved = global_batch_changes(saved, 2, {"sim": {"num_envs": 4}}, 1, [])
    assert halved == [(GLOBAL_BATCH, "2 x 4 = 8", "1 x 4 = 4")]
    assert global_batch_changes(saved, 1, {"sim": {"num_envs": 8}}, 1, same) == same  # one rank: as configured


def test_two_rank_checkpoint_resumed_by_one_process_at_half_the_batch_is_refused(tmp_path):
    run(train_cmd(tmp_path, "two", 2, 4, extra=["trainer.iterations=2"]))
    marker = json.loads((tmp_path / "two" / "checkpoints" / "iter_000002" / "COMPLETE").read_text())
    assert marker["world_size"] == 2
    cut_to(tmp_path / "two", 1)
    cmd = train_cmd(tmp_path, "two", 1, 4, extra=["trainer.iterations=2"])  # 1 x 4: half of 2 x 4
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert GLOBAL_BATCH in errors[0] and "2 x 4 = 8" in errors[0] and "accept_config_change" in errors[0]
    assert "Traceback" not in res.stderr
    asked = run(train_cmd(tmp_path, "two", 1, 4, extra=["trainer.iterations=2", "trainer.accept_config_change=true"]))
    said = asked.stdout + asked.stderr
    assert "resumed from checkpoint iter_000001" in said and GLOBAL_BATCH in said
    history = (tmp_path / "two" / "config_history.jsonl").read_text()
    assert GLOBAL_BATCH in history
