"""The device check (issue 30): what users run on a GPU, run once on a GPU, as one prepared script.

    python scripts/device_check.py --out DIR               # on a CUDA machine (scripts/device_check.sh)
    python scripts/device_check.py --cpu --tiny --out DIR  # the CPU dry run: every step, tiny, ~2 minutes
    python scripts/device_check.py --cpu --tiny --only flow vlm --hide device

Every step runs mmrl's real code (the configs in ``configs/``, `mmrl.experiment.build_trainer`, the
policies' ``rollout`` / ``evaluate``, the contract checker, ``torchrun``) in its own subprocess
under a time limit, so one that fails or hangs costs only its own minutes; what is left of the
run's ``--budget`` caps each step's limit, and a step that would get less than `MIN_STEP_S` is
skipped, saying so. Steps (`STEPS`):

- ``quickstart``: configs/quickstart.yaml (the embedded ``reach`` simulator, pure torch) on the
  device at 128 / 1024 / 4096 envs: raw env steps/s (random action chunks), env steps/s with the
  quickstart's flow VLA choosing every chunk, and a short run of the trainer (the config's warm
  start, then a fixed number of RL iterations): seconds per RL iteration, RL env steps/s and
  held-out success before and after RL.
- ``flow``: the flow samplers behind the flow VLA on the device, in fp32 and under bf16 autocast:
  the PPO ratio before an update (``rollout`` then ``evaluate``: ratio - 1) for Flow-SDE, CPS and
  Flow-Noise, ODE == SDE with noise level 0 (`mmrl.flow.sample`), the policy contract checker
  (``mmrl check policy``) of the flow VLA and the diffusion policy, and a quickstart iteration
  trained with ``trainer.engine.precision=bf16``.
- ``diffusion``: one Flow-GRPO and one AWM run (warm start, then RL iterations) of the built-in
  tiny text-to-image generator (configs/diffusion_shapes_*.yaml).
- ``diffusers``: the same for tiny random-weight SD3 and FLUX pipelines with LoRA (needs diffusers).
- ``vlm``: configs/vlm_quickstart.yaml (a tiny SmolVLM, Hugging Face generate as the rollout
  engine) with LoRA: SFT warm start, GRPO iterations, log-probs recomputed against the rollout's.
- ``video``: one Flow-GRPO, one AWM and one DiffusionNFT run (warm start, then RL iterations) of the
  built-in tiny text-to-video generator (configs/video_shapes_*.yaml), and DiffusionNFT and
  Flow-GRPO runs of a tiny random-weight Wan pipeline with LoRA (needs diffusers).
- ``vlm_video``: configs/vlm_video_qa.yaml (a tiny Qwen2.5-VL answering questions about clips through
  its video path): SFT warm start, GRPO iterations; and configs/vlm_zoom_tools.yaml (multi-turn
  tool use: the zoom tool's image crops in the conversation), SFT on its demonstrations, then GRPO.
- ``lerobot``: configs/reach_smolvla_flow_noise.yaml with tiny LeRobot SmolVLA and PI05 models
  (needs lerobot, which runs on Python >= 3.12).
- ``metaworld``: configs/metaworld_mt50_pixels.yaml (one flow VLA over Meta-World's MT50 from 64 px
  pixels, state and instruction): env steps/s with and without rendering (EGL on the GPU), and a
  short run (scripted-expert demonstrations recorded with the camera, warm start, RL). Needs
  metaworld, mujoco, gymnasium and scipy, which travel as wheels (scripts/device_check.sh).
- ``distributed``: ``torchrun --nproc_per_node 1`` of the quickstart with the FSDP2 engine, which
  starts a process group of one: NCCL on CUDA, gloo on the CPU.
- ``real_size``: benchmarks/real_size.py's cases (issue 71): Qwen2.5-VL-3B / 7B GRPO with LoRA and the
  flow VLA on SmolVLM2-500M at their real sizes (random weights written on the machine), two RL
  iterations each: peak allocated memory beside `mmrl estimate`'s plan, seconds per iteration.
  Alone it needs most of the budget: ``--only real_size`` (it comes last so it never starves the others).
- ``hybrid``: placement where it can pay (issue 71, benchmarks/placement.py): the policy (inference and
  the PPO update) on the device, the simulators in CPU processes; collocated (the simulator in the
  step's process, 1 thread and all cores) against disaggregated and hybrid pipelined with 2 and 4
  stages (that many sim workers): env steps/s per mode and each mode's speed-ups against collocated,
  on synthetic busy-work whose simulator decision costs `HYBRID_SIM_RATIO` policy decisions, and on
  Meta-World from pixels (EGL) where its packages import (else that half says skipped). ``--tiny``:
  the benchmark's ``--smoke`` path.
- ``benchmark``: the quickstart benchmark (benchmarks/quickstart.py, 3 seeds; ``--smoke``
  with --tiny) as users run it, evaluation videos included: held-out success and wall time per seed
  against the CPU figures of docs/benchmarks/quickstart.md.

``--cpu --tiny`` runs every step on the CPU with tiny settings (CI's dry run:
tests/test_device_check.py), so the script cannot rot between the times a GPU is lent. ``--hide
device`` hides the packages the GPU machine lacks (`ABSENT_ON_DEVICE`) from every step, to find
here an import the GPU machine would fail. A step that needs a package this Python lacks is
skipped, naming it.

Output, under ``--out`` (default ``$OUT``, else ``device_check_out``): ``device_check.json`` (the
commit, the device, torch, and per step: status ok / failed / skipped, seconds, figures, and the
reason or the last lines of the error), rewritten after every step, and ``device_check.log`` (every
step's output). The exit status is 1 when a step failed. ``--inject STEP=raise|hang`` makes a step
fail or hang on purpose (the test of the time-boxing).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

JSON_NAME, LOG_NAME = "device_check.json", "device_check.log"
MIN_STEP_S = 20.0  # a step that would get less time than this is skipped
TINY_TIMEOUT_S = 240.0  # a --tiny step's limit (10-30 s on 2 quiet cores; a loaded CI machine is slower)
ERROR_LINES = 25  # the lines of a failed step's output kept in the JSON
#: what the GPU machine lacks (as measured there) among what a step might import; diffusers
#: travels as a wheel (scripts/device_check.sh) and lerobot is skipped by its own step
ABSENT_ON_DEVICE = (
    "gymnasium",
    "datasets",
    "imageio_ffmpeg",
    "deepspeed",
    "ray",
    "open_clip",
    "vllm",
    "mujoco",
    "mani_skill",
    "sapien",
    "libero",
)
HIDE_ENV = "MMRL_DEVICE_CHECK_HIDE"  # comma-separated modules the step processes treat as absent


# ---- what a step gets and gives --------------------------------------------------------------
class Skip(Exception):
    """The step cannot run here (a package is missing); its message says why."""


@dataclass
class Context:
    """What a step runs with, in its own process."""

    device: str  # "cuda" or "cpu"
    tiny: bool  # tiny settings: the code path in seconds, no figure worth quoting
    scratch: Path  # run folders and tiny models (a temporary folder)
    overrides: list[str] = field(default_factory=list)  # --set STEP:KEY=VALUE of this step, for every run
    problems: list[str] = field(default_factory=list)  # failed expectations: the step fails, figures kept

    def pick(self, full, tiny):
        """``tiny`` under --tiny, else ``full``."""
        return tiny if self.tiny else full

    def expect(self, ok: bool, problem: str) -> None:
        """Record a failed expectation (the step goes on, and is marked failed at its end)."""
        if not ok:
            self.problems.append(problem)

    def synchronize(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()


def needs(*modules: str) -> None:
    """`Skip` naming the first of ``modules`` this Python cannot import."""
    for name in modules:
        if importlib.util.find_spec(name) is None:
            raise Skip(f"needs the Python package '{name}', which is not installed here")


def train(ctx: Context, config: str, name: str, overrides: list[str]) -> dict:
    """Train ``configs/<config>.yaml`` with ``overrides`` in a fresh run folder on the step's device
    (no videos, no resume); the figures of its results."""
    from mmrl.experiment import build_trainer, load_experiment

    base = [
        f"run.device={ctx.device}",
        f"run.output_dir={ctx.scratch}",
        f"run.name={name}",
        "trainer.resume=false",
        "trainer.video_episodes=0",
        *(["run.threads=1"] if ctx.device == "cpu" else []),
    ]
    cfg = load_experiment(ROOT / "configs" / f"{config}.yaml", [*base, *overrides, *ctx.overrides])
    t0 = time.perf_counter()
    results = build_trainer(cfg).run()
    wall = time.perf_counter() - t0
    start, final = results["start"], results["final"]
    held_out = {
        f"{when}_{key}": round(float(res[key]), 4)
        for key in ("success_rate", "return")
        for when, res in (("start", start), ("final", final))
        if key in res
    }
    return {
        "wall_s": round(wall, 2),
        "iterations": final["iteration"],
        "iteration_s": round(final["rl_seconds"] / max(final["iteration"], 1), 4),
        "rl_env_steps_per_s": round(final["env_steps"] / max(final["rl_seconds"], 1e-9), 1),
        **held_out,
        "eval_episodes": final["episodes"],
    }


def max_abs(a, b=None) -> float:
    """Largest absolute value of ``a`` (or of ``a - b``), as a float."""
    d = a.detach().float() if b is None else (a.detach().float() - b.detach().to(a.device).float())
    return float(d.abs().max()) if d.numel() else 0.0


# ---- the steps -------------------------------------------------------------------------------
TINY_QUICKSTART = [  # the quickstart shrunk to seconds on 2 cores (tests/reliability/kill_harness.py's)
    "sim.kwargs={max_episode_steps: 12}",
    "policy.dim=16",
    "policy.expert_dim=16",
    "policy.expert_layers=1",
    "policy.num_steps=3",
    "warm_start.num_episodes=4",
    "warm_start.steps=3",
    "warm_start.batch_size=8",
    "algorithm.minibatch_size=16",
    "algorithm.epochs=1",
    "trainer.eval_episodes=8",
    "sim.eval_num_envs=8",
]


def env_steps_per_s(ctx: Context, sim, choose: Callable, chunk: int, seconds: float) -> float:
    """Executed env steps (envs x chunk) per second of ``sim.step_chunk(choose(obs))``, after one
    warm-up chunk: wall time, with the device synchronised before and after."""
    obs = sim.step_chunk(choose(sim.reset(0))).obs
    ctx.synchronize()
    steps, t0 = 0, time.perf_counter()
    while steps == 0 or time.perf_counter() - t0 < seconds:
        obs = sim.step_chunk(choose(obs)).obs
        steps += sim.num_envs * chunk
    ctx.synchronize()
    return steps / (time.perf_counter() - t0)


def random_chunk(shape: tuple, gen, obs=None):
    """Uniform actions in [-1, 1] of ``shape`` on ``gen``'s device (whatever the observation)."""
    import torch

    return torch.rand(shape, generator=gen, device=gen.device) * 2 - 1


