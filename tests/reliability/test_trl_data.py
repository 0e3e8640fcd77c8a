"""Issue 68, a TRL user's VLM data: TRL's GRPO trainer takes a conversational ``prompt`` whose user
content is a plain string beside an ``image`` column, and puts the image placeholder into the first
user message itself (``prepare_multimodal_messages``). mmrl refused the same JSONL ("the messages
have 0 image placeholder(s) but the record has 1 image(s)"); it now reads it as TRL does."""

from __future__ import annotations

import json

import pytest
import torch

from mmrl.data import load_dataset
from tests.datasets.test_vlm_records_sources import _image, _png

pytest.importorskip("PIL", reason="VLM datasets decode images with Pillow")


def write(tmp_path, rows) -> str:
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_trl_string_content_with_an_image_column(tmp_path):
    img = _image(8, 8, 3)
    (tmp_path / "a.png").write_bytes(_png(img))
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Answer with one word."},
                {"role": "user", "content": "What shape is it?"},
            ],
            "image": str(tmp_path / "a.png"),
            "solution": "circle",
        }
    ]
    d = load_dataset("vlm_records", path=write(tmp_path, rows), answer_key="solution")
    assert d["prompt"] == ["What shape is it?"] and torch.equal(d["images"][0][0], img)
    user = d["meta"][0]["messages"][1]
    assert user["role"] == "user" and user["content"][0] == {"type": "image"}  # where TRL puts it
    assert user["content"][1] == {"type": "text", "text": "What shape is it?"}
    assert d["meta"][0]["messages"][0] == {"role": "system", "content": "Answer with one word."}


def test_messages_that_place_their_images_are_kept_and_a_mismatch_is_still_refused(tmp_path):
    (tmp_path / "a.png").write_bytes(_png(_image(8, 8, 3)))
    rows = [
        {
            "prompt": [{"role": "user", "content": "<image> and <image>: which is larger?"}],
            "image": str(tmp_path / "a.png"),
            "solution": "left",
        }
    ]
    with pytest.raises(ValueError, match=r"the messages have 2 image placeholder\(s\) but the record has 1"):
        load_dataset("vlm_records", path=write(tmp_path, rows), answer_key="solution")
