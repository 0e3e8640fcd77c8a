"""Issue 19: a reward is any Python function, TRL style (``fn(completions, **kwargs) -> list[float]``),
given from YAML / the CLI as 'module:function' or 'path/file.py:function' or from Python; several
rewards are summed with weights (``reward.weights``), each part logged as ``rewards/<name>/mean``;
the dataset's columns (the question's meta) reach the function as keyword arguments."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

pytest.importorskip("transformers")

from mmrl.config import ConfigError
from mmrl.experiment import build_reward, build_trainer, load_experiment
from mmrl.reward import FunctionReward, RewardFunctionError, WeightedSum, as_reward, import_reference
from tests.trainer.test_vlm_training import TINY

REWARDS_PY = textwrap.dedent('''
    CALLS = []

    def exact(completions, answer, **kwargs):
        """TRL style: the dataset's `answer` column arrives as a keyword, one value per completion."""
        CALLS.append(sorted(kwargs))
        return [1.0 if c.strip().lower() == str(a).lower() else 0.0 for c, a in zip(completions, answer)]

    def brevity(completions, scale=10.0, **kwargs):
        return [-len(c) / scale for c in completions]

    def only_colors(completions, task=None, **kwargs):
        """None where the reward does not apply (TRL's convention)."""
        return [1.0 if t == "color" else None for t in task]