def sim_throughput(ctx: Context, n: int, overrides: list[str], seconds: float) -> dict:
    """Env steps/s of the quickstart's ``reach`` with ``n`` envs on the device: random action chunks
    (raw) and chunks the quickstart's flow VLA chooses (no gradients), as in a training rollout."""
    import torch

    from mmrl.experiment import build_policy, build_sim, load_experiment

    cfg = load_experiment(
        ROOT / "configs" / "quickstart.yaml", [*overrides, f"run.device={ctx.device}", *ctx.overrides]
    )
    sim = build_sim(cfg, n, seed=0)
    torch.manual_seed(0)
    policy = build_policy(cfg, sim).eval()
    chunk = policy.chunk_size
    gen = torch.Generator(device=ctx.device).manual_seed(0)

    def policy_chunk(obs):
        return policy.rollout(obs, gen).actions

    raw = env_steps_per_s(ctx, sim, partial(random_chunk, (n, chunk, sim.action_dim), gen), chunk, seconds)
    with torch.no_grad():
        with_policy = env_steps_per_s(ctx, sim, policy_chunk, chunk, seconds)
    sim.close()
    return {"raw_env_steps_per_s": round(raw, 1), "policy_env_steps_per_s": round(with_policy, 1)}


def step_quickstart(ctx: Context) -> dict:
    """Env steps/s (raw, policy in the loop) and a short RL run of the quickstart per env count."""
    tiny = ctx.pick([], TINY_QUICKSTART)
    iterations = ctx.pick(5, 1)
    figures: dict = {"rl_iterations": iterations}
    for n in ctx.pick([128, 1024, 4096], [8, 32]):
        envs = [*tiny, f"sim.num_envs={n}"]
        row = sim_throughput(ctx, n, envs, seconds=ctx.pick(3.0, 0.3))
        row.update(train(ctx, "quickstart", f"quickstart_{n}", [*envs, f"trainer.iterations={iterations}"]))
        figures[str(n)] = row
        print(f"quickstart {n} envs: {row}", flush=True)
    return figures


