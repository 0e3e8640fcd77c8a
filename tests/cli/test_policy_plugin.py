"""A policy from another package, declared by ONE entry point (``mmrl.policies``), is selectable
from YAML, trains, and shows in ``mmrl list``, exactly like a built-in.

The plugin is a real distribution laid out on disk (its package plus a ``.dist-info`` with
``entry_points.txt``), put on ``PYTHONPATH`` of a fresh ``python -m mmrl`` process: what
``pip install my-plugin`` leaves behind, minus the copying.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PLUGIN = '''
from dataclasses import dataclass

from mmrl.policies.base import Decision
from mmrl.policies.flow_vla import FlowVLAConfig, FlowVLAPolicy


@dataclass
class ScaledFlowConfig(FlowVLAConfig):
    """A flow VLA whose executed actions are scaled (a field the built-in config does not have)."""

    type: str = "scaled_flow"
    action_scale: float = 1.0


class ScaledFlowPolicy(FlowVLAPolicy):
    """Plugin policy: the built-in flow VLA, actions multiplied by ``action_scale``."""

    config_class = ScaledFlowConfig

    def rollout(self, obs, generator=None, mode="train"):
        batch, actions = super().rollout(obs, generator, mode)
        batch["actions"] = actions = actions * self.cfg.action_scale
        return Decision(batch, actions)
'''

CONFIG = """
run: {name: plugin, output_dir: %s, seed: 0}
sim: {type: reach, num_envs: 8, eval_num_envs: 8, kwargs: {image_size: 16, max_episode_steps: 8}}
policy: {type: scaled_flow, action_scale: 0.5, backbone: tiny, chunk_size: 4, num_steps: 2}
algorithm: {minibatch_size: 16, epochs: 1}
trainer: {iterations: 2, eval_episodes: 8, video_episodes: 0, checkpoint_every: 1}
"""


def make_plugin(root: Path) -> None:
    pkg = root / "mmrl_scaled_flow"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    info = root / "mmrl_scaled_flow-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mmrl-scaled-flow\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[mmrl.policies]\nscaled_flow = mmrl_scaled_flow:ScaledFlowPolicy\n")


def run_mmrl(args: list[str], plugin_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mmrl", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_plugin_policy_trains_from_yaml(tmp_path):
    make_plugin(tmp_path / "site")
    cfg = tmp_path / "plugin.yaml"
    cfg.write_text(CONFIG % (tmp_path / "runs"))

    listed = run_mmrl(["list"], tmp_path / "site", tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "scaled_flow" in listed.stdout

    done = run_mmrl(["train", str(cfg), "run.threads=1"], tmp_path / "site", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["final"]["iteration"] == 2
    saved = (tmp_path / "runs" / "plugin" / "checkpoints" / "latest").read_text().strip()
    config = (tmp_path / "runs" / "plugin" / "checkpoints" / saved / "config.yaml").read_text()
    assert "type: scaled_flow" in config and "action_scale: 0.5" in config

    # the plugin's own key is checked like a built-in's
    bad = run_mmrl(["train", str(cfg), "policy.action_scal=2"], tmp_path / "site", tmp_path)
    assert bad.returncode != 0 and "action_scal" in bad.stderr and "action_scale" in bad.stderr
