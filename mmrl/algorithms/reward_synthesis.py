"""Reward synthesis: combine a reward model's score (CLIP / VLM / any reward of the trainer's reward
stage, per step) with the simulator's terms (its task reward, success, terminations, a step cost).

Pure functions on float tensors ``[N]`` (lists / numpy arrays are accepted and converted); ``score``
is the model's score (VLM-RL's "semantic reward"):

- `weighted`: ``w_model * score + sum_k w_k * terms[k]``.
- `gated`: ``score * gate * prod_k factors[k]`` (multiplicative gating by normalised state terms in
  [0, 1], e.g. "in lane" or a lane-centering factor; a bool gate is 0 / 1).
- `speed_target` / `hierarchical`: VLM-RL's hierarchical reward synthesis (Huang et al. 2024,
  arXiv:2412.15544, Sec. "Hierarchical reward synthesis"; the authors' code,
  github.com/zihaosheng/VLM-RL ``clip/clip_rewarded_sac.py::_compute_clip_rewards`` with the factors
  of ``carla_env/rewards.py::reward_fn5``). The normalised score ``s`` in [0, 1] sets the
  desired speed, and the speed reward is multiplied by normalised state factors::

      v_des   = clip(s, 0, 1) * v_target
      r_speed = 1 - |v - v_des| / v_target
      r       = r_speed * f_center * f_angle * f_stability          (each f in [0, 1])

  so an unsafe-looking scene (s -> 0) asks the agent to slow down. Range: ``r <= 1``; ``r >= 0`` while
  ``v <= v_des + v_target``.
- `terminal_override`: where an episode ended in failure (collision, off-track, ...) the reward *is*
  the penalty, whatever the other terms say (VLM-RL: ``rewards = np.where(base_reward < 0,
  base_reward, rewards)`` with ``penalty_reward = -10``).

`RewardSynthesis` / `synthesize(cfg, score, terms, failure_mask)` apply one declared mode then the
terminal override, e.g. ``{"mode": "hierarchical", "speed": "speed", "target_speed": 25.0,
"factors": ["centering", "angle", "stability"], "failure_penalty": -10.0}`` or ``{"mode": "weighted",
"weights": {"model": 1.0, "progress": 0.5}}`` or ``{"mode": "gated", "gate": "in_lane"}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import torch

MODES = ("weighted", "gated", "hierarchical")
MODEL = "model"  # the weight key of the model's score in ``weighted``


def _vec(x, what: str, n: int | None = None) -> torch.Tensor:
    t = torch.as_tensor(x).float()
    if t.dim() != 1:
        raise ValueError(f"{what} must be a 1-D tensor [N], got shape {tuple(t.shape)}")
    if n is not None and t.shape[0] != n:
        raise ValueError(f"{what} has {t.shape[0]} entries, expected {n} (one per step)")
    return t


def _pick(terms: Mapping[str, object], names: Sequence[str], n: int, what: str) -> list[torch.Tensor]:
    missing = [k for k in names if k not in terms]
    if missing:
        raise ValueError(f"{what}: unknown term(s) {missing}; available terms: {sorted(terms)}")
    return [_vec(terms[k], f"term '{k}'", n) for k in names]


def weighted(score, terms: Mapping[str, object], weights: Mapping[str, float]) -> torch.Tensor:
    """``weights.get("model", 1) * score + sum_k weights[k] * terms[k]`` over the terms named in
    ``weights`` (every key other than ``"model"`` must be a term; terms without a weight are unused)."""
    sem = _vec(score, "score")
    names = [k for k in weights if k != MODEL]
    parts = _pick(terms, names, sem.shape[0], "weighted")
    out = float(weights.get(MODEL, 1.0)) * sem
    for k, t in zip(names, parts):
        out = out + float(weights[k]) * t
    return out


def gated(score, gate=None, factors: Mapping[str, object] | None = None) -> torch.Tensor:
    """``score * gate * prod(factors)``; ``gate`` and each factor in [0, 1] (bool allowed) or None."""
    sem = _vec(score, "score")
    out = sem.clone()
    items = ([("gate", gate)] if gate is not None else []) + list((factors or {}).items())
    for k, f in items:
        t = _vec(f, f"'{k}'", sem.shape[0])
        if ((t < 0) | (t > 1)).any():
            raise ValueError(f"'{k}' must lie in [0, 1] (a normalised state term), got {t.tolist()}")
        out = out * t
    return out


def speed_target(score, speed, target_speed: float) -> torch.Tensor:
    """VLM-RL speed reward ``1 - |v - clip(s, 0, 1) * v_target| / v_target``."""
    if not target_speed > 0:
        raise ValueError(f"target_speed must be > 0, got {target_speed}")
    sem = _vec(score, "score")
    v = _vec(speed, "speed", sem.shape[0])
    return 1.0 - (v - sem.clamp(0.0, 1.0) * target_speed).abs() / target_speed


def hierarchical(score, speed, target_speed: float, factors: Mapping[str, object] | None = None) -> torch.Tensor:
    """VLM-RL hierarchical synthesis: `speed_target` times the state factors (each in [0, 1])."""
    return gated(speed_target(score, speed, target_speed), None, factors)


def terminal_override(reward, terminated_mask, penalty) -> torch.Tensor:
    """``penalty`` where ``terminated_mask`` (a failed ending) is true, else ``reward``."""
    r = _vec(reward, "reward")
    mask = _vec(terminated_mask, "terminated_mask", r.shape[0]).bool()
    pen = torch.as_tensor(penalty, dtype=torch.float32)
    if pen.dim() > 0:
        pen = _vec(pen, "penalty", r.shape[0])
    return torch.where(mask, pen, r)


@dataclass
class RewardSynthesis:
    """A declared synthesis: one of `MODES`, then the terminal override when a failure mask is given.

    ``weights`` (weighted), ``gate`` / ``factors`` (gated), ``speed`` / ``target_speed`` / ``factors``
    (hierarchical) name entries of the ``terms`` dict; ``failure_penalty`` is the override value.
    """

    mode: str = "weighted"
    weights: dict = field(default_factory=lambda: {MODEL: 1.0})
    gate: str | None = None
    factors: list = field(default_factory=list)
    speed: str = "speed"
    target_speed: float | None = None
    failure_penalty: float = -10.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown synthesis mode {self.mode!r}; valid modes: {list(MODES)}")
        if self.mode == "hierarchical" and self.target_speed is None:
            raise ValueError("mode 'hierarchical' needs target_speed (VLM-RL: 25 km/h)")
        self.factors = list(self.factors)

    @classmethod
    def from_dict(cls, cfg: Mapping) -> RewardSynthesis:
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(cfg) - set(valid))
        if unknown:
            raise ValueError(f"unknown reward synthesis key(s) {unknown}; valid keys: {valid}")
        return cls(**dict(cfg))

    def named_terms(self) -> list[str]:
        """The terms this synthesis reads (besides the model's score)."""
        if self.mode == "weighted":
            return [k for k in self.weights if k != MODEL]
        return (
            list(self.factors)
            + ([self.gate] if self.mode == "gated" and self.gate else [])
            + ([self.speed] if self.mode == "hierarchical" else [])
        )

    def __call__(self, score, terms: Mapping[str, object] | None = None, failure_mask=None) -> torch.Tensor:
        terms = dict(terms or {})
        n = _vec(score, "score").shape[0]
        if self.mode == "weighted":
            out = weighted(score, terms, self.weights)
        else:
            _pick(terms, self.named_terms(), n, f"mode {self.mode!r}")
            factors = {k: terms[k] for k in self.factors}
            if self.mode == "gated":
                out = gated(score, terms[self.gate] if self.gate else None, factors)
            else:
                assert self.target_speed is not None  # __post_init__ requires it for hierarchical
                out = hierarchical(score, terms[self.speed], float(self.target_speed), factors)
        if failure_mask is not None:
            out = terminal_override(out, failure_mask, self.failure_penalty)
        return out


def synthesize(
    cfg: Mapping | RewardSynthesis, score, terms: Mapping[str, object] | None = None, failure_mask=None
) -> torch.Tensor:
    """Apply the synthesis declared by ``cfg`` (a dict of `RewardSynthesis` fields, or one)."""
    synth = cfg if isinstance(cfg, RewardSynthesis) else RewardSynthesis.from_dict(cfg)
    return synth(score, terms, failure_mask)


__all__ = [
    "MODEL",
    "weighted",
    "gated",
    "speed_target",
    "hierarchical",
    "terminal_override",
    "RewardSynthesis",
    "synthesize",
    "MODES",
]
