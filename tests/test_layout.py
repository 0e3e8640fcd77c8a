"""The two files a newcomer opens first stay readable: the training loop (`mmrl/trainer/trainer.py`)
and the experiment schema and builders (`mmrl/experiment.py`), each at most 600 lines. What grows
goes beside them, in the module of the part it belongs to (the warm start, a learner, a config
section next to the code it configures)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 600


@pytest.mark.parametrize("path", ["mmrl/trainer/trainer.py", "mmrl/experiment.py"])
def test_the_loop_and_the_schema_stay_under_600_lines(path):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= LIMIT, f"{path} has {lines} lines (> {LIMIT}): move a part into the module it belongs to"
