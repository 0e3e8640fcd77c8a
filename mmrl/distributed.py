"""Several processes, one trainer per rank: what the trainer needs from `torch.distributed`.

A launcher starts one process per rank and sets ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
``MASTER_ADDR`` / ``MASTER_PORT`` (``torchrun --nproc_per_node N -m mmrl train CONFIG``,
``accelerate launch -m mmrl train CONFIG``, ``torchrun --nnodes M --node_rank i
--rdzv_endpoint HOST:PORT ...`` across machines). Every rank runs the same loop:

* it collects its share of the environments (``sim.num_envs`` each: the global batch is
  ``world * sim.num_envs``; a GRPO group lives in one rank), drawing its rows of the global batch's
  noise (`mmrl.utils.rows`), and the collected batches are gathered, so that every statistic that
  spans the batch (advantage whitening, GRPO baselines, the reward scaler, observation statistics,
  dynamic sampling's kept groups, success rates) is computed on the global batch, as one process
  computes it (verl's driver computes advantages on the whole batch the same way);
* each minibatch of the global batch is split over the ranks, each computes the loss of its rows,
  and DDP averages the gradients (`mmrl.trainer.train_engine`), so the update is the one-process
  update up to the order of float additions;
* rank 0 writes the logs, checkpoints and videos; the others wait for it at a barrier.

Without a launcher (``WORLD_SIZE`` unset or 1) nothing here starts a process group and each helper
is the identity: one process runs as it always did.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import torch

#: seconds a collective may wait for the other ranks before the rank raises (a rank that died or
#: hangs then stops every rank, instead of leaving them waiting forever)
TIMEOUT_S = float(os.environ.get("MMRL_DIST_TIMEOUT_S", "600"))


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of a run."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Whether this rank writes the run's files (rank 0)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def launched() -> Ranks:
    """The ranks a launcher described in the environment (one process when none did)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    return Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def init(device: str) -> Ranks:
    """Join the launcher's process group (gloo on CPU, NCCL on CUDA, with `TIMEOUT_S`); on CUDA
    each rank takes ``cuda:LOCAL_RANK``. Returns the ranks (one process: nothing is started)."""
    import torch.distributed as dist

    if launched().distributed and not dist.is_initialized():
        _join(device)
    return current()


def start_group(device: str | torch.device) -> None:
    """`init`, but with no launcher a process group of one is started (what an engine built on
    torch.distributed needs in one process too: FSDP2)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        solo_environment()
        _join(device)


def solo_environment() -> None:
    """With no launcher, the environment a process group of one reads (this machine, a free port)."""
    if "RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")


def _join(device: str | torch.device) -> None:
    import torch.distributed as dist

    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))


def free_port() -> int:
    """A TCP port free on this machine now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def current() -> Ranks:
    """The ranks of the process group this process has joined (one process when none)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return Ranks()
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def barrier() -> None:
    """Wait for every rank (nothing in one process)."""
    if current().distributed:
        import torch.distributed as dist

        dist.barrier()


def gather_objects(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` on every rank (``[obj]`` in one process). Tensors
    travel on the CPU."""
    if not current().distributed:
        return [obj]
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce(values: dict[str, float], op: str = "mean") -> dict[str, float]:
    """Each value reduced over the ranks: ``mean``, ``sum``, ``max`` or ``min`` (the same dict in one process)."""
    if not current().distributed or not values:
        return values
    import torch.distributed as dist

    keys = sorted(values)
    # NCCL reduces CUDA tensors only (init gave each rank its GPU); gloo CPU ones
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    ops = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    dist.all_reduce(t, op=ops[op])
    if op == "mean":
        t /= dist.get_world_size()
    return dict(zip(keys, t.tolist(), strict=True))


def mean(value: float) -> float:
    """``value`` averaged over the ranks."""
    return all_reduce({"value": value})["value"]


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics of each rank's part of the update as one: averaged over the ranks, but the ``*_max``
    ones (the largest)."""
    peaks = {k: v for k, v in metrics.items() if k.endswith("_max")}
    rest = {k: v for k, v in metrics.items() if k not in peaks}
    return {**all_reduce(rest), **all_reduce(peaks, "max")}


def share(total: int, ranks: Ranks) -> tuple[int, int]:
    """``(start, count)``: this rank's contiguous rows of ``total`` rows split as evenly as they go
    (the first ``total % world`` ranks one more; ``count`` is 0 for a rank left without rows)."""
    base, extra = divmod(total, ranks.world)
    start = ranks.rank * base + min(ranks.rank, extra)
    return start, base + (ranks.rank < extra)


def all_true(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (so all ranks take the same branch)."""
    return bool(all_reduce({"flag": float(flag)}, "min")["flag"])


def broadcast_generator(generator: torch.Generator) -> None:
    """Give every rank rank 0's ``generator`` state (a no-op in one process, and when the ranks
    drew the same numbers: it guards the update's shuffling against a draw one rank skipped)."""
    if current().distributed:
        state = [generator.get_state()]
        import torch.distributed as dist

        dist.broadcast_object_list(state, src=0)
        generator.set_state(state[0])
