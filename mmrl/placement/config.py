"""The ``placement`` section: where each role runs and how rollout collection is laid out.

Where the simulator renders (``render_device``: the device its workers build it on) and how
collection is laid out; the policy (inference and update) lives on ``run.device``. Modes:

- ``collocated``: one process simulates then infers, in sequence (`collect_episodes` itself);
- ``disaggregated``: the simulator lives in its own worker process, inference in the main
  process; no overlap (``stages`` = 1);
- ``hybrid``: the N environments are split into ``stages`` contiguous slices, one sim worker each,
  so that stage s simulates while stage s+1 runs inference (``stages`` >= 2).

Backends: ``local`` (worker processes on this machine, the default) and ``ray`` (one Ray actor
per sim worker, in a Ray placement group of one bundle per worker, placed by ``ray_strategy``:
``PACK`` on as few nodes as possible, ``SPREAD`` across nodes; needs ``pip install 'mmrl[ray]'``).
With ``ray``, ``train_ranks`` > 1 has Ray Train start the training ranks too (`mmrl.ray_train`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mmrl.config import ConfigError
from mmrl.utils.deadline import timeout_problem

MODES = ("collocated", "disaggregated", "hybrid")
BACKENDS = ("local", "ray")
RAY_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ROLES = ("render",)  # roles with a device of their own here (the policy's is run.device)


@dataclass
class PlacementConfig:
    # collocated: simulate in the trainer's process; disaggregated: in a worker process; hybrid: stages pipelined
    mode: Literal["collocated", "disaggregated", "hybrid"] = "collocated"
    stages: int = 1  # hybrid: env-batch slices (one sim worker each) pipelined against inference
    # local: worker processes on this machine; ray: Ray actors in a placement group (and Ray Train ranks)
    backend: Literal["local", "ray"] = "local"
    # device the sim workers build their simulators on ("cpu", "cuda", "cuda:1"); inference and the
    # update run where the policy lives, `run.device`
    render_device: str = "cpu"
    torch_threads: int = 1  # intra-op threads of each sim worker process (0 = torch's default)
    max_restarts: int = 3  # per sim worker: crashes survived (lost episodes counted) before giving up
    # how long a sim worker may stay silent on a call (reset, step, ...) before it is killed, restarted
    # (max_restarts) and its episodes in flight counted as lost. null (default) = automatic, per
    # method: max(120 s, 20 x the slowest answer of that method this worker has given), measured in
    # the worker and kept across restarts, so a method's first call (warm-up) gets 120 s
    # (`mmrl.placement.worker.AUTO_TIMEOUT_FLOOR_S` / `AUTO_TIMEOUT_FACTOR`); a number = a fixed limit
    # in seconds; .inf = wait forever. Start-up has its own limit (STARTUP_TIMEOUT_S, 120 s).
    step_timeout_s: float | None = None
    # ray backend: how the placement group's bundles (one per sim worker) spread over the nodes
    ray_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    # ray backend: training ranks Ray Train starts as one torch.distributed group, each running the
    # trainer as a torchrun rank would (`mmrl.ray_train`); 1 = this process trains (as under
    # torchrun, whose ranks each set 1)
    train_ranks: int = 1
    train_cpus_per_rank: float = 1.0  # CPUs Ray reserves for each training rank (and 1 GPU on cuda)
    train_max_restarts: int = 0  # times Ray restarts the failed group, each resuming from its checkpoint

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"placement.mode = {self.mode!r} is not one of: {', '.join(MODES)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"placement.backend = {self.backend!r} is not one of: {', '.join(BACKENDS)}")
        if isinstance(self.stages, bool) or not isinstance(self.stages, int) or self.stages < 1:
            raise ConfigError(
                f"placement.stages = {self.stages!r} must be an int >= 1 "
                "(1 for collocated / disaggregated, >= 2 for hybrid)"
            )
        if self.mode in ("collocated", "disaggregated") and self.stages != 1:
            raise ConfigError(f"placement.stages = {self.stages} needs mode hybrid; valid for mode {self.mode!r}: 1")
        if self.mode == "hybrid" and self.stages < 2:
            raise ConfigError(
                "placement.stages = 1 with mode 'hybrid': valid stages are >= 2 "
                "(one stage without overlap is mode 'disaggregated')"
            )
        for role in ROLES:
            dev = getattr(self, f"{role}_device")
            if not _valid_device(dev):
                raise ConfigError(
                    f"placement.{role}_device = {dev!r} is not a device; valid: cpu, cuda, cuda:<index>, mps"
                )
        if self.torch_threads < 0:
            raise ConfigError(f"placement.torch_threads = {self.torch_threads} must be >= 0")
        if self.max_restarts < 0:
            raise ConfigError(f"placement.max_restarts = {self.max_restarts} must be >= 0")
        problem = timeout_problem("placement.step_timeout_s", self.step_timeout_s)
        if problem:
            raise ConfigError(problem)
        if self.ray_strategy not in RAY_STRATEGIES:
            raise ConfigError(
                f"placement.ray_strategy = {self.ray_strategy!r} is not one of: {', '.join(RAY_STRATEGIES)}"
            )
        for key in ("train_ranks", "train_max_restarts"):
            value, least = getattr(self, key), 1 if key == "train_ranks" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"placement.{key} = {value!r} must be an int >= {least}")
        if self.train_ranks > 1 and self.backend != "ray":
            raise ConfigError(
                f"placement.train_ranks = {self.train_ranks} needs placement.backend=ray (or launch the ranks with "
                "torchrun --nproc_per_node N and leave train_ranks 1)"
            )
        if not self.train_cpus_per_rank > 0:
            raise ConfigError(f"placement.train_cpus_per_rank = {self.train_cpus_per_rank} must be > 0")
        gpu_index = self.render_device.startswith("cuda:") and self.render_device != "cuda:0"
        if self.backend == "ray" and gpu_index:
            raise ConfigError(
                f"placement.render_device = {self.render_device!r} with backend 'ray': "
                "each sim actor sees only the GPU Ray assigns it; valid: cpu, cuda"
            )

    @property
    def num_workers(self) -> int:
        """Sim worker processes this placement starts (0: collocated simulates in-process)."""
        return 0 if self.mode == "collocated" else self.stages

    def check_backend(self) -> None:
        """Raise ImportError naming the extra to install when ``backend`` needs a missing package."""
        if self.backend == "ray":
            from mmrl.placement.ray_worker import import_ray

            import_ray()

    def stage_slices(self, num_envs: int) -> list[slice]:
        """The contiguous env slice of every stage (all the envs for collocated / disaggregated)."""
        s = self.stages
        if num_envs % s:
            raise ConfigError(
                f"placement.stages = {s} must divide the number of envs ({num_envs}); "
                f"valid stages for {num_envs} envs: "
                f"{', '.join(str(d) for d in range(1, num_envs + 1) if num_envs % d == 0)}"
            )
        n = num_envs // s
        return [slice(i * n, (i + 1) * n) for i in range(s)]


def _valid_device(dev: object) -> bool:
    if not isinstance(dev, str):
        return False
    import torch

    try:
        torch.device(dev)
    except (RuntimeError, ValueError):
        return False
    return True
