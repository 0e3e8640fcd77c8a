"""benchmarks/sample_efficiency.py's reach part (issue 36): the evaluations read back from a run's
metrics (a resumed run's repeated evaluation counted once, train rows ignored) and the env steps /
RL seconds of the first one at the level."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    pytest.importorskip("gymnasium", reason="the benchmark's sac part imports gymnasium helpers")
    return load_benchmark("sample_efficiency")


def eval_row(steps, seconds, success):
    return {"step": steps, "eval/env_steps": steps, "eval/rl_seconds": seconds, "eval/success_rate": success}


def test_evaluations_in_order_once_each_without_train_rows(bench, tmp_path):
    rows = [
        eval_row(0, 0.0, 0.40),
        eval_row(0, 0.0, 0.40),  # a resumed run's folder repeats the evaluation it resumed at
        {"step": 1, "train/success": 0.99, "train/env_steps": 320},
        eval_row(640, 12.5, 0.62),
        eval_row(320, 6.0, 0.50),
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    curve = bench.evaluations(tmp_path)
    assert [p["env_steps"] for p in curve] == [0, 320, 640]
    assert [p["success"] for p in curve] == [0.40, 0.50, 0.62]


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
