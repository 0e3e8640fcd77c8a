"""Issue 32, user code: a reward given as a Python function runs under a time limit
(``reward.timeout_s``: automatic by default, max(120 s, 20 x its slowest call so far), the rule of
`mmrl.utils.deadline` that sim workers share), and whatever it does wrong (hangs, raises, returns
the wrong length, shape or type, a file that does not parse) is one `error:` line naming the
function by file:name, what it did and what was expected, no traceback. A run stopped by it keeps
its newest complete checkpoint, and the same command resumes once the function is fixed.

The command-line cases that are known before any work (a reward file that does not parse, a bad
``reward.timeout_s``) are in cases_user_code.py; a function that misbehaves only when called is
found after the warm start's checkpoint, so its end-to-end runs are here."""

from __future__ import annotations

import textwrap
import time

import pytest
import torch

pytest.importorskip("transformers")

from mmrl.cli import main
from mmrl.errors import TrainingError
from mmrl.reward import FunctionReward, RewardFunctionError, as_reward
from mmrl.utils import deadline
from mmrl.utils.deadline import CallLimit, CallTimedOut, auto_timeout_s
from tests.trainer.test_vlm_training import TINY

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LIMIT_S = 1.0  # the test's fixed limit (reward.timeout_s)

HANGING = textwrap.dedent('''
    """Scores 1 until the run's first RL checkpoint is complete, then never returns (until RELEASE)."""
    import os
    import time

    RUN, RELEASE = {run!r}, {release!r}

    def score(completions, **kwargs):
        if os.path.exists(os.path.join(RUN, "checkpoints", "iter_000001", "COMPLETE")):
            open(os.path.join(RELEASE + ".started"), "w").write(repr(time.monotonic()))
            while not os.path.exists(RELEASE):  # "forever": the test lets it go at its end
                time.sleep(0.05)
        return [1.0] * len(completions)
''')

FIXED = textwrap.dedent("""
    def score(completions, **kwargs):
        return [1.0] * len(completions)
""")


def errors(capsys) -> tuple[list[str], str]:
    err = capsys.readouterr().err
    return [ln for ln in err.splitlines() if ln.startswith("error:")], err


def test_a_reward_that_never_returns_stops_the_run_within_its_limit_and_the_same_command_resumes(tmp_path, capsys):
    run, release = tmp_path / "vlm_quickstart", tmp_path / "release"
    reward = tmp_path / "hang.py"
    reward.write_text(HANGING.format(run=str(run), release=str(release)))
    argv = [
        "train",
        "configs/vlm_quickstart.yaml",
        f"run.output_dir={tmp_path}",
        *TINY,
        f"reward.type={reward}:score",
        f"reward.timeout_s={LIMIT_S}",
    ]
    try:
        rc = main(argv)
        ended = time.monotonic()
        lines, err = errors(capsys)
        assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
        line = lines[0]
        for words in (
            f"reward function {reward}:score did not return within 1 s (reward.timeout_s = 1)",
            "set reward.timeout_s=SECONDS for a fixed limit, or reward.timeout_s=.inf to wait forever",
            "newest complete checkpoint: iter_000001; run the same command to resume",
        ):
            assert words in line, line
        started = float((tmp_path / "release.started").read_text())
        assert LIMIT_S <= ended - started < LIMIT_S + 5.0  # the limit, not forever
    finally:
        release.write_text("")  # the stuck call (a daemon thread) may end now
    reward.write_text(FIXED)  # the function fixed, the same command
    assert main(argv) == 0
    assert "resumed from checkpoint iter_000001 (iteration 1)" in capsys.readouterr().out
    assert (run / "checkpoints" / "iter_000002" / "COMPLETE").exists()


BAD = textwrap.dedent("""
    import torch

    def raises(completions, **kwargs):
        table = {}
        return [table[c] for c in completions]

    def short(completions, **kwargs):
        return [1.0]

    def wide(completions, **kwargs):
        return torch.zeros(len(completions), 2)

    def words(completions, **kwargs):
        return ["good" for _ in completions]

    def nothing(completions, **kwargs):
        pass
""")


@pytest.fixture
def bad(tmp_path):
    from mmrl.reward import import_reference

    path = tmp_path / "bad.py"
    path.write_text(BAD)
    return lambda name: (import_reference(f"{path}:{name}"), f"{path}:{name}")


@pytest.mark.parametrize(
    "name,said",
    [
        ("raises", ["raised KeyError: 'a'", "bad.py:6 scoring 3 samples", "kind=text` tries it"]),
        ("short", ["returned 1 score for 3 samples", "one score per sample: a list of 3 numbers"]),
        ("wide", ["returned a Tensor of shape (3, 2) for 3 samples", "tensor of shape (3,)"]),
        ("words", ["returned 'good' (str) as the score of sample 0", "must be numbers (float, int, bool) or None"]),
        ("nothing", ["returned None (NoneType) for 3 samples", "a list of 3 numbers"]),
    ],
)
def test_a_misbehaving_function_is_one_line_naming_it_what_it_returned_and_what_was_expected(bad, name, said):
    fn, where = bad(name)
    with pytest.raises(RewardFunctionError) as caught:
        as_reward(fn, "text")(["a", "b", "c"], ["p"] * 3)
    message = str(caught.value)
    assert message.startswith(f"reward function {where} ") and "\n" not in message
    for words in said:
        assert words in message, message


