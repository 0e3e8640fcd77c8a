"""Issue 32's command-line cases (user code): (case, `mmrl` arguments, words the one `error:` line
must hold), run by tests/reliability/test_round_three.py and tabled in docs/bad_inputs.md by
scripts/bad_input_table.py. {out}: a 2-iteration tiny quickstart run folder; {tmp}: a fresh folder
that `prepare` fills."""

from __future__ import annotations

from pathlib import Path

CASES: list[tuple[str, list[str], list[str]]] = [
    (
        "a reward file with a syntax error",
        ["train", "configs/vlm_quickstart.yaml", "reward.type={tmp}/syntax_error.py:accuracy"],
        ["reward file", "syntax_error.py has a syntax error at line 3: '(' was never closed", "fix the file"],
    ),
    (
        "a reward file whose imports fail",
        ["train", "configs/vlm_quickstart.yaml", "reward.type={tmp}/needs_lib.py:accuracy"],
        [
            "needs_lib.py failed to import: ModuleNotFoundError: No module named 'a_library_not_installed'",
            "needs_lib.py:1",
        ],
    ),
    (
        "reward.timeout_s=0",
        ["train", "configs/vlm_quickstart.yaml", "reward.timeout_s=0"],
        ["reward.timeout_s = 0.0 must be seconds > 0", ".inf (wait forever) or null (automatic"],
    ),
    # a function that misbehaves only when called: `mmrl eval` of the trained run scoring its frames
    # with it (a training run finds it after the warm start's checkpoint: test_user_code.py)
    (
        "a reward function that raises",
        ["eval", "{out}", "reward.type={tmp}/frame_rewards.py:raises"],
        ["reward function", "frame_rewards.py:raises raised ZeroDivisionError: division by zero at", "py:5 scoring"],
    ),
    (
        "a reward function that returns too few scores",
        ["eval", "{out}", "reward.type={tmp}/frame_rewards.py:too_few"],
        ["frame_rewards.py:too_few returned 1 score for", "it must return one score per sample"],
    ),
    (
        "a reward function that returns a tensor of the wrong shape",
        ["eval", "{out}", "reward.type={tmp}/frame_rewards.py:wide"],
        ["frame_rewards.py:wide returned a Tensor of shape (", ", 2) for", "or an array / tensor of shape ("],
    ),
    (
        "a reward function that returns strings",
        ["eval", "{out}", "reward.type={tmp}/frame_rewards.py:words"],
        ["frame_rewards.py:words returned 'good' (str) as the score of sample 0", "must be numbers"],
    ),
    (
        "a reward function that never returns",
        ["eval", "{out}", "reward.type={tmp}/frame_rewards.py:stuck", "reward.timeout_s=0.5"],
        [
            "frame_rewards.py:stuck did not return within 0.5 s (reward.timeout_s = 0.5)",
            "set reward.timeout_s=SECONDS for a fixed limit, or reward.timeout_s=.inf to wait forever",
        ],
    ),
]

SYNTAX_ERROR = """def accuracy(completions, **kwargs):
    scores = [1.0 for c in completions]
    return (scores
"""
NEEDS_LIB = """import a_library_not_installed

def accuracy(completions, **kwargs):
    return a_library_not_installed.score(completions)
"""
FRAME_REWARDS = """import time
import torch

def raises(images, **kwargs):
    return [1 / 0 for _ in images]

def too_few(images, **kwargs):
    return [1.0]

def wide(images, **kwargs):
    return torch.zeros(len(images), 2)

def words(images, **kwargs):
    return ["good" for _ in images]

def stuck(images, **kwargs):
    time.sleep(60)  # as good as forever (its daemon thread ends with the tests)
    return [0.0 for _ in images]
"""


def prepare(tmp: Path, out: Path) -> None:
    """Write the files this module's cases use into tmp (out: the trained run folder)."""
    (tmp / "syntax_error.py").write_text(SYNTAX_ERROR)
    (tmp / "needs_lib.py").write_text(NEEDS_LIB)
    (tmp / "frame_rewards.py").write_text(FRAME_REWARDS)
