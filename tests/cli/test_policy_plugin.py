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
    (info / "entry_points.txt").write_text("[mmrl.policies]\nscaled_flow = mmrl_scaled_flow:ScaledFlowPolicy\n")


def run_mmrl(args: list[str], plugin_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "mmrl", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


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


ALGO_PLUGIN = '''
import torch

from mmrl.capabilities import Component, component
from mmrl.registry import ADVANTAGES, OBJECTIVES
from mmrl.trainer.objectives import ppo_loss

CALLS = {"estimate": 0, "objective": 0}


def median_baseline(batch, algo, last_values=None):
    """Each episode's return minus its group's median (a plugin estimator)."""
    CALLS["estimate"] += 1
    valid = batch["valid"]
    ret = (batch["rewards"] * valid).sum(0)
    group = batch["group"][0]
    median = torch.stack([ret[group == g].median() for g in group.tolist()])
    return (ret - median)[None].expand_as(valid) * valid, ret[None].expand_as(valid)


ADVANTAGES.register("median_baseline", Component(median_baseline, frozenset({"groups"})))


@component(OBJECTIVES, "half_ppo", needs=("likelihood",))
def half_ppo(policy, mb, algo):
    """PPO at half the loss (a plugin objective)."""
    CALLS["objective"] += 1
    loss, metrics = ppo_loss(policy, mb, algo)
    with open(__file__ + ".calls", "w") as f:
        f.write(repr(CALLS))
    return 0.5 * loss, metrics
'''

ALGO_CONFIG = """
run: {name: algo_plugin, output_dir: %s, seed: 0}
sim: {type: reach, num_envs: 8, eval_num_envs: 8, kwargs: {image_size: 16, max_episode_steps: 8}}
policy: {type: flow_vla, backbone: tiny, chunk_size: 4, num_steps: 2, critic: false}
algorithm: {advantage: median_baseline, objective: half_ppo, group_size: 4, minibatch_size: 16, epochs: 1}
trainer: {iterations: 2, eval_episodes: 8, video_episodes: 0, checkpoint_every: 1}
"""


def test_a_plugin_advantage_and_objective_train_from_yaml(tmp_path):
    """An estimator and an objective from another package (one ``mmrl.plugins`` module registering
    both beside their definitions) are listed, checked against the policy's capabilities like the
    built-ins, and train."""
    pkg = tmp_path / "site" / "mmrl_algo_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(ALGO_PLUGIN))
    info = tmp_path / "site" / "mmrl_algo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mmrl-algo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[mmrl.plugins]\nalgo = mmrl_algo_plugin\n")
    cfg = tmp_path / "algo.yaml"
    cfg.write_text(ALGO_CONFIG % (tmp_path / "runs"))

    listed = run_mmrl(["list"], tmp_path / "site", tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "median_baseline" in listed.stdout and "half_ppo" in listed.stdout

    done = run_mmrl(["train", str(cfg), "run.threads=1"], tmp_path / "site", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["final"]["iteration"] == 2
    calls = eval((pkg / "__init__.py.calls").read_text())
    assert calls["estimate"] == 2 and calls["objective"] >= 2  # they trained, not the built-ins

    # the plugin's needs are checked at load, like a built-in's: no groups of episodes
    bad = run_mmrl(["train", str(cfg), "algorithm.group_size=1"], tmp_path / "site", tmp_path)
    assert bad.returncode != 0 and "compares episodes within a group" in bad.stderr