def flow_vla(ctx: Context, method: str, noise_level: float):
    """The quickstart's flow VLA with ``method`` on the device, and a reach observation for it."""
    import torch

    from mmrl.experiment import build_policy, build_sim, load_experiment

    tiny = ctx.pick([], ["policy.dim=16", "policy.expert_dim=16", "policy.expert_layers=1"])
    overrides = [*tiny, f"policy.method={method}", f"policy.noise_level={noise_level}", f"run.device={ctx.device}"]
    cfg = load_experiment(ROOT / "configs" / "quickstart.yaml", [*overrides, *ctx.overrides])
    sim = build_sim(cfg, ctx.pick(256, 8), seed=0)
    torch.manual_seed(0)
    policy = build_policy(cfg, sim)
    obs = sim.reset(0)
    sim.close()
    return policy, obs


def step_flow(ctx: Context) -> dict:
    """Ratio 1 before an update and ODE == SDE at noise level 0, fp32 and bf16 autocast; the contract
    checker of the flow VLA and the diffusion policy; a bf16 quickstart iteration."""
    import torch

    from mmrl.checks.policy import check_policy
    from mmrl.flow import sample
    from mmrl.trainer.train_engine import autocast as engine_autocast

    # the contexts the trainer runs the policy in (`mmrl.trainer.train_engine.autocast`); fp32: the
    # CPU tests' tolerances; bf16: rollout and recompute take the same kernels, a little more
    precisions = {prec: (lambda prec=prec: engine_autocast(ctx.device, prec)) for prec in ("fp32", "bf16")}
    ratio_tol = {"fp32": 1e-4, "bf16": 1e-3}
    ode_tol = {"fp32": 1e-6, "bf16": 1e-3}
    figures: dict = {}
    for method, level in (("sde", 0.5), ("cps", 0.5), ("noise", 0.0)):
        policy, obs = flow_vla(ctx, method, level)
        for prec, autocast in precisions.items():
            gen = torch.Generator(device=ctx.device).manual_seed(0)
            with autocast():
                policy.eval()
                batch = policy.rollout(obs, gen).batch
                policy.train()
                with torch.no_grad():
                    logp = policy.evaluate(batch).logp
            dev = max_abs(torch.exp(logp.float() - batch["old_logp"].float()) - 1)
            figures[f"ratio_minus_1_{method}_{prec}"] = dev
            ctx.expect(dev <= ratio_tol[prec], f"{method} {prec}: |ratio - 1| = {dev:.3g} > {ratio_tol[prec]}")
    policy, obs = flow_vla(ctx, "sde", 0.0)
    policy.eval()
    prefix, mask = policy.encode(obs.image, obs.instruction, obs.state)
    noise = torch.randn(prefix.shape[0], policy.chunk_size, policy.action_dim, device=prefix.device)
    for prec, autocast in precisions.items():
        with autocast():
            ode = sample(policy.model_fn(prefix, mask, "ode"), noise, policy.grid, "ode")
            sde = sample(
                policy.model_fn(prefix, mask, "sde"),
                noise,
                policy.grid,
                "sde",
                noise_level=0.0,
                generator=torch.Generator(device=ctx.device).manual_seed(5),
            )
        diff = max_abs(sde.chain, ode.chain)
        figures[f"ode_minus_sde_a0_{prec}"] = diff
        ctx.expect(diff <= ode_tol[prec], f"{prec}: SDE at noise level 0 is {diff:.3g} from the ODE")
    for name in ("flow_vla", "diffusion"):
        result = check_policy(name, device=ctx.device, verbose=True)
        figures[f"policy_check_{name}_failed"] = len(result.failed)
        ctx.expect(result.ok, f"mmrl check policy {name} on {ctx.device}: failed {', '.join(result.failed)}")
    bf16 = [
        "trainer.engine.precision=bf16",
        "trainer.iterations=1",
        *ctx.pick(["warm_start.steps=100"], TINY_QUICKSTART),
    ]
    figures["bf16_quickstart"] = train(ctx, "quickstart", "flow_bf16", [*bf16, f"sim.num_envs={ctx.pick(256, 8)}"])
    return figures


TINY_DIFFUSION = [
    "sim.num_envs=8",
    "sim.eval_num_envs=8",
    "algorithm.group_size=4",
    "algorithm.minibatch_size=8",
    "algorithm.epochs=1",
    "trainer.eval_episodes=8",
]


