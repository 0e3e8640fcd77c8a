"""Suite evaluation for ``mmrl eval``: success per task and overall, one video per task, a JSON report.

Tasks are evaluated one after another; each gets its own simulator of at most ``max_envs``
environments, built when its turn comes and closed before the next, so a 90-task suite never holds
more than one batch of environments. Episode e of every task resets with seed ``seed + e``; on
LIBERO that walks the task's held-out initial-state pool (the simulator's ``eval_kwargs``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from mmrl.rollout import evaluate_policy, weighted_rates


def task_slug(task: Any) -> str:
    """A file-name-safe label of a task value (``PickCube-v1``, ``3``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(task)) or "task"


def evaluate_suite(policy, make_sim: Callable[[Any, int], Any], tasks: list, episodes: int, seed: int,
                   generator: torch.Generator | None = None, video_dir: Path | None = None,
                   video_envs: int = 8, max_envs: int = 64, reward=None) -> dict:
    """Evaluate ``policy`` on every task in ``tasks``; ``make_sim(task, num_envs)`` builds one
    task's simulator; ``reward`` is the experiment's reward stage (`mmrl.reward.RewardStage`) or None. Returns the report: overall ``success_rate`` / ``return`` / ``length`` /
    ``episodes`` (episode-weighted over tasks), ``tasks``, one entry per task, and ``suites`` (success
    per suite) when the simulators name theirs (LIBERO)."""
    if not tasks:
        raise ValueError("evaluate_suite needs at least one task")
    if episodes < 1 or max_envs < 1:
        raise ValueError(f"need episodes >= 1 and max_envs >= 1, got {episodes} and {max_envs}")
    rows = []
    for task in tqdm(tasks, desc="eval tasks", dynamic_ncols=True, disable=len(tasks) == 1):
        sim = make_sim(task, min(max_envs, episodes))
        try:
            video = video_dir / f"eval_{task_slug(task)}.mp4" if video_dir is not None and video_envs else None
            res = evaluate_policy(policy, sim, episodes, seed, generator, video, video_envs, reward=reward)
            language, suite = sim.instruction, getattr(sim, "suite", None)
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

    report = {"success_rate": mean("success_rate"), "return": mean("return"), "length": mean("length"),
              "episodes": total, "tasks": rows}
    if all("suite" in r for r in rows):  # e.g. LIBERO: success per suite, episode-weighted over its tasks
        report["suites"] = weighted_rates((r["suite"], r["success_rate"], r["episodes"]) for r in rows)
    return report
