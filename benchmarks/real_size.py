"""Real model sizes, measured: each family's real-size config run for two RL iterations with random
weights of the real architecture, its memory plan (`mmrl estimate`) beside the measured peak.

Nothing is downloaded: `mmrl.planning.random_weights` (transformers VLMs) and `mmrl.planning.random_pipelines`
(diffusers pipelines) write random-weight checkpoints of the published architectures to
``runs/real_size/`` (once; later runs reuse them), and each case loads one through mmrl's real loading
code. A case is the real-size config (``configs/``: the GPU recipe, its memory-saving mode kept:
bf16, gradient checkpointing, LoRA, the reference as the adapter switched off) with the overrides that
make it a small CPU run: a built-in task instead of the recipe's dataset, a few rollouts, short
sequences, two iterations. The memory plan is made for exactly that overridden config.

Each case runs in a process of its own (a fresh peak). Measured:
- ``measured_peak_bytes``: on the CPU, the process's peak resident memory (``VmRSS``, sampled every
  10 ms; it counts the weights, which transformers and diffusers leave in the memory-mapped safetensors
  files when the dtype matches, each page read once after loading (`resident`) as a GPU would hold
  it) minus its value after the imports (Python, torch and the libraries: ``baseline_bytes``), with
  glibc set to give freed tensors back (`GLIBC_RETURNS_FREED`); on CUDA, ``torch.cuda.max_memory_allocated``.
- Both peaks are those of the RL iterations, the weights in place: loading's transients (host memory
  while a checkpoint is read and cast) are left out, as a GPU never holds them; ``measured_phases``
  shows the build's peak beside the rollout's and the update's.
- ``estimated_peak_bytes``: the plan's total for the same config on the same device (the sum of its
  terms: it holds the rollout's KV cache and the update's activations at once, an upper bound).
- ``s_per_iter``: seconds per RL iteration (rollout + update), each iteration.

    python benchmarks/real_size.py                        # every case that fits this machine's memory
    python benchmarks/real_size.py --cases qwen25vl_3b_lora --device cuda
    python benchmarks/real_size.py --smoke                # CI: the same path at one layer per stack, one iteration

A smoke on a CPU without native bf16 matrix products (no AVX512-BF16 or AMX: torch's
``_is_mkldnn_bf16_supported`` is false) loads the weights in float32 (each case's ``float32``
overrides; ``"float32_smoke": true`` in its line): there torch multiplies bf16 matrices in a scalar
loop, and the one-layer Qwen2.5-VL smoke took 243 s per iteration on 2 AVX2 cores (CI ran over).

One JSON line per case, then one summary line (``{"real_size": [...], "goal_met": ...}``). Goal:
the estimate within 15% of the measured peak for every case measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.15  # |estimate / measured - 1| at most this, for every case
#: glibc's malloc keeps freed blocks below its (dynamically raised, up to 32 MiB) mmap threshold in the
#: process heap: a 3B model's freed activations stayed resident (1.19 of a 10.70 GiB peak, gone after
#: malloc_trim). A fixed 64 KiB threshold maps every tensor-sized block on its own and unmaps it on
#: free, so the resident peak tracks live tensors, as torch.cuda.max_memory_allocated does on a GPU
#: (where the caching allocator's spare reserve is not counted either).
GLIBC_RETURNS_FREED = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


@dataclass(frozen=True)
class Case:
    """A real-size config and how to measure it small: ``checkpoint`` is the hub id whose random-weight
    folder goes into the config key ``key``; ``small`` the overrides of the measurement run."""

    name: str
    config: str
    checkpoint: str
    key: str
    small: tuple[str, ...]
    writer: str = "transformers"  # or "diffusers"
    cpu_gib: float = 0.0  # the RAM the case needs (bigger than this machine's: skipped unless asked)
    smoke: bool = True  # in --smoke (false: its path is another case's, at a bigger size)
    gpu: tuple[str, ...] = ()  # overrides on top of ``small`` on a GPU (a batch that says something there)
    notes: tuple[str, ...] = field(default=())
    float32: tuple[str, ...] = ()  # a smoke's overrides on a CPU without native bf16 matmuls (the docstring)


# the VLM cases answer shapes_vqa's built-in questions about 56 px scenes (4 image tokens in
# Qwen2.5-VL's 14 px patches merged 2 x 2): the prompt is 66 tokens, so max_prompt_tokens is set
# near it (the plan's sequence is the configured maximum) and every answer runs to max_new_tokens
# (random weights almost never sample the end-of-turn token)
_VLM_SMALL = (
    "run.device=cpu",
    "sim.num_envs=4",
    "sim.eval_num_envs=2",
    "sim.kwargs.dataset=shapes_vqa",
    "sim.kwargs.dataset_kwargs={num_samples: 16, image_size: 56, tasks: [count]}",
    "sim.eval_kwargs={split: eval}",
    "reward.type=short_answer",
    "reward.success_threshold=1.0",
    "policy.system_prompt=null",
    "policy.max_prompt_tokens=72",
    "policy.max_new_tokens=16",
    "algorithm.group_size=2",
    "algorithm.minibatch_size=4",
    "algorithm.kl_coef=0.0",
    "trainer.eval_episodes=2",
    "run.threads=-1",  # torch's default: every core (mmrl's automatic leaves one to the simulator)
)

# the flow VLA cases act in the built-in reach task (one 64 px camera, upscaled to the VLM's 512 px by its
# processor; short episodes): one episode per env, its decisions are the minibatch
_VLA_SMALL = (
    "run.device=cpu",
    "run.threads=-1",
    "sim.type=reach",
    "sim.num_envs=2",
    "sim.eval_num_envs=2",
    "sim.eval_tasks=null",
    "sim.kwargs={image_size: 64, num_objects: 3, max_episode_steps: 50}",  # one 50-action chunk per episode
    "algorithm.minibatch_size=2",  # the 2 decisions collected (the plan prices a full minibatch)
    "trainer.eval_episodes=2",
    "trainer.video_episodes=0",
)

_VLM_GPU = ("sim.num_envs=16", "algorithm.group_size=4", "algorithm.minibatch_size=16", "policy.max_new_tokens=256")
_VLA_GPU = (
    "sim.num_envs=32",
    "sim.kwargs={image_size: 64, num_objects: 3, max_episode_steps: 100}",  # two chunks per episode
    "algorithm.minibatch_size=64",
)

# the generator cases: built-in prompts and rewards (the recipes' PickScore is a model download), small
# images or clips, few steps: two prompts x groups of two per iteration
_GEN_SMALL = (
    "run.device=cpu",
    "run.threads=-1",
    "sim.num_envs=4",
    "sim.eval_num_envs=2",
    "algorithm.group_size=2",
    "algorithm.minibatch_size=4",
    "policy.num_steps=4",
    "policy.eval_num_steps=4",
    "policy.max_sequence_length=64",
    "trainer.eval_episodes=2",
    "trainer.video_episodes=0",
)
_SD35_SMALL = (
    *_GEN_SMALL,
    "sim.kwargs={dataset: shapes_prompts, image_size: 128}",
    "reward={type: shapes, success_threshold: 0.9}",
    "policy.image_size=128",
)
_WAN_SMALL = (
    *_GEN_SMALL,
    "sim.kwargs={dataset: moving_shapes_prompts, image_size: 128, num_frames: 5}",
    "reward={type: moving_shapes, success_threshold: 0.9}",
    "policy.image_size=128",
    "policy.num_frames=5",
)
_GEN_GPU = ("sim.num_envs=16", "algorithm.group_size=4", "algorithm.minibatch_size=8", "policy.num_steps=10")

CASES = {
    c.name: c
    for c in (
        Case(
            "qwen25vl_3b_lora",
            "configs/qwen25vl_3b_geo3k_grpo_lora.yaml",
            "Qwen/Qwen2.5-VL-3B-Instruct",
            "policy.model",
            _VLM_SMALL,
            cpu_gib=12,
            gpu=_VLM_GPU,
            float32=("policy.dtype=float32",),
        ),
        Case(
            "qwen25vl_7b_lora",
            "configs/qwen25vl_7b_geo3k_grpo_lora.yaml",
            "Qwen/Qwen2.5-VL-7B-Instruct",
            "policy.model",
            _VLM_SMALL,
            cpu_gib=24,
            gpu=_VLM_GPU,
            float32=("policy.dtype=float32",),
            smoke=False,
            notes=("17 GB of bf16 weights: more than this machine's free memory beside the others",),
        ),
        Case(
            "flow_vla_smolvla_size",
            "configs/libero_spatial_flow_vla_smolvla_size.yaml",
            "HuggingFaceTB/SmolVLM2-500M-Video-Instruct",
            "policy.backbone",
            _VLA_SMALL,
            cpu_gib=6,
            gpu=_VLA_GPU,
            float32=("policy.backbone_dtype=float32",),
        ),
        Case(
            "wan21_1.3b_lora",
            "configs/wan21_t2v_1.3b_nft.yaml",
            "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
            "policy.model",
            _WAN_SMALL,
            writer="diffusers",
            cpu_gib=17,
            gpu=(
                *_GEN_GPU,
                "policy.image_size=480",
                "policy.num_frames=33",
                "sim.kwargs={dataset: moving_shapes_prompts, image_size: 480, num_frames: 33}",
            ),
            float32=("policy.dtype=float32", "trainer.engine.precision=fp32"),
        ),
        Case(
            "sd35_medium_lora",
            "configs/sd35_medium_nft.yaml",
            "stabilityai/stable-diffusion-3.5-medium",
            "policy.model",
            _SD35_SMALL,
            writer="diffusers",
            cpu_gib=18,
            gpu=(*_GEN_GPU, "policy.image_size=512", "sim.kwargs={dataset: shapes_prompts, image_size: 512}"),
            float32=("policy.dtype=float32", "trainer.engine.precision=fp32"),
        ),
    )
}


# ------------------------------------------------------------------------------------------ child


def _status() -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of this process, in bytes (Linux)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) * 1024
    if "VmRSS" not in out:
        raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")
    return out


def _rss() -> int:
    return _status()["VmRSS"]


class PeakSampler:
    """The process's peak resident memory, sampled by a thread every ``every`` seconds, per phase
    (``phase`` is set by the caller: build, rollout, update): the peak's VmRSS and its anonymous and
    file-backed parts."""

    def __init__(self, every: float = 0.01):
        self.every, self.phase = every, "build"
        self.peaks: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        now = _status()
        best = self.peaks.get(self.phase)
        if best is None or now["VmRSS"] > best["VmRSS"]:
            self.peaks[self.phase] = now

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._sample()

    def stop(self) -> int:
        """The peak over the RL iterations: every phase but the build (loading's host-memory transients:
        a checkpoint loaded on the CPU, then moved, never holds them on a GPU)."""
        self._stop.set()
        self._thread.join()
        self._sample()
        return max(p["VmRSS"] for phase, p in self.peaks.items() if phase != "build")


def lock_memory(lock: bool = True) -> bool:
    """Lock this process's mapped pages resident (``mlockall(MCL_CURRENT)``: every page of every
    current mapping, read in whole), or with ``lock=False`` unlock them (they stay resident until the
    kernel needs the memory). Locked after loading, the mapped weights stay counted: under memory
    pressure the kernel otherwise drops their clean pages (1.6 GiB of Wan's 13 GiB were gone in its
    update), where a GPU keeps them. Nothing is locked while loading, whose transients (SD3's
    positional table: 3.4 GiB for a moment) would otherwise be pinned too. False when not allowed
    (then `resident` reads the weights once and the figure may undercount)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    mcl_current = 1
    return (libc.mlockall(mcl_current) if lock else libc.munlockall()) == 0


