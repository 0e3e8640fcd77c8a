r"""Verifiable text rewards (rewards/verifiable.py): hand-computed parsing, normalisation, IoU and DAPO cases."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from mmrl.registry import REWARDS
from rewards import WeightedSum, check_reward
from rewards.verifiable import (
    Counting,
    FormatReward,
    GroundingIoU,
    MathAnswer,
    MathWithFormat,
    MultipleChoice,
    OverlongPenalty,
    ShortAnswer,
    answers_match,
    box_iou,
    canonical_number,
    extract_choice,
    extract_count,
    extract_final_answer,
    format_ok,
    normalize_answer,
    normalize_short_answer,
    parse_box,
    rescale_box,
    soft_overlong_penalty,
    to_fraction,
)

TEXT_REWARDS = [
    "math_answer",
    "multiple_choice",
    "counting",
    "short_answer",
    "grounding_iou",
    "format",
    "overlong_penalty",
    "math_with_format",
]


def one(reward, completion, meta=None):
    return reward([completion], ["q"], None if meta is None else [meta]).item()


# ---------------------------------------------------------------------------------------------
# math_answer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{3} first, finally \boxed{4}", "4"),  # the last box
        (r"\fbox{12}", "12"),
        (r"\boxed {x^{2}+1}", "x^{2}+1"),
        (r"<answer> 5 </answer> and 7", " 5 "),  # a tag beats the last number
        (r"<answer>1</answer> \boxed{2}", "2"),  # a box beats a tag
        ("we get 1,000 apples", "1,000"),
        ("it is 3.14 or -3", "-3"),
        ("5-3 = 2.", "2"),  # "-3" inside "5-3" is not negative; the trailing dot is not part of it
        ("about 1e3 of them", "1e3"),
        ("ratio 1/2", "1/2"),
        ("no number here", None),
        ("v2 is a name", None),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("$42$", "42"),
        (" 42. ", "42"),
        ("1,000,000", "1000000"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"3\!000", "3000"),
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        ("90°", "90"),
        (r"50\%", "50"),
        ("50%", "50"),
        (r"5 \text{ cm}", "5"),  # unit dropped
        (r"\text{Red}", "red"),  # nothing else: unwrapped, lower-cased
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        (r"\tfrac12", r"\frac12"),
        ("x = 5", "5"),
        (r"\$1,200", "1200"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize(
    "s, expected",
    [
        ("1/2", Fraction(1, 2)),
        (r"\frac{1}{2}", Fraction(1, 2)),
        (r"\frac12", Fraction(1, 2)),
        (r"-\frac{3}{4}", Fraction(-3, 4)),
        ("0.5", Fraction(1, 2)),
        ("-3", Fraction(-3)),
        ("2.50", Fraction(5, 2)),
        ("1e3", Fraction(1000)),
        (".5", Fraction(1, 2)),
        ("1/0", None),
        ("red", None),
        (r"\sqrt{2}", None),
    ],
)
def test_to_fraction(s, expected):
    assert to_fraction(s) == expected


@pytest.mark.parametrize(
    "pred, gold, expected",
    [
        ("1/2", "0.5", True),
        (r"\frac{1}{2}", "1/2", True),
        (r"\dfrac12", 0.5, True),
        ("2.50", "2.5", True),
        ("-3", -3, True),
        ("1e3", "1000", True),
        ("1,000", 1000, True),
        ("50%", "50", True),
        (r"50\%", 50, True),
        (r"90^\circ", "90", True),
        (r"5\text{ cm}", "5", True),
        ("0.333333333", "1/3", True),  # rel diff 1e-9
        ("0.3333", "1/3", False),  # rel diff 1e-4 > 1e-6
        ("1000000", "1000001", False),  # integers compare exactly, no tolerance
        ("Red", "red", True),
        ("blue", "red", False),
        ("", "0", False),
        ("3", "4", False),
    ],
)
def test_answers_match(pred, gold, expected):
    assert answers_match(pred, gold) is expected


def test_answers_match_rel_tol_option():
    assert answers_match("0.3333", "1/3", rel_tol=1e-3)
    assert not answers_match("0.333333333", "1/3", rel_tol=0.0)


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        (r"... so the answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
        (r"\boxed{2} no wait \boxed{3}", 3, 1.0),
        ("<think>6*7</think><answer>42</answer>", "42", 1.0),
        ("It costs $1,250.", 1250, 1.0),
        ("It is 41.", "42", 0.0),
        ("It is a red cube.", "red", 0.0),  # no box, tag or number
        (r"\boxed{\text{red}}", "Red", 1.0),
        ("about 7", ["7", "seven"], 1.0),  # a list of accepted answers
    ],
)
def test_math_answer_reward(completion, answer, expected):
    assert one(MathAnswer(), completion, {"answer": answer}) == expected


# ---------------------------------------------------------------------------------------------
# multiple_choice and counting
# ---------------------------------------------------------------------------------------------

OPTIONS = ["red", "blue", "green", "yellow"]


@pytest.mark.parametrize(
    "text, options, expected",
    [
        (r"\boxed{B}", None, "B"),
        ("<answer>B</answer>", None, "B"),
        ("Answer: (B)", None, "B"),
        ("the answer is B", None, "B"),
        ("B", None, "B"),
        ("B.", None, "B"),
        ("(C) because ...", None, "C"),
        ("**Answer:** D", None, "D"),
        ("The best option is option E.", None, "E"),
        (r"Answer: A. Hmm, no: the answer is \boxed{C}", None, "C"),  # the last explicit one wins
        ("A is wrong; <answer>(E)</answer>", None, "E"),
        ("F", None, None),  # not among the choices
        ("A red cube is shown.", None, None),  # an article, not a choice
        ("blue", OPTIONS, "B"),
        ("The answer is green.", OPTIONS, "C"),
        ("<answer>Yellow</answer>", OPTIONS, "D"),
        ("purple", OPTIONS, None),
    ],
)
def test_extract_choice(text, options, expected):
    assert extract_choice(text, options=options) == expected


def test_multiple_choice_reward():
    r = MultipleChoice()
    assert one(r, "Answer: (B)", {"answer": "B"}) == 1.0
    assert one(r, "Answer: (B)", {"answer": "C"}) == 0.0
    assert one(r, "blue", {"answer": "B", "options": OPTIONS}) == 1.0
    assert one(r, "B", {"answer": "blue", "options": OPTIONS}) == 1.0  # gold given as option text
    assert one(MultipleChoice(choices="ABCDEFGH"), "the answer is G", {"answer": "G"}) == 1.0
    with pytest.raises(ValueError, match="not one of the choices"):
        one(r, "B", {"answer": "42"})


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3", 3),
        ("There are three cubes.", 3),
        ("Three", 3),
        (r"\boxed{12}", 12),
        ("<answer>seven</answer>", 7),
        ("I see 2 red and 5 blue, so twenty", 20),
        ("zero", 0),
        (r"\boxed{4} (not 5)", 4),
        ("3.5", None),
        ("none", None),
    ],
)
def test_extract_count(text, expected):
    assert extract_count(text) == expected


def test_counting_reward():
    r = Counting()
    assert one(r, "There are three.", {"answer": 3}) == 1.0
    assert one(r, "3", {"answer": "three"}) == 1.0
    assert one(r, "four", {"answer": "3"}) == 0.0
    with pytest.raises(ValueError, match="is not an integer"):
        one(r, "3", {"answer": "red"})


# ---------------------------------------------------------------------------------------------
# short_answer
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("red", "red"),
        ("  Red.  ", "red"),
        ("RED!", "red"),
        ('"red"', "red"),
        ("**red**", "red"),
        ("The red", "red"),
        ("a square", "square"),
        ("an apple", "apple"),
        ("theory", "theory"),  # whole words only
        ("<answer> Blue </answer>", "blue"),
        (r"it is \boxed{\text{Green}}", "green"),
        (r"\boxed{2} <answer>3</answer>", "2"),  # a box beats a tag (as math_answer)
        ("three", "3"),
        ("Three.", "3"),
        ("zero", "0"),
        ("3.0", "3"),
        ("+3", "3"),
        ("1,000", "1000"),
        ("2.50", "5/2"),
        ("0.5", "1/2"),
        ("3 shapes", "3 shapes"),
        ("light-blue", "light-blue"),
        ("yes,   no", "yes no"),
        ("", ""),
        ("...", ""),
        ("the", ""),
    ],
)
def test_normalize_short_answer(text, expected):
    assert normalize_short_answer(text) == expected


@pytest.mark.parametrize(
    "word, expected",
    [
        ("3", "3"),
        ("03", "3"),
        ("-2", "-2"),
        ("12,345", "12345"),
        ("1,00", "1,00"),
        ("1.25", "5/4"),
        ("red", "red"),
        ("3rd", "3rd"),
    ],
)
def test_canonical_number(word, expected):
    assert canonical_number(word) == expected


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("Red.", "red", 1.0),
        ("the red", "Red", 1.0),
        ("<answer>red</answer>", "red", 1.0),
        ("red blue", "red", 0.0),  # hedging two answers is wrong
        ("reddish", "red", 0.0),
        ("It is red.", "red", 0.0),  # exact match, not containment
        ("3", "3", 1.0),
        ("three", "3", 1.0),
        ("3", "three", 1.0),
        ("\\boxed{3}", 3, 1.0),
        ("4", "3", 0.0),
        ("3 shapes", "3", 0.0),
        ("", "0", 0.0),
        ("yes", "No", 0.0),
        ("No.", "no", 1.0),
        ("crimson", ["red", "crimson"], 1.0),  # a list of accepted answers
    ],
)
def test_short_answer_reward(completion, answer, expected):
    assert one(ShortAnswer(), completion, {"answer": answer}) == expected


def test_short_answer_scores_every_shapes_vqa_gold_answer():
    from mmrl.data import builder_module

    svqa = builder_module("shapes_vqa")
    r = ShortAnswer()
    for task in svqa.TASKS:
        for split in svqa.SPLITS:
            d = svqa.build(24, split=split, tasks=[task])
            assert r(d["solution"], d["prompt"], d["meta"]).tolist() == [1.0] * 24, (task, split)
            # every answer against a question with a different answer scores 0
            wrong = [next(a for a in d["solution"] if a != g) for g in d["solution"]]
            assert r(wrong, d["prompt"], d["meta"]).tolist() == [0.0] * 24, (task, split)


def test_short_answer_rejects_an_empty_gold_answer():
    with pytest.raises(ValueError, match=r"meta\[0\]\['answer'\] = 'the' is empty once normalised"):
        one(ShortAnswer(), "the", {"answer": "the"})


# ---------------------------------------------------------------------------------------------
# grounding_iou
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[10, 20, 30, 40]", [10, 20, 30, 40]),
        ('[{"bbox_2d": [1.5, 2, 3, 4.5], "label": "cat"}]', [1.5, 2, 3, 4.5]),
        ("(10,20),(30,40)", [10, 20, 30, 40]),
        ("<box>1, 2, 3, 4</box>", [1, 2, 3, 4]),
        ("<|box_start|>(5,6),(7,8)<|box_end|>", [5, 6, 7, 8]),
        ("box [0, 1] then [9, 8, 7, 6, 5]", [8, 7, 6, 5]),  # the last 4 numbers of the last >= 4-number group
        ("<box>1,2,3,4</box> [9, 9, 9, 9]", [1, 2, 3, 4]),  # a box tag is preferred
        ("no box", None),
        ("[1, 2, 3]", None),
    ],
)
def test_parse_box(text, expected):
    assert parse_box(text) == expected


def test_box_iou_hand_cases():
    assert box_iou([0, 0, 2, 2], [1, 1, 3, 3]) == pytest.approx(1 / 7)  # inter 1, union 4 + 4 - 1
    assert box_iou([0, 0, 2, 2], [0, 0, 2, 2]) == 1.0
    assert box_iou([0, 0, 1, 1], [2, 2, 3, 3]) == 0.0
    assert box_iou([0, 0, 4, 2], [2, 0, 6, 2]) == pytest.approx(4 / 12)
    assert box_iou([2, 2, 1, 3], [0, 0, 3, 3]) == 0.0  # degenerate (x2 < x1)


def test_rescale_box_rule():
    w_h = [200, 100]
    assert rescale_box([0.1, 0.2, 0.5, 1.0], w_h) == pytest.approx([20, 20, 100, 100])  # fractions
    assert rescale_box([100, 100, 500, 900], w_h) == pytest.approx([20, 10, 100, 90])  # doesn't fit -> /1000
    assert rescale_box([10, 10, 150, 90], w_h) == [10, 10, 150, 90]  # fits as pixels -> pixels
    assert rescale_box([10, 10, 150, 90], w_h, normalized=True) == pytest.approx([2, 1, 30, 9])  # forced /1000
    assert rescale_box([0.1, 0.2, 0.5, 1.0], w_h, normalized=False) == [0.1, 0.2, 0.5, 1.0]
    assert rescale_box([100, 100, 500, 1200], w_h) == [100, 100, 500, 1200]  # > 1000: pixels


def test_grounding_reward():
    r = GroundingIoU()
    assert one(r, "[1, 1, 3, 3]", {"box": [0, 0, 2, 2]}) == pytest.approx(1 / 7)
    assert one(r, "no box", {"box": [0, 0, 2, 2]}) == 0.0
    assert one(r, "[3, 3, 1, 1]", {"box": [0, 0, 2, 2]}) == 0.0  # degenerate prediction
    meta = {"box": [20, 20, 100, 100], "image_size": [200, 100]}
    assert one(r, "[0.1, 0.2, 0.5, 1.0]", meta) == pytest.approx(1.0)
    assert one(r, "[100, 200, 500, 1000]", meta) == pytest.approx(1.0)  # Qwen 0..1000 grid
    assert one(GroundingIoU(normalized=False), "[0.1, 0.2, 0.5, 1.0]", meta) == 0.0
    assert one(GroundingIoU(threshold=0.5), "[1, 1, 3, 3]", {"box": [0, 0, 2, 2]}) == 0.0
    assert one(GroundingIoU(threshold=0.1), "[1, 1, 3, 3]", {"box": [0, 0, 2, 2]}) == 1.0
    with pytest.raises(ValueError, match="image_size"):
        one(GroundingIoU(normalized=True), "[1, 1, 3, 3]", {"box": [0, 0, 2, 2]})
    with pytest.raises(ValueError, match=r"\[x1, y1, x2, y2\]"):
        one(r, "[1, 1, 3, 3]", {"box": [0, 0, 2]})


# ---------------------------------------------------------------------------------------------
# format and overlong
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, answer_only, expected",
    [
        ("<think>a\nb</think><answer>4</answer>", False, True),
        ("  <think>x</think>\n\n<answer>4</answer>\n", False, True),
        ("<answer>4</answer><think>x</think>", False, False),  # wrong order
        ("<think>x</think>", False, False),
        ("<think>x</think><answer>4</answer> trailing", False, False),
        ("<think>x</think><answer>4</answer><answer>5</answer>", False, False),  # two answers
        ("<think>x<think>y</think><answer>4</answer>", False, False),
        ("<answer>4</answer>", True, True),
        ("<think>x</think><answer>4</answer>", True, False),
        ("<answer>4</answer><answer>5</answer>", True, False),
    ],
)
def test_format_ok(text, answer_only, expected):
    assert format_ok(text, answer_only=answer_only) is expected


def test_format_reward_custom_tags():
    r = FormatReward(think_tag="reasoning", answer_tag="final")
    assert one(r, "<reasoning>x</reasoning><final>1</final>") == 1.0
    assert one(r, "<think>x</think><answer>1</answer>") == 0.0


@pytest.mark.parametrize(
    "length, expected",
    [
        (0, 0.0),
        (12, 0.0),
        (13, -1 / 8),
        (16, -0.5),
        (20, -1.0),
        (21, -1.0),
        (1000, -1.0),
    ],
)
def test_soft_overlong_penalty_regions(length, expected):
    assert soft_overlong_penalty(length, max_length=20, cache_length=8) == pytest.approx(expected)


def test_overlong_penalty_length_sources():
    r = OverlongPenalty(max_length=20, cache_length=8)
    assert one(r, "x", {"completion_tokens": 16}) == pytest.approx(-0.5)  # meta wins over the text
    assert one(r, "x" * 64) == pytest.approx(-0.5)  # 64 chars / 4.0 = 16 tokens
    assert one(OverlongPenalty(max_length=20, cache_length=8, chars_per_token=1.0), "x" * 12) == 0.0

    class WordTokenizer:  # stands in for a HF tokenizer: tokenizer(text).input_ids
        def __call__(self, text, add_special_tokens=True):
            return type("Enc", (), {"input_ids": text.split()})()

    assert one(OverlongPenalty(max_length=20, cache_length=8, tokenizer=WordTokenizer()), "a " * 16) == -0.5
    with pytest.raises(ValueError, match="completion_tokens"):
        one(r, "x", {"completion_tokens": -1})
    with pytest.raises(ValueError, match="cache_length"):
        OverlongPenalty(max_length=8, cache_length=20)


# ---------------------------------------------------------------------------------------------
# contract, registry, combination, missing meta
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TEXT_REWARDS)
def test_registered_text_rewards_pass_the_checker(name):
    reward = REWARDS.build(name)
    assert reward.kind == "text" and reward.name == name
    assert "rejects_bad_input" in check_reward(reward, kind="text")


@pytest.mark.parametrize(
    "name, good",
    [
        ("math_answer", {"answer": "1"}),
        ("multiple_choice", {"answer": "A"}),
        ("counting", {"answer": 1}),
        ("short_answer", {"answer": "red"}),
        ("grounding_iou", {"box": [0, 0, 1, 1]}),
    ],
)
def test_missing_meta_key_is_named(name, good):
    reward, key = REWARDS.build(name), next(iter(good))
    with pytest.raises(ValueError, match=rf"reward '{name}': meta\[1\] has no '{key}' key"):
        reward(["1", "2"], ["q", "q"], [good, {"other": 1}])
    with pytest.raises(ValueError, match=f"no '{key}' key"):
        reward(["1"], ["q"])  # no meta at all


def test_weighted_sum_of_text_rewards():
    completions = ["<think>6*7</think><answer>42</answer>", r"\boxed{42}", "<think>hm</think><answer>41</answer>"]
    meta = [{"answer": "42"}] * 3
    combo = WeightedSum({"math_answer": MathAnswer(), "format": FormatReward()}, [0.9, 0.1])
    assert combo(completions, ["q"] * 3, meta).tolist() == pytest.approx([1.0, 0.9, 0.1])
    assert set(combo.parts(completions, ["q"] * 3, meta)) == {"math_answer", "format"}
    built = REWARDS.build("math_with_format", format_weight=0.1)
    assert isinstance(built, MathWithFormat) and built.kind == "text"
    assert built(completions, ["q"] * 3, meta).tolist() == pytest.approx([1.0, 0.9, 0.1])
    with pytest.raises(ValueError, match="format_weight"):
        MathWithFormat(format_weight=1.5)


def test_scores_are_float32_and_batch_independent():
    r = MathAnswer()
    out = r(["1", r"\boxed{2}", "x"], ["q"] * 3, [{"answer": 1}, {"answer": 3}, {"answer": "x"}])
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.0, 0.0]
