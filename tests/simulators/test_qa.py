"""QASim: the contract checker, answers as byte actions, and the data order (an epoch-wise
permutation of the questions: consecutive seeds never repeat or skip a question)."""

import torch

from mmrl.checks.simulator import check_simulator
from simulators.qa import QASim, decode_answers, encode_answers

KW = dict(dataset="shapes_vqa", dataset_kwargs={"num_samples": 24, "tasks": ["count"]}, reward="counting")


def test_qa_sim_passes_the_checker():
    passed = check_simulator(lambda: QASim(num_envs=4, **KW), chunk_size=1, verbose=False)
    assert "determinism" in " ".join(passed) or passed


def test_answers_round_trip_as_actions():
    acts = encode_answers(["3", "héllo", ""], [2, 5, 1], width=8)
    assert acts.shape == (3, 1, 9)
    texts, n = decode_answers(acts[:, 0])
    assert texts == ["3", "héllo", ""] and n == [2, 5, 1]
    cut, _ = decode_answers(encode_answers(["ééééé"], [1], width=5)[:, 0])
    assert cut == ["éé"]  # cut at a character boundary, never a broken byte


def test_correct_answers_score_and_succeed():
    sim = QASim(num_envs=4, **KW)
    sim.reset([0, 1, 2, 3])
    answers = [sim.meta[i]["answer"] for i in sim._idx.tolist()]
    answers[1] = "nine hundred"
    res = sim.step_chunk(encode_answers(answers, [1] * 4, sim.answer_bytes))
    assert res.reward.tolist() == [1.0, 0.0, 1.0, 1.0] and res.success.tolist() == [True, False, True, True]
    assert res.done.all() and res.info["answers"][1] == "nine hundred"


def test_data_order_is_a_permutation_per_epoch():
    sim = QASim(num_envs=4, **KW)
    first = sim.question_index(list(range(24))).tolist()
    second = sim.question_index(list(range(24, 48))).tolist()
    assert sorted(first) == list(range(24)) and sorted(second) == list(range(24))
    assert first != second  # reshuffled each epoch
    assert sim.question_index([5, 30]).tolist() == [first[5], second[6]]  # a pure function of the seed
