"""Flow-GRPO vs the likelihood-free AWM and DiffusionNFT on the embedded VIDEO demo, same budget, per seed.

    python benchmarks/video_align.py                      # seeds 0-2, 120 iterations each, eval every 10
    python benchmarks/video_align.py --resume             # a killed run goes on from its checkpoints
    python benchmarks/video_align.py --smoke              # seconds: 1 seed, 2 iterations, no figure
    python benchmarks/video_align.py --seeds 0 --cost-steps 8,16,32   # seconds per training clip at K steps

The image benchmark's protocol (`benchmarks/diffusion_align.py`, which this one runs with another
`Demo`), on clips: for each seed s, one tiny pixel-space text-to-video generator
(`mmrl.policies.tiny_video_generator`) is pretrained by flow matching on the synthetic
`moving_shapes` clips (8 frames of 16 px: one coloured circle, square or triangle moving right,
left, up or down) of the 48 TRAIN prompts with noisy captions (half of them swapped for another
train prompt; the warm start of configs/video_shapes_flow_grpo.yaml), so it follows its prompt only
part of the time. From those same weights configs/video_shapes_flow_grpo.yaml (Flow-SDE on the first 3
of 8 steps, per-step PPO ratios), configs/video_shapes_awm.yaml and configs/video_shapes_nft.yaml (ODE
rollouts, no log-likelihood) each run the same iterations with the same train prompts (8 prompts x
4 clips per iteration), and the mean `moving_shapes` reward (colour, shape and direction of motion
read from the frames, `rewards/moving_shapes.py`) over the 12 held-out prompts, each evaluated twice
(ODE, 16 steps), is measured every ``--eval-every`` iterations. The held-out prompts (colour, shape
and direction each seen in training, never together) are in neither the pretraining nor the
training. Grids of held-out clips before and after are written at every evaluation
(runs/bench_video/seed<s>/<name>/videos/*.mp4, a still of the last frames beside each) and to
TensorBoard.

Baselines beside the result, on the same held-out episodes: the pretrained generator (every run's
start), correct clips of each prompt drawn by the dataset's renderer (the reward's ceiling) and the
same correct clips scored against another held-out prompt (a perfect animator that ignores its prompt).

Time to a common level: ``pretrained + frac * (min over the methods of their best - pretrained)``
(``--level-frac``, default 0.8), reached by every method that improves; ``<method>_time_to_level_s``
is the RL wall time (evaluation excluded) at which it first gets there, interpolated between
evaluations (null if never), and ``<method>_speedup_time`` Flow-GRPO's over the method's.

The last line is one JSON object with per-seed lists ``pretrained_reward``, ``flow_grpo_reward``,
``awm_reward``, ``nft_reward``, their gains, ``<method>_time_to_level_s``, speedups, ``level``, each
with ``_mean`` and ``_std``, the ceiling (``gold_reward``), the prompt-ignoring baseline
(``prompt_ignoring_reward``), the evaluation protocol and the curves.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the image benchmark it reuses

from diffusion_align import SMOKE, Demo, main


def moving_shapes_gold(sim, meta: list[dict]):
    """Correct clips of each episode's prompt, as the dataset draws them."""
    from mmrl.data import builder_module

    specs = [{k: m[k] for k in ("color", "shape", "direction")} for m in meta]
    return builder_module("moving_shapes").draw(specs, num_frames=sim.num_frames, image_size=sim.image_size, seed=0)


VIDEOS = Demo(
    samples="clips",
    configs={
        "flow_grpo": "configs/video_shapes_flow_grpo.yaml",
        "awm": "configs/video_shapes_awm.yaml",
        "nft": "configs/video_shapes_nft.yaml",
    },
    gold=moving_shapes_gold,
    one_eval=["sim.eval_num_envs=12", "trainer.eval_episodes=12"],
    smoke=[*SMOKE, "sim.num_envs=8", "algorithm.epochs=1", "policy.window=[0,1]"],  # Flow-GRPO's window in 2 steps
    output_dir="runs/bench_video",
    iterations=120,  # chosen on the validation prompts (configs/video_shapes_*.yaml)
    eval_every=10,
    # the 12 validation prompts (moving_shapes' `validation`) out of pretraining and RL, evaluated instead
    validation=(
        "sim.kwargs.dataset_kwargs.val_fraction=0.2",
        "sim.eval_kwargs.split=validation",
        "warm_start.kwargs.val_fraction=0.2",
    ),
)


if __name__ == "__main__":
    main(VIDEOS, __doc__)
