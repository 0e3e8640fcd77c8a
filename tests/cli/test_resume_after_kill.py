"""`mmrl train` killed with SIGKILL mid-run and started again with the same command resumes from its
last checkpoint and ends with exactly the parameters of a run that was never interrupted."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from mmrl.trainer import checkpoint

ARGS = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "sim.kwargs={max_episode_steps: 12}",
    "policy.dim=16",
    "policy.expert_dim=16",
    "policy.expert_layers=1",
    "policy.num_steps=3",
    "warm_start.num_episodes=4",
    "warm_start.steps=3",
    "warm_start.batch_size=8",
    "algorithm.minibatch_size=16",
    "algorithm.epochs=1",
    "trainer.iterations=8",
    "trainer.checkpoint_every=2",
    "trainer.eval_episodes=8",
    "trainer.video_episodes=0",
]


def train_cmd(out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "mmrl.cli",
        "train",
        "configs/quickstart.yaml",
        f"run.output_dir={out}",
        "run.name=k",
        *ARGS,
    ]


def final_params(out: Path) -> dict:
    return checkpoint.read_weights(out / "k" / "checkpoints" / "iter_000008")[0]


def test_sigkill_then_same_command_resumes_exactly(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(train_cmd(tmp_path / "a"), check=True, capture_output=True, env=env, timeout=600)

    proc = subprocess.Popen(train_cmd(tmp_path / "b"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    latest = tmp_path / "b" / "k" / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and not (latest.exists() and latest.read_text() >= "iter_000004"):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = latest.read_text()
    assert "iter_000004" <= killed_at < "iter_000008", killed_at  # it really stopped mid-run

    done = subprocess.run(train_cmd(tmp_path / "b"), check=True, capture_output=True, text=True, env=env, timeout=600)
    assert f"resumed from checkpoint {killed_at} (iteration {int(killed_at[5:])})" in done.stdout + done.stderr
    a, b = final_params(tmp_path / "a"), final_params(tmp_path / "b")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"parameter {k} differs after resume"