def step_diffusion(ctx: Context) -> dict:
    """One short Flow-GRPO and one AWM run of the built-in tiny generator."""
    tiny = ctx.pick(
        ["warm_start.num_episodes=2000", "warm_start.steps=100"],
        [*TINY_DIFFUSION, "policy.width=16", "policy.num_steps=3", "policy.eval_num_steps=3"]
        + ["warm_start.num_episodes=64", "warm_start.steps=2", "warm_start.batch_size=8"],
    )
    runs = [f"trainer.iterations={ctx.pick(2, 1)}", "trainer.eval_every=0", *tiny]
    return {
        objective: train(ctx, f"diffusion_shapes_{objective}", f"diffusion_{objective}", runs)
        for objective in ("flow_grpo", "awm")
    }


def step_diffusers(ctx: Context) -> dict:
    """One short Flow-GRPO and one AWM run of tiny random-weight SD3 and FLUX pipelines with LoRA."""
    from mmrl.tiny.tiny_diffusers import tiny_flux_pipeline, tiny_sd3_pipeline

    figures: dict = {}
    for family, build in (("sd3", tiny_sd3_pipeline), ("flux", tiny_flux_pipeline)):
        folder = build(ctx.scratch / f"tiny_{family}")
        model = [f"policy.model={folder}", "policy.lora_rank=4", "policy.lora_alpha=8", "policy.guidance_scale=1.0"]
        # random weights draw nothing the shapes reward scores: JPEG size varies per image
        runs = [*model, "warm_start.dataset=null", "reward={type: jpeg_compressibility}", "trainer.eval_every=0"]
        runs += [f"trainer.iterations={ctx.pick(2, 1)}", "policy.num_steps=4", "policy.eval_num_steps=4"]
        runs += ctx.pick([], TINY_DIFFUSION)
        for objective in ("flow_grpo", "awm"):
            figures[f"{family}_{objective}"] = train(
                ctx, f"diffusion_shapes_{objective}", f"{family}_{objective}", runs
            )
    return figures


def step_vlm(ctx: Context) -> dict:
    """The VLM quickstart with LoRA: SFT, GRPO iterations with log-probs recomputed (HF generate)."""
    tiny = ctx.pick(
        ["sim.eval_num_envs=128", "trainer.eval_episodes=128"],
        [
            "sim.num_envs=8",
            "sim.eval_num_envs=8",
            "algorithm.group_size=4",
            "algorithm.minibatch_size=8",
            "sim.kwargs.dataset_kwargs={num_samples: 64, tasks: [count]}",
            "warm_start.num_episodes=16",
            "warm_start.steps=2",
            "warm_start.batch_size=4",
            "trainer.eval_episodes=8",
        ],
    )
    runs = ["policy.finetune=lora", "policy.recompute_logp=true", "trainer.eval_every=0", *tiny]
    figures = train(ctx, "vlm_quickstart", "vlm", [*runs, f"trainer.iterations={ctx.pick(3, 1)}"])
    rows = [json.loads(line) for line in (ctx.scratch / "vlm" / "metrics.jsonl").read_text().splitlines()]
    mismatch = [r["train/logp_mismatch_max"] for r in rows if "train/logp_mismatch_max" in r]
    figures["logp_mismatch_max"] = max(mismatch) if mismatch else math.nan
    return figures


TINY_VIDEO = [*TINY_DIFFUSION, "policy.width=16", "policy.num_steps=3", "policy.eval_num_steps=3"]


def step_video(ctx: Context) -> dict:
    """A short Flow-GRPO, AWM and DiffusionNFT run of the built-in tiny video generator, then
    DiffusionNFT and Flow-GRPO runs of a tiny random-weight Wan pipeline with LoRA."""
    from mmrl.tiny.tiny_wan import tiny_wan_pipeline

    tiny = ctx.pick(
        ["warm_start.num_episodes=1000", "warm_start.steps=50"],
        [*TINY_VIDEO, "warm_start.num_episodes=16", "warm_start.steps=2", "warm_start.batch_size=8"],
    )
    runs = [f"trainer.iterations={ctx.pick(2, 1)}", "trainer.eval_every=0"]
    figures = {
        objective: train(ctx, f"video_shapes_{objective}", f"video_{objective}", [*runs, *tiny])
        for objective in ("flow_grpo", "awm", "nft")
    }
    folder = tiny_wan_pipeline(ctx.scratch / "tiny_wan")
    # 16 px, 5 frames: a [4, 2, 4, 4] latent; random weights draw no shapes, the motion reward scores any clip
    wan = [f"policy.model={folder}", "policy.lora_rank=4", "policy.lora_alpha=8", "policy.max_sequence_length=16"]
    wan += ["policy.image_size=16", "policy.num_frames=5", "policy.num_steps=4", "policy.eval_num_steps=4"]
    wan += ["sim.kwargs={dataset: moving_shapes_prompts, image_size: 16, num_frames: 5}"]
    wan += ["warm_start.dataset=null", "reward={type: motion_amount}", *runs]
    wan += ctx.pick(["sim.num_envs=16", "trainer.eval_episodes=8", "sim.eval_num_envs=8"], TINY_DIFFUSION)
    for objective in ("nft", "flow_grpo"):
        figures[f"wan_{objective}"] = train(ctx, f"video_shapes_{objective}", f"wan_{objective}", wan)
    return figures


