"""Suite evaluation for ``mmrl eval``: success per task and overall, one video per task, a JSON report.

Tasks are evaluated one after another; each gets its own simulator of at most ``max_envs``
environments, built when its turn comes and closed before the next, so a 90-task suite never holds
more than one batch of environments. Episode e of every task resets with seed ``seed + e``; on
LIBERO that walks the task's held-out initial-state pool (the simulator's ``eval_kwargs``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mmrl.rollout import evaluate_policy, weighted_rates
from mmrl.trainer.audit import summarize


def task_slug(task: Any) -> str:
    """A file-name-safe label of a task value (``PickCube-v1``, ``3``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(task)) or "task"


def evaluate_suite(
    policy,
    make_sim: Callable[[Any, int], Any],
    tasks: list,
    episodes: int,
    seed: int,
    generator: torch.Generator | None = None,
    video_dir: Path | None = None,
    video_envs: int = 8,
    max_envs: int = 64,
    reward=None,
    audit: bool = True,
) -> dict:
    """Evaluate ``policy`` on every task in ``tasks``; ``make_sim(task, num_envs)`` builds one
    task's simulator; ``reward`` is the experiment's reward stage
    (`mmrl.trainer.reward_stage.RewardStage`) or None, audited unless ``audit`` is false. Returns
    the report: overall ``success_rate`` / ``return`` / ``length`` / ``episodes`` (episode-weighted
    over tasks), ``tasks``, one entry per task, ``suites`` (success per suite) when the simulators
    name theirs (LIBERO), and ``breakdown`` (success per label of each dimension, over every task) when they label their
    episodes (`mmrl.rollout.episode_breakdown`: reach's goal colour, goal cell, start distance), and
    ``reward_audit`` with a reward stage (`mmrl.trainer.audit.summarize`: how its score tracked
    success there)."""
    if not tasks:
        raise ValueError("evaluate_suite needs at least one task")
    if episodes < 1 or max_envs < 1:
        raise ValueError(f"need episodes >= 1 and max_envs >= 1, got {episodes} and {max_envs}")
    rows = []
    has_success = True  # every task's simulator judges success (the audit's label)
    audit = audit and reward is not None
    if audit:
        reward.start_audit()  # each scored sample with its labels, over every task (`summarize`)
    for task in tqdm(tasks, desc="eval tasks", dynamic_ncols=True, disable=len(tasks) == 1):
        sim = make_sim(task, max_envs)  # batches as in training's evaluation: the same draws, the same number
        try:
            name = "eval.mp4" if task is None else f"eval_{task_slug(task)}.mp4"
            video = video_dir / name if video_dir is not None and video_envs else None
            res = evaluate_policy(policy, sim, episodes, seed, generator, video, video_envs, reward=reward)
            language, suite = sim.instruction, sim.suite
            has_success = has_success and sim.has_success
        finally:
            sim.close()
        row = {"task": task, **res}
        if language is not None:
            row["instruction"] = language
        if isinstance(suite, str):
            row["suite"] = suite
        if video is not None:
            row["video"] = str(video)
        rows.append(row)
        tqdm.write(f"[eval] task {task}: success {res['success_rate']:.3f} over {res['episodes']} episodes")
    total = sum(r["episodes"] for r in rows)

    def mean(key: str) -> float:
        return sum(r[key] * r["episodes"] for r in rows) / total

    report = {
        "success_rate": mean("success_rate"),
        "return": mean("return"),
        "length": mean("length"),
        "episodes": total,
        "tasks": rows,
    }
    if all("suite" in r for r in rows):  # e.g. LIBERO: success per suite, episode-weighted over its tasks
        report["suites"] = weighted_rates((r["suite"], r["success_rate"], r["episodes"]) for r in rows)
    if all("breakdown" in r for r in rows):  # labelled episodes: success per label, over every task
        dims = set.intersection(*(set(r["breakdown"]) for r in rows))
        report["breakdown"] = {
            d: weighted_rates(
                (label, x["success_rate"], x["episodes"]) for r in rows for label, x in r["breakdown"][d].items()
            )
            for d in sorted(dims)
        }
    audited = summarize(reward, [reward.finish_audit()], has_success) if audit else None
    if audited is not None:
        report["reward_audit"] = audited
    return report


