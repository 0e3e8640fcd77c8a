"""Moved: the reward-model contract is `mmrl.reward`. This alias keeps reward models written
against ``rewards.base`` importing."""

from mmrl.reward import Reward, RewardError, WeightedSum, check_images  # noqa: F401