def step_vlm_video(ctx: Context) -> dict:
    """A tiny Qwen2.5-VL on video QA (SFT, GRPO iterations) and on multi-turn zoom-tool use."""
    small = ["algorithm.epochs=1", "warm_start.warmup_steps=0", "warm_start.steps=2", "warm_start.batch_size=4"]
    video = ctx.pick(
        ["warm_start.steps=50", "warm_start.warmup_steps=5", "trainer.eval_episodes=64"],
        [
            *small,
            "sim.num_envs=8",
            "sim.eval_num_envs=8",
            "sim.kwargs.dataset_kwargs.num_samples=64",
            "algorithm.group_size=4",
            "algorithm.minibatch_size=8",
            "warm_start.num_episodes=16",
            "trainer.eval_episodes=8",
        ],
    )
    runs = ["trainer.eval_every=0", f"trainer.iterations={ctx.pick(2, 1)}"]
    figures = {"video_qa": train(ctx, "vlm_video_qa", "vlm_video_qa", [*runs, *video])}
    tools = ctx.pick(
        ["warm_start.steps=20", "warm_start.warmup_steps=2"],
        [
            *small,
            "sim.num_envs=4",
            "sim.eval_num_envs=4",
            "sim.kwargs.dataset_kwargs.num_samples=16",
            "algorithm.group_size=4",
            "algorithm.minibatch_size=4",
            "warm_start.num_episodes=4",
            "trainer.eval_episodes=4",
        ],
    )
    figures["zoom_tools"] = train(ctx, "vlm_zoom_tools", "vlm_zoom_tools", [*runs, *tools])
    return figures


def step_lerobot(ctx: Context) -> dict:
    """A short run of configs/reach_smolvla_flow_noise.yaml with tiny SmolVLA and PI05 models."""
    tiny = ctx.pick(
        ["sim.num_envs=128", "warm_start.num_episodes=256", "warm_start.steps=50", "trainer.eval_episodes=128"],
        [
            "sim.num_envs=4",
            "sim.eval_num_envs=4",
            "sim.kwargs={image_size: 32, max_episode_steps: 8}",
            "warm_start.num_episodes=4",
            "warm_start.steps=2",
            "warm_start.batch_size=4",
            "warm_start.warmup_steps=0",
            "algorithm.minibatch_size=8",
            "algorithm.epochs=1",
            "trainer.eval_episodes=4",
        ],
    )
    small = "policy.tiny={image_size: 32, patch_size: 8, hidden: 32, layers: 2, horizon: 4}"
    runs = [*tiny, *ctx.pick([], [small, "policy.chunk_size=2"]), f"trainer.iterations={ctx.pick(2, 1)}"]
    return {
        family: train(ctx, "reach_smolvla_flow_noise", f"lerobot_{family}", [f"policy.model=tiny:{family}", *runs])
        for family in ("smolvla", "pi05")
    }


def step_metaworld(ctx: Context) -> dict:
    """Meta-World from pixels (configs/metaworld_mt50_pixels.yaml): env steps/s of the simulator at
    64 px, rendering through EGL on the GPU (the sim's default GL on the CPU), against the same envs
    without pixels; then a short run of the config (scripted-expert demonstrations recorded with the
    same camera, the warm start, RL iterations)."""
    import torch

    if ctx.device == "cuda":
        os.environ.setdefault("MUJOCO_GL", "egl")  # before MuJoCo loads: the GPU's EGL, no display
    from mmrl.experiment import build_sim, load_experiment

    envs = ctx.pick(["sim.num_envs=32", "sim.eval_num_envs=50"], ["sim.num_envs=2", "sim.eval_num_envs=2"])
    tiny = ctx.pick(
        ["warm_start.num_episodes=100", "warm_start.steps=100", "trainer.rollout_steps=8", "trainer.eval_episodes=50"],
        [
            "sim.kwargs.vectorization=sync",
            "sim.kwargs.task=MT10",  # the same code; MT50's 50 tasks take longer to build on a CPU
            "sim.kwargs.max_episode_steps=20",
            "policy.dim=32",
            "policy.expert_dim=32",
            "warm_start.num_episodes=2",
            "warm_start.steps=2",
            "warm_start.batch_size=8",
            "trainer.rollout_steps=2",
            "trainer.eval_episodes=2",
            "algorithm.minibatch_size=4",
            "algorithm.epochs=1",
        ],
    )
    figures: dict = {}
    for pixels in (True, False):
        cfg = load_experiment(
            ROOT / "configs" / "metaworld_mt50_pixels.yaml",
            [*envs, *tiny, f"run.device={ctx.device}", f"sim.kwargs.render_images={str(pixels).lower()}"],
        )
        sim = build_sim(cfg, cfg.sim.num_envs, seed=0)
        shape = (sim.num_envs, 4, sim.action_dim)  # random chunks of 4 actions
        gen = torch.Generator().manual_seed(0)
        rate = env_steps_per_s(ctx, sim, partial(random_chunk, shape, gen), 4, ctx.pick(5.0, 0.3))
        sim.close()
        figures["pixels_env_steps_per_s" if pixels else "state_env_steps_per_s"] = round(rate, 1)
    figures["mujoco_gl"] = os.environ.get("MUJOCO_GL", "")
    figures["train"] = train(
        ctx, "metaworld_mt50_pixels", "metaworld_mt50_pixels", [*envs, *tiny, "trainer.iterations=1"]
    )
    print(f"metaworld: {figures}", flush=True)
    return figures


def step_distributed(ctx: Context) -> dict:
    """``torchrun --nproc_per_node 1`` of this script's `distributed_worker` (the quickstart with the
    FSDP2 engine, which starts a process group of one); its figures."""
    result = ctx.scratch / "distributed.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", __file__]
    cmd += [*worker_flags(ctx), "--worker", "distributed", "--result", str(result)]
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT).returncode  # the worker's output goes to this step's log
    if not result.exists():
        raise RuntimeError(f"torchrun exited {rc} before its worker wrote a result (the output above says why)")
    outcome = json.loads(result.read_text())
    if outcome["status"] != "ok" or rc:
        raise RuntimeError(f"the torchrun worker: {outcome.get('error') or outcome.get('reason')} (exit {rc})")
    return outcome["figures"]


