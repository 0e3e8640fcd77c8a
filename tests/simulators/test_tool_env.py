"""The multi-turn tool simulator (`simulators.tool_env`): a tool call runs and the conversation goes
on, an answer ends the episode; a tool that raises, hangs past its limit or returns garbage, and an
unparseable call, end only their own episode, counted; caps on turns and tokens end episodes; a bad
tool fails in one line before any work; the reward stage scores the answer, not the tool turns."""

import time

import pytest
import torch

from mmrl.data import load_dataset
from mmrl.errors import UserError
from mmrl.simulator import Completions
from mmrl.tools import ChatEnv, EnvReply, ToolError, parse_tool_calls, question_messages, tool_content
from simulators.tool_env import ToolEnvSim

DATA = {"dataset": "zoom_vqa", "dataset_kwargs": {"num_samples": 8}}


def call(name, **args):
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def echo(text: str) -> str:
    """Repeat a text.

    Args:
        text: what to repeat
    """
    return text


def boom(x: int) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("boom")


def hang(x: int) -> str:
    """Never answers in time.

    Args:
        x: anything
    """
    time.sleep(5)
    return "late"


def garbage(x: int) -> dict:
    """Returns what a message cannot hold.

    Args:
        x: anything
    """
    return {"x": x}


def sim_of(**kw):
    return ToolEnvSim(num_envs=kw.pop("num_envs", 4), tools=kw.pop("tools", [echo, boom, hang, garbage]), **DATA, **kw)


def test_a_tool_call_goes_on_and_an_answer_ends_the_episode():
    sim = sim_of(num_envs=2)
    obs = sim.reset(0)
    assert [m["role"] for m in obs.messages[0]] == ["user"] and obs.tools[0][0]["function"]["name"] == "echo"
    res = sim.step_chunk(Completions([call("echo", text="hi"), "square"], [6, 1]))
    assert res.terminated.tolist() == [False, True] and not res.truncated.any()
    assert res.info["tool_calls"].tolist() == [1, 0] and res.info["turns"].tolist() == [1, 1]
    conv = res.obs.messages[0]
    assert [m["role"] for m in conv] == ["user", "assistant", "tool"]
    assert conv[-1]["content"] == [{"type": "text", "text": "hi"}] and conv[1]["content"] == call("echo", text="hi")
    assert [m["role"] for m in res.final_obs.messages[1]] == ["user", "assistant"]  # ended as it was
    assert [m["role"] for m in res.obs.messages[1]] == ["user"]  # auto reset: the next question


def test_failing_tools_end_only_their_episode_counted():
    sim = sim_of(tool_timeout_s=0.3, num_envs=5)
    sim.reset(0)
    turns = [call("boom", x=1), call("hang", x=1), call("garbage", x=1), "<tool_call>{oops", call("echo", text="ok")]
    start = time.monotonic()
    res = sim.step_chunk(Completions(turns, [5] * 5))
    assert time.monotonic() - start < 3  # the hung call was left behind after its 0.3 s
    assert res.truncated.tolist() == [True, True, True, True, False] and not res.terminated.any()
    assert res.info["tool_errors"].tolist() == [1, 1, 1, 1, 0] and not res.info["capped"].any()
    errors = res.info["errors"]
    assert "RuntimeError: boom" in errors[0] and "timed out" in errors[1] and "returned dict" in errors[2]
    assert "unparseable" in errors[3] and errors[4] is None
    assert res.obs.messages[4][-1]["role"] == "tool"  # the healthy episode goes on
    res = sim.step_chunk(Completions([call("nope", x=1), "a", "b", "c", "circle"], [5] * 5))
    assert "does not exist" in res.info["errors"][0] and res.terminated[4]


def test_caps_on_turns_and_tokens_end_episodes_counted():
    sim = sim_of(num_envs=2, max_turns=2, max_total_tokens=10)
    sim.reset(0)
    res = sim.step_chunk(Completions([call("echo", text="a"), call("echo", text="b")], [3, 10]))
    assert res.truncated.tolist() == [False, True] and res.info["capped"].tolist() == [False, True]
    res = sim.step_chunk(Completions([call("echo", text="a"), call("echo", text="b")], [3, 3]))
    assert res.truncated.tolist() == [True, False] and res.info["capped"].tolist() == [True, False]
    assert res.info["turns"].tolist() == [2, 1] and not res.info["tool_errors"].any()


def test_a_tool_without_hints_or_docstring_fails_in_one_line_before_any_work(monkeypatch):
    import mmrl.data

    monkeypatch.setattr(mmrl.data, "load_dataset", lambda *a, **k: pytest.fail("built the dataset first"))

    def bare(x):
        return x

    with pytest.raises(UserError, match=r"tool .*bare.* no docstring.*Fix: give every argument a type hint"):
        ToolEnvSim(num_envs=1, tools=[bare], **DATA)


