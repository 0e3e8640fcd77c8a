"""OCR reward for text rendering: does the image show the target text?

``score = 1 - min(d, len(t)) / len(t)`` where ``t`` is the target and ``d`` the Levenshtein
distance between the recognised text and ``t``, both lower-cased with all whitespace removed; a
recognised text that contains ``t`` scores 1 (Flow-GRPO's OCR reward). Scores lie in [0, 1].

The target is ``meta["text"]`` when given, else the first text in double quotes in the prompt
(``'a sign that says "open 24 hours"'`` -> ``open 24 hours``); a sample with neither raises
``ValueError``.

Engines (``engine=``):

- ``"rapidocr"`` (default): PaddleOCR's PP-OCRv4 models run by ONNX Runtime, shipped inside the
  ``rapidocr-onnxruntime`` wheel (nothing downloaded at run time). ``pip install rapidocr-onnxruntime``.
- ``"tesseract"``: ``pip install pytesseract`` plus the tesseract program (``apt-get install tesseract-ocr``).
- any callable ``f(image: np.ndarray uint8 [H, W, 3]) -> str``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mmrl.registry import MissingDependencyError
from mmrl.reward import Reward

_QUOTED = re.compile(r'"([^"]*)"|\u201c([^\u201d]*)\u201d')


# ----------------------------------------------------------------------------- text matching (pure)
def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def normalize_text(text: str) -> str:
    """Lower-case and drop all whitespace (OCR splits and spaces words unreliably)."""
    return "".join(text.lower().split())


def text_match_score(recognized: str, target: str) -> float:
    """``1 - min(d, len(t)) / len(t)`` on normalised texts; 1.0 if the target is contained."""
    rec, tgt = normalize_text(recognized), normalize_text(target)
    if tgt in rec:  # also covers an empty target
        return 1.0
    return 1.0 - min(levenshtein(rec, tgt), len(tgt)) / len(tgt)


def target_text(prompt: str, meta: dict | None = None) -> str:
    """``meta["text"]`` if present, else the first double-quoted text in the prompt."""
    if meta and meta.get("text") is not None:
        return str(meta["text"])
    match = _QUOTED.search(prompt)
    if match is None:
        raise ValueError(
            f'OCR reward needs a target text: meta["text"] or text in double quotes in the prompt, '
            f"got prompt {prompt!r}"
        )
    return match.group(1) if match.group(1) is not None else match.group(2)


# ----------------------------------------------------------------------------- engines
def rapidocr_engine(min_confidence: float = 0.0, **kwargs: Any) -> Callable[[np.ndarray], str]:
    try:
        from rapidocr_onnxruntime import RapidOCR
    except ImportError as exc:
        raise MissingDependencyError(
            f"OCR engine 'rapidocr' is not installed ({exc}). Fix: pip install rapidocr-onnxruntime"
        ) from exc
    from PIL import Image

    ocr = RapidOCR(**kwargs)

    def read(image: np.ndarray) -> str:
        result, _ = ocr(Image.fromarray(image), use_cls=False)  # PIL input: RapidOCR converts RGB -> BGR
        return " ".join(text for _, text, conf in (result or []) if float(conf) >= min_confidence)

    return read


def tesseract_engine(**kwargs: Any) -> Callable[[np.ndarray], str]:
    try:
        import pytesseract

        pytesseract.get_tesseract_version()
    except ImportError as exc:
        raise MissingDependencyError(
            f"OCR engine 'tesseract' is not installed ({exc}). Fix: pip install pytesseract"
        ) from exc
    except Exception as exc:  # pytesseract raises its own error when the program is missing
        raise MissingDependencyError(
            f"OCR engine 'tesseract' cannot run the tesseract program ({exc}). "
            "Fix: apt-get install tesseract-ocr (or your system's package)"
        ) from exc
    from PIL import Image

    return lambda image: pytesseract.image_to_string(Image.fromarray(image), **kwargs)


ENGINES = {"rapidocr": rapidocr_engine, "tesseract": tesseract_engine}


class OCRScore(Reward):
    """1 - normalised edit distance between the OCR'd text and the target text (Flow-GRPO), in [0, 1]."""

    name = "ocr"
    kind = "image"

    def __init__(self, *, engine: str | Callable[[np.ndarray], str] = "rapidocr", **engine_kwargs: Any):
        if callable(engine):
            self.read = engine
        elif engine in ENGINES:
            self.read = ENGINES[engine](**engine_kwargs)
        else:
            raise ValueError(f"unknown OCR engine {engine!r}: use one of {sorted(ENGINES)} or a callable")

    def score(self, images, prompts, meta) -> torch.Tensor:
        targets = [target_text(p, m) for p, m in zip(prompts, meta)]  # fail before the slow part
        arrays = np.ascontiguousarray(images.cpu().numpy())
        return torch.tensor([text_match_score(self.read(a), t) for a, t in zip(arrays, targets)])


__all__ = ["OCRScore", "levenshtein", "normalize_text", "text_match_score", "target_text"]
