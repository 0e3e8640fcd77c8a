"""OCR reward: the text matching is pure and hand-checked; the engine runs only where it is installed."""

import importlib.util
import sys

import numpy as np
import pytest
import torch

from mmrl.registry import MissingDependencyError
from rewards import check_reward
from rewards.ocr import OCRScore, levenshtein, normalize_text, target_text, text_match_score

HAS_RAPIDOCR = importlib.util.find_spec("rapidocr_onnxruntime") is not None


@pytest.mark.parametrize(
    "a, b, d",
    [
        ("kitten", "sitting", 3),
        ("flaw", "lawn", 2),
        ("", "abc", 3),
        ("abc", "", 3),
        ("abc", "abc", 0),
        ("hello", "help", 2),
        ("hello", "world", 4),
    ],
)
def test_levenshtein(a, b, d):
    assert levenshtein(a, b) == d == levenshtein(b, a)


def test_normalize_text():
    assert normalize_text(" Hello  World\n42 ") == "helloworld42"


@pytest.mark.parametrize(
    "recognized, target, score",
    [
        ("HELLO", "hello", 1.0),
        ("the big Hello sign", "hello", 1.0),  # contained
        ("help", "hello", 0.6),  # d = 2, len 5
        ("world", "hello", 0.2),  # d = 4
        ("", "abc", 0.0),
        ("xxxxxxxxxx", "ab", 0.0),  # d capped at len(target)
        ("open 24 hours", "Open 24hours", 1.0),  # whitespace ignored
    ],
)
def test_text_match_score(recognized, target, score):
    assert text_match_score(recognized, target) == pytest.approx(score)


def test_target_text():
    assert target_text('a sign that says "Open 24 hours" in neon') == "Open 24 hours"
    assert target_text("a mug with \u201ccoffee\u201d on it") == "coffee"
    assert target_text('a sign that says "no"', {"text": "yes"}) == "yes"
    with pytest.raises(ValueError, match="double quotes"):
        target_text("a sign with no quoted text")


def test_ocr_reward_with_a_callable_engine():
    reads = {0: "HELL0", 255: "hello world"}
    reward = OCRScore(engine=lambda image: reads[int(image[0, 0, 0])])
    images = torch.stack([torch.zeros(8, 8, 3, dtype=torch.uint8), torch.full((8, 8, 3), 255, dtype=torch.uint8)])
    out = reward(images, ['"hello"', "anything"], [{}, {"text": "world"}])
    assert torch.allclose(out, torch.tensor([0.8, 1.0]))
    with pytest.raises(ValueError, match="target text"):
        reward(images, ["no quotes", '"x"'])
    assert "batch_invariance" in check_reward(OCRScore(engine=lambda image: str(int(image.mean()) % 7)))


def test_missing_engine_names_the_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # import now raises ImportError
    with pytest.raises(MissingDependencyError, match="pip install rapidocr-onnxruntime"):
        OCRScore()
    monkeypatch.setitem(sys.modules, "pytesseract", None)
    with pytest.raises(MissingDependencyError, match="pip install pytesseract"):
        OCRScore(engine="tesseract")
    with pytest.raises(ValueError, match="unknown OCR engine"):
        OCRScore(engine="nope")


@pytest.mark.skipif(not HAS_RAPIDOCR, reason="rapidocr-onnxruntime not installed (pip install rapidocr-onnxruntime)")
def test_rapidocr_reads_rendered_text():
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (160, 48), "white")
    ImageDraw.Draw(img).text((6, 6), "HELLO", fill="black", font=ImageFont.load_default(size=32))
    images = torch.from_numpy(np.array(img))[None].repeat(3, 1, 1, 1)
    reward = OCRScore(det_limit_side_len=64)  # the default (736) is for real 512-1024 px generations
    out = reward(images, ['a sign that says "hello"', 'a sign that says "help"', '"world"'])
    assert torch.allclose(out, torch.tensor([1.0, 0.5, 0.2]))  # "help": d(hello, help) = 2 of 4
