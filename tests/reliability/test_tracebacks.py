"""Issue 68, tracebacks where one line is due: each case was a traceback before its fix and is now
one line naming the problem and the fix (exit 2, or 1 for a contract check that fails)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from safetensors import SafetensorError

from mmrl.cli import main
from mmrl.registry import SIMULATORS
from tests.distributed.launch import ROOT
from tests.reliability.test_bad_inputs import (
    QUICK,
    trained,  # noqa: F401  (the shared trained-run fixture)
)


def one_line(capsys, rc_want: int = 2, starts: str = "error:") -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith(starts) or starts in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mani_skill") is None, reason="mani_skill is not installed")
@pytest.mark.parametrize("num_envs", [1, 2])  # in-process, and one worker process per env
def test_maniskill_without_a_vulkan_driver(tmp_path, num_envs):
    env = {**os.environ, "VK_ICD_FILENAMES": str(tmp_path / "no_driver.json")}  # no Vulkan driver works
    cmd = [sys.executable, "-m", "mmrl", "check", "simulator", "maniskill:PickCube-v1", f"num_envs={num_envs}"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "no working Vulkan driver" in errors[0] and "scripts/install_sim_deps.sh" in errors[0]


def test_init_to_under_a_file_and_onto_a_folder(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["init", "quickstart", "--to", str(tmp_path / "afile" / "sub")]) == 2
    assert "afile is a file, not a folder" in one_line(capsys)
    (tmp_path / "cfg.yaml").mkdir()
    assert main(["init", "quickstart", "--to", str(tmp_path / "cfg.yaml"), "--force"]) == 2
    assert "cfg.yaml is a folder" in one_line(capsys)


def test_export_onto_a_full_disk(trained, tmp_path, capsys, monkeypatch):  # noqa: F811
    def full(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("mmrl.utils.weights.save_weights", full)
    assert main(["export", str(trained), "--to", str(tmp_path / "out")]) == 2
    line = one_line(capsys)
    assert "no space left on the device" in line and "checkpoints are untouched" in line and "--force" in line


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["sim.kwargs.max_turns=0"], ["'sim.kwargs' of simulator 'tool_env'", "max_turns", "must be >= 1"]),
        (["sim.kwargs.tools=[nosuch]"], ["'sim.kwargs' of simulator 'tool_env'", "'nosuch' is not a reference"]),
    ],
)
def test_tool_environment_config_mistakes(overrides, words, tmp_path, capsys):
    assert main(["train", "configs/vlm_zoom_tools.yaml", *overrides, f"run.output_dir={tmp_path}"]) == 2
    line = one_line(capsys)
    assert all(w in line for w in words), line


def test_a_video_reward_on_an_image_generator(tmp_path, capsys):
    argv = ["train", "configs/diffusion_shapes_flow_grpo.yaml", "reward.type=motion_amount"]
    assert main([*argv, f"run.output_dir={tmp_path}"]) == 2
    line = one_line(capsys)
    assert "'reward'" in line and "scores video, but the simulator's actions are images" in line


@pytest.mark.parametrize(
    "args,words",
    [
        (["no_such"], ["no registered reward 'no_such'"]),
        (["format", "--kwargs", "{bad"], ["is not JSON"]),
        (["format", "--kwargs", '{"nope": 1}'], ["does not take --kwargs", "nope"]),
    ],
)
def test_reward_server_arguments(args, words):
    res = subprocess.run(
        [sys.executable, "-m", "rewards.http", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert res.returncode == 2 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert all(w in errors[0] for w in words), errors[0]


@pytest.fixture
def plugin(monkeypatch):
    """Register tests/plugin_sims.py's simulators as a plugin would (removed after the test)."""
    from tests import plugin_sims

    entries = dict(SIMULATORS._entries)
    monkeypatch.setattr(SIMULATORS, "_entries", entries)
    SIMULATORS.register("wrong_size_images", plugin_sims.WrongSizeImages, description="test plugin")
    SIMULATORS.register("raises_in_step", plugin_sims.RaisesInStep, description="test plugin")
    plugin_sims.RaisesInStep.calls = 0
    return plugin_sims


def test_check_simulator_on_wrong_size_images(plugin, capsys):
    assert main(["check", "simulator", "wrong_size_images", "num_envs=4"]) == 1
    line = one_line(capsys, starts="FAILED")
    assert "image shape (4, 30, 32, 3) != [N, *image_shape] (4, 32, 32, 3)" in line


def test_a_plugin_simulator_that_raises_in_step_chunk_while_training(plugin, tmp_path, capsys):
    argv = ["train", *QUICK, "sim.type=raises_in_step", "sim.kwargs={}", f"run.output_dir={tmp_path}"]
    assert main(argv) == 2
    line = one_line(capsys)
    for words in (
        "simulator tests.plugin_sims.RaisesInStep raised RuntimeError in step_chunk",
        "the physics engine lost contact with the table at plugin_sims.py:",
        "newest complete checkpoint",
    ):
        assert words in line, line


@pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="metaworld is not installed")
def test_a_gymnasium_id_of_another_package_with_a_namespace(capsys):
    """``package:Namespace/EnvId`` (Meta-World registers ``Meta-World/MT1``): gymnasium's own lookup
    imports the package; mmrl's render-size probe used to look the id up without it."""
    rc = main(["check", "simulator", "gym:metaworld:Meta-World/MT1", "env_kwargs={env_name: reach-v3}", "num_envs=2"])
    err = capsys.readouterr().err
    assert "NamespaceNotFound" not in err and "Traceback" not in err, err[-3000:]
    assert rc in (0, 1)  # its contract checks ran (Meta-World's own gym env renders differently per reset)


def test_a_prompt_longer_than_the_policy_stores(tmp_path, capsys):
    """A 100,000-character prompt in a prompt file: the line names the setting that widens the
    stored prompt (it named none, as a ValueError traceback)."""
    (tmp_path / "prompts.txt").write_text("\n".join(["a red circle " * 8000] + ["a blue square"] * 15) + "\n")
    argv = ["train", "configs/diffusion_shapes_flow_grpo.yaml", "sim.num_envs=8", "sim.eval_num_envs=6"]
    argv += ["warm_start.steps=2", "trainer.iterations=1", "trainer.eval_episodes=6", "sim.kwargs.dataset=prompt_list"]
    argv += [f"sim.kwargs.dataset_kwargs={{path: {tmp_path / 'prompts.txt'}}}", f"run.output_dir={tmp_path}"]
    assert main(argv) == 2
    line = one_line(capsys)
    assert "instruction of 103999 bytes exceeds the 256-byte text field" in line and "raise policy.prompt_bytes" in line
