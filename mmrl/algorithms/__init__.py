"""RL math as pure torch functions: advantage estimators, policy/value losses, KL estimators,
loss aggregation and DAPO dynamic sampling. Shapes and formulas are in each docstring.

Importing this package registers the advantage estimators in `mmrl.registry.ADVANTAGES`.
The group-based ones share the call ``fn(rewards [M], group [M]) -> advantages [M]``; ``gae``
is the per-step critic-based one (``gae(rewards, values, dones, last_values, gamma, lam)``).
"""

from mmrl.algorithms.advantages import (
    dr_grpo_advantages,
    gae,
    grpo_advantages,
    ngrpo_advantages,
    psr_nsr_weights,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from mmrl.algorithms.dynamic_sampling import DynamicSamplingBuffer, nonconstant_group_mask
from mmrl.algorithms.losses import (
    AGG_MODES,
    KL_KINDS,
    aggregate_loss,
    gspo_log_ratio,
    gspo_token_ratio,
    kl_penalty,
    ppo_clip_loss,
    value_loss,
)
import functools

from mmrl.registry import ADVANTAGES

ADVANTAGES.register(
    "grpo", grpo_advantages, description="GRPO: (r - group mean) / group std (unbiased)"
)
ADVANTAGES.register(
    "grpo_global_std",
    functools.partial(grpo_advantages, scale="batch_std"),
    description="Flow-GRPO: (r - group mean) / std of the whole batch",
)
ADVANTAGES.register(
    "dr_grpo", dr_grpo_advantages, description="Dr.GRPO: r - group mean (no std division)"
)
ADVANTAGES.register(
    "rloo", rloo_advantages, description="RLOO: r - mean of the other samples of the group"
)
ADVANTAGES.register(
    "reinforce_pp_baseline",
    reinforce_pp_baseline_advantages,
    description="REINFORCE++-baseline: r - group mean, divided by the batch std",
)
ADVANTAGES.register(
    "ngrpo",
    ngrpo_advantages,
    description="NGRPO: GRPO with a virtual max-reward sample in each group's mean and std",
)
ADVANTAGES.register(
    "reinforce_pp",
    reinforce_pp_advantages,
    description="REINFORCE++: discounted return-to-go of each decision, whitened over the batch (no critic, no groups)",
)
ADVANTAGES.register(
    "gae", gae, description="GAE(gamma, lambda) over time-major [T, N] rollouts with a critic"
)

__all__ = [
    "gae",
    "grpo_advantages",
    "dr_grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "ngrpo_advantages",
    "psr_nsr_weights",
    "ppo_clip_loss",
    "gspo_log_ratio",
    "gspo_token_ratio",
    "kl_penalty",
    "value_loss",
    "aggregate_loss",
    "AGG_MODES",
    "KL_KINDS",
    "nonconstant_group_mask",
    "DynamicSamplingBuffer",
]
