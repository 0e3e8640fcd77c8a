"""The reward contract checker passes good rewards and fails broken ones, naming the check."""

import pytest
import torch

from rewards import Reward, check_reward
from rewards.jpeg import JpegCompressibility


class MeanBrightness(Reward):
    """A correct toy image reward: mean pixel value / 255."""

    name = "brightness"

    def score(self, images, prompts, meta):
        return images.float().mean(dim=(1, 2, 3)) / 255


class BatchNormalised(MeanBrightness):
    name = "batch_normalised"

    def score(self, images, prompts, meta):  # depends on the other samples in the batch
        s = super().score(images, prompts, meta)
        return s - s.mean()


class Noisy(MeanBrightness):
    name = "noisy"

    def score(self, images, prompts, meta):
        return super().score(images, prompts, meta) + torch.rand(len(prompts))


class NaNs(MeanBrightness):
    name = "nans"

    def score(self, images, prompts, meta):
        return torch.full((len(prompts),), float("nan"))


class Crashes(MeanBrightness):
    name = "crashes"

    def score(self, images, prompts, meta):
        if images.shape[1] != 32:
            raise RuntimeError("only 32 px images")
        return super().score(images, prompts, meta)


class Mutates(MeanBrightness):
    name = "mutates"

    def score(self, images, prompts, meta):
        out = super().score(images, prompts, meta)
        images.zero_()
        return out


class NoBaseClass:
    """Duck-typed reward that skips input validation and returns float64."""

    name, kind = "duck", "image"

    def __call__(self, images, prompts, meta=None):
        return images.double().mean(dim=(1, 2, 3))


class Exact(Reward):
    """A correct toy text reward: 1 if the completion contains the answer."""

    name, kind = "exact", "text"

    def score(self, completions, prompts, meta):
        return torch.tensor([float(m.get("answer", "") in c) for c, m in zip(completions, meta)])


def test_good_rewards_pass():
    assert check_reward(MeanBrightness)[0] == "attributes"
    assert "image_sizes" in check_reward(JpegCompressibility(quality=50))
    passed = check_reward(Exact, kind="text")
    assert "batch_invariance" in passed and "image_sizes" not in passed


@pytest.mark.parametrize(
    "reward, check, message",
    [
        (BatchNormalised, "batch_invariance", "alone differ"),
        (Noisy, "deterministic", "twice differs"),
        (NaNs, "finite", "NaN"),
        (Crashes, "image_sizes", "RuntimeError: only 32 px"),
        (Mutates, "inputs_untouched", "modified"),
        (NoBaseClass, "output", "float32"),
        (Exact, "attributes", "kind is 'text'"),
    ],
)
def test_broken_rewards_fail_with_the_check_named(reward, check, message):
    with pytest.raises(AssertionError, match=rf"check_reward\[{check}\].*{message}"):
        check_reward(reward)


def test_text_checks_reject_images_and_bad_input():
    with pytest.raises(AssertionError, match=r"check_reward\[attributes\].*expected 'text'"):
        check_reward(MeanBrightness, kind="text")

    class NoValidation(Exact):
        def __call__(self, completions, prompts, meta=None):
            return self.score(completions, prompts, meta or [{}] * len(prompts)).float()

    with pytest.raises(AssertionError, match=r"rejects_bad_input.*must raise ValueError"):
        check_reward(NoValidation, kind="text")
    with pytest.raises(ValueError, match="kind"):
        check_reward(MeanBrightness, kind="audio")  # not a reward kind


def test_a_reward_can_declare_its_own_check_prompts():
    class NeedsColour(MeanBrightness):
        name = "needs_colour"
        example_prompts = ["a red square", "a blue circle"]

        def score(self, images, prompts, meta):
            if any(not p.startswith("a ") for p in prompts):
                raise ValueError("cannot parse")
            return super().score(images, prompts, meta)

    assert "image_sizes" in check_reward(NeedsColour)
    with pytest.raises(AssertionError, match="cannot parse"):
        check_reward(NeedsColour, prompts=["the red square", "x"])
    with pytest.raises(ValueError, match="2 to 64 prompts"):
        check_reward(NeedsColour, prompts=["a red square"])
