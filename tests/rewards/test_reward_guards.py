"""Guards against reward hacking for generators: how far each generated sample lies from the others of
its prompt (logged, and a reward term that penalises collapse), a weighted sum whose parts are
standardised so one reward's scale cannot swamp the others, both through the real reward stage."""

import pytest
import torch

from mmrl.algorithms.reward_audit import sample_diversity
from mmrl.algorithms.reward_synthesis import RewardSynthesis
from mmrl.config import ConfigError
from mmrl.experiment import load_experiment
from mmrl.reward import WeightedSum, as_reward, standardize
from mmrl.trainer.reward_stage import RewardStage
from simulators.prompts import PromptSim


def test_diversity_is_the_mean_rms_distance_within_a_prompt():
    images = torch.zeros(5, 8, 8, 3, dtype=torch.uint8)
    images[1] = 255  # the other sample of prompt "a": as far as pixels go
    images[3, :4] = 255  # half the picture differs from sample 2 (prompt "b")
    div = sample_diversity(images, ["a", "a", "b", "b", "c"])
    assert div[:2].tolist() == [1.0, 1.0]
    assert div[2:4].tolist() == pytest.approx([0.5**0.5] * 2)  # RMS of a half-differing picture
    assert torch.isnan(div[4])  # a prompt seen once: nothing to compare with
    same = torch.full((4, 8, 8, 3), 77, dtype=torch.uint8)
    assert sample_diversity(same, ["p"] * 4).tolist() == [0.0] * 4  # collapsed onto one picture
    videos = torch.zeros(2, 3, 8, 8, 3, dtype=torch.uint8)
    videos[1, 2] = 255  # one frame of three differs
    assert sample_diversity(videos, ["v", "v"]).tolist() == pytest.approx([3**-0.5] * 2)
    with pytest.raises(ValueError, match="uint8 images"):
        sample_diversity(torch.zeros(2, 8, 8, 3), ["p", "p"])


def test_standardised_parts_weigh_what_their_weights_say_whatever_their_scale():
    small = torch.tensor([0.0, 1.0, 0.0, 1.0])
    huge = torch.tensor([4000.0, 1000.0, 3000.0, 2000.0])  # another reward's units: it would decide alone
    a = as_reward(lambda c, **k: small.tolist(), "text", name="a")
    b = as_reward(lambda c, **k: huge.tolist(), "text", name="b")
    raw = WeightedSum({"a": a, "b": b}, [1.0, 1.0])(["x"] * 4, ["p"] * 4)
    assert raw.argmax().item() == 0  # the huge part picks the best sample
    norm = WeightedSum({"a": a, "b": b}, [1.0, 1.0], normalize=True)
    total = norm(["x"] * 4, ["p"] * 4)
    assert torch.allclose(total, standardize(small) + standardize(huge))
    assert torch.allclose(norm.combine(norm.parts(["x"] * 4, ["p"] * 4), normalize=False), raw)
    assert standardize(torch.tensor([2.0, 2.0])).tolist() == [0.0, 0.0]  # a constant part adds nothing
    nan = standardize(torch.tensor([1.0, float("nan"), 3.0]))
    assert nan[0].item() == pytest.approx(-(0.5**0.5)) and torch.isnan(nan[1])


def test_the_stage_logs_diversity_and_pays_it_as_a_term():
    sim = PromptSim(num_envs=4, image_size=4)
    obs = sim.reset([5, 5, 6, 7])  # envs 0 and 1 share a prompt
    images = torch.zeros(4, 4, 4, 3, dtype=torch.uint8)
    images[1] = 255
    zero = as_reward(lambda images, **k: [0.0] * len(images), "image", name="zero")

    stage = RewardStage(zero, "image", combine=RewardSynthesis(weights={"model": 1.0, "diversity": 0.5}))
    res = stage(sim.step_chunk(images), obs, images, torch.ones(4, dtype=torch.bool))
    assert res.reward.tolist() == [0.5, 0.5, 0.0, 0.0]  # distance 1 within prompt 5; the others alone
    assert stage.drain()["diversity"] == 1.0
    with pytest.raises(ValueError, match="measures generated images and videos"):
        RewardStage(zero, "frame", combine=RewardSynthesis(weights={"model": 1.0, "diversity": 1.0}))


def test_normalize_parts_needs_several_rewards():
    with pytest.raises(ConfigError, match="name two or more rewards"):
        load_experiment("configs/vlm_quickstart.yaml", ["reward.normalize_parts=true"])
