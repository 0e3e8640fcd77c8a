"""benchmarks/vs_sb3.py's task handling (issue 33): any registered gymnasium id runs from the state
template with its env id, an unknown id is refused before any run, naming close ones; the validation
split shares no training seed and no evaluation episode with the reported one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def vs_sb3(load_benchmark):
    return load_benchmark("vs_sb3")


def test_any_id_runs_from_the_state_template_with_its_env_id(vs_sb3):
    from mmrl.experiment import load_experiment

    template = yaml.safe_load((ROOT / vs_sb3.TEMPLATE_STATE).read_text())
    data = vs_sb3.task_config("HalfCheetah-v5")
    assert data["sim"]["kwargs"]["env_id"] == "HalfCheetah-v5"
    template["sim"]["kwargs"]["env_id"] = "HalfCheetah-v5"
    assert data == template  # only the env id differs, as for a user copying the template
    cfg = load_experiment(data, ["run.output_dir=/nonexistent"])
    assert cfg.sim.kwargs["env_id"] == "HalfCheetah-v5"
    own = yaml.safe_load((ROOT / "configs/gym_pendulum.yaml").read_text())
    assert vs_sb3.task_config("Pendulum-v1") == own  # a task with a config of its own keeps it


def test_an_unknown_id_is_refused_naming_close_ones(vs_sb3):
    pytest.importorskip("gymnasium")
    vs_sb3.check_tasks(["HalfCheetah-v5", "Pendulum-v1"])
    with pytest.raises(SystemExit) as err:
        vs_sb3.check_tasks(["Pendulum-v1", "HalfCheeta-v5"])
    assert "'HalfCheeta-v5' is not a registered gymnasium environment" in str(err.value)
    assert "HalfCheetah-v5" in str(err.value).split("close registered ids:")[1]


def test_the_validation_split_shares_nothing_with_the_reported_one(vs_sb3):
    episodes, seeds = 10, 3
    test = set(range(vs_sb3.EVAL_SEED, vs_sb3.EVAL_SEED + episodes))
    val = set(range(vs_sb3.VALIDATION_EVAL_SEED, vs_sb3.VALIDATION_EVAL_SEED + episodes))
    assert not test & val and vs_sb3.VALIDATION_SEED0 >= seeds


def test_the_initial_std_auto_chose_is_reported_per_seed(vs_sb3):
    def run(side, task, seed, steps):  # stands in for `spawn`: what each side's subprocess prints
        out = {"return": float(seed), "train_s": 1.0, "env_steps": steps}
        if side == "flow":
            out["action_std_init"] = 0.3679 if seed else 1.0
        return out

    rows = vs_sb3.side_by_side(
        ["Ant-v5"], ["sb3", "flow"], range(2), lambda t: 10, run, {"flow": "ratio_return"}, "flow"
    )
    assert rows["Ant-v5"]["flow"]["action_std_init"] == [1.0, 0.3679]
    assert "action_std_init" not in rows["Ant-v5"]["sb3"]
