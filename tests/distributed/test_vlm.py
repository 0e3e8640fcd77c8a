"""The VLM GRPO config with LoRA on 2 CPU ranks (issue 29): FSDP2, whose units are the blocks the
transformers model names (`framework_units`: the tiny SmolVLM's decoder layers and vision
attention), trains what DDP trains. Both sample each rank's answers with a generator of the rank's
own, so a 2-rank run equals the one-process run in distribution, not bit for bit (the README says
so); this compares the two engines on identical samples."""

from __future__ import annotations

import pytest

from tests.distributed.launch import ROOT, TOL, max_diff, run, torchrun, weights

pytestmark = pytest.mark.slow

SHORT_VLM = [
    "trainer.iterations=2",
    "trainer.eval_every=0",
    "trainer.eval_episodes=4",
    "trainer.checkpoint_every=1",
    "sim.num_envs=8",  # a group of 8 per rank
    "sim.eval_num_envs=4",
    "warm_start.steps=5",
    "warm_start.num_episodes=16",
    "algorithm.minibatch_size=8",
    "policy.finetune=lora",
    f"reward.type={ROOT / 'tests' / 'distributed' / 'letters.py'}:letters",
    "reward.success_threshold=2.0",  # never: the short-answer threshold means nothing here
]


def test_vlm_lora_fsdp_on_two_ranks_trains_what_ddp_trains(tmp_path):
    args = ["-m", "mmrl", "train", str(ROOT / "configs" / "vlm_quickstart.yaml"), *SHORT_VLM]
    args.append(f"run.output_dir={tmp_path}")
    for name, backend in (("ddp", "torch"), ("fsdp", "fsdp")):
        run(
            torchrun(
                "--standalone", "--nproc_per_node=2", *args, f"run.name={name}", f"trainer.engine.backend={backend}"
            )
        )
    ddp, fsdp = weights(tmp_path, "ddp", 2), weights(tmp_path, "fsdp", 2)  # FSDP2 writes the frozen base too
    diff = max_diff(ddp, {k: fsdp[k] for k in ddp})
    moved = max_diff(ddp, {k: v for k, v in weights(tmp_path, "ddp", 1).items() if k in ddp})
    assert diff < TOL, f"VLM LoRA GRPO, 2 ranks: FSDP2 vs DDP max parameter difference {diff:.3g}"
    assert moved > 1000 * max(diff, 1e-9)
