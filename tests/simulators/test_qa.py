"""QASim: the contract checker, answers as text actions scored by the trainer's reward stage, and
the data order (an epoch-wise permutation of the questions: consecutive seeds never repeat or skip
a question)."""

import pytest
import torch

from mmrl.checks.simulator import check_simulator
from mmrl.registry import REWARDS
from mmrl.reward import RewardError
from mmrl.simulator import Completions
from mmrl.trainer.reward_stage import RewardStage
from simulators.qa import QASim

KW = dict(dataset="shapes_vqa", dataset_kwargs={"num_samples": 24, "tasks": ["count"]})


def test_qa_sim_passes_the_checker():
    passed = check_simulator(lambda: QASim(num_envs=4, **KW), chunk_size=1, verbose=False)
    assert "single_turn" in passed and "state_roundtrip" in passed


def test_the_simulator_pays_nothing_the_reward_stage_scores_the_answers():
    sim = QASim(num_envs=4, **KW)
    obs = sim.reset([0, 1, 2, 3])
    answers = [m["answer"] for m in obs.meta]
    answers[1] = "nine hundred"
    actions = Completions(answers, [1, 3, 1, 1])
    res = sim.step_chunk(actions)
    assert res.reward.tolist() == [0.0] * 4 and not res.success.any()  # no task reward of its own
    assert res.done.all() and res.info["answers"][1] == "nine hundred"
    stage = RewardStage(REWARDS.build("counting"), "text", success_threshold=1.0)
    res = stage(res, obs, actions, torch.tensor([True, True, True, False]))
    assert res.reward.tolist() == [1.0, 0.0, 1.0, 0.0]  # env 3 was not acting: not scored
    assert res.success.tolist() == [True, False, True, False]


def test_reward_stage_passes_token_counts_and_names_a_failing_reward():
    seen = []

    class Spy(REWARDS.get("counting")):
        def score(self, samples, prompts, meta):
            seen.extend(m["completion_tokens"] for m in meta)
            raise KeyError("boom")

    sim = QASim(num_envs=2, **KW)
    obs = sim.reset(0)
    actions = Completions(["1", "2"], [4, 7])
    with pytest.raises(RewardError, match="reward 'spy' failed on 2 samples.*KeyError"):
        RewardStage(Spy(), "text", name="spy")(sim.step_chunk(actions), obs, actions, torch.ones(2, dtype=torch.bool))
    assert seen == [4, 7]


def test_actions_of_the_wrong_type_are_refused():
    with pytest.raises(ValueError, match="takes 2 answers"):
        QASim(num_envs=2, **KW).step_chunk(torch.zeros(2, 1, 9))


def test_data_order_is_a_permutation_per_epoch():
    sim = QASim(num_envs=4, **KW)
    first = sim.question_index(list(range(24))).tolist()
    second = sim.question_index(list(range(24, 48))).tolist()
    assert sorted(first) == list(range(24)) and sorted(second) == list(range(24))
    assert first != second  # reshuffled each epoch
    assert sim.question_index([5, 30]).tolist() == [first[5], second[6]]  # a pure function of the seed


def test_a_split_inside_dataset_kwargs_is_refused_naming_the_simulator_argument():
    from simulators.qa import QASim

    with pytest.raises(ValueError, match=r"sim.kwargs.split for training, sim.eval_kwargs.split"):
        QASim(num_envs=2, dataset="shapes_vqa", dataset_kwargs={"num_samples": 8, "split": "test"})
