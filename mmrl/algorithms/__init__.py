"""RL math as pure torch functions: advantage estimators, policy/value losses, KL estimators,
loss aggregation and DAPO dynamic sampling. Shapes and formulas are in each docstring.

Importing this package registers the advantage estimators in `mmrl.registry.ADVANTAGES`
(beside their definitions in `mmrl.algorithms.advantages`, with the registry's one signature). The
group-based pure functions share the call ``fn(rewards [M], group [M]) -> advantages [M]``; ``gae``
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
