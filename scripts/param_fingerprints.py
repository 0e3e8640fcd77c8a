"""Fingerprints of the parameters every shipped config trains to in a short run: the check a
refactor that must not change training passes (same fingerprints before and after).

    python scripts/param_fingerprints.py --root . --out after.json            # this tree
    git worktree add /tmp/before <commit>
    python scripts/param_fingerprints.py --root /tmp/before --out before.json  # the same runs there
    python scripts/param_fingerprints.py --compare before.json after.json

Each config in ``configs/`` (of ``--root``) runs as users run it, shortened (`SHORT`: few envs, a few
warm-start steps, 2 RL iterations or a small env-step budget, no videos) with the tiny stand-ins a
CPU needs where the config names a hub checkpoint or a GPU simulator (`STAND_INS`); its fingerprint
is the sha256 of the final policy state dict (every tensor's name, dtype, shape and bytes, sorted),
printed as one JSON line per config. Configs whose family is absent from this interpreter (LeRobot
needs ``.venv-lerobot``) are reported as skipped, not silently dropped. The run folders, the tiny
CLIP and the tiny SmolVLM live under ``--work`` (shared by both trees, so both runs see the same
stand-ins).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

COMMON = [
    "run.threads=1",
    "trainer.iterations=2",
    "trainer.eval_every=0",
    "trainer.eval_episodes=4",
    "trainer.video_episodes=0",
    "trainer.checkpoint_every=1",
    "trainer.resume=false",
]
REACH = ["sim.num_envs=16", "sim.eval_num_envs=4", "warm_start.num_episodes=16", "warm_start.steps=20"]
#: the off-policy quickstarts (16 envs x 5 decisions x 4 steps = 320 env steps an iteration): learning
#: starts after the second iteration, a few dozen gradient steps on small batches each iteration after it
OFF_POLICY_REACH = ["algorithm.sac.learning_starts=640", "algorithm.sac.utd_ratio=0.25", "algorithm.sac.batch_size=32"]
#: per config: the overrides that make it short (on top of COMMON)
SHORT = {
    "quickstart": REACH,
    "quickstart_flow_noise": REACH,
    "quickstart_grpo": REACH,
    "quickstart_clip_reward": REACH,
    "quickstart_clip_shaping": REACH,
    "quickstart_token_vla": [
        "sim.num_envs=8",
        "sim.eval_num_envs=4",
        "warm_start.num_episodes=4",
        "warm_start.steps=5",
        "algorithm.minibatch_size=8",
    ],
    "diffusion_shapes_flow_grpo": [
        "sim.num_envs=8",
        "sim.eval_num_envs=6",
        "warm_start.steps=10",
        "trainer.eval_episodes=6",
        "algorithm.minibatch_size=8",
    ],
    "diffusion_shapes_awm": [
        "sim.num_envs=8",
        "sim.eval_num_envs=6",
        "warm_start.steps=10",
        "trainer.eval_episodes=6",
        "algorithm.minibatch_size=8",
    ],
    "vlm_quickstart": [
        "sim.num_envs=8",
        "sim.eval_num_envs=4",
        "warm_start.steps=5",
        "warm_start.num_episodes=16",
        "algorithm.minibatch_size=8",
    ],
    "gym_pendulum": [
        "sim.num_envs=4",
        "sim.eval_num_envs=2",
        "trainer.rollout_steps=16",
        "trainer.env_steps=256",
        "algorithm.minibatch_size=32",
        "trainer.eval_episodes=2",
    ],
    "gym_inverted_pendulum": [
        "sim.num_envs=4",
        "sim.eval_num_envs=2",
        "trainer.rollout_steps=16",
        "trainer.env_steps=256",
        "algorithm.minibatch_size=32",
        "trainer.eval_episodes=2",
    ],
    "maniskill_pickcube_flow_noise": [
        "run.device=cpu",
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "sim.kwargs.max_episode_steps=8",
        "trainer.eval_episodes=2",
        "algorithm.minibatch_size=8",
        "warm_start.dataset=null",
    ],
    "libero_spatial_token_vla_grpo": [
        "run.device=cpu",
        "sim.num_envs=8",
        "sim.eval_num_envs=2",
        "sim.eval_tasks=null",
        "sim.kwargs.max_episode_steps=8",
        "sim.kwargs.num_noop_steps=1",
        "sim.kwargs.image_size=32",
        "trainer.eval_episodes=2",
        "algorithm.minibatch_size=8",
        "warm_start.dataset=null",
        "policy.image_size=32",
    ],
    "reach_smolvla_flow_noise": [*REACH, "warm_start.warmup_steps=0"],
    "libero_spatial_smolvla_flow_noise": [
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "sim.eval_tasks=null",
        "sim.kwargs.image_size=32",
        "sim.kwargs.max_episode_steps=20",
        "sim.kwargs.num_noop_steps=1",
        "trainer.eval_episodes=2",
        "algorithm.minibatch_size=8",
        "run.device=cpu",
    ],
    "libero_pi05_flow_sde": [
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "sim.eval_tasks=null",
        "sim.kwargs.image_size=32",
        "sim.kwargs.max_episode_steps=20",
        "sim.kwargs.num_noop_steps=1",
        "trainer.eval_episodes=2",
        "algorithm.minibatch_size=8",
        "algorithm.group_size=2",
        "run.device=cpu",
    ],
    # the off-policy mode (SAC, DSRL, RLPD): learning starts inside the short budget, a few gradient steps
    "gym_pendulum_sac": [
        "sim.eval_num_envs=2",
        "trainer.env_steps=160",
        "trainer.eval_episodes=2",
        "trainer.checkpoint_every=40",
        "algorithm.sac.learning_starts=100",
        "algorithm.sac.batch_size=32",
    ],
    "quickstart_dsrl": [*REACH, "trainer.env_steps=1280", *OFF_POLICY_REACH],
    "quickstart_rlpd": [*REACH, "trainer.env_steps=1280", *OFF_POLICY_REACH, "algorithm.sac.demo_episodes=16"],
    "diffusion_shapes_nft": [
        "sim.num_envs=8",
        "sim.eval_num_envs=6",
        "warm_start.steps=10",
        "trainer.eval_episodes=6",
        "algorithm.minibatch_size=8",
    ],
    **{
        name: [
            "sim.num_envs=8",
            "sim.eval_num_envs=4",
            "warm_start.steps=10",
            "warm_start.num_episodes=64",
            "algorithm.minibatch_size=8",
        ]
        for name in ("video_shapes_awm", "video_shapes_flow_grpo", "video_shapes_nft")
    },
    "metaworld_sac": [
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "sim.kwargs.max_episode_steps=20",
        "trainer.env_steps=160",
        "trainer.eval_episodes=2",
        "trainer.checkpoint_every=40",
        "algorithm.sac.learning_starts=100",
        "algorithm.sac.batch_size=32",
    ],
    "metaworld_ppo": [
        "sim.num_envs=4",
        "sim.eval_num_envs=2",
        "sim.kwargs.max_episode_steps=20",
        "trainer.rollout_steps=16",
        "trainer.env_steps=256",
        "algorithm.minibatch_size=32",
        "trainer.eval_episodes=2",
    ],
    "metaworld_mt10": [
        "sim.num_envs=10",
        "sim.eval_num_envs=10",
        "sim.kwargs.max_episode_steps=20",
        "warm_start.num_episodes=10",
        "warm_start.steps=5",
        "trainer.rollout_steps=4",
        "trainer.eval_episodes=10",
        "algorithm.minibatch_size=40",
    ],
    "metaworld_mt50_pixels": [
        "run.device=cpu",
        "sim.num_envs=2",
        "sim.eval_num_envs=2",
        "sim.kwargs.vectorization=sync",
        "sim.kwargs.max_episode_steps=20",
        "warm_start.num_episodes=2",
        "warm_start.steps=2",
        "trainer.rollout_steps=2",
        "trainer.eval_episodes=2",
        "trainer.video_episodes=0",
        "algorithm.minibatch_size=4",
    ],
    "vlm_video_qa": [
        "sim.num_envs=16",
        "sim.eval_num_envs=4",
        "warm_start.steps=5",
        "warm_start.warmup_steps=0",
        "warm_start.num_episodes=16",
        "algorithm.minibatch_size=8",
    ],
    "vlm_zoom_tools": [
        "sim.num_envs=8",
        "sim.eval_num_envs=4",
        "warm_start.steps=5",
        "warm_start.warmup_steps=0",
        "warm_start.num_episodes=8",
        "algorithm.minibatch_size=8",
    ],
}
LEROBOT = ("reach_smolvla_flow_noise", "libero_spatial_smolvla_flow_noise", "libero_pi05_flow_sde")
FAKE_LIBERO = "tests/simulators/test_libero.py:FakeLiberoEnv"  # LIBERO's stand-in envs (no scene assets)


def stand_ins(name: str, root: Path, work: Path) -> list[str]:
    """Overrides putting tiny real models (built here, offline) and LIBERO's stand-in envs in place of
    what a config names for a GPU machine."""
    out = []
    if name in (
        "quickstart_clip_reward",
        "quickstart_clip_shaping",
    ):  # the configs read runs/reach_clip: a tiny CLIP trained here, briefly
        if not (work / "runs" / "reach_clip" / "train_info.json").exists():
            from mmrl.data import load_dataset
            from rewards.train_tiny_clip import train_tiny_clip

            train_tiny_clip(
                load_dataset("reach_clip", num_samples=256, seed=0),
                work / "runs" / "reach_clip",
                steps=5,
                batch_size=32,
                log_every=0,
            )
    if name in ("quickstart_token_vla", "libero_spatial_token_vla_grpo"):
        folder = work / "runs" / "tiny_smolvlm"
        if not (folder / "config.json").exists():
            from mmrl.tiny.tiny_models import tiny_image_text_model

            tiny_image_text_model(str(folder))
        out.append(f"policy.model={folder}")
    if name.startswith("libero_"):
        out.append(f"sim.kwargs.env_factory={root / FAKE_LIBERO}")
    if name in ("libero_spatial_smolvla_flow_noise", "libero_pi05_flow_sde"):
        sys.path.insert(0, str(root / "tests" / "policies"))
        import test_lerobot_recipes as recipes  # the tiny LIBERO-shaped checkpoints of the recipe tests

        family = "smolvla" if "smolvla" in name else "pi05"
        tok = recipes.tiny_lerobot.tiny_gemma_tokenizer_folder(work / "tok") if family != "smolvla" else None
        out.append(f"policy.model={recipes.tiny_libero_checkpoint(family, work / 'lerobot', tok)}")
        if tok:
            out.append(f"policy.tokenizer={tok}")
    return out


def fingerprint(state: dict) -> str:
    """sha256 (16 hex digits) of a state dict: every tensor's name, dtype, shape and bytes, sorted."""
    import torch

    h = hashlib.sha256()
    for key in sorted(state):
        v = state[key].detach().cpu().contiguous()
        h.update(f"{key}|{v.dtype}|{tuple(v.shape)}|".encode())
        if v.numel():
            h.update(v.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def run_one(name: str, root: Path, work: Path) -> dict:
    import contextlib

    from mmrl.experiment import build_trainer, load_experiment

    t0 = time.time()
    ctx = contextlib.nullcontext()
    if name == "libero_pi05_flow_sde":  # the tiny PI05 needs the tiny Gemma variants while it is built
        from mmrl.tiny import tiny_lerobot

        ctx = tiny_lerobot.TinyPiVariants(tiny_lerobot.tiny_gemma_tokenizer_folder(work / "tok"))
    with ctx:
        overrides = stand_ins(name, root, work)
        cfg = load_experiment(
            root / "configs" / f"{name}.yaml",
            [f"run.output_dir={work / 'runs' / 'fingerprints'}", f"run.name={name}", *COMMON, *SHORT[name], *overrides],
        )
        trainer = build_trainer(cfg)
        trainer.run()
    import mmrl

    return {
        "config": name,
        "fingerprint": fingerprint(trainer.policy.state_dict()),
        "mmrl": mmrl.__file__,
        "iterations": trainer.state.iteration,
        "env_steps": trainer.state.env_steps,
        "final": {k: trainer.state.results["final"].get(k) for k in ("success_rate", "return")},
        "seconds": round(time.time() - t0, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=".", help="the tree whose code and configs run")
    parser.add_argument("--work", default="/tmp/mmrl_fingerprints", help="run folders and shared stand-ins")
    parser.add_argument("--out", help="write the JSON lines here too")
    parser.add_argument("--only", nargs="*", help="config names (default: every config of --root)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two --out files")
    args = parser.parse_args()
    if args.compare:
        a, b = ({r["config"]: r for r in map(json.loads, Path(p).read_text().splitlines())} for p in args.compare)
        for name in sorted(set(a) | set(b)):
            ra, rb = a.get(name, {}), b.get(name, {})
            fa, fb = ra.get("fingerprint"), rb.get("fingerprint")
            skipped = not fa and not fb and ra.get("skipped") and ra.get("skipped") == rb.get("skipped")
            verdict = f"skipped ({ra['skipped']})" if skipped else "same" if fa and fa == fb else "DIFFERENT"
            print(f"{name:36s} {fa or '-':18s} {fb or '-':18s} {verdict}")
        return
    root, work = Path(args.root).resolve(), Path(args.work).resolve()
    sys.path.insert(0, str(root))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)  # the configs' relative paths (runs/reach_clip, runs/tiny_smolvlm) resolve here
    names = args.only or sorted(p.stem for p in (root / "configs").glob("*.yaml"))
    lines = []
    for name in names:
        if name not in SHORT:
            row = {"config": name, "skipped": "no short settings in scripts/param_fingerprints.py: add them"}
        elif name in LEROBOT and sys.version_info < (3, 12):
            row = {"config": name, "skipped": "LeRobot runs in .venv-lerobot (Python 3.12)"}
        else:
            try:
                row = run_one(name, root, work)
            except Exception as exc:  # reported in the row; the other configs still run
                row = {"config": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
        print(json.dumps(row), flush=True)
        lines.append(json.dumps(row))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
