"""benchmarks/world_model.py (issue 72): where the evaluations' spacing leaves a method's crossing of
the level (`below_level`), so the goal is judged on the worst case that spacing allows."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("world_model")


def test_below_level_is_the_last_evaluation_under_the_level(bench):
    points = [[0, 0.44], [8000, 0.64], [16000, 0.98], [24000, 0.80], [32000, 1.0]]
    assert bench.below_level(points, 0.85) == 8000  # crossed between 8000 and 16000; a later dip is no crossing
    assert bench.below_level(points, 0.5) == 0  # crossed between the warm start and the first evaluation
    assert bench.below_level(points, 0.4) == 0  # at the level from the start: nothing before it
    assert bench.below_level(points, 1.0) == 24000
    assert bench.below_level([[0, 0.4], [500, 0.8]], 0.85) is None  # never reached
