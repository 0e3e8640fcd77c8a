r"""Verifiable (rule-based) text rewards for VLM reasoning RL: ``kind = "text"``, no model, no sympy.

Each reward scores completions against ground truth in ``meta`` (a missing key raises ``ValueError``
naming it). The parsing and normalising steps are pure module-level functions:

- ``math_answer`` (`MathAnswer`), range {0, 1}: the final answer (`extract_final_answer`: the last
  ``\boxed{}`` / ``\fbox{}``, else the last ``<answer>...</answer>``, else the last number) matches
  ``meta["answer"]`` (`answers_match`, after `normalize_answer`; numbers compare as `Fraction`).
- ``multiple_choice`` (`MultipleChoice`), range {0, 1}: the chosen letter (`extract_choice`) equals
  ``meta["answer"]`` (a letter, or an option text when ``meta["options"]`` lists them).
- ``counting`` (`Counting`), range {0, 1}: the integer answer (`extract_count`: digits or the words
  zero..twenty) equals ``meta["answer"]``.
- ``short_answer`` (`ShortAnswer`), range {0, 1}: normalised exact match of a short word or number
  answer (`normalize_short_answer`) with ``meta["answer"]`` ("Red." = "red", "three" = "3").
- ``grounding_iou`` (`GroundingIoU`), range [0, 1]: IoU of the predicted box (`parse_box`) with
  ``meta["box"]``; {0, 1} with ``threshold``.
- ``format`` (`FormatReward`), range {0, 1}: the completion is ``<think>...</think> <answer>...</answer>``.
- ``overlong_penalty`` (`OverlongPenalty`), range [-1, 0]: DAPO soft overlong punishment.
- ``math_with_format`` (`MathWithFormat`), range [0, 1]: ``(1 - w) * math_answer + w * format``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import torch

from mmrl.reward import Reward, WeightedSum

# extraction

_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_LAST_NUM = re.compile(r"(?:(?<![\w)\]])-)?(?<![\w.])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?(?:/\d+)?")


def iter_boxed(text: str) -> Iterator[tuple[int, str]]:
    r"""``(start, content)`` of every ``\boxed{...}`` / ``\fbox{...}`` with balanced (nested) braces."""
    for m in _BOX_START.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            yield m.start(), text[m.end() : i - 1]


def last_boxed(text: str) -> str | None:
    found = list(iter_boxed(text))
    return max(found)[1] if found else None


def iter_tag(text: str, tag: str = "answer") -> Iterator[tuple[int, str]]:
    """``(start, content)`` of every ``<tag>...</tag>`` (shortest match, across lines)."""
    for m in re.finditer(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL):
        yield m.start(), m.group(1)


def last_tag(text: str, tag: str = "answer") -> str | None:
    found = list(iter_tag(text, tag))
    return found[-1][1] if found else None


def extract_final_answer(text: str) -> str | None:
    r"""The last ``\boxed{}``/``\fbox{}`` content, else the last ``<answer>`` content, else the last number."""
    for found in (last_boxed(text), last_tag(text)):
        if found is not None:
            return found
    nums = _LAST_NUM.findall(text)
    return nums[-1] if nums else None


# math normalisation and comparison

_TEXT_CMD = re.compile(r"\\(?:text|textrm|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_DROP = ("\\!", "\\,", "\\;", "\\:", "\\ ", "^{\\circ}", "^\\circ", "°", "\\%", "%", "\\$", "$")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?"
_FRAC = re.compile(rf"([-+]?)\\frac(?:\{{({_NUM})\}}|(\d))(?:\{{({_NUM})\}}|(\d))")


def normalize_answer(answer: Any) -> str:
    r"""Canonical lower-case string without spaces for comparing answers.

    ``\text{..}``-like groups are dropped as units when anything else remains ("5\text{ cm}" -> "5"),
    else unwrapped ("\text{red}" -> "red"); ``\dfrac``/``\tfrac`` -> ``\frac``; ``\left``/``\right``,
    ``\!`` and LaTeX spaces, degrees (``^\circ``, ``°``), percent (``\%``, ``%``) and dollars go;
    thousands commas (``1,000``) go; spaces go; trailing dots go; ``x = 5`` keeps the right side.
    """
    s = str(answer).strip()
    rest = _TEXT_CMD.sub("", s)
    s = rest if rest.strip(" .$") else _TEXT_CMD.sub(r"\1", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    for token in _DROP:
        s = s.replace(token, "")
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    s = re.sub(r"\s+", "", s)
    if "=" in s and s.rsplit("=", 1)[1]:
        s = s.rsplit("=", 1)[1]
    return s.rstrip(".").lower()


def _dec(s: str) -> Fraction | None:
    try:
        return Fraction(s) if re.fullmatch(_NUM, s) else None
    except (ValueError, ZeroDivisionError):
        return None


def to_fraction(s: str) -> Fraction | None:
    r"""A normalised answer as an exact `Fraction` ("-3", "2.50", "1e3", "1/2", "\frac{1}{2}", "\frac12"), else None."""
    m = _FRAC.fullmatch(s)
    if m:
        num, den = _dec(m.group(2) or m.group(3)), _dec(m.group(4) or m.group(5))
        sign = -1 if m.group(1) == "-" else 1
    elif s.count("/") == 1:
        num, den = (_dec(p) for p in s.split("/"))
        sign = 1
    else:
        return _dec(s)
    return None if num is None or not den else sign * num / den


def answers_match(pred: Any, gold: Any, rel_tol: float = 1e-6) -> bool:
    """Normalised strings equal, or both parse as numbers that are equal: exactly, or within
    ``rel_tol`` (relative to the larger magnitude) when either side is written as a decimal or in
    scientific notation (so "0.333333" ~ "1/3", while "1000000" != "1000001")."""
    p, g = normalize_answer(pred), normalize_answer(gold)
    if not p:
        return False
    if p == g:
        return True
    fp, fg = to_fraction(p), to_fraction(g)
    if fp is None or fg is None:
        return False
    if fp == fg:
        return True
    inexact = any(c in p or c in g for c in ".e")
    return inexact and abs(fp - fg) <= rel_tol * max(abs(fp), abs(fg))


# multiple choice and counting

_KEYWORD = re.compile(r"(?i:\b(?:answer|option|choice)\b(?!>)(?:\s+is)?)[\s*:=]*(?=([^\n]*))")


def _plain(s: str) -> str:
    return re.sub(r"\s+", " ", _TEXT_CMD.sub(r"\1", s)).strip(" \t*.:;!\"'").lower()


def choice_of(content: str, choices: str = "ABCDE", options: Sequence[str] | None = None) -> str | None:
    """The letter a snippet names: "B", "(B)", "B.", "B) blue", "(B) blue", or an option's text."""
    inner = last_boxed(content)
    s = (inner if inner is not None else content).strip()
    s = _TEXT_CMD.sub(r"\1", s).strip(" *")
    letters = re.escape(choices)
    m = re.match(rf"\(([{letters}])\)|([{letters}])(?=$|[.,:;)])", s)
    if m:
        return m.group(1) or m.group(2)
    if options:
        hits = [i for i, opt in enumerate(options) if _plain(s) == _plain(str(opt))]
        if len(hits) == 1 and hits[0] < len(choices):
            return choices[hits[0]]
    return None


