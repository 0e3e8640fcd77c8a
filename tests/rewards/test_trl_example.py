"""Issue 31: a TRL GRPO example as TRL documents it trains with mmrl unchanged: its dataset (a
``prompt`` column, conversational or standard, an ``image``, a ``solution``), its reward functions
(`trl.rewards.accuracy_reward` and `think_format_reward` themselves, a reward file written for TRL)
given as TRL's ``reward_funcs`` list with ``reward_weights``, in YAML and in Python."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("transformers")

from mmrl.config import ConfigError
from mmrl.experiment import RewardConfig, build_trainer, load_experiment
from mmrl.reward import RewardFunctionError, as_reward
from tests.trainer.test_vlm_training import TINY

#: TRL's documented example of a reward for the standard format (completions are strings)
TRL_REWARD_FILE = textwrap.dedent("""
    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]
""")


def trl_dataset(folder, conversational: bool) -> str:
    """Rows as TRL's VLM GRPO example builds them: an image, a problem, a ``solution``."""
    from PIL import Image

    rows = []
    for i in range(12):
        Image.new("RGB", (32, 32), color=(40 * (i % 6), 255 - 20 * i, 90)).save(folder / f"img{i}.png")
        problem = f"How many shapes are there in picture {i}?"
        if conversational:
            prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": problem}]}]
        else:
            prompt = problem
        rows.append({"prompt": prompt, "image": f"img{i}.png", "solution": str(i % 4)})
    path = folder / ("conversational.jsonl" if conversational else "standard.jsonl")
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def overrides(tmp_path, data: str, name: str) -> list[str]:
    return [
        f"run.output_dir={tmp_path}",
        f"run.name={name}",
        *TINY,
        "sim.kwargs.dataset=vlm_records",
        f"sim.kwargs.dataset_kwargs={{path: {data}}}",
        "warm_start.dataset=null",
    ]


def train_rows(tmp_path, name) -> list[dict]:
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/policy_loss" in r]