def resident() -> None:
    """Read every weight of every module once. transformers and diffusers leave weights in their
    memory-mapped safetensors files, whose pages count as resident only once touched: a text
    encoder's 256k-row embedding would count the few rows a prompt reads, where a GPU holds it all."""
    import gc

    import torch

    with torch.no_grad():
        for obj in gc.get_objects():
            if isinstance(obj, torch.nn.Module):
                for t in (*obj.parameters(recurse=False), *obj.buffers(recurse=False)):
                    if t.device.type == "cpu" and t.numel():
                        t.reshape(-1)[:: max(1, 4096 // t.element_size())].sum()  # one read per 4 KiB page


def measure(case: Case, folder: Path, device: str, iterations: int, out_dir: Path, smoke: bool = False) -> dict:
    """Run ``case`` in this process: the plan, then ``iterations`` RL iterations (see the module docstring);
    a ``smoke`` on a CPU without native bf16 matmuls in float32 (``case.float32``)."""
    import torch
    from tqdm import tqdm

    from mmrl.api import _config
    from mmrl.experiment import build_trainer
    from mmrl.planning.estimate import plan_experiment
    from mmrl.utils.threads import bf16_native

    cuda = device.startswith("cuda")
    float32 = smoke and not cuda and not bf16_native()
    overrides = [
        *case.small,
        *(case.gpu if cuda else ()),
        *(case.float32 if float32 else ()),
        f"{case.key}={folder}",
        f"run.device={device}",
        f"run.output_dir={out_dir}",
        f"run.name={case.name}",
        f"trainer.iterations={iterations}",
        "run.gpu_memory=off",
    ]
    cfg = _config(ROOT / case.config, overrides, None)
    locked = False if cuda else lock_memory()  # the libraries read in whole: their pages are the baseline's
    baseline = torch.cuda.memory_allocated() if cuda else _rss()
    if locked:
        lock_memory(False)
    plan = plan_experiment(cfg, device_memory=1 << 50, world=1)
    w = plan.workload
    sampler = None if cuda else PeakSampler()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer = build_trainer(cfg)
    if cuda:  # the peak of the iterations, from the weights in place (as on the CPU)
        torch.cuda.reset_peak_memory_stats()
    else:
        locked = locked and lock_memory()  # the loaded weights, every page (mlockall reads them in), from here on
        if not locked:
            resident()  # without the lock, read each weight page once instead
        sampler.phase = "between"  # type: ignore[union-attr]
    if sampler is not None:  # mark the phases: the peak's phase says which terms meet at it
        for method, phase in (("collect", "rollout"), ("learn", "update")):
            inner = getattr(trainer, method)

            def marked(*a, _inner=inner, _phase=phase, **k):
                sampler.phase = _phase
                try:
                    return _inner(*a, **k)
                finally:
                    sampler.phase = "between"

            setattr(trainer, method, marked)
    seconds = []
    steps0 = trainer.state.env_steps
    bar = tqdm(disable=True)
    try:
        for _ in range(iterations):
            t0 = time.perf_counter()
            trainer.iteration(trainer.state.iteration, None, bar)  # it counts itself
            seconds.append(round(time.perf_counter() - t0, 2))
    finally:
        trainer.close()
    peak = torch.cuda.max_memory_allocated() if cuda else sampler.stop()  # type: ignore[union-attr]
    measured = peak - baseline
    return {
        "case": case.name,
        "config": case.config,
        "model": case.checkpoint,
        "device": device,
        "params": w.params,
        "trainable": w.trainable,
        "estimated_peak_bytes": plan.total,
        "measured_peak_bytes": measured,
        "baseline_bytes": baseline,
        "memory_locked": locked,
        "estimated_gib": round(plan.total / 2**30, 2),
        "measured_gib": round(measured / 2**30, 2),
        "estimate_over_measured": round(plan.total / measured, 3),
        "within_goal": abs(plan.total / measured - 1) <= GOAL,
        "estimate_terms": plan.terms,
        "measured_phases": {  # bytes above the baseline at each phase's peak (CPU: VmRSS, its anon / file parts)
            phase: {k: v - (baseline if k == "VmRSS" else 0) for k, v in peak.items()}
            for phase, peak in (sampler.peaks.items() if sampler is not None else ())
        },
        "s_per_iter": seconds,
        # env steps (VLM: answers; VLA: actions' chunks executed step by step) per second over the iterations
        "samples_per_s": round((trainer.state.env_steps - steps0) / max(sum(seconds), 1e-9), 3),
        "overrides": [*case.small, *(case.gpu if cuda else ()), *(case.float32 if float32 else ())],
        "float32_smoke": float32,
    }


# ----------------------------------------------------------------------------------------- parent


def checkpoint_folder(case: Case, smoke: bool, work: Path) -> Path:
    return work / (case.checkpoint.split("/")[-1].lower() + ("-smoke" if smoke else ""))


def checkpoint(case: Case, smoke: bool, work: Path, device: str = "cpu") -> Path:
    """The case's random-weight checkpoint folder under ``work``, written on first use (``--smoke``:
    one layer per stack)."""
    folder = checkpoint_folder(case, smoke, work)
    from mmrl.planning.architectures import ARCHITECTURES
    from mmrl.planning.random_weights import one_layer, write_random_checkpoint

    arch = ARCHITECTURES[case.checkpoint]
    arch = one_layer(arch) if smoke else arch
    if case.writer == "diffusers":
        from mmrl.planning.random_pipelines import write_random_pipeline

        # its model_index.json is written last: a folder with one is finished
        return folder if (folder / "model_index.json").is_file() else write_random_pipeline(arch, folder)
    return write_random_checkpoint(arch, folder, device=device)


def run_case(case: Case, device: str, iterations: int, smoke: bool, timeout: float, work: Path) -> dict:
    """``case`` in a fresh process (its own peak); its JSON result, or the error it ended with."""
    folder = checkpoint(case, smoke, work, device)
    cmd = [sys.executable, __file__, "--child", case.name, "--folder", str(folder), "--device", device,
           "--iterations", str(iterations), "--work", str(work), *(["--smoke"] if smoke else [])]  # fmt: skip
    env = {**os.environ, "TQDM_DISABLE": "1", **(GLIBC_RETURNS_FREED if device == "cpu" else {})}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"case": case.name, "device": device, "error": f"ran over its {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"case": case.name, "device": device, "error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases", default=None, help=f"comma-separated, of: {', '.join(CASES)} (default: those that fit)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--iterations", type=int, default=None, help="RL iterations per case (default 2; --smoke: 1)")
    parser.add_argument("--smoke", action="store_true", help="one layer per stack (CI): the path, not the figures")
    parser.add_argument("--memory-gib", type=float, default=None, help="RAM for the cases (default: this machine's)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    parser.add_argument("--out", default=None, help="also write the summary JSON here")
    parser.add_argument(
        "--work",
        default=None,
        help="checkpoints and run folders (default: runs/real_size; --smoke: a temporary folder)",
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.iterations is None:
        args.iterations = 1 if args.smoke else 2
    if args.child:
        out = Path(args.work) / "runs"
        print(json.dumps(measure(CASES[args.child], Path(args.folder), args.device, args.iterations, out, args.smoke)))
        return
    if args.work is None and args.smoke:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="mmrl_real_size_") as tmp:
            return run_all(args, Path(tmp))
    return run_all(args, Path(args.work) if args.work else ROOT / "runs" / "real_size")


def run_all(args, work: Path, argv: list[str] | None = None) -> None:
    if args.cases:
        unknown = [c for c in args.cases.split(",") if c not in CASES]
        if unknown:
            raise SystemExit(f"error: unknown case(s) {unknown}: choose from {', '.join(CASES)}")
        chosen = [CASES[c] for c in args.cases.split(",")]
    else:
        ram = args.memory_gib or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        fits = [c for c in CASES.values() if args.device != "cpu" or c.cpu_gib <= ram * 0.75]
        chosen = [c for c in CASES.values() if c.smoke] if args.smoke else fits
        for c in CASES.values():
            if c not in chosen:
                print(f"skipped {c.name}: needs about {c.cpu_gib:.0f} GiB of RAM ({'; '.join(c.notes) or 'too big'})")
    from mmrl.utils.threads import bf16_native

    load_start = os.getloadavg()[0]
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "mmrl", "benchmarks"], cwd=ROOT, capture_output=True, text=True
    )
    results = []
    for case in chosen:
        r = run_case(case, args.device, args.iterations, args.smoke, args.timeout, work)
        if args.smoke:  # a smoke's checkpoints are gigabytes even at one layer: one on disk at a time
            shutil.rmtree(checkpoint_folder(case, True, work), ignore_errors=True)
        results.append(r)
        print(json.dumps(r), flush=True)
    measured = [r for r in results if "error" not in r]
    summary = {
        "real_size": results,
        "command": "python benchmarks/real_size.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "commit": (git.stdout.strip() or "unknown") + (" with uncommitted changes" if dirty.stdout.strip() else ""),
        "machine": {
            "cpus": os.cpu_count(),
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "bf16_native": bf16_native(),  # bf16 matmuls in hardware (the s per iteration depend on it)
            "load_avg_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],  # at the start and the end
        },
        "device": args.device,
        "smoke": args.smoke,
        "goal": f"estimate within {GOAL:.0%} of the measured peak, every case",
        "goal_met": bool(measured) and len(measured) == len(results) and all(r["within_goal"] for r in measured),
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    if len(measured) < len(results):
        raise SystemExit(1)  # a case that did not run is a failure, not a skipped figure


if __name__ == "__main__":
    main()
