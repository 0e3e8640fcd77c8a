"""Waits for an external service end with one line naming the address and the fix.

Before the fix, ``RAY_ADDRESS=127.0.0.1:PORT mmrl train ... placement.backend=ray`` with no cluster
there printed Ray's "GCS TimedOut" every 30 s without end and no line of mmrl's. (The HTTP reward
client's limits are tested in tests/rewards/test_http.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mmrl.distributed import free_port
from mmrl.errors import UserError
from mmrl.placement.ray_worker import check_reachable, ray_endpoint
from tests.distributed.launch import ROOT

pytest.importorskip("ray")


def test_ray_endpoints():
    assert ray_endpoint(None) is None and ray_endpoint("auto") is None and ray_endpoint("local") is None
    assert ray_endpoint("10.0.0.2:6379") == ("10.0.0.2", 6379)
    assert ray_endpoint("ray://head:10001") == ("head", 10001)
    with pytest.raises(UserError, match="not HOST:PORT"):
        ray_endpoint("head-node")


def test_unreachable_address_is_one_line():
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(UserError, match=f"no Ray cluster answers at RAY_ADDRESS={address}.*ray start --head"):
        check_reachable(address, timeout_s=2)


@pytest.mark.slow
@pytest.mark.parametrize("placement", [["placement.train_ranks=2"], ["placement.mode=disaggregated"]])
def test_train_on_ray_without_a_cluster_says_so_at_once(tmp_path, placement):
    address = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "mmrl", "train", str(ROOT / "configs" / "quickstart.yaml"), "placement.backend=ray"]
    cmd += [*placement, f"run.output_dir={tmp_path}", "trainer.iterations=1", "warm_start.steps=5"]
    env = {**os.environ, "RAY_ADDRESS": address}
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mmrl train waited over 120 s for a Ray cluster at {address} that does not exist")
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode != 0 and len(errors) == 1 and address in errors[0], res.stderr[-3000:]
    assert "Traceback" not in res.stderr