def step_benchmark(ctx: Context) -> dict:
    """The quickstart benchmark (``benchmarks/quickstart.py``) on the device, as users run
    it: baselines, warm start, RL and evaluation videos of 3 seeds (``--smoke`` with --tiny); its
    JSON line."""
    import runpy

    script = ROOT / "benchmarks" / "quickstart.py"
    args = [*ctx.pick(["--seeds", "3"], ["--smoke", "trainer.video_episodes=4"]), f"run.device={ctx.device}"]
    args += [*(["run.threads=1"] if ctx.device == "cpu" else []), *ctx.overrides]
    print(" ".join([str(script), *args]), flush=True)
    # in this step's process, as `python benchmarks/quickstart.py ...`: what --hide hides stays hidden
    out, argv, path = io.StringIO(), sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = [str(script), *args], [str(script.parent)]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
        print(out.getvalue(), flush=True)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError("benchmarks/quickstart.py printed no JSON line (its output above says why)")
    figures = json.loads(lines[-1])
    keep = ("seeds", "sft_success", "rl_success", "rl_success_mean", "rl_success_std", "wall_s", "wall_s_mean")
    return {k: figures[k] for k in keep if k in figures}


#: the device check's synthetic simulator: one decision on the N envs costs this many GPU policy
#: decisions (benchmarks/placement.py --sim-ratio): a rendering simulator costing several policy
#: decisions, as ManiSkill3 rgb did against the policy on the 2-core CPU machine (about 5x,
#: docs/benchmarks/placement.md). Balanced (1) would leave the hybrid's extra policy calls (one per
#: stage, each launch-bound on a GPU) nothing to hide behind; a fixed cost per env step would tie the
#: figure to the host CPU's speed rather than to the policy's
HYBRID_SIM_RATIO = 5


def step_hybrid(ctx: Context) -> dict:
    """Placement with the policy on the device (issue 71): benchmarks/placement.py's collocated,
    disaggregated and hybrid (2 and 4 stages) modes on synthetic busy-work (`HYBRID_SIM_RATIO`) and on
    Meta-World from pixels where it imports; per workload the simulator's and the policy's cost per
    decision, and per mode env steps/s, seconds per iteration and the speed-ups against collocated
    (1 thread and all cores). --tiny: the benchmark's --smoke path (Meta-World's too, where it imports)."""
    benchmarks = str(ROOT / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)  # its `_smoke` helper
    spec = importlib.util.spec_from_file_location("placement_benchmark", ROOT / "benchmarks" / "placement.py")
    assert spec is not None and spec.loader is not None
    pb = importlib.util.module_from_spec(spec)
    sys.modules["placement_benchmark"] = pb
    spec.loader.exec_module(pb)
    common = ["--device", ctx.device, *ctx.pick([], ["--smoke"])]
    synthetic = ["--workload", "synthetic", "--sim-ratio", str(HYBRID_SIM_RATIO)]
    synthetic += ctx.pick(["--envs", "64", "--rounds", "6", "--max-steps", "40", "--stages", "2", "4"], [])
    metaworld = ["--workload", "metaworld"]
    metaworld += ctx.pick(["--mw-envs", "16", "--mw-rounds", "3", "--mw-max-steps", "32", "--mw-stages", "2", "4"], [])
    keep = ("num_envs", "policy_ms", "sim_ms", "sim_over_policy", "sim_ms_per_env_step", "skipped")
    figures: dict = {"cpus": os.cpu_count()}
    for name, key, argv in (
        ("synthetic", "synthetic_busywork", synthetic),
        ("metaworld", "metaworld_pixels", metaworld),
    ):
        print(" ".join(["benchmarks/placement.py", *common, *argv]), flush=True)
        try:
            result = pb.main([*common, *argv])[key]
        except Exception as exc:  # the other workload's figures are kept
            traceback.print_exc()
            ctx.expect(False, f"{name}: {type(exc).__name__}: {exc}")
            continue
        row = {k: result[k] for k in keep if k in result}
        row["modes"] = {
            mode: {k: v for k, v in f.items() if k in ("env_sps", "iter_s") or k.startswith("speedup_")}
            for mode, f in result.get("modes", {}).items()
        }
        figures[name] = row
        ctx.expect("skipped" in row or all(f["env_sps"] > 0 for f in row["modes"].values()), f"{name}: no env steps")
    return figures


REAL_SIZE_BUDGET_S = 360.0  # the real_size step starts no case past this (its figures so far are kept)


def step_real_size(ctx: Context) -> dict:
    """Real model sizes (issue 71, benchmarks/real_size.py): each case's real-size config for two RL
    iterations on random weights of the real architecture (one layer per stack under --tiny), its
    memory plan beside the peak allocated and the seconds per iteration. On the GPU each case runs
    its ``gpu`` batch (more rollouts, longer answers than the CPU's); the diffusers cases need the
    diffusers wheel (scripts/device_check.sh) and are left out without it."""
    spec = importlib.util.spec_from_file_location("real_size", ROOT / "benchmarks" / "real_size.py")
    rs = importlib.util.module_from_spec(spec)
    sys.modules["real_size"] = rs  # dataclasses look their module up there
    spec.loader.exec_module(rs)  # type: ignore[union-attr]
    have_diffusers = importlib.util.find_spec("diffusers") is not None
    figures: dict = {}
    # --tiny (CI's dry run): the first case's path at one layer per stack; benchmarks/real_size.py
    # --smoke runs the others' in CI already
    cases = list(rs.CASES.values())[:1] if ctx.tiny else list(rs.CASES.values())
    start = time.perf_counter()
    for case in cases:
        if case.writer == "diffusers" and not have_diffusers:
            continue
        left = REAL_SIZE_BUDGET_S - (time.perf_counter() - start)
        if left < 60:  # a case needs a minute or more (writing its checkpoint, loading, two iterations)
            figures[case.name] = {"skipped": f"the step's {REAL_SIZE_BUDGET_S:.0f} s are spent"}
            continue
        r = rs.run_case(case, ctx.device, 2, ctx.tiny, left, ctx.scratch / "real_size")
        ctx.expect("error" not in r, f"{case.name}: {r.get('error')}")
        keep = ("params", "trainable", "estimated_peak_bytes", "measured_peak_bytes", "estimate_over_measured",
                "s_per_iter", "samples_per_s")  # fmt: skip
        figures[case.name] = {k: r[k] for k in keep if k in r}
    return figures


