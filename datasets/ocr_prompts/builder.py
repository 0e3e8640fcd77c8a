"""Build the `ocr_prompts` dataset: text-rendering prompts whose target text is in double quotes.

Loads a copy the user downloaded (never downloads): Flow-GRPO's ``dataset/ocr`` folder
(``train.txt`` / ``test.txt``, one prompt per line, e.g. ``A neon sign that says "OPEN LATE"``),
a single text file in that format, or a JSONL file with ``prompt`` (and optionally ``text``).
Meta ``{"text": ...}`` is the text between the first pair of double quotes, the string the OCR
reward compares with what it reads. See CARD.md.
"""

from __future__ import annotations

import re
from pathlib import Path

DOWNLOAD = (
    "Download the prompts first (this project never downloads), e.g. Flow-GRPO's OCR split:\n"
    "  mkdir -p data/ocr && for s in train test; do wget -O data/ocr/$s.txt "
    "https://raw.githubusercontent.com/yifan123/flow_grpo/main/dataset/ocr/$s.txt; done\n"
    "then pass path='data/ocr'."
)
_QUOTED = re.compile(r'"([^"]*)"|\u201c([^\u201d]*)\u201d')  # straight or curly double quotes


def _prompt_list():
    from mmrl.data import builder_module

    return builder_module("prompt_list")


def target_text(prompt: str) -> str | None:
    """The text between the first pair of double quotes (straight or curly), or None."""
    m = _QUOTED.search(prompt)
    if m is None:
        return None
    text = m.group(1) if m.group(1) is not None else m.group(2)
    return text if text.strip() else None


def build(
    path,
    split: str = "train",
    num_prompts: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    on_missing: str = "error",
) -> dict:
    """OCR prompts from ``path`` -> ``{"prompt", "meta"}`` with meta ``{"text": target}``.

    ``path``: a folder holding ``{split}.txt`` (Flow-GRPO layout: "train" or "test"), or one text
    / JSONL file. A JSONL record's ``text`` key, when present, is the target; its other keys are
    kept in meta. A prompt without quoted text raises ValueError naming the line
    (``on_missing="skip"`` drops it instead). Then ``shuffle`` / ``num_prompts`` as in `prompt_list`.
    """
    split = "test" if split == "eval" else split  # PromptSim asks for "eval"; the sets ship "test"
    if on_missing not in ("error", "skip"):
        raise ValueError(f"on_missing must be 'error' or 'skip', got {on_missing!r}")
    io = _prompt_list()
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"OCR prompts not found at {p}.\n{DOWNLOAD}")
    if p.is_dir():
        p = p / f"{split}.txt"
        if not p.is_file():
            raise FileNotFoundError(f"no {split}.txt in {p.parent}.\n{DOWNLOAD}")
    if p.suffix.lower() in io.JSONL_SUFFIXES:
        rows = [(line, rec.pop("prompt"), rec) for line, rec in io.read_jsonl(p)]
    else:
        rows = [(line, text, {}) for line, text in io.read_lines(p, comments=False)]
    prompts, metas = [], []
    for line, prompt, extra in rows:
        text = extra.pop("text", None) or target_text(prompt)
        if text is None:
            if on_missing == "skip":
                continue
            raise ValueError(
                f"{p}, line {line}: no text in double quotes in {prompt!r} "
                "(the OCR target must be quoted; on_missing='skip' drops such lines)"
            )
        prompts.append(prompt)
        metas.append({"text": text, **extra})
    if not prompts:
        raise ValueError(f"no prompt with quoted text in {p}")
    return io.select(prompts, metas, num_prompts, shuffle, seed)