def test_a_raising_function_ends_a_command_line_run_in_one_line(tmp_path, capsys):
    (tmp_path / "bad.py").write_text(BAD)
    argv = ["train", "configs/vlm_quickstart.yaml", f"run.output_dir={tmp_path}", *TINY]
    assert main([*argv, f"reward.type={tmp_path}/bad.py:raises"]) == 2
    lines, err = errors(capsys)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"error: reward function {tmp_path}/bad.py:raises raised KeyError:" in lines[0], lines[0]
    assert f"at {tmp_path}/bad.py:6 scoring" in lines[0] and "run the same command to resume" in lines[0]


def test_the_python_api_stops_with_a_training_error_naming_the_function(tmp_path):
    import mmrl

    def counted(completions, **kwargs):
        return [1.0, 2.0]  # as many as... two, whatever the batch

    with pytest.raises(TrainingError, match=r"reward function .*test_user_code.py:.*counted returned 2 scores for 8"):
        mmrl.train("configs/vlm_quickstart.yaml", f"run.output_dir={tmp_path}", *TINY, reward=counted)


def test_the_automatic_limit_is_the_shared_rule_per_function(monkeypatch):
    assert auto_timeout_s(None) == 120.0 and auto_timeout_s(10.0) == 200.0  # the default rule
    monkeypatch.setattr(deadline, "AUTO_TIMEOUT_FLOOR_S", 0.3)
    monkeypatch.setattr(deadline, "AUTO_TIMEOUT_FACTOR", 4.0)
    delay = {"s": 0.0}
    stop = []

    def slow(completions, **kwargs):
        end = time.monotonic() + delay["s"]
        while time.monotonic() < end and not stop:
            time.sleep(0.01)
        return [0.0] * len(completions)

    reward = as_reward(slow, "text")
    assert isinstance(reward, FunctionReward) and reward.time_limit.limit() == (0.3, reward.time_limit.limit()[1])
    assert "the 0.3 s floor, no call returned yet" in reward.time_limit.limit()[1]
    delay["s"] = 0.2  # within the floor: measured, the limit becomes 4 x 0.2 s
    reward(["a"], ["p"])
    limit, why = reward.time_limit.limit()
    assert 0.8 <= limit < 1.2 and "4 x the slowest call so far" in why
    delay["s"] = 30.0
    began = time.monotonic()
    try:
        with pytest.raises(RewardFunctionError, match=r"slow did not return within 0\.8\d* s \(automatic limit: 4 x"):
            reward(["a"], ["p"])
        assert time.monotonic() - began < limit + 2.0
    finally:
        stop.append(True)


def test_call_limit_fixed_forever_and_errors_pass_through():
    assert CallLimit(2.5, "reward.timeout_s").limit() == (2.5, "reward.timeout_s = 2.5")
    assert CallLimit(float("inf"), "reward.timeout_s").limit() == (None, "reward.timeout_s = .inf")
    with pytest.raises(ValueError, match="must be seconds > 0"):
        CallLimit(0.0)
    limit = CallLimit(5.0)
    assert limit.call(lambda x: x + 1, 1) == 2
    with pytest.raises(ZeroDivisionError):
        limit.call(lambda: 1 / 0)
    with pytest.raises(CallTimedOut, match="past its limit of 0.05 s"):
        CallLimit(0.05).call(time.sleep, 0.5)
    # a limited call sees the caller's grad mode (thread-local in torch)
    with torch.no_grad():
        assert not as_reward(lambda c, **k: [float(torch.is_grad_enabled())], "text")(["a"], ["p"]).item()


def test_mmrl_check_reward_says_a_failing_function_in_one_line(bad, capsys):
    _, where = bad("short")
    assert main(["check", "reward", where, "kind=text"]) == 1
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"reward '{where}' FAILED check_reward[output]") and "returned 1 score for" in err


def test_a_function_that_needs_the_main_thread_is_told_how_to_run_there():
    import signal

    def alarmed(completions, **kwargs):  # signal-based timeouts (math_verify's) need the main thread
        signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
        return [1.0] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"raised ValueError: signal only works in main thread.*=\.inf runs"):
        as_reward(alarmed, "text")(["a"], ["p"])
    reward = as_reward(alarmed, "text")
    assert isinstance(reward, FunctionReward)
    reward.time_limit = CallLimit(float("inf"), "reward.timeout_s")  # reward.timeout_s=.inf
    assert reward(["a"], ["p"]).tolist() == [1.0]
