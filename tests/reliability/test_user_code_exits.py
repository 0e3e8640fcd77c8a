"""User code that would end the process ends only its own call.

Before the fix a tool or a reward function calling ``sys.exit(3)`` or ``os._exit(5)`` ended the
whole run with no output (SystemExit is not an Exception; ``os._exit`` skips every handler),
although a failing tool is documented to end only its episode. Now both raise `UserCodeExit` inside
the limited call (`mmrl.utils.deadline.trap_exits`): a tool's episode ends, counted in
``tool_errors``; a reward function's run stops with one line naming the function and the call.
Each scenario runs in a process of its own, so that a regression kills that process, not pytest."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.distributed.launch import ROOT

TOOLS = textwrap.dedent('''
    import os, sys
    from mmrl.simulator import Completions
    from simulators.tool_env import ToolEnvSim
    from tests.simulators.test_tool_env import call

    def quit(x: int) -> str:
        """Calls sys.exit.

        Args:
            x: anything
        """
        sys.exit(3)

    def hard_quit(x: int) -> str:
        """Calls os._exit.

        Args:
            x: anything
        """
        os._exit(5)

    sim = ToolEnvSim(num_envs=3, tools=[quit, hard_quit], dataset="zoom_vqa", dataset_kwargs={"num_samples": 8})
    sim.reset(0)
    res = sim.step_chunk(Completions([call("quit", x=1), call("hard_quit", x=2), "square"], [6, 6, 1]))
    print("ended", (res.terminated | res.truncated).tolist(), "tool_errors", res.info["tool_errors"].tolist())
    print("said", res.info["errors"])
    print("alive")
''')

REWARD = textwrap.dedent("""
    import os, sys
    from mmrl.reward import RewardFunctionError, as_reward

    def {name}(completions, **kwargs):
        {body}

    try:
        as_reward({name}, "text").score(["a", "b"], ["p", "q"], [{{}}, {{}}])
    except RewardFunctionError as exc:
        print("error:", exc)
    print("alive")
""")


def run_script(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_tool_that_exits_ends_only_its_episode_counted():
    res = run_script(TOOLS)
    assert res.returncode == 0 and "alive" in res.stdout, f"rc {res.returncode}: {res.stdout}{res.stderr[-2000:]}"
    assert "ended [True, True, True] tool_errors [1, 1, 0]" in res.stdout, res.stdout
    assert "sys.exit(3)" in res.stdout and "os._exit(5)" in res.stdout, res.stdout


@pytest.mark.parametrize(
    "name,body,words", [("quits", "sys.exit(3)", "sys.exit(3)"), ("dies", "os._exit(5)", "os._exit(5)")]
)
def test_a_reward_function_that_exits_is_one_line_naming_it(name, body, words):
    res = run_script(REWARD.format(name=name, body=body))
    assert res.returncode == 0 and "alive" in res.stdout, f"rc {res.returncode}: {res.stdout}{res.stderr[-2000:]}"
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("error:"))
    assert f"reward function {name}" in line or name in line, line
    assert words in line and "would have ended the whole run" in line, line


def test_exits_outside_user_code_still_end_the_process():
    code = "import os; from mmrl.utils.deadline import CallLimit; CallLimit(None).call(lambda: 1); os._exit(7)"
    assert run_script(code).returncode == 7
    assert run_script("import sys; from mmrl.utils.deadline import CallLimit; sys.exit(4)").returncode == 4
