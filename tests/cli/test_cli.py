"""The command line: list, check, config errors before any work, eval of a checkpoint."""

import json
import subprocess
import sys

import pytest

from mmrl.cli import main
from mmrl.config import ConfigError
from mmrl.experiment import load_experiment
from mmrl.registry import SIMULATORS


def test_list_shows_every_registered_component(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in [
        "reach",
        "flow_vla",
        "gae",
        "grpo",
        "dr_grpo",
        "rloo",
        "ngrpo",
        "reinforce_pp_baseline",
        "reach_demos",
    ]:
        assert f"  {name} " in out, name
    for kind in ["policies:", "simulators:", "rewards:", "advantages:", "objectives:", "datasets:"]:
        assert kind in out


# small, fast settings per simulator; anything registered later is checked with num_envs=2
CHECK_ARGS = {
    "reach": ["num_envs=4"],
    "gym": ["num_envs=2", "max_episode_steps=20"],
    "maniskill": ["num_envs=2"],
}
# simulators whose contract check runs elsewhere, with the same `check_simulator`: a real LIBERO scene
# takes minutes to check (env start-ups) even at tiny settings, and is checked once, not twice
# a world model's simulator needs a trained world model and reward model: checked on a trained (tiny) one
CHECKED_ELSEWHERE = {
    "libero": "tests/simulators/test_libero_real.py::test_contract_on_a_real_libero_spatial_scene",
    "world_model": "tests/policies/test_world_model.py::"
    "test_trained_checkpoint_exports_and_plays_as_a_checked_simulator",
}


@pytest.mark.parametrize("name", SIMULATORS.names())
def test_every_registered_simulator_passes_the_contract_check(name, capsys):
    from mmrl.registry import MissingDependencyError

    if name in CHECKED_ELSEWHERE:
        pytest.skip(f"simulator '{name}' is contract-checked in {CHECKED_ELSEWHERE[name]}")
    try:
        SIMULATORS.get(name)
    except MissingDependencyError as exc:
        pytest.skip(str(exc))
    assert main(["check", "simulator", name, *CHECK_ARGS.get(name, ["num_envs=2"])]) == 0
    assert f"simulator '{name}' passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "override, needles",
    [
        ("trainer.lrr=1", ["trainer.lrr", "lr", "iterations"]),
        ("algorithm.loss_agg=mean", ["algorithm.loss_agg", "token-mean", "seq-mean-token-sum-norm"]),
        ("algorithm.advantage=grpoo", ["grpoo", "grpo", "rloo", "gae"]),
        ("policy.method=ddim", ["policy.method", "sde", "cps", "noise"]),
        ("policy.type=nope", ["policy.type", "flow_vla"]),
        ("sim.type=nope", ["nope", "reach"]),
        ("sim.kwargs={colour: 1}", ["kwargs.colour", "image_size", "num_objects"]),
        ("trainer.iterations=ten", ["trainer.iterations", "int"]),
        ("algorithm.kl_coef=0.1", ["algorithm.kl_coef", "flow_vla", "kl_coef=0"]),
        ("algorithm.group_size=3", ["sim.num_envs", "group_size"]),
    ],
)
def test_bad_config_fails_naming_key_and_choices(override, needles):
    with pytest.raises(ConfigError) as err:
        load_experiment("configs/quickstart.yaml", [override])
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_eval_tasks_need_a_simulator_with_tasks(capsys):
    assert main(["eval", "configs/quickstart.yaml", "sim.eval_tasks=all"]) == 2
    assert "has a single task" in capsys.readouterr().err


def test_train_with_bad_key_exits_before_any_work(tmp_path, capsys):
    code = main(["train", "configs/quickstart.yaml", f"run.output_dir={tmp_path}", "trainer.lrr=1"])
    assert code == 2
    assert "trainer.lrr" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_eval_reports_success_of_a_checkpoint(tmp_path):
    common = [
        f"run.output_dir={tmp_path}",
        "run.name=e",
        "sim.num_envs=4",
        "sim.eval_num_envs=4",
        "policy.dim=16",
        "policy.expert_dim=16",
        "policy.expert_layers=1",
        "warm_start.steps=2",
        "warm_start.num_episodes=2",
        "trainer.iterations=1",
        "trainer.eval_episodes=4",
        "trainer.video_episodes=0",
        "algorithm.minibatch_size=32",
        "algorithm.epochs=1",
    ]
    assert main(["train", "configs/quickstart.yaml", *common]) == 0
    ckpt = tmp_path / "e" / "checkpoints" / "iter_000001"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmrl.cli",
            "eval",
            "configs/quickstart.yaml",
            *common,
            "trainer.eval_episodes=6",
            f"checkpoint={ckpt}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 6 and 0.0 <= report["success_rate"] <= 1.0
    assert len(report["tasks"]) == 1 and report["tasks"][0]["task"] is None  # the configured task
    assert json.loads((tmp_path / "e" / "eval_report.json").read_text())["checkpoint"] == str(ckpt)
    # where it fails: reach's episodes broken down by goal colour, goal cell and start distance,
    # printed one row each and in the report, each dimension over the same 6 episodes
    assert set(report["breakdown"]) == {"goal", "goal_cell", "start_distance"}
    for dim, rows in report["breakdown"].items():
        assert sum(r["episodes"] for r in rows.values()) == 6
        for label, r in rows.items():
            assert f"({r['episodes']} episodes)  {dim} = {label}" in proc.stdout


def test_check_reward_command(capsys):
    assert main(["check", "reward", "jpeg_compressibility", "quality=80"]) == 0
    assert "passed 9 contract checks" in capsys.readouterr().out
    assert main(["check", "reward", "jpeg_compressibility", "quality"]) == 2
    assert "key=value" in capsys.readouterr().err


def test_version_config_show_and_keys(tmp_path, capsys):
    """`mmrl --version`; `mmrl config show` prints a resolved config that loads back equal;
    `mmrl config keys` and `mmrl train --help` list every key with its default (and its help)."""
    import subprocess
    import sys

    import mmrl
    from mmrl.experiment import load_experiment

    out = subprocess.run([sys.executable, "-m", "mmrl", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"mmrl {mmrl.__version__}"
    import tomllib

    assert tomllib.loads(open("pyproject.toml").read())["project"]["version"] == mmrl.__version__
    assert main(["config", "show", "configs/quickstart.yaml", "trainer.lr=1e-4", "sim.num_envs=16"]) == 0
    (tmp_path / "resolved.yaml").write_text(capsys.readouterr().out)
    assert load_experiment(tmp_path / "resolved.yaml") == load_experiment(
        "configs/quickstart.yaml", ["trainer.lr=1e-4", "sim.num_envs=16"]
    )
    assert main(["config", "keys", "trainer.max_skipped"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "trainer.max_skipped_steps: int = 20",
        "      the run stops (newest checkpoint kept) when this many optimizer steps in a row were skipped "
        "for a non-finite loss or gradient",
    ]
    assert main(["config", "keys", "bogus"]) == 2
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    helptext = capsys.readouterr().out
    assert "trainer.lr: float = 0.0003" in helptext and "policy.type: str" in helptext
