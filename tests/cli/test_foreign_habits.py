"""Issue 31: the command-line habits of TRL / accelerate / LeRobot users: ``--key=value`` and
``--key value`` are dotted overrides, and another tool's name for one of our keys is answered with
ours in the one-line error (never silently mapped)."""

from __future__ import annotations

import pytest

from mmrl.cli import dotted_overrides, main
from mmrl.config import ConfigError
from mmrl.experiment import load_experiment


def test_double_dash_forms_are_dotted_overrides():
    argv = ["train", "c.yaml", "--trainer.lr=1e-4", "--trainer.iterations", "3", "sim.num_envs=4", "--x.flag"]
    assert dotted_overrides(argv) == [
        "train",
        "c.yaml",
        "trainer.lr=1e-4",
        "trainer.iterations=3",
        "sim.num_envs=4",
        "x.flag=true",
    ]
    assert dotted_overrides(["train", "--help"]) == ["train", "--help"]
    assert dotted_overrides(["export", "run", "--to", "out"]) == ["export", "run", "--to", "out"]  # real options


@pytest.mark.parametrize(
    "override, ours",
    [
        ("learning_rate=1e-4", "trainer.lr"),
        ("num_generations=4", "algorithm.group_size"),
        ("max_completion_length=64", "policy.max_new_tokens"),
        ("steps=100", "trainer.iterations"),
        ("output_dir=out", "run.output_dir"),
    ],
)
def test_another_tools_name_is_answered_with_ours(override, ours):
    with pytest.raises(ConfigError, match=f"unknown config key '{override.split('=')[0]}'.*mmrl's name for it: {ours}"):
        load_experiment("configs/quickstart.yaml", [override])


def test_the_command_line_takes_them_and_says_so_in_one_line(capsys):
    assert main(["train", "configs/quickstart.yaml", "--learning_rate", "1e-4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mmrl's name for it: trainer.lr" in err[0]
    assert main(["config", "show", "configs/quickstart.yaml", "trainer.lr=3e-4"]) == 0  # config show unchanged
    cfg = load_experiment("configs/quickstart.yaml", dotted_overrides(["train", "x", "--trainer.lr", "3e-4"])[2:])
    assert cfg.trainer.lr == 3e-4