def test_trl_rewards_and_a_conversational_dataset_train_unchanged(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("math_verify")  # trl.rewards.accuracy_reward needs it (the bench extra)
    data = trl_dataset(tmp_path, conversational=True)
    funcs = "reward.type=[trl.rewards:accuracy_reward, trl.rewards:think_format_reward]"
    cfg = load_experiment(
        "configs/vlm_quickstart.yaml", [*overrides(tmp_path, data, "conv"), funcs, "reward.weights=[1.0, 0.5]"]
    )
    assert cfg.reward.weights == {"trl.rewards:accuracy_reward": 1.0, "trl.rewards:think_format_reward": 0.5}
    build_trainer(cfg).run()
    rows = train_rows(tmp_path, "conv")
    assert len(rows) == 2
    for r in rows:  # each TRL function scored every completion (think_format: 0, no <think> from a tiny model)
        assert 0.0 <= r["train/rewards/accuracy_reward/mean"] <= 1.0
        assert r["train/rewards/think_format_reward/mean"] == 0.0
        # the statistics TRL users look for: per function std, reward std over groups, dead groups
        assert r["train/rewards/think_format_reward/std"] == 0.0 and r["train/rewards/accuracy_reward/std"] >= 0
        assert r["train/reward_std"] >= 0 and 0.0 <= r["train/frac_reward_zero_std"] <= 1.0


def test_a_trl_reward_file_and_a_standard_dataset_train_from_python(tmp_path, monkeypatch):
    import mmrl

    (tmp_path / "my_trl_rewards.py").write_text(TRL_REWARD_FILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_trl_rewards import reward_len

    def exact_solution(completions, solution, **kwargs):  # the solution column arrives as TRL passes it
        return [float(c.strip() == s) for c, s in zip(completions, solution)]

    data = trl_dataset(tmp_path, conversational=False)
    mmrl.train(
        "configs/vlm_quickstart.yaml",
        *overrides(tmp_path, data, "std"),
        reward=[reward_len, exact_solution],
        reward_weights=[0.1, 1.0],
    )
    rows = train_rows(tmp_path, "std")
    assert len(rows) == 2 and all(r["train/rewards/reward_len/mean"] < 0 for r in rows)
    assert all(0.0 <= r["train/rewards/exact_solution/mean"] <= 1.0 for r in rows)
    saved = (tmp_path / "std" / "checkpoints" / "iter_000002" / "config.yaml").read_text()
    assert "my_trl_rewards:reward_len: 0.1" in saved  # recorded by reference: the run resumes anywhere


def test_completions_take_trls_form_for_the_prompts_form():
    """Chat-message prompts (``meta["messages"]``): completions as ``[{"role": "assistant", ...}]``
    and prompts as the messages, as TRL passes them; string prompts: strings."""
    seen = {}

    def spy(completions, prompts, solution, **kwargs):
        seen.update(completions=completions, prompts=prompts, solution=solution, kwargs=sorted(kwargs))
        return [1.0] * len(completions)

    reward = as_reward(spy, "text")
    chat = [{"role": "user", "content": "1+1?"}]
    reward(["2"], ["1+1?"], [{"messages": chat, "solution": "2", "answer": "2"}])
    assert seen["completions"] == [[{"role": "assistant", "content": "2"}]] and seen["prompts"] == [chat]
    assert seen["solution"] == ["2"] and seen["kwargs"] == ["answer"]  # the messages became the prompts
    reward(["2"], ["1+1?"], [{"solution": "2"}])
    assert seen["completions"] == ["2"] and seen["prompts"] == ["1+1?"]


def test_a_conversational_reward_on_string_prompts_says_why_in_one_line():
    def conversational_only(completions, **kwargs):
        return [float(len(c[0]["content"])) for c in completions]

    with pytest.raises(
        RewardFunctionError, match=r"the completions are strings: the dataset's prompts are strings.*chat messages"
    ):
        as_reward(conversational_only, "text")(["2"], ["1+1?"], [{}])


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"type": ["a.py:f", "b.py:g"], "weights": [1.0]}, "must be a list of 2 numbers, one per reward"),
        ({"type": "short_answer", "weights": [1.0]}, "is a list, TRL's reward_weights: give 'type' the list"),
        ({"type": []}, "empty list"),
        ({"type": ["short_answer", "short_answer"]}, "twice"),
    ],
)
def test_trl_list_forms_fail_in_one_line(kwargs, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        RewardConfig(**kwargs).validate()


def test_trl_list_forms_become_the_weighted_mapping():
    cfg = RewardConfig(type=["short_answer", "counting"], weights=[1.0, 0.5])
    cfg.validate()
    assert cfg.type is None and cfg.weights == {"short_answer": 1.0, "counting": 0.5}
    cfg = RewardConfig(type=["short_answer", "counting"])
    cfg.validate()
    assert cfg.weights == {"short_answer": 1.0, "counting": 1.0}
    one = RewardConfig(type=["short_answer"])
    one.validate()
    assert one.type == "short_answer" and one.weights == {}


def test_mmrl_check_reward_takes_a_function_as_reward_type_does(tmp_path, capsys):
    from mmrl.cli import main

    (tmp_path / "my_trl_rewards.py").write_text(TRL_REWARD_FILE)
    assert main(["check", "reward", f"{tmp_path}/my_trl_rewards.py:reward_len"]) == 0
    assert "passed 8 contract checks" in capsys.readouterr().out
    assert main(["check", "reward", f"{tmp_path}/my_trl_rewards.py:nope"]) == 2
    assert "has no 'nope'" in capsys.readouterr().err
    assert main(["check", "reward", f"{tmp_path}/my_trl_rewards.py:reward_len", "kind=audio"]) == 2  # not a reward kind


def test_a_hugging_face_dataset_object_and_a_save_to_disk_folder_train(tmp_path, capsys):
    """Issue 31: TRL's train_dataset= (a datasets.Dataset) is accepted, saved in the run folder so the
    run's config names it; a save_to_disk folder is a vlm_records path; and the quickstart says when its
    warm start is on its demo questions, not the user's data."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    import mmrl

    rows = [
        {
            "prompt": f"How many shapes are there in picture {i}?",
            "image": Image.new("RGB", (32, 32), (9 * i, 0, 0)),
            "solution": str(i % 3),
        }
        for i in range(12)
    ]
    ds = datasets.Dataset.from_list(rows)
    tiny = [f"run.output_dir={tmp_path}", "run.name=hf", *(o for o in TINY if "dataset_kwargs" not in o)]
    mmrl.train("configs/vlm_quickstart.yaml", *tiny, train_dataset=ds, eval_dataset=ds.select(range(4)))
    out = capsys.readouterr().out
    assert (
        "warm start: supervised on 16 examples of 'shapes_vqa' (warm_start.dataset), not of the RL data 'vlm_records'"
        in out
    )
    assert (tmp_path / "hf" / "data" / "dataset_dict.json").is_file() and len(train_rows(tmp_path, "hf")) == 2
    from mmrl.data import load_dataset

    saved = load_dataset("vlm_records", path=str(tmp_path / "hf" / "data"), split="eval")
    assert (
        len(saved["prompt"]) == 4 and saved["meta"][1]["answer"] == "1" and saved["images"][0][0].shape == (32, 32, 3)
    )