def extract_choice(text: str, choices: str = "ABCDE", options: Sequence[str] | None = None) -> str | None:
    r"""The chosen letter: the last explicit one (``\boxed{B}``, ``<answer>B</answer>``, "Answer: (B)",
    "the answer is B", "option B") that names a choice, else the whole text as a choice ("B", "B.",
    or an option's text)."""
    spans = list(iter_boxed(text)) + list(iter_tag(text)) + [(m.start(), m.group(1)) for m in _KEYWORD.finditer(text)]
    for _, content in sorted(spans, reverse=True):
        letter = choice_of(content, choices, options)
        if letter is not None:
            return letter
    return choice_of(text, choices, options)


NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
_COUNT_TOKEN = re.compile(rf"(?<![\w.])(-?\d+(?:\.\d+)?|{'|'.join(NUMBER_WORDS)})(?!\w)", re.IGNORECASE)


def parse_count(s: Any) -> int | None:
    """The last integer in ``s`` written as digits or a word zero..twenty (any case); None otherwise."""
    if isinstance(s, int) and not isinstance(s, bool):
        return s
    tokens = _COUNT_TOKEN.findall(str(s))
    if not tokens:
        return None
    tok = tokens[-1].lower()
    if tok in NUMBER_WORDS:
        return NUMBER_WORDS.index(tok)
    value = Fraction(tok)
    return int(value) if value.denominator == 1 else None


