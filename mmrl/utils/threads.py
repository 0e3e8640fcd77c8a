"""How many intra-op threads torch uses in a training process (``run.threads``).

On a machine whose cores are shared with other jobs, OpenMP's default wait policy makes torch's
threads spin at every parallel region's barrier: when one of them is descheduled by another
process, the others burn their time slices waiting for it, and a 2-core run beside one busy
process measured 11x slower (4.1 s -> 45-48 s per quickstart iteration; `benchmarks/threads.py`).

- ``run.threads: 0`` (default, "auto"): one thread fewer than the machine has CPUs (at least 1),
  so that a simulator worker, a data loader or another user's job has a core without pre-empting
  a torch thread, and OpenMP's passive wait policy (threads sleep instead of spinning at barriers;
  effective when ``mmrl`` is imported before torch, as ``mmrl`` / ``python -m mmrl`` do, or when
  ``OMP_WAIT_POLICY`` is already set by the user, which wins).
- ``run.threads: N > 0``: exactly N threads.
- ``run.threads: -1``: whatever torch chose (one per physical core, spinning waits).
"""

from __future__ import annotations

import os


def prefer_passive_waits() -> None:
    """Ask OpenMP for sleeping (not spinning) waits, unless the user chose a policy. Only effective
    before the OpenMP runtime starts, i.e. before torch is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def auto_threads() -> int:
    """The automatic thread count: CPUs available to this process minus one, at least one."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, cpus - 1)


def configure_threads(requested: int) -> int:
    """Apply ``run.threads`` (see the module docstring); returns the thread count in use."""
    import torch

    if requested < -1:
        raise ValueError(f"run.threads = {requested}: use 0 (automatic), -1 (torch's default) or a positive count")
    if requested != -1:
        torch.set_num_threads(requested or auto_threads())
    return torch.get_num_threads()


def bf16_native() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (oneDNN with AVX512-BF16 or AMX)."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def slow_bf16(device: str, module, precision: str = "fp32") -> str | None:
    """A warning line for a CPU run that multiplies bf16 matrices (bf16 weights in ``module``, or
    ``trainer.engine.precision: bf16``) on cores without native bf16 matrix products (no
    AVX512-BF16 or AMX: torch then runs a scalar loop; a one-layer Qwen2.5-VL update took 243 s in
    bf16 on 2 AVX2 cores, 11 s in float32); None otherwise."""
    import torch

    if not device.startswith("cpu") or bf16_native():
        return None
    bf16 = sum(p.numel() for p in module.parameters() if p.dtype == torch.bfloat16)
    if not bf16 and precision != "bf16":
        return None
    what = f"{bf16 / 1e6:.1f}M bf16 weights" if bf16 else "trainer.engine.precision: bf16"
    return (
        f"warning: {what} on a CPU without native bf16 matrix products (no AVX512-BF16 or AMX): torch "
        "multiplies them in a scalar loop, often 10-20x slower than float32. On this machine load the "
        "weights in float32 (the policy's dtype setting, e.g. policy.dtype=float32) and use "
        "trainer.engine.precision=fp32"
    )
