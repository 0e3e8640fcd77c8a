"""`mmrl.data.concat_records`: the rows of two datasets of one builder as one (how the warm start
reads its training rows and its held-in rows through one `warm_start_batch` call)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmrl.data import concat_records


def test_rows_are_joined_first_then_second_and_summaries_are_the_first_s():
    a = {"image": torch.zeros(2, 3), "text": ["a", "b"], "n": np.arange(2), "success_rate": 0.5, "meta": {"k": 1}}
    b = {"image": torch.ones(1, 3), "text": ("c",), "n": np.arange(5, 6), "success_rate": 1.0, "meta": {"k": 2}}
    out = concat_records(a, b)
    assert torch.equal(out["image"], torch.cat([torch.zeros(2, 3), torch.ones(1, 3)]))
    assert out["text"] == ["a", "b", "c"]
    assert out["n"].tolist() == [0, 1, 5]
    assert out["success_rate"] == 0.5 and out["meta"] == {"k": 1}


def test_datasets_with_other_columns_are_refused():
    with pytest.raises(ValueError, match="different columns"):
        concat_records({"a": [1]}, {"b": [1]})