def test_parsing_and_tool_results():
    assert parse_tool_calls("the answer is 3") == []
    (c,) = parse_tool_calls('think <tool_call>\n{"name": "zoom", "arguments": {"x": 1, "y": 2}}\n</tool_call>')
    assert (c.name, c.arguments) == ("zoom", {"x": 1, "y": 2})
    for bad in ('<tool_call>{"name": 3}</tool_call>', "<tool_call>[1]</tool_call>", "a </tool_call>"):
        with pytest.raises(ToolError):
            parse_tool_calls(bad)
    image = torch.zeros(4, 5, 3, dtype=torch.uint8)
    items = tool_content(["see", image.numpy()])
    assert items[0] == {"type": "text", "text": "see"} and torch.equal(items[1]["image"], image)
    with pytest.raises(ToolError, match="float32"):
        tool_content(torch.zeros(4, 5, 3))


def test_zoom_returns_the_full_resolution_crop_around_the_point():
    sim = ToolEnvSim(num_envs=1, env="zoom", **DATA)
    obs = sim.reset(0)
    shown = obs.messages[0][0]["content"][0]["image"]
    assert tuple(shown.shape) == (16, 16, 3)
    box = obs.meta[0]["box"]
    cx, cy = (box[0] + box[2]) // 2 // 4, (box[1] + box[3]) // 2 // 4  # the object's point in the 16 px image
    res = sim.step_chunk(Completions([call("zoom", x=cx, y=cy)], [5]))
    crop = res.obs.messages[0][-1]["content"][0]["image"]
    full = sim.images[int(sim._idx[0])][0]
    x0 = min(max(round((cx + 0.5) * 4 - 12), 0), 40)
    y0 = min(max(round((cy + 0.5) * 4 - 12), 0), 40)
    assert tuple(crop.shape) == (24, 24, 3) and torch.equal(crop, full[y0 : y0 + 24, x0 : x0 + 24])
    assert crop.flatten(0, 1).amax(0).sum() > 0  # the object is in the crop


def test_a_displayed_image_is_the_small_one_blown_up_and_zoom_still_counts_small_pixels():
    small, big = (ToolEnvSim(num_envs=1, env="zoom", env_kwargs=kw, **DATA) for kw in ({}, {"display_size": 64}))
    a, b = (s.reset(0).messages[0][0]["content"][0]["image"] for s in (small, big))
    assert tuple(b.shape) == (64, 64, 3) and torch.equal(b, a.repeat_interleave(4, 0).repeat_interleave(4, 1))
    crops = [
        s.step_chunk(Completions([call("zoom", x=5, y=9)], [5])).obs.messages[0][-1]["content"][0]["image"]
        for s in (small, big)
    ]
    assert torch.equal(crops[0], crops[1])
    with pytest.raises(ValueError, match="multiple of show_size"):
        ToolEnvSim(num_envs=1, env="zoom", env_kwargs={"display_size": 40}, **DATA)


def test_the_reward_stage_scores_the_answer_not_the_tool_turns_and_errors_get_the_failure_reward():
    from mmrl.algorithms.reward_synthesis import RewardSynthesis
    from mmrl.reward import as_reward
    from mmrl.trainer.reward_stage import RewardStage

    def always(completions, **kwargs):  # scores any text 1: only what the stage chooses to score gets it
        return [1.0] * len(completions)

    combine = RewardSynthesis(weights={"model": 1.0, "task": 1.0}, failure_penalty=-1.0)
    stage = RewardStage(as_reward(always, "text"), "text", 1.0, combine=combine, failure_term="truncated")
    sim = sim_of(num_envs=3)
    obs = sim.reset(0)
    acts = Completions([call("echo", text="a"), call("boom", x=1), "square"], [5, 5, 1])
    res = stage(sim.step_chunk(acts), obs, acts, torch.ones(3, dtype=torch.bool))
    assert res.reward.tolist() == [0.0, -1.0, 1.0] and res.success.tolist() == [False, False, True]


class Crashing(ChatEnv):
    """An OpenEnv-like environment (reset / step) whose step raises on its second turn."""

    def reset(self, record):
        self.turn = 0
        return question_messages(record)

    def step(self, messages):
        self.turn += 1
        if "crash" in messages[-1]["content"]:
            raise KeyError("lost state")
        return EnvReply([{"role": "user", "content": "go on"}], reward=0.5, done=self.turn >= 2)


