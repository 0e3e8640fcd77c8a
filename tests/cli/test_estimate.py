"""``mmrl estimate`` prints a plan for every shipped config; a plan that cannot fit exits 1, and
``mmrl train`` refuses it in one line before any work."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))


def _library_missing(path: Path) -> str | None:
    text = path.read_text()
    if "type: lerobot" in text and importlib.util.find_spec("lerobot") is None:
        return "the lerobot family needs LeRobot (bash scripts/setup_lerobot.sh; its tests run in .venv-lerobot)"
    diffusers = ("type: diffusion" in text and "model: tiny" not in text) or "type: wan_world_model" in text
    if diffusers and importlib.util.find_spec("diffusers") is None:
        return "the diffusers family needs mmrl[diffusion]"
    return None


@pytest.fixture(scope="module")
def tiny_smolvlm(tmp_path_factory):
    from mmrl.tiny.tiny_models import tiny_image_text_model

    folder = tmp_path_factory.mktemp("tiny_smolvlm")
    tiny_image_text_model(folder)
    return folder


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_prints_a_plan(name, capsys, tiny_smolvlm):
    path = ROOT / "configs" / name
    missing = _library_missing(path)
    if missing:
        pytest.skip(missing)
    extra = [f"policy.model={tiny_smolvlm}"] if "model: runs/tiny_smolvlm" in path.read_text() else []
    code = main(["estimate", str(path), *extra, "--gpu-memory", "80GiB", "--json"])
    out, err = capsys.readouterr()
    if code == 2 and "did not start here" in err:  # a simulator whose renderer / assets are not on this machine
        pytest.skip(err.strip())
    if code == 2 and "does not cover" in err:  # LeRobot policies (in .venv-lerobot): not planned yet, and it says so
        pytest.skip(err.strip())
    plan = json.loads(out)
    assert code == (0 if plan["fits"] else 1)
    assert plan["params"] > 0 and plan["total"] == sum(plan["terms"].values())
    assert set(plan["terms"]) == {
        "weights",
        "frozen encoders",
        "gradients",
        "optimizer",
        "reference",
        "rollout",
        "activations",
    }


def test_real_size_vlm_plan(capsys):
    code = main(["estimate", str(ROOT / "configs/qwen25vl_3b_video_qa.yaml"), "--gpu-memory", "80GiB"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Qwen/Qwen2.5-VL-3B-Instruct" in out and "fits yes" in out and "an estimate" in out
    assert "3,814,490,112" in out  # 3,754,622,976 published + 59,867,136 LoRA (rank 32)


def test_small_memory_exits_1_with_knobs(capsys):
    code = main(["estimate", str(ROOT / "configs/qwen25vl_3b_video_qa.yaml"), "--gpu-memory", "24GiB"])
    out = capsys.readouterr().out
    assert code == 1
    assert "fits no" in out and "algorithm.minibatch_size=" in out


def test_more_ranks_shard(capsys):
    args = ["estimate", str(ROOT / "configs/quickstart.yaml"), "trainer.engine.backend=fsdp", "--json"]
    main([*args, "--world-size", "1"])
    one = json.loads(capsys.readouterr().out)
    main([*args, "--world-size", "4"])
    four = json.loads(capsys.readouterr().out)
    assert four["world_size"] == 4
    assert four["terms"]["optimizer"] == -(-one["terms"]["optimizer"] // 4)


SHORT = [  # a short run, so a check that let it through fails in seconds, not after the quickstart's minutes
    "warm_start.steps=1",
    "warm_start.candidates=1",
    "trainer.iterations=1",
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "trainer.eval_episodes=8",
    "algorithm.minibatch_size=8",
]


def _train(tmp_path, *extra):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mmrl",
            "train",
            "configs/quickstart.yaml",
            f"run.output_dir={tmp_path}",
            *SHORT,
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )


@pytest.mark.parametrize("flag", [["run.gpu_memory=1MiB"], ["--gpu-memory", "1MiB"]])
def test_train_refuses_a_plan_that_cannot_fit(tmp_path, flag):
    proc = _train(tmp_path, *flag)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: the memory plan does not fit") and "largest term" in lines[0]
    assert "try " in lines[0]
    assert not any(tmp_path.iterdir())  # before any work: no run folder


def test_cpu_run_without_budget_is_not_checked():
    from mmrl.experiment import load_experiment
    from mmrl.planning.estimate import check_plan

    assert check_plan(load_experiment(ROOT / "configs/quickstart.yaml"), 1) is None
    assert check_plan(load_experiment(ROOT / "configs/quickstart.yaml", ["run.gpu_memory=off"]), 1) is None
    assert check_plan(load_experiment(ROOT / "configs/quickstart.yaml", ["run.gpu_memory=1GiB"]), 1).fits


def test_bad_budget_is_a_config_error():
    from mmrl.config import ConfigError
    from mmrl.experiment import load_experiment

    with pytest.raises(ConfigError, match="gpu_memory"):
        load_experiment(ROOT / "configs/quickstart.yaml", ["run.gpu_memory=lots"])