def distributed_worker(ctx: Context) -> dict:
    """Under torchrun: the quickstart with ``trainer.engine.backend=fsdp``; the process group's backend."""
    import torch.distributed as dist

    tiny = ctx.pick(["sim.num_envs=1024", "warm_start.steps=100"], [*TINY_QUICKSTART, "sim.num_envs=8"])
    figures = train(ctx, "quickstart", "distributed", [*tiny, "trainer.engine.backend=fsdp", "trainer.iterations=2"])
    figures.update(backend=dist.get_backend(), world_size=dist.get_world_size())
    dist.destroy_process_group()
    expected = "nccl" if ctx.device == "cuda" else "gloo"
    ctx.expect(figures["backend"] == expected, f"process group backend {figures['backend']}, expected {expected}")
    return figures


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Context], dict]
    timeout_s: float  # on the GPU (--tiny: `TINY_TIMEOUT_S`)
    needs: tuple[str, ...] = ()  # Python packages beyond mmrl's own dependencies; skipped without them
    #: its ``needs`` travel to the GPU machine as wheels (.whl/, scripts/device_check.sh): ``--hide
    #: device`` leaves them importable for this step only (every other step still finds them absent)
    travels: bool = False


STEPS = [
    Step("quickstart", step_quickstart, 170),
    Step("flow", step_flow, 60),
    Step("diffusion", step_diffusion, 60),
    Step("diffusers", step_diffusers, 60, needs=("diffusers", "peft", "transformers")),
    Step("vlm", step_vlm, 60, needs=("transformers", "peft")),
    Step("video", step_video, 90, needs=("diffusers", "peft", "transformers")),
    Step("vlm_video", step_vlm_video, 60, needs=("transformers",)),
    Step("lerobot", step_lerobot, 60, needs=("lerobot",)),
    Step("metaworld", step_metaworld, 120, needs=("metaworld", "mujoco", "gymnasium", "scipy"), travels=True),
    Step("distributed", step_distributed, 60),
    Step("benchmark", step_benchmark, 170),
    Step("hybrid", step_hybrid, 180),
    Step("real_size", step_real_size, 420, needs=("transformers", "peft")),
]
WORKERS = {"distributed": distributed_worker}


# ---- one step, in its own process ------------------------------------------------------------
def hide_modules(names: list[str]) -> None:
    """Make ``names`` absent in this process: ``import`` raises ModuleNotFoundError and
    ``importlib.util.find_spec`` answers None (a None entry in ``sys.modules``)."""
    for name in names:
        sys.modules[name] = None  # type: ignore[assignment]


def child_main(args: argparse.Namespace) -> int:
    """Run one step (or a worker) and write its outcome to ``--result``: 0 ok or skipped, 1 failed."""
    name = args.step or args.worker
    step = next((s for s in STEPS if s.name == name), None)
    brought = set(step.needs) if step is not None and step.travels else set()
    hide_modules([n for n in os.environ.get(HIDE_ENV, "").split(",") if n and n not in brought])
    ctx = Context(
        device="cpu" if args.cpu else "cuda",
        tiny=args.tiny,
        scratch=Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="mmrl_device_check_")),
        overrides=[kv.split(":", 1)[1] for kv in args.set if kv.split(":", 1)[0] == name],
    )
    outcome: dict = {"status": "ok", "figures": {}}
    try:
        injected = dict(kv.split("=", 1) for kv in args.inject).get(name)
        if injected == "raise":
            raise RuntimeError(f"injected failure of step {name} (--inject {name}=raise)")
        if injected == "hang":
            print(f"step {name} hangs on purpose (--inject {name}=hang)", flush=True)
            time.sleep(1e6)
        if ctx.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise Skip("no CUDA device here (run with --cpu for the CPU dry run)")
        if args.worker:
            outcome["figures"] = WORKERS[name](ctx)
        else:
            step = next(s for s in STEPS if s.name == name)
            needs(*step.needs)
            outcome["figures"] = step.run(ctx)
        if ctx.device == "cuda":  # this process's peak (a torchrun worker reports its own)
            import torch

            outcome["figures"].setdefault("gpu_peak_memory_gib", round(torch.cuda.max_memory_allocated() / 2**30, 3))
        if ctx.problems:
            outcome.update(status="failed", error="; ".join(ctx.problems))
    except Skip as exc:
        outcome = {"status": "skipped", "reason": str(exc), "figures": {}}
    except BaseException as exc:  # reported to the parent, with the traceback in the log
        traceback.print_exc()
        outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}", "figures": outcome["figures"]}
    sys.stdout.flush()
    Path(args.result).write_text(json.dumps(outcome, default=float))
    return 0 if outcome["status"] != "failed" else 1


def worker_flags(ctx: Context) -> list[str]:
    """The flags that give a worker process the step's context."""
    flags = ["--scratch", str(ctx.scratch), *(["--cpu"] if ctx.device == "cpu" else [])]
    flags += ["--tiny"] if ctx.tiny else []
    return flags + (["--set", *(f"distributed:{o}" for o in ctx.overrides)] if ctx.overrides else [])


