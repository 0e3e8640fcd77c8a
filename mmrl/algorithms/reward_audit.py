"""How far a trained reward can be trusted: pure functions over scored samples, and the watch that
warns when the trained reward and a held-out measure part ways (reward hacking).

A reward model is trained on (or chosen for) what it can see; where a label exists beside it, the
audit says how the reward tracks the label on the same samples:

- `pearson` and `auc` (ROC AUC, ties counted one half) of the reward against success;
- `audit_scores`: those, the means of the reward on successes and failures, its correlation with the
  simulator's own task reward where there is one, and against a held-out reward model's score of
  the same samples (the mean ``gap`` between the two, when both are on one scale);
- `sample_diversity`: how far each generated sample lies from the others of its prompt (a collapse to
  one picture per prompt reads 0), logged and usable as a reward term;
- `HackingWatch`: fed one (trained, held-out) pair per evaluation, it says in one line when the
  trained reward rose while the held-out measure fell over ``patience`` evaluations in a row.

Everything is CPU float64 and deterministic; nothing here knows about simulators or trainers
(`mmrl.trainer.reward_stage` records the samples, the trainer logs what this returns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two ``[N]`` tensors (0 when either is constant or N < 2)."""
    if x.numel() < 2:
        return 0.0
    x, y = x.double() - x.double().mean(), y.double() - y.double().mean()
    den = (x.norm() * y.norm()).item()
    return float((x * y).sum().item() / den) if den > 0 else 0.0