def extract_count(text: str) -> int | None:
    r"""The count in the last ``\boxed{}``, else the last ``<answer>``, else the last number-or-word in the text."""
    for found in (last_boxed(text), last_tag(text)):
        if found is not None:
            return parse_count(found)
    return parse_count(text)


# short answers (VQA-style exact match)

_EDGE_PUNCT = " \t\n.,;:!?'\"`*()[]{}<>"
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
ARTICLES = ("a", "an", "the")


def canonical_number(word: str) -> str:
    """A number written as digits in one canonical form ("3.0" -> "3", "+3" -> "3", "1,000" -> "1000",
    "2.50" -> "5/2", "0.5" -> "1/2"); any other word unchanged."""
    if _THOUSANDS.fullmatch(word):
        word = word.replace(",", "")
    value = _dec(word)
    if value is None:
        return word
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def normalize_short_answer(text: Any) -> str:
    r"""Canonical form of a short word or number answer, for exact match (the VQA / SQuAD habit).

    The content of the last ``\boxed{}`` (else of the last ``<answer>...</answer>``) when there is
    one, else the whole text; ``\text{..}`` unwrapped; lower case; split on whitespace; each word
    stripped of surrounding punctuation (``.,;:!?'"`*()[]{}<>``; inner hyphens and decimal points
    stay); the articles a / an / the dropped; number words zero..twenty -> digits; numbers in one
    form (`canonical_number`); words joined by one space. ``"The Red."`` -> ``"red"``,
    ``"<answer> Three </answer>"`` -> ``"3"``, ``"3 shapes"`` -> ``"3 shapes"``.
    """
    s = str(text)
    inner = last_boxed(s)
    inner = last_tag(s) if inner is None else inner
    s = _TEXT_CMD.sub(r"\1", s if inner is None else inner).lower()
    words = []
    for w in s.split():
        w = w.strip(_EDGE_PUNCT)
        if not w or w in ARTICLES:
            continue
        words.append(str(NUMBER_WORDS.index(w)) if w in NUMBER_WORDS else canonical_number(w))
    return " ".join(words)


# boxes

_BOX_NUM = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_PAIR = re.compile(rf"\(\s*({_BOX_NUM})\s*,\s*({_BOX_NUM})\s*\)\s*,?\s*\(\s*({_BOX_NUM})\s*,\s*({_BOX_NUM})\s*\)")


