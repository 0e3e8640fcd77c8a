"""benchmarks/sample_efficiency.py's reach part (issue 36): the evaluations of a run's results in
order of env steps (a repeated evaluation counted once) and the env steps / RL seconds of the first
one at the level."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    pytest.importorskip("gymnasium", reason="the benchmark's sac part imports gymnasium helpers")
    return load_benchmark("sample_efficiency")


def evaluation(steps, seconds, success):
    return {"env_steps": steps, "rl_seconds": seconds, "success_rate": success, "episodes": 256}


def test_evaluations_in_order_once_each(bench):
    results = {  # Trainer.run's results: every evaluation by name, in the order they ran
        "start": evaluation(0, 0.0, 0.40),
        "iter_000002": evaluation(640, 12.5, 0.62),
        "iter_000001": evaluation(320, 6.0, 0.50),
        "final": evaluation(640, 12.5, 0.62),  # the final evaluation repeats the last iteration's
    }
    curve = bench.evaluations(results)
    assert [p["env_steps"] for p in curve] == [0, 320, 640]
    assert [p["success"] for p in curve] == [0.40, 0.50, 0.62]
    assert [p["rl_seconds"] for p in curve] == [0.0, 6.0, 12.5]


def test_steps_to_level_is_the_first_evaluation_at_or_above_it(bench):
    curve = [
        {"env_steps": 0, "rl_seconds": 0.0, "success": 0.4},
        {"env_steps": 100, "rl_seconds": 5.0, "success": 0.85},
        {"env_steps": 200, "rl_seconds": 9.0, "success": 0.70},
        {"env_steps": 300, "rl_seconds": 14.0, "success": 0.95},
    ]
    assert bench.to_level(curve, 0.85) == (100, 5.0)
    assert bench.to_level(curve, 0.9) == (300, 14.0)
    assert bench.to_level(curve, 0.99) == (None, None)  # never reached: null in the JSON line
