"""Multi-turn tool use: SFT, then GRPO over whole episodes; held-out accuracy against a no-tool baseline, over seeds.

    python benchmarks/vlm_tools.py                     # configs/vlm_zoom_tools.yaml, seeds 0, 1, 2
    python benchmarks/vlm_tools.py --jobs 2            # two runs side by side
    python benchmarks/vlm_tools.py --validation trainer.lr=3e-4   # choosing settings: validation split only
    python benchmarks/vlm_tools.py --smoke             # seconds: 2 iterations, no figure

Each seed runs `configs/vlm_zoom_tools.yaml` (a tiny Qwen2.5-VL sees a scene of four shapes at 16 px
in grayscale, where all colours look alike, and may call ``zoom(x, y)``, which returns the
full-resolution colour crop as an image, before it answers "What color is the object in the top left
quarter?"; see the config) twice from scratch with ``run.seed`` = the seed:

- ``tools``: as configured (SFT on two-turn demonstrations: the call, then the answer after the crop;
  then GRPO on whole episodes, the loss on the model's own turns only), in ``runs/bench_vlm_tools/tools<seed>``;
- ``no_tool``: the same pipeline, SFT and RL alike, without the tool
  (``sim.kwargs.env_kwargs.offer_zoom=false``: the demonstrations answer from the small image): the
  baseline the tool run must beat, in ``runs/bench_vlm_tools/no_tool<seed>``.

Both measure greedy accuracy after SFT and after RL on the held-out ``eval`` split of zoom_vqa
(scenes never trained on) and on its ``validation`` split; ``--validation`` evaluates on validation
only, the mode to choose settings in. The baselines (``gold``, ``constant``), ``mean_turns`` (model
turns per episode: 2 for a call then an answer) and ``mean_tool_calls`` (per episode, the main arm
at its final evaluation) and the JSON line are `benchmarks/_vlm_arms.py`'s, as for `vlm_video.py`.
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
    config=ROOT / "configs/vlm_zoom_tools.yaml",
    arms={"tools": [], "no_tool": ["sim.kwargs.env_kwargs.offer_zoom=false"]},  # arm -> its overrides
    smoke=[
        "sim.num_envs=4",
        "sim.eval_num_envs=4",
        "warm_start.num_episodes=4",
        "warm_start.steps=2",
        "warm_start.warmup_steps=0",
        "warm_start.batch_size=4",
        "algorithm.group_size=2",
        "algorithm.minibatch_size=4",
        "trainer.iterations=2",
        "trainer.eval_episodes=4",
        "trainer.checkpoint_every=2",
        "trainer.eval_every=2",
    ],
    out="runs/bench_vlm_tools",
)

if __name__ == "__main__":
    main(BENCH)