def test_a_user_environment_steps_and_its_crash_ends_only_its_episode():
    sim = ToolEnvSim(num_envs=2, env=f"{__name__}:Crashing", **DATA)
    sim.reset(0)
    res = sim.step_chunk(Completions(["hello", "crash"], [1, 1]))
    assert res.reward.tolist() == [0.5, 0.0] and res.truncated.tolist() == [False, True]
    assert res.info["env_errors"].tolist() == [0, 1] and "KeyError" in res.info["errors"][1]
    assert res.obs.messages[0][-1] == {"role": "user", "content": "go on"}
    assert sim.step_chunk(Completions(["bye", "x"], [1, 1])).terminated[0]


class ScriptedTurns:
    """Drives the simulator with fixed turns per env (a test driver in the policy's place: the
    collector needs only ``chunk_size`` and ``rollout``)."""

    chunk_size = 1

    def __init__(self, turns: list[list[str]]):
        self.turns, self.turn = turns, 0

    def rollout(self, obs, generator=None, mode="eval"):
        from mmrl.batch import Batch

        texts = [t[min(self.turn, len(t) - 1)] for t in self.turns]
        self.turn += 1
        return Batch(x=torch.zeros(len(texts))), Completions(texts, [4] * len(texts))

    def train(self, mode=True):
        return self

    eval = train


def test_the_episodic_collector_sums_the_counters_over_each_episode():
    from mmrl.rollout import collect_episodes

    sim = sim_of()
    script = ScriptedTurns(
        [
            [call("echo", text="a"), "square"],  # one call, then the answer
            [call("echo", text="a"), call("echo", text="b"), "circle"],  # two calls
            ["square", call("echo", text="z")],  # answers at once (its next episode's call counts nowhere)
            [call("boom", x=1)],  # a tool error ends it, counted as an error, not as a call run
        ]
    )
    _, info = collect_episodes(script, sim, [0, 1, 2, 3], None, mode="eval")
    assert info["length"].tolist() == [2, 3, 1, 1]  # turns per episode
    counters = info["counters"]
    assert set(counters) == {"tool_calls", "tool_errors", "env_errors", "capped"}
    assert counters["tool_calls"].tolist() == [1, 2, 0, 0]
    assert counters["tool_errors"].tolist() == [0, 0, 0, 1]


def test_evaluation_reports_the_counters_per_episode():
    from mmrl.rollout import evaluate_policy

    script = ScriptedTurns(
        [
            [call("echo", text="a"), "square"],
            [call("echo", text="a"), call("echo", text="b"), "circle"],
            ["square", call("echo", text="z")],
            [call("boom", x=1)],
        ]
    )
    script.training = False  # what evaluate_policy reads and restores of a policy
    res = evaluate_policy(script, sim_of(), num_episodes=4, seed=0)
    # the same episodes as the collector's test above: per-episode means under the counters' names
    assert res["tool_calls"] == pytest.approx(3 / 4) and res["tool_errors"] == pytest.approx(1 / 4)
    assert res["env_errors"] == 0 and res["capped"] == 0 and res["length"] == pytest.approx(7 / 4)


def test_without_schemas_in_the_prompt_the_template_gets_no_tools_and_the_tools_still_run():
    shown, hidden = (ToolEnvSim(num_envs=1, env="zoom", schemas_in_prompt=s, **DATA) for s in (True, False))
    assert [t["function"]["name"] for t in shown.reset(0).tools[0]] == ["zoom"]
    assert hidden.reset(0).tools == [[]] and hidden.record(0)["tools"] == []
    res = hidden.step_chunk(Completions([call("zoom", x=5, y=9)], [5]))
    assert int(res.info["tool_calls"][0]) == 1 and int(res.info["tool_errors"][0]) == 0 and not res.done.any()
    assert res.obs.messages[0][-1]["role"] == "tool" and res.obs.tools == [[]]
    sim_kwargs = {"env": "zoom", "schemas_in_prompt": False, "dataset_kwargs": {"num_samples": 4}}
    demos = load_dataset("zoom_vqa", num_samples=4, demos=True, sim_kwargs=sim_kwargs)
    assert demos["tools"] == [[]] * 8 and len(demos["solution"]) == 8  # still the call and the answer per question


def test_a_gray_overview_is_the_luma_of_the_small_image_and_the_crop_keeps_its_colour():
    from simulators.qa import luma

    color, gray = (ToolEnvSim(num_envs=1, env="zoom", env_kwargs={"gray": g}, **DATA) for g in (False, True))
    a, b = (s.reset(0).messages[0][0]["content"][0]["image"] for s in (color, gray))
    assert (b == b[..., :1]).all() and (b[..., 0].float() - luma(a)).abs().max() <= 0.5
    crops = [
        s.step_chunk(Completions([call("zoom", x=5, y=9)], [5])).obs.messages[0][-1]["content"][0]["image"]
        for s in (color, gray)
    ]
    assert torch.equal(crops[0], crops[1])
    assert "grayscale" in gray.reset(0).messages[0][0]["content"][-1]["text"]