def parse_box(text: str) -> list[float] | None:
    """``[x1, y1, x2, y2]`` from, in this order of preference: the last ``<box>..</box>`` (or Qwen2-VL
    ``<|box_start|>..<|box_end|>``) holding exactly 4 numbers; the last "(x1,y1),(x2,y2)"; the last
    ``[...]`` group (no nested brackets, so a JSON list or {"bbox_2d": [...]}) holding >= 4 numbers,
    whose last 4 numbers are taken. None when nothing parses."""
    tags = re.findall(r"<box>(.*?)</box>|<\|box_start\|>(.*?)<\|box_end\|>", text, re.DOTALL)
    for a, b in reversed(tags):
        nums = re.findall(_BOX_NUM, a or b)
        if len(nums) == 4:
            return [float(v) for v in nums]
    pairs = _PAIR.findall(text)
    if pairs:
        return [float(v) for v in pairs[-1]]
    for group in reversed(re.findall(r"\[([^\[\]]*)\]", text)):
        nums = re.findall(_BOX_NUM, group)
        if len(nums) >= 4:
            return [float(v) for v in nums[-4:]]
    return None


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two ``[x1, y1, x2, y2]`` boxes (continuous coordinates); 0 when
    either box is degenerate (``x2 <= x1`` or ``y2 <= y1``) or not finite."""
    if not all(math.isfinite(v) for v in (*a, *b)) or a[2] <= a[0] or a[3] <= a[1] or b[2] <= b[0] or b[3] <= b[1]:
        return 0.0
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def rescale_box(box: Sequence[float], image_size: Sequence[float], normalized: bool | None = None) -> list[float]:
    """Predicted box -> pixels of an image ``[W, H]`` (the ground truth's units).

    ``normalized=True``: the box is normalised: all coordinates in [0, 1] -> fractions of W, H;
    otherwise Qwen2-VL's 0..1000 grid -> ``x * W / 1000``, ``y * H / 1000``.
    ``normalized=False``: pixels, unchanged.
    ``normalized=None`` (auto): all coordinates in [0, 1] -> fractions; else all in [0, 1000] and the
    box does not fit the image as pixels (``x2 > W`` or ``y2 > H``) -> the 0..1000 grid; else pixels.
    (So in auto mode a pixel box inside [0, 1]^2 reads as fractions, and a 0..1000 box that fits
    the image reads as pixels: pass ``normalized=True`` when the model always emits 0..1000.)
    """
    w, h = float(image_size[0]), float(image_size[1])
    if normalized is False:
        return list(box)
    if all(0.0 <= v <= 1.0 for v in box):
        return [box[0] * w, box[1] * h, box[2] * w, box[3] * h]
    if normalized or (all(0.0 <= v <= 1000.0 for v in box) and (box[2] > w or box[3] > h)):
        return [box[0] * w / 1000, box[1] * h / 1000, box[2] * w / 1000, box[3] * h / 1000]
    return list(box)


# format and length


def format_ok(text: str, think_tag: str = "think", answer_tag: str = "answer", answer_only: bool = False) -> bool:
    """The whole text (up to surrounding whitespace) is ``<think>...</think>\\s*<answer>...</answer>``
    (``answer_only``: ``<answer>...</answer>``), with exactly one opening and one closing of each tag."""
    tags = [answer_tag] if answer_only else [think_tag, answer_tag]
    if any(text.count(f"<{t}>") != 1 or text.count(f"</{t}>") != 1 for t in tags):
        return False
    pattern = r"\s*" + r"\s*".join(rf"<{re.escape(t)}>.*</{re.escape(t)}>" for t in tags) + r"\s*"
    return re.fullmatch(pattern, text, re.DOTALL) is not None


def soft_overlong_penalty(length: float, max_length: float, cache_length: float) -> float:
    """DAPO (arXiv 2503.14476, Eq. 13): 0 if L <= L_max - L_cache; ((L_max - L_cache) - L) / L_cache
    if L_max - L_cache < L <= L_max; -1 if L > L_max."""
    start = max_length - cache_length
    if length <= start:
        return 0.0
    return (start - length) / cache_length if length <= max_length else -1.0


# rewards


class _TextReward(Reward):
    kind = "text"

    def need(self, m: dict, key: str, i: int) -> Any:
        if not isinstance(m, dict) or key not in m:
            got = sorted(m) if isinstance(m, dict) else type(m).__name__
            raise ValueError(f"reward '{self.name}': meta[{i}] has no '{key}' key (got {got})")
        return m[key]

    def score(self, completions, prompts, meta) -> torch.Tensor:
        return torch.tensor(
            [float(self.score_one(c, m, i)) for i, (c, m) in enumerate(zip(completions, meta))], dtype=torch.float32
        )

    def score_one(self, completion: str, meta: dict, i: int) -> float:
        raise NotImplementedError


class MathAnswer(_TextReward):
    """1.0 when the final answer matches meta["answer"] (number, string or a list of accepted ones)."""

    name = "math_answer"

    def __init__(self, *, rel_tol: float = 1e-6):
        self.rel_tol = float(rel_tol)

    def score_one(self, completion, meta, i):
        gold = self.need(meta, "answer", i)
        pred = extract_final_answer(completion)
        golds = gold if isinstance(gold, (list, tuple)) else [gold]
        return pred is not None and any(answers_match(pred, g, self.rel_tol) for g in golds)


class MultipleChoice(_TextReward):
    """1.0 when the chosen letter equals meta["answer"] (a letter, or an option of meta["options"])."""

    name = "multiple_choice"
    example_meta = [{"answer": "A"}, {"answer": "B"}, {"answer": "C", "options": ["blue", "green", "red cube"]}]

    def __init__(self, *, choices: str = "ABCDE"):
        self.choices = str(choices)

    def score_one(self, completion, meta, i):
        options = meta.get("options") if isinstance(meta, dict) else None
        gold = choice_of(str(self.need(meta, "answer", i)), self.choices, options)
        if gold is None:
            raise ValueError(
                f"reward '{self.name}': meta[{i}]['answer'] = {meta['answer']!r} is not one of the "
                f"choices {self.choices} (nor an option text)"
            )
        return extract_choice(completion, self.choices, options) == gold


class Counting(_TextReward):
    """1.0 when the integer answer (digits or zero..twenty in words) equals meta["answer"]."""

    name = "counting"
    example_meta = [{"answer": 42}, {"answer": "seven"}, {"answer": "1"}]

    def score_one(self, completion, meta, i):
        gold = parse_count(self.need(meta, "answer", i))
        if gold is None:
            raise ValueError(f"reward '{self.name}': meta[{i}]['answer'] = {meta['answer']!r} is not an integer")
        return extract_count(completion) == gold


class ShortAnswer(_TextReward):
    """1.0 when the normalised answer equals a normalised meta["answer"] (a string, a number or a list
    of accepted ones), see `normalize_short_answer`: an exact match on short word or number answers
    ("What color is the square?" -> "red"), where `math_answer` needs a number, box or tag."""

    name = "short_answer"
    example_meta = [{"answer": "42"}, {"answer": 7}, {"answer": ["red", "crimson"]}]

    def score_one(self, completion, meta, i):
        gold = self.need(meta, "answer", i)
        golds = [normalize_short_answer(g) for g in (gold if isinstance(gold, (list, tuple)) else [gold])]
        if not all(golds):
            raise ValueError(
                f"reward '{self.name}': meta[{i}]['answer'] = {gold!r} is empty once normalised "
                "(an answer must keep a word or number after dropping articles and punctuation)"
            )
        return normalize_short_answer(completion) in golds


class GroundingIoU(_TextReward):
    """IoU of the predicted box with meta["box"] (pixels; rescaled with meta["image_size"], see `rescale_box`)."""

    name = "grounding_iou"
    example_meta = [{"box": [0, 0, 10, 10]}, {"box": [1, 1, 3, 3]}, {"box": [0, 0, 1, 1], "image_size": [8, 8]}]

    def __init__(self, *, threshold: float | None = None, normalized: bool | None = None):
        if threshold is not None and not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1] or None, got {threshold}")
        self.threshold, self.normalized = threshold, normalized

    def score_one(self, completion, meta, i):
        gt = self.need(meta, "box", i)
        if not isinstance(gt, (list, tuple)) or len(gt) != 4:
            raise ValueError(f"reward '{self.name}': meta[{i}]['box'] must be [x1, y1, x2, y2], got {gt!r}")
        pred = parse_box(completion)
        if pred is None:
            return 0.0
        if self.normalized and "image_size" not in meta:
            raise ValueError(f"reward '{self.name}': normalized=True needs meta[{i}]['image_size'] = [W, H]")
        if "image_size" in meta:
            pred = rescale_box(pred, meta["image_size"], self.normalized)
        iou = box_iou(pred, [float(v) for v in gt])
        return iou if self.threshold is None else float(iou >= self.threshold)


class FormatReward(_TextReward):
    """1.0 when the completion is exactly <think>...</think> <answer>...</answer> (see `format_ok`)."""

    name = "format"

    def __init__(self, *, think_tag: str = "think", answer_tag: str = "answer", answer_only: bool = False):
        self.think_tag, self.answer_tag, self.answer_only = think_tag, answer_tag, answer_only

    def score_one(self, completion, meta, i):
        return format_ok(completion, self.think_tag, self.answer_tag, self.answer_only)


class OverlongPenalty(_TextReward):
    """DAPO soft overlong punishment in [-1, 0] (see `soft_overlong_penalty`).

    Length L in tokens: ``meta["completion_tokens"]`` when present (the trainer passes it), else
    ``len(tokenizer(text).input_ids)`` (without special tokens when the tokenizer takes
    ``add_special_tokens``) when a tokenizer is given, else ``len(text) / chars_per_token`` (4.0:
    a rough average for English BPE tokenizers; a float, not rounded).
    """

    name = "overlong_penalty"

    def __init__(
        self, *, max_length: int = 1024, cache_length: int = 256, tokenizer: Any = None, chars_per_token: float = 4.0
    ):
        if not 0 < cache_length <= max_length:
            raise ValueError(f"need 0 < cache_length <= max_length, got {cache_length}, {max_length}")
        if chars_per_token <= 0:
            raise ValueError(f"chars_per_token must be > 0, got {chars_per_token}")
        self.max_length, self.cache_length = max_length, cache_length
        self.tokenizer, self.chars_per_token = tokenizer, float(chars_per_token)

    def length(self, completion: str, meta: dict, i: int) -> float:
        if isinstance(meta, dict) and meta.get("completion_tokens") is not None:
            n = meta["completion_tokens"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"reward '{self.name}': meta[{i}]['completion_tokens'] must be an int >= 0, got {n!r}")
            return float(n)
        if self.tokenizer is not None:
            try:
                enc = self.tokenizer(completion, add_special_tokens=False)
            except TypeError:
                enc = self.tokenizer(completion)
            ids = getattr(enc, "input_ids", None)
            return float(len(enc["input_ids"] if ids is None else ids))
        return len(completion) / self.chars_per_token

    def score_one(self, completion, meta, i):
        return soft_overlong_penalty(self.length(completion, meta, i), self.max_length, self.cache_length)


class MathWithFormat(WeightedSum):
    """(1 - format_weight) * math_answer + format_weight * format, each part reported."""

    def __init__(
        self, *, format_weight: float = 0.1, rel_tol: float = 1e-6, think_tag: str = "think", answer_tag: str = "answer"
    ):
        if not 0.0 <= format_weight <= 1.0:
            raise ValueError(f"format_weight must be in [0, 1], got {format_weight}")
        parts = {
            "math_answer": MathAnswer(rel_tol=rel_tol),
            "format": FormatReward(think_tag=think_tag, answer_tag=answer_tag),
        }
        super().__init__(parts, [1.0 - format_weight, format_weight], name="math_with_format")


__all__ = [
    "MathAnswer",
    "MultipleChoice",
    "Counting",
    "ShortAnswer",
    "GroundingIoU",
    "FormatReward",
    "OverlongPenalty",
    "MathWithFormat",
    "extract_final_answer",
    "normalize_answer",
    "to_fraction",
    "answers_match",
    "extract_choice",
    "choice_of",
    "parse_count",
    "extract_count",
    "normalize_short_answer",
    "canonical_number",
    "parse_box",
    "box_iou",
    "rescale_box",
    "format_ok",
    "soft_overlong_penalty",
]
