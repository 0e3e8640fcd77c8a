"""Training ranks placed by Ray: ``placement.train_ranks: N`` with ``placement.backend: ray``.

    mmrl train configs/quickstart.yaml placement.backend=ray placement.train_ranks=2

The command's process becomes a driver: Ray Train's `TorchTrainer` starts N workers (Ray actors, one
per rank, on whichever nodes of the cluster have the resources: ``placement.train_cpus_per_rank``
CPUs each and, with ``run.device: cuda``, one GPU), joins them in one `torch.distributed` process
group (gloo on CPU, NCCL on GPUs, `mmrl.distributed.TIMEOUT_S`) and sets ``RANK`` / ``WORLD_SIZE``
/ ``LOCAL_RANK`` in each, exactly as ``torchrun`` would; every worker then runs the same trainer as a
``torchrun`` rank (`mmrl.distributed`), so a Ray-placed run trains what ``torchrun`` trains. Rank 0
writes the run folder; the driver prints its ``results.json``. This is how verl and RLinf put
their training ranks on a Ray cluster; the simulator workers of ``placement.mode`` disaggregated /
hybrid are Ray actors of the same cluster (`mmrl.placement.ray_worker`).

Failures: a rank that raises or dies (its process killed, its node lost) ends the whole group;
Ray restarts it ``placement.train_max_restarts`` times, each time resuming from the newest complete
checkpoint (`trainer.resume`), then the driver exits non-zero with one line naming the rank and the
cause. The workers start in the driver's working directory, so relative paths in the config mean
what they mean to the driver: on several machines, that folder (and the run folder) must be shared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from mmrl.errors import UserError


def train_on_ray(config: str, overrides: list[str], cfg) -> dict:
    """Train experiment ``config`` (with ``overrides``; loaded as ``cfg``) on ``placement.train_ranks``
    Ray Train workers; returns rank 0's results. Raises `UserError` naming the rank that failed."""
    from mmrl import distributed
    from mmrl.experiment import output_dir
    from mmrl.placement.ray_worker import init_ray

    ray = init_ray()
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    place = cfg.placement
    gpu = cfg.run.device.startswith("cuda")
    out = Path(output_dir(cfg)).resolve()
    trainer = TorchTrainer(
        _rank,
        train_loop_config={"cwd": os.getcwd(), "config": str(Path(config).resolve()), "overrides": list(overrides)},
        scaling_config=ScalingConfig(
            num_workers=place.train_ranks, use_gpu=gpu, resources_per_worker={"CPU": place.train_cpus_per_rank}
        ),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo", timeout_s=int(distributed.TIMEOUT_S)),
        run_config=RunConfig(
            name=cfg.run.name,
            storage_path=str(out.parent / ".ray_train"),  # Ray Train's own bookkeeping, beside the run
            failure_config=FailureConfig(max_failures=place.train_max_restarts),
        ),
    )
    try:
        trainer.fit()
    except Exception as exc:  # Ray Train's errors: the worker group's, or the controller's
        from mmrl.trainer.checkpoint import latest_path

        newest = latest_path(out)
        raise UserError(
            f"training on Ray failed: {describe_failure(exc)}; newest complete checkpoint: "
            f"{newest.name if newest else 'none'}; run the same command to resume"
        ) from None
    finally:
        ray.shutdown()
    return json.loads((out / "results.json").read_text())


def _rank(spec: dict) -> None:
    """One training rank inside a Ray Train worker (its process group already joined)."""
    os.chdir(spec["cwd"])
    from mmrl.experiment import build_trainer, load_experiment

    build_trainer(load_experiment(spec["config"], spec["overrides"])).run()


#: how a rank's error reads when another rank's death broke a collective it was in (gloo, NCCL)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "NCCL communicator")


def describe_failure(exc: BaseException) -> str:
    """One line naming the rank(s) that failed first and why, from Ray Train's per-rank failures:
    the ranks that only lost a peer in a collective are summed up, not described."""
    failures = getattr(exc, "worker_failures", None)
    if not isinstance(failures, dict) or not failures:
        return _short(exc.__cause__ or exc)
    followers = {r for r, err in failures.items() if any(p in str(err) for p in PEER_GONE)}
    first = sorted(set(failures) - followers) or sorted(failures)
    line = "; ".join(f"rank {r}: {_short(failures[r])}" for r in first)
    others = sorted(followers - set(first))
    if others:
        line += f" (then rank(s) {', '.join(map(str, others))} lost it in a collective)"
    return line


def _short(err: BaseException, limit: int = 240) -> str:
    """``Type: message``, from the message's last line (a traceback's), cut to its first sentence."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if "actor is dead" in str(err):  # Ray's account of a dead worker process: say it plainly
        last = "its process died (killed, crashed, or its node was lost)"
    last = last.split(". ")[0]
    return (f"{type(err).__name__}: {last}" if last else type(err).__name__)[:limit]
