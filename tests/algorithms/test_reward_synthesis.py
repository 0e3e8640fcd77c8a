"""Reward synthesis formulas, each against hand-computed values."""

import pytest
import torch

from mmrl.algorithms.reward_synthesis import (
    RewardSynthesis,
    gated,
    hierarchical,
    speed_target,
    synthesize,
    terminal_override,
    weighted,
)

SEM = torch.tensor([1.0, 0.5, 0.0, 0.8])


def close(a, b):
    return torch.allclose(torch.as_tensor(a), torch.tensor(b), atol=1e-6)


def test_weighted():
    terms = {"progress": torch.tensor([0.0, 1.0, 2.0, 0.5]), "energy": [1.0, 1.0, 0.0, 2.0]}
    # 2 * sem + 0.5 * progress - 0.1 * energy
    out = weighted(SEM, terms, {"model": 2.0, "progress": 0.5, "energy": -0.1})
    assert close(out, [2.0 - 0.1, 1.0 + 0.5 - 0.1, 0.0 + 1.0, 1.6 + 0.25 - 0.2])
    assert close(weighted(SEM, terms, {"progress": 1.0}), [1.0, 1.5, 2.0, 1.3])  # the model's weight defaults to 1
    assert close(weighted(SEM, {}, {}), SEM.tolist())
    with pytest.raises(ValueError, match=r"unknown term\(s\) \['speed'\]; available terms: \['energy', 'progress'\]"):
        weighted(SEM, terms, {"speed": 1.0})
    with pytest.raises(ValueError, match="3 entries, expected 4"):
        weighted(SEM, {"progress": [1.0, 2.0, 3.0]}, {"progress": 1.0})


def test_gated():
    gate = torch.tensor([True, True, False, True])
    assert close(gated(SEM, gate), [1.0, 0.5, 0.0, 0.8])
    centering, angle = [0.5, 1.0, 1.0, 0.25], [1.0, 0.5, 1.0, 0.5]
    # sem * gate * centering * angle
    assert close(gated(SEM, [1.0, 0.5, 1.0, 1.0], {"centering": centering, "angle": angle}), [0.5, 0.125, 0.0, 0.1])
    assert close(gated(SEM, None, {"centering": centering}), [0.5, 0.5, 0.0, 0.2])
    with pytest.raises(ValueError, match=r"'angle' must lie in \[0, 1\]"):
        gated(SEM, None, {"angle": [1.0, 1.5, 0.0, 0.0]})


def test_vlm_rl_speed_target_and_hierarchical():
    speed = torch.tensor([25.0, 12.5, 10.0, 30.0])
    # v_des = clip(s, 0, 1) * 25 = [25, 12.5, 0, 20]; r = 1 - |v - v_des| / 25
    assert close(speed_target(SEM, speed, 25.0), [1.0, 1.0, 0.6, 0.6])
    # a score outside [0, 1] is clipped before setting the desired speed
    assert close(speed_target([1.4, -0.2], [25.0, 5.0], 25.0), [1.0, 0.8])
    factors = {"centering": [1.0, 0.5, 1.0, 0.5], "angle": [1.0, 1.0, 0.5, 1.0], "stability": [0.5, 1.0, 1.0, 1.0]}
    assert close(hierarchical(SEM, speed, 25.0, factors), [0.5, 0.5, 0.3, 0.3])
    with pytest.raises(ValueError, match="target_speed"):
        speed_target(SEM, speed, 0.0)


def test_terminal_override():
    reward = torch.tensor([0.5, 0.2, 0.9, 0.0])
    mask = torch.tensor([False, True, False, True])
    assert close(terminal_override(reward, mask, -10.0), [0.5, -10.0, 0.9, -10.0])
    per_step = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    assert close(terminal_override(reward, [0, 1, 1, 0], per_step), [0.5, -2.0, -3.0, 0.0])
    with pytest.raises(ValueError, match="terminated_mask has 2 entries"):
        terminal_override(reward, [True, False], -1.0)


def test_synthesize_modes_and_override():
    speed = [25.0, 12.5, 10.0, 30.0]
    terms = {
        "speed": speed,
        "centering": [1.0, 0.5, 1.0, 0.5],
        "angle": [1.0, 1.0, 0.5, 1.0],
        "stability": [0.5, 1.0, 1.0, 1.0],
        "in_lane": [1.0, 1.0, 0.0, 1.0],
        "progress": [1.0, 0.0, 0.0, 1.0],
    }
    fail = torch.tensor([False, False, False, True])
    vlm_rl = {
        "mode": "hierarchical",
        "speed": "speed",
        "target_speed": 25.0,
        "factors": ["centering", "angle", "stability"],
        "failure_penalty": -10.0,
    }
    assert close(synthesize(vlm_rl, SEM, terms, fail), [0.5, 0.5, 0.3, -10.0])
    assert close(synthesize(vlm_rl, SEM, terms), [0.5, 0.5, 0.3, 0.3])  # no mask: no override
    assert close(
        synthesize({"mode": "gated", "gate": "in_lane", "factors": ["centering"]}, SEM, terms, fail),
        [1.0, 0.25, 0.0, -10.0],
    )
    assert close(
        synthesize(
            {"mode": "weighted", "weights": {"model": 1.0, "progress": 0.5}, "failure_penalty": -1.0}, SEM, terms, fail
        ),
        [1.5, 0.5, 0.0, -1.0],
    )
    assert close(RewardSynthesis()(SEM), SEM.tolist())  # default: the model's score alone


def test_synthesize_bad_config_lists_the_valid_choices():
    with pytest.raises(
        ValueError,
        match=r"unknown synthesis mode 'sum'; valid modes: \['weighted', 'gated', "
        r"'hierarchical'\]",
    ):
        synthesize({"mode": "sum"}, SEM, {})
    with pytest.raises(ValueError, match=r"unknown reward synthesis key\(s\) \['wieghts'\]; valid keys: \['mode'"):
        synthesize({"wieghts": {}}, SEM, {})
    with pytest.raises(ValueError, match=r"unknown term\(s\) \['lane'\]; available terms: \['speed'\]"):
        synthesize({"mode": "gated", "gate": "lane"}, SEM, {"speed": [1.0] * 4})
    with pytest.raises(ValueError, match="target_speed"):
        synthesize({"mode": "hierarchical"}, SEM, {"speed": [1.0] * 4})
