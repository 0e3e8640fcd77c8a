"""The reward audit of each evaluation (``reward.audit``): the trainer's side of
`mmrl.algorithms.reward_audit`.

`start` asks the reward stage to keep each scored sample of the evaluation with its labels; `finish`
turns them into the audit (`audit_scores` against the simulator's success and own reward, and the
held-out reward where one is configured), gathered over the ranks, and decides the hacking warning
by replaying the run's evaluations in order (`HackingWatch`): the results saved in every checkpoint
hold each evaluation's audit, so a resumed run warns exactly where the uninterrupted one would.
"""

from __future__ import annotations

from mmrl.algorithms.advantages import group_reward_stats
from mmrl.algorithms.reward_audit import HackingWatch, audit_logs, audit_scores
from mmrl.distributed import gather_objects

KEY = "reward_audit"  # the audit's key in an evaluation's results (results.json)


def enabled(trainer) -> bool:
    """Whether the trainer's evaluations are audited: a reward stage scores them and
    ``reward.audit.enabled`` (on by default)."""
    cfg = trainer.cfg.reward
    return trainer.reward_stage is not None and cfg is not None and cfg.audit.enabled


def start(trainer) -> None:
    if enabled(trainer):
        trainer.reward_stage.start_audit()


def finish(trainer, name: str) -> dict | None:
    """The audit of the evaluation ``name`` that ran since `start`, over every rank's samples (None:
    not audited, or nothing scored). Every rank calls it."""
    if not enabled(trainer):
        return None
    return summarize(
        trainer.reward_stage, gather_objects(trainer.reward_stage.finish_audit()), trainer.eval_sim.has_success
    )


def summarize(stage, parts: list, has_success: bool) -> dict | None:
    """`audit_scores` of what the reward stage ``stage`` kept (``parts``: its `finish_audit` results,
    one per rank, None where nothing was scored) against the simulator's success (where it judges
    one, ``has_success``), its own reward and the held-out reward, with the mean sample diversity
    where it was measured and the two rewards' names; None when nothing was scored. Training's
    evaluations (`finish`) and ``mmrl eval`` (`mmrl.trainer.evaluation`) both audit with it."""
    import torch

    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    data = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    out = audit_scores(data["score"], data["success"] if has_success else None, data["task"], data.get("heldout"))
    div = data.get("diversity")
    if div is not None and bool(torch.isfinite(div).any()):  # generated samples, a prompt seen more than once
        out["diversity"] = float(div[torch.isfinite(div)].mean())
    out["reward"] = stage.name
    if stage.heldout is not None:
        out["heldout"] = stage.heldout.name
    return out


def record(trainer, name: str, res: dict) -> dict[str, float]:
    """`finish` the audit of evaluation ``name`` into its results ``res`` (under `KEY`; ``res`` is
    already the run's ``state.results[name]``), say the hacking warning if it completes a streak,
    and return its scalar logs (``eval/reward_audit/<key>``); nothing when not audited."""
    out = finish(trainer, name)
    if out is None:
        return {}
    res[KEY] = out
    line = hacking_warning(trainer, trainer.state.results)
    if line is not None:
        trainer.log_line(line)
    return audit_logs(f"eval/{KEY}", out)


def group_stats(group_size: int, batch) -> dict:
    """The reward's spread within GRPO groups, as TRL logs it (`group_reward_stats`):
    ``train/reward_std`` and ``train/frac_reward_zero_std`` (groups that give no signal); nothing
    without groups."""
    if group_size <= 1 or "group" not in batch:
        return {}
    returns = (batch["rewards"] * batch["valid"]).sum(0)
    return {f"train/{k}": v for k, v in group_reward_stats(returns, batch["group"][0]).items()}


def measure(audit: dict, success_rate: float | None) -> tuple[float, float, str] | None:
    """(trained, held-out, held-out's name) of one evaluation for the watch: the trained reward's
    mean, against the held-out reward's mean where there is one, else the evaluation's success
    (``success_rate``: the simulator's own, None where only the trained reward defines success)."""
    if audit.get("mean") is None:
        return None
    if audit.get("heldout_mean") is not None:
        return audit["mean"], audit["heldout_mean"], audit["heldout"]
    if success_rate is not None:
        return audit["mean"], success_rate, "success"
    return None


def hacking_warning(trainer, results: dict[str, dict]) -> str | None:
    """The warning line the latest evaluation in ``results`` (by iteration, in the order they ran)
    completes, or None: `HackingWatch` replayed over every audited evaluation of the run."""
    cfg = trainer.cfg.reward.audit
    watch: HackingWatch | None = None
    line = None
    for name, res in results.items():  # insertion order = the order they ran (and were saved)
        audit = res.get(KEY)
        if not audit:
            continue
        # the simulator's own success only: a success the trained reward's threshold defines rises with it
        m = measure(audit, res.get("success_rate") if trainer.eval_sim.has_success else None)
        if m is None:
            continue
        if watch is None:
            watch = HackingWatch(audit["reward"], m[2], cfg.patience, cfg.tolerance)
        line = watch.update(m[0], m[1], where=name)
    return line


__all__ = ["KEY", "enabled", "start", "finish", "summarize", "record", "group_stats", "measure", "hacking_warning"]