def resolve_checkpoint(given: str | None, run_dir: Path, log=None, key: str = "checkpoint") -> Path:
    """The checkpoint folder ``mmrl eval`` / ``mmrl export`` load: ``checkpoint=`` a checkpoint
    folder, its ``state.pt``, a run folder or its ``checkpoints/`` (their newest complete
    checkpoint, saying on ``log``, stderr by default, each newer one passed over and why), or
    nothing (the configured run's). Raises `UserError` naming what was looked at and why, and the
    setting ``key`` that gives another (``checkpoint``; DSRL's ``policy.base_checkpoint``)."""
    from mmrl.errors import UserError
    from mmrl.trainer import checkpoint as ckpt

    path = Path(given) if given else run_dir
    if path.is_file() and path.name in ("state.pt", "model.safetensors"):
        path = path.parent
    if path.is_dir() and not (path / "state.pt").exists():  # a run folder or its checkpoints/
        root = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        good, problems = ckpt.newest_complete(root)
        if good is not None:
            for skipped in problems:  # never an older checkpoint in silence
                (log or _to_stderr)(f"warning: using {good.name}, not the newer {skipped}")
            return good
        if not problems:
            raise UserError(
                f"no checkpoint in {path}: pass {key}=PATH (a run folder, or a checkpoint folder holding state.pt)"
                if given
                else f"no checkpoint in {path} (the configured run has not saved one): pass {key}=PATH"
            )
        raise UserError(f"no complete checkpoint in {root}: " + "; ".join(problems))
    if not path.exists():
        raise UserError(
            f"checkpoint {path} does not exist: pass {key}=PATH (a run folder, or a checkpoint folder holding state.pt)"
            if given
            else f"nothing was trained in {path} (the configured run folder) yet: train it with the same "
            "config and overrides first, or pass checkpoint=PATH"
        )
    why = ckpt.verify(path)
    if why is not None:
        raise UserError(f"checkpoint {path} is not usable: {why}")
    return path


def _to_stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr)


def run_folder_of(checkpoint: Path) -> Path:
    """The run folder a checkpoint folder belongs to (``RUN/checkpoints/iter_N``), or the checkpoint
    folder itself when it stands alone."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint


def load_checkpoint_policy(path: Path, policy, cfg) -> dict:
    """Load the weights of checkpoint folder ``path`` into ``policy``, built from ``cfg``. A file
    that is not a checkpoint, or weights of another policy config, raise `UserError`: the latter
    names the differing config keys and the command that evaluates with the checkpoint's own config."""

    from mmrl.config import to_dict
    from mmrl.errors import UserError
    from mmrl.trainer import checkpoint as ckpt
    from mmrl.trainer.run_folder import config_changes

    file = Path(path) / "state.pt"
    try:
        data = ckpt.read(path)
        weights = data["policy"]
    except Exception as exc:  # any unreadable file is the same problem for the user
        if isinstance(exc, ckpt.UnreadableFile):
            file, exc = exc.file, exc.cause
        raise UserError(
            f"{file} cannot be read as an mmrl checkpoint ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else 'no detail'}): it is damaged or "
            "was not written by mmrl; pass another checkpoint=PATH"
        ) from None
    try:
        ckpt.load_into(policy, weights, data.get("source"), where=f"checkpoint {path}")
    except ckpt.CheckpointError as exc:  # trained on other base weights: its own line
        raise UserError(str(exc)) from None
    except RuntimeError as exc:
        try:
            old = {"policy": ckpt.recorded_config(Path(path), log=lambda _: None).get("policy", {})}
        except UserError:  # no config to compare with: the mismatch alone is said
            old = None
        hint = ""
        if old is not None:
            diff = [
                f"{k} {a!r} (checkpoint) vs {b!r}" for k, a, b in config_changes(old, {"policy": to_dict(cfg.policy)})
            ]
            hint = (
                f" ({', '.join(diff[:6])})" if diff else ""
            ) + f". Evaluate it with the config it was trained with: mmrl eval {path}"
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise UserError(
            f"checkpoint {path} holds weights of another policy config: {len(lines) - 1} "
            f"mismatches, first: {lines[1] if len(lines) > 1 else lines[0]}{hint}"
        ) from None
    return data
