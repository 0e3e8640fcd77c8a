"""Issue 68's command-line cases (settings and off-policy data): (case, `mmrl` arguments, words the
one `error:` line must hold), run by tests/reliability/test_settings.py and tabled in
docs/bad_inputs.md by scripts/bad_input_table.py. {out}: a 2-iteration tiny quickstart run folder;
{tmp}: a fresh folder that `prepare` fills. Every case trained silently, or failed late or unclearly,
before its fix."""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

VLM = "configs/vlm_quickstart.yaml"
PENDULUM = "configs/gym_pendulum_sac.yaml"  # state 3 wide, actions 1 wide (chunk 1)
TWO = "reward.type=[format, short_answer]"

CASES: list[tuple[str, list[str], list[str]]] = [
    (
        "a NaN reward weight",
        ["train", VLM, TWO, "reward.weights=[.nan, 1]"],
        ["'weights' must be finite numbers", "'format': nan"],
    ),
    (
        "every reward weight 0",
        ["train", VLM, TWO, "reward.weights=[0, 0]"],
        ["'weights' are all 0", "the trained reward would be 0"],
    ),
    (
        "an unknown reward among TRL's reward_funcs",
        ["train", VLM, "reward.type=[jpeg_compressibility, no_such_reward]"],
        ["'type' = 'no_such_reward' is not a registered reward"],
    ),
    (
        "the mapping form of weights naming a reward 'type' does not list",
        ["train", VLM, TWO, "reward.weights={format: 1, nosuch: 2}"],
        ["one weight to each reward 'type' lists (format, short_answer)", "['nosuch'] not in 'type'"],
    ),
    (
        "SAC's learning_starts past the whole run",
        ["train", PENDULUM, "algorithm.sac.learning_starts=50000"],
        ["'algorithm.sac.learning_starts' = 50000", "trainer.env_steps=20000", "no gradient step would be taken"],
    ),
    (
        "a replay buffer smaller than one batch",
        ["train", PENDULUM, "algorithm.sac.buffer_size=100"],
        ["'buffer_size' = 100 holds fewer transitions than one batch (batch_size = 256)"],
    ),
    (
        "a DSRL base checkpoint that does not exist",
        ["train", "configs/quickstart_dsrl.yaml", "policy.base_checkpoint={tmp}/no_such_run"],
        ["no_such_run does not exist", "pass policy.base_checkpoint=PATH"],
    ),
    ("an empty config file", ["train", "{tmp}/empty.yaml"], ["empty.yaml is empty", "mmrl init quickstart"]),
    ("a folder as the config", ["train", "{tmp}"], ["is a folder, not a config file"]),
    ("mmrl train without a config", ["train"], ["mmrl train needs an experiment config", "configs/quickstart.yaml"]),
    (
        "demonstrations of the wrong state size",
        ["train", PENDULUM, "algorithm.sac.demos={tmp}/wrong_state.pt"],
        ["algorithm.sac.demos", "'state' rows are [5] wide, this run's policy replays 3"],
    ),
    (
        "demonstrations that are random bytes",
        ["train", PENDULUM, "algorithm.sac.demos={tmp}/bytes.pt"],
        ["is not a torch file of tensors", "torch.save("],
    ),
    (
        "demonstrations that are a pickled list",
        ["train", PENDULUM, "algorithm.sac.demos={tmp}/list.pt"],
        ["algorithm.sac.demos", "is not a torch file of tensors"],
    ),
    (
        "demonstrations with NaN rewards",
        ["train", PENDULUM, "algorithm.sac.demos={tmp}/nan_rewards.pt"],
        ["algorithm.sac.demos", "2 transition(s) hold NaN or infinite 'rewards'"],
    ),
    (
        "demonstration actions outside a squashed actor's range",
        ["train", PENDULUM, "algorithm.sac.demos={tmp}/wide_actions.pt"],
        ["algorithm.sac.demos", "actions outside [-1, 1] (largest |a| = 2)", "squashed (tanh) actor"],
    ),
]


def demos(m: int = 8, state: int = 3, action: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "state": torch.randn(m, state, generator=g),
        "actions": torch.rand(m, 1, action, generator=g) * 2 - 1,
        "rewards": torch.randn(m, generator=g),
        "next_state": torch.randn(m, state, generator=g),
        "terminated": torch.zeros(m, dtype=torch.bool),
    }


def prepare(tmp: Path, out: Path) -> None:
    (tmp / "empty.yaml").write_text("# nothing but a comment\n")
    torch.save(demos(state=5), tmp / "wrong_state.pt")
    (tmp / "bytes.pt").write_bytes(bytes(range(256)) * 4)
    (tmp / "list.pt").write_bytes(pickle.dumps([1, 2, 3]))
    nan = demos()
    nan["rewards"][[1, 4]] = float("nan")
    torch.save(nan, tmp / "nan_rewards.pt")
    wide = demos()
    wide["actions"][0] = 2.0
    torch.save(wide, tmp / "wide_actions.pt")
