"""Video QA: SFT, then GRPO with a verifiable reward; held-out accuracy against a single-frame baseline, over seeds.

    python benchmarks/vlm_video.py                     # configs/vlm_video_qa.yaml, seeds 0, 1, 2
    python benchmarks/vlm_video.py --jobs 2            # two seeds' runs side by side
    python benchmarks/vlm_video.py --validation trainer.lr=3e-4   # choosing settings: validation split only
    python benchmarks/vlm_video.py --smoke             # seconds: 2 iterations, no figure

Each seed runs `configs/vlm_video_qa.yaml` (a tiny Qwen2.5-VL answering "which direction does the
shape move?" about 8-frame clips, see the config) twice from scratch with ``run.seed`` = the seed:

- ``video``: as configured (several frames per clip through Qwen's video path), in
  ``runs/bench_vlm_video/video<seed>``;
- ``single_frame``: the same pipeline, SFT and RL alike, given ONE frame of each clip
  (``policy.video_max_frames=1``): the answer is then a guess from where the shape is, the baseline
  the video run must beat, in ``runs/bench_vlm_video/single_frame<seed>``.

Both measure greedy accuracy after the SFT warm start ("SFT") and after the RL iterations ("RL") on
the held-out ``eval`` split of moving_shapes_vqa ((colour, shape, direction) combinations never
trained on; the trainer's own evaluation, ``trainer.eval_episodes`` questions) and on its
``validation`` split (a third disjoint pool of combinations, see its CARD.md). ``--validation``
evaluates on validation only, the trainer's evaluations too: no policy ever answers a held-out
question; that is the mode to choose settings in. The per-question evaluation is
`benchmarks/vlm_grpo.py`'s, as are the baselines: ``gold`` (the gold answers through the same
reward: 1.0, the reward can score every answer) and ``constant`` (the single answer scoring best on
the RL training pool, answered to every question). ``mean_turns`` is the trainer's mean episode
length at the final evaluation (model turns per episode; 1: one answer); ``mean_tool_calls`` is 0
because the QA simulator offers no tools. The gain is RL minus SFT accuracy per seed, its std the
sample std (n - 1). The last line is one JSON object with the per-seed lists and the means
(`benchmarks/_vlm_arms.py` runs the arms, as for `vlm_tools.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _vlm_arms import ArmBenchmark, main  # noqa: E402

BENCH = ArmBenchmark(
    doc=__doc__,
    config=ROOT / "configs/vlm_video_qa.yaml",
    arms={"video": [], "single_frame": ["policy.video_max_frames=1"]},  # arm -> its overrides
    smoke=[
        "sim.num_envs=4",
        "sim.eval_num_envs=8",
        "sim.kwargs.dataset_kwargs={num_samples: 16, num_frames: 8, image_size: 32, fps: 4.0}",
        "warm_start.num_episodes=8",
        "warm_start.steps=2",
        "warm_start.warmup_steps=0",
        "warm_start.batch_size=8",
        "algorithm.group_size=4",
        "algorithm.minibatch_size=8",
        "trainer.iterations=2",
        "trainer.eval_episodes=8",
        "trainer.checkpoint_every=2",
        "trainer.eval_every=2",
    ],
    out="runs/bench_vlm_video",
)

if __name__ == "__main__":
    main(BENCH)