def auc(score: torch.Tensor, label: torch.Tensor) -> float:
    """ROC AUC of ``score`` for binary ``label`` (ties count one half; nan without both classes):
    the chance that a random positive scores above a random negative (Mann-Whitney U / n+ n-)."""
    label = label.bool().flatten()
    score = score.double().flatten()
    n_pos, n_neg = int(label.sum()), int((~label).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    uniq, inv = torch.unique(score, return_inverse=True)
    ranks = torch.empty(score.numel(), dtype=torch.float64)
    ranks[score.argsort()] = torch.arange(1, score.numel() + 1, dtype=torch.float64)
    sums = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, ranks)
    cnts = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, torch.ones_like(ranks))
    ranks = (sums / cnts)[inv]  # average ranks of ties
    return float((ranks[label].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _mean(x: torch.Tensor) -> float | None:
    return float(x.double().mean()) if x.numel() else None


def _sem(x: torch.Tensor) -> float | None:
    """The standard error of the mean of ``x`` (sample std / sqrt n; None under two values)."""
    return float(x.double().std() / math.sqrt(x.numel())) if x.numel() > 1 else None


def audit_scores(
    score: torch.Tensor,
    success: torch.Tensor | None = None,
    task: torch.Tensor | None = None,
    heldout: torch.Tensor | None = None,
) -> dict:
    """How the trained reward ``score`` ``[N]`` tracks the labels of the same N samples.

    ``success`` (bool [N]): ``corr_success``, ``auc_success``, ``mean_success`` / ``mean_failure``
    (None where a class is absent) and ``success_share``; ``task`` (the simulator's own reward of
    each sample, [N]): ``corr_task``; ``heldout`` (a held-out reward model's score, [N]):
    ``heldout_mean``, ``heldout_sem``, ``corr_heldout`` and ``gap`` (trained mean minus held-out
    mean). Always: ``n``, ``mean`` and ``sem`` (the standard error of the mean: whether two
    evaluations' means differ by more than their noise). Non-finite scores are left out with their
    labels (``nonfinite`` counts them).
    """
    score = score.double().flatten()
    keep = torch.isfinite(score)
    out: dict = {"n": int(keep.sum()), "nonfinite": int((~keep).sum())}
    s = score[keep]
    out["mean"] = _mean(s)
    out["sem"] = _sem(s)
    if success is not None:
        ok = success.bool().flatten()[keep]
        out["corr_success"] = pearson(s, ok.double())
        out["auc_success"] = auc(s, ok)
        out["mean_success"] = _mean(s[ok])
        out["mean_failure"] = _mean(s[~ok])
        out["success_share"] = _mean(ok.double())
    if task is not None:
        out["corr_task"] = pearson(s, task.double().flatten()[keep])
    if heldout is not None:
        h = heldout.double().flatten()[keep]
        good = torch.isfinite(h)
        out["heldout_mean"] = _mean(h[good])
        out["heldout_sem"] = _sem(h[good])
        out["corr_heldout"] = pearson(s[good], h[good])
        out["gap"] = out["mean"] - out["heldout_mean"] if out["heldout_mean"] is not None and s.numel() else None
    return out


def audit_logs(prefix: str, audit: dict) -> dict[str, float]:
    """The finite numbers of an `audit_scores` result as scalar logs ``<prefix>/<key>``."""
    return {
        f"{prefix}/{k}": float(v)
        for k, v in audit.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


DIVERSITY_PX = 16  # the feature space of `sample_diversity`: each frame's pixels, area-pooled to at most this side


def diversity_features(samples: torch.Tensor) -> torch.Tensor:
    """``[B, D]`` features of uint8 images ``[B, H, W, 3]`` or videos ``[B, F, H, W, 3]``: the pixels in
    [0, 1], each frame area-pooled to at most `DIVERSITY_PX` a side (so the distance measures layout and
    colour, not pixel noise), flattened."""
    if samples.dtype != torch.uint8 or samples.dim() not in (4, 5) or samples.shape[-1] != 3:
        raise ValueError(
            f"diversity needs uint8 images [B, H, W, 3] or videos [B, F, H, W, 3], got {tuple(samples.shape)}"
        )
    x = samples.float().div(255.0)
    frames = x.reshape(-1, *x.shape[-3:]).permute(0, 3, 1, 2)  # [B*F, 3, H, W]
    h, w = frames.shape[-2:]
    frames = torch.nn.functional.adaptive_avg_pool2d(frames, (min(h, DIVERSITY_PX), min(w, DIVERSITY_PX)))
    return frames.reshape(samples.shape[0], -1)


def sample_diversity(samples: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Per sample ``[B]``: its mean RMS distance (`diversity_features`, pixel units in [0, 1]) to the
    other samples of the same prompt in the batch; NaN for a sample whose prompt appears once. The
    mean over a prompt's samples is the group's mean pairwise distance: 0 when a generator has
    collapsed onto one picture per prompt, the failure reward hacking tends to end in."""
    if len(prompts) != samples.shape[0]:
        raise ValueError(f"{len(prompts)} prompts for {samples.shape[0]} samples")
    feats = diversity_features(samples).double()
    out = torch.full((len(prompts),), float("nan"), dtype=torch.float64)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p, []).append(i)
    for rows in groups.values():
        if len(rows) < 2:
            continue
        f = feats[rows]
        dist = torch.cdist(f, f) / f.shape[1] ** 0.5  # RMS over features
        out[rows] = dist.sum(1) / (len(rows) - 1)
    return out.float()


@dataclass
class HackingWatch:
    """Warns when the trained reward rises while a held-out measure falls (`update`, one pair per
    evaluation). ``patience`` consecutive evaluations of both moving apart, each by more than
    ``tolerance``, give one warning line naming both numbers, then the count starts over; any
    evaluation where they do not part resets it. ``heldout_name`` is what the held-out measure is
    (``success``, a held-out reward's name). The trainer keeps none of it in checkpoints: it replays
    a fresh watch over the evaluations saved in the run's results (`mmrl.trainer.audit.hacking_warning`),
    so a resumed run warns exactly when the uninterrupted one would."""

    trained_name: str
    heldout_name: str
    patience: int = 3
    tolerance: float = 0.0
    history: list[tuple[float, float]] = field(default_factory=list)  # the (trained, held-out) pairs of the streak

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")
        if self.tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {self.tolerance}")

    def update(self, trained: float, heldout: float, where: str = "") -> str | None:
        """Record one evaluation's trained reward and held-out measure; the warning line, or None."""
        if not (math.isfinite(trained) and math.isfinite(heldout)):
            self.history = []  # a measure that could not be taken breaks the streak
            return None
        if self.history:
            last_t, last_h = self.history[-1]
            parting = trained > last_t + self.tolerance and heldout < last_h - self.tolerance
            if not parting:
                self.history = []
        self.history.append((float(trained), float(heldout)))
        if len(self.history) <= self.patience:
            return None
        (t0, h0), (t1, h1) = self.history[0], self.history[-1]
        self.history = [self.history[-1]]  # warn once per streak of `patience` evaluations
        at = f" at {where}" if where else ""
        return (
            f"warning: possible reward hacking{at}: the trained reward '{self.trained_name}' rose "
            f"{t0:.4g} -> {t1:.4g} while the held-out '{self.heldout_name}' fell {h0:.4g} -> {h1:.4g}, "
            f"apart at each of the last {self.patience} evaluations; look at the samples (videos, image "
            "grids) before trusting the run, and add a guard (a KL term, a held-out reward)"
        )

    def state_dict(self) -> dict:
        return {"history": [list(p) for p in self.history]}

    def load_state_dict(self, state: dict) -> None:
        self.history = [(float(a), float(b)) for a, b in state.get("history", [])]


__all__ = ["pearson", "auc", "audit_scores", "audit_logs", "diversity_features", "sample_diversity", "HackingWatch"]