''')


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(REWARDS_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    # imported as `my_rewards`: forgotten afterwards, or a later test's own my_rewards.py (the docs'
    # example) would get this one from sys.modules
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    yield tmp_path / "my_rewards.py"
    sys.modules.pop("my_rewards", None)


def cfg(tmp_path, *extra):
    return load_experiment("configs/vlm_quickstart.yaml", [f"run.output_dir={tmp_path}", "run.name=f", *TINY, *extra])


def test_a_plain_function_scores_with_the_dataset_columns_as_keywords():
    def exact(completions, answer, prompts=None):
        assert prompts == ["p", "q"]
        return [float(c == a) for c, a in zip(completions, answer)]

    reward = as_reward(exact, "text")
    assert isinstance(reward, FunctionReward) and reward.name == "exact"
    assert reward(["2", "3"], ["p", "q"], [{"answer": "2"}, {"answer": "4"}]).tolist() == [1.0, 0.0]
    # a numpy array or tensor is fine too; a wrong count names the function
    assert as_reward(lambda c, **k: torch.ones(len(c)), "text")(["a"], ["p"]).tolist() == [1.0]
    with pytest.raises(RewardFunctionError, match="returned 1 score for 2 samples"):
        as_reward(lambda c, **k: [1.0], "text", name="short")(["a", "b"], ["p", "q"])


def test_weighted_parts_skip_a_none_and_are_nan_only_when_every_part_is():
    a = as_reward(lambda c, **k: [1.0, None, None], "text", name="a")
    b = as_reward(lambda c, **k: [2.0, 4.0, None], "text", name="b")
    total = WeightedSum({"a": a, "b": b}, [0.5, 0.25])(["x", "y", "z"], ["p"] * 3)
    assert total[:2].tolist() == [1.0, 1.0] and torch.isnan(total[2])


def test_references_import_from_a_module_or_a_file_and_fail_clearly(user_rewards):
    assert import_reference("my_rewards:exact").__name__ == "exact"
    assert import_reference(f"{user_rewards}:brevity").__name__ == "brevity"
    with pytest.raises(ValueError, match="has no 'nope'.*callables there: brevity, exact, only_colors"):
        import_reference("my_rewards:nope")
    with pytest.raises(ValueError, match="not found"):
        import_reference("missing/file.py:f")


def test_a_function_reward_trains_the_vlm_quickstart_from_yaml(tmp_path, user_rewards):
    trainer = build_trainer(cfg(tmp_path, f"reward.type={user_rewards}:exact", "trainer.iterations=1"))
    trainer.run()
    rows = [json.loads(x) for x in (tmp_path / "f" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/policy_loss" in r]
    assert len(train) == 1 and 0.0 <= train[0]["train/rewards/exact/mean"] <= 1.0
    # TRL's completion statistics and table: 8 rows of prompt, completion and reward
    assert (
        1
        <= train[0]["train/completions/min_length"]
        <= train[0]["train/completions/mean_length"]
        <= train[0]["train/completions/max_length"]
        <= 4
    )  # policy.max_new_tokens
    table = train[0]["train/completions"]
    assert len(table) == 8 and set(table[0]) == {"prompt", "completion", "reward"}
    assert sum(r["reward"] for r in table) / 8 >= 0.0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "f" / "tb"), size_guidance={"tensors": 0}).Reload()
    assert "config/text_summary" in events.Tags()["tensors"]
    assert "train/completions/text_summary" in events.Tags()["tensors"]


def test_weighted_multi_reward_logs_each_part(tmp_path, user_rewards):
    c = cfg(
        tmp_path,
        "reward.type=weighted_sum",
        "reward.weights={short_answer: 0.7, 'my_rewards:brevity': 0.3}",
        "reward.kwargs={'my_rewards:brevity': {scale: 4.0}}",
        "trainer.iterations=1",
    )
    stage = build_reward(c)
    assert stage.name == "weighted_sum" and [k for k, _ in stage.model.items] == ["short_answer", "brevity"]
    build_trainer(c).run()
    rows = [json.loads(x) for x in (tmp_path / "f" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/policy_loss" in r][0]
    assert 0.0 <= train["train/rewards/short_answer/mean"] <= 1.0
    assert train["train/rewards/brevity/mean"] < 0  # -len/4 of non-empty answers


def test_dataset_columns_reach_the_function(user_rewards):
    import my_rewards

    stage_cfg = load_experiment("configs/vlm_quickstart.yaml", ["reward.type=my_rewards:exact", *TINY])
    reward = build_reward(stage_cfg).model
    my_rewards.CALLS.clear()
    reward(["2"], ["how many?"], [{"answer": "2", "task": "count"}])
    assert my_rewards.CALLS == [["prompts", "task"]]


@pytest.mark.parametrize(
    "override,words",
    [
        ("reward.type=my_rewards:nope", "has no 'nope'"),
        ("reward.type=nowhere.module:f", "cannot import module 'nowhere.module'"),
        ("reward.type=no_such_reward", "nor a function reference"),
        ("reward.weights={short_answer: 1.0, bogus: 1.0}", r"drop 'type' \('short_answer'\) or set it to weighted_sum"),
        ("reward={weights: {short_answer: 1.0, bogus: 1.0}}", "'bogus' is not a registered reward"),
        ("reward={success_threshold: 1.0}", "'type' is required"),
        ("reward.kwargs={other: {}}", None),
    ],
)
def test_bad_reward_references_fail_at_load_time(user_rewards, override, words):
    extra = [override] if words else ["reward={weights: {short_answer: 1.0}}", override]
    with pytest.raises(ConfigError, match=words or "name no part of 'weights'"):
        load_experiment("configs/vlm_quickstart.yaml", [*TINY, *extra])


def test_python_api_trains_with_a_function_and_evaluate_reproduces_it(tmp_path):
    import mmrl

    def exact(completions, answer, **kwargs):  # defined here (not importable): kept in mmrl.api
        return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]

    results = mmrl.train(
        "configs/vlm_quickstart.yaml",
        f"run.output_dir={tmp_path}",
        "run.name=api",
        *TINY,
        "trainer.iterations=1",
        reward=exact,
    )
    saved = (tmp_path / "api" / "checkpoints" / "iter_000001" / "config.yaml").read_text()
    assert "type: mmrl.api:" in saved and "exact" in saved
    report = mmrl.evaluate(tmp_path / "api")
    assert report["success_rate"] == results["final"]["success_rate"]
    assert report["return"] == results["final"]["return"]


def test_a_weighted_sum_preflights_every_part():
    from mmrl.reward import RewardError

    class Down(FunctionReward):
        def preflight(self):
            raise RewardError("server down")

    ok = as_reward(lambda c, **k: [1.0] * len(c), "text", name="ok")
    with pytest.raises(RewardError, match="server down"):
        WeightedSum({"ok": ok, "down": Down(lambda c, **k: [0.0] * len(c), "text")}, [1.0, 1.0]).preflight()