# ---- the run: every step, time-boxed ---------------------------------------------------------
def nonfinite(figures, path: str = "") -> list[str]:
    """The keys (dotted) of non-finite numbers in nested ``figures``."""
    if isinstance(figures, dict):
        return [k for key, v in figures.items() for k in nonfinite(v, f"{path}{key}.")]
    if isinstance(figures, float) and not math.isfinite(figures):
        return [path.rstrip(".")]
    return []


def tail(text: str, lines: int = ERROR_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_step(step: Step, args: argparse.Namespace, timeout: float, scratch: Path, log) -> dict:
    """Run ``step`` in a subprocess (its own process group, killed whole at ``timeout``); its entry."""
    result = scratch / f"{step.name}.result.json"
    output = scratch / f"{step.name}.log"
    cmd = [sys.executable, __file__, *args.child_flags, "--step", step.name, "--result", str(result)]
    cmd += ["--scratch", str(scratch / step.name)]
    (scratch / step.name).mkdir()
    t0 = time.perf_counter()
    with open(output, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    seconds = round(time.perf_counter() - t0, 2)
    with contextlib.suppress(ProcessLookupError):  # what it started and left behind (torchrun workers)
        os.killpg(proc.pid, signal.SIGKILL)
    text = output.read_text(errors="replace")
    log.write(f"\n===== step {step.name} ({seconds} s, limit {timeout:.0f} s) =====\n{text}")
    log.flush()
    if rc is None:
        return {
            "status": "failed",
            "seconds": seconds,
            "figures": {},
            "error": f"timed out after {timeout:.0f} s\n" + tail(text),
        }
    entry = json.loads(result.read_text()) if result.exists() else {"status": "failed", "figures": {}}
    entry["seconds"] = seconds
    if entry["status"] == "failed" or rc != 0:
        entry.update(status="failed", error=f"{entry.get('error', f'exit status {rc}')}\n{tail(text)}")
    elif bad := nonfinite(entry["figures"]):
        entry.update(status="failed", error=f"non-finite figures: {', '.join(bad)}")
    return entry


def environment(cpu: bool) -> dict:
    """The commit, the device and the versions the figures were measured with."""
    import torch

    commit = os.environ.get("MMRL_COMMIT")
    if not commit:
        git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
        commit = git.stdout.strip() if git.returncode == 0 else "unknown (no .git here: set MMRL_COMMIT)"
    cuda = torch.cuda.is_available() and not cpu
    return {
        "commit": commit,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def parent_main(args: argparse.Namespace) -> int:
    out = Path(args.out or os.environ.get("OUT") or "device_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    hidden = [m for item in args.hide for m in (ABSENT_ON_DEVICE if item == "device" else item.split(",")) if m]
    os.environ[HIDE_ENV] = ",".join(hidden)
    if args.cpu:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(PYTHONUNBUFFERED="1", TQDM_DISABLE="1")
    budget = args.budget or (900.0 if args.tiny else 450.0)
    report = {
        **environment(args.cpu),
        "mode": {"cpu": args.cpu, "tiny": args.tiny, "budget_s": budget, "hidden": hidden},
        "steps": {},
    }
    chosen = [s for s in STEPS if not args.only or s.name in args.only]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mmrl_device_check_") as tmp, open(out / LOG_NAME, "w") as log:
        for step in chosen:
            left = budget - (time.perf_counter() - t_start)
            limit = min(TINY_TIMEOUT_S if args.tiny else step.timeout_s, args.step_timeout or math.inf, left)
            if limit < min(MIN_STEP_S, args.step_timeout or MIN_STEP_S):
                entry = {"status": "skipped", "seconds": 0.0, "figures": {}}
                entry["reason"] = f"the run's budget of {budget:.0f} s is spent ({left:.0f} s left)"
            else:
                entry = run_step(step, args, limit, Path(tmp), log)
            report["steps"][step.name] = entry
            report["seconds"] = round(time.perf_counter() - t_start, 2)
            (out / JSON_NAME).write_text(json.dumps(report, indent=1, default=float))
            why = (entry.get("reason") or entry.get("error") or "").split("\n")[0]
            print(f"{step.name:12s} {entry['status']:8s} {entry['seconds']:7.1f} s  {why}", flush=True)
    failed = [name for name, e in report["steps"].items() if e["status"] == "failed"]
    print(f"{len(chosen)} steps in {report['seconds']:.0f} s, failed: {', '.join(failed) or 'none'}; {out / JSON_NAME}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="run every step on the CPU (the dry run)")
    p.add_argument("--tiny", action="store_true", help="tiny settings: the code paths in seconds")
    p.add_argument("--out", help="folder of the JSON and the log (default: $OUT, else device_check_out)")
    p.add_argument("--only", nargs="*", choices=[s.name for s in STEPS], help="run these steps only")
    p.add_argument("--budget", type=float, help="seconds for the whole run (default 450; --tiny 900)")
    p.add_argument("--step-timeout", type=float, help="cap every step's time limit at this many seconds")
    p.add_argument("--hide", nargs="*", default=[], help="modules to treat as absent ('device': ABSENT_ON_DEVICE)")
    p.add_argument("--set", nargs="*", default=[], help="STEP:KEY=VALUE config overrides of a step's runs")
    p.add_argument("--inject", nargs="*", default=[], help="STEP=raise|hang: make a step fail on purpose")
    p.add_argument("--step", help=argparse.SUPPRESS)  # internal: run this step (a child process)
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)  # internal: under torchrun
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--scratch", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.step or args.worker:
        return child_main(args)
    args.child_flags = [*(["--cpu"] if args.cpu else []), *(["--tiny"] if args.tiny else [])]
    args.child_flags += [
        *(["--set", *args.set] if args.set else []),
        *(["--inject", *args.inject] if args.inject else []),
    ]
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
