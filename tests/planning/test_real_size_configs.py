"""The real-size generator recipes (issue 71) are in the memory-saving mode their users train in (bf16
pipeline, gradient checkpointing, LoRA with the adapter-off reference) and their memory plans fit one
80 GiB GPU; ``mmrl train`` refuses one of them on a device too small, in one line, before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
REAL_SIZE = ["sd35_medium_nft.yaml", "flux1_dev_nft.yaml", "wan21_t2v_1.3b_nft.yaml", "wan22_ti2v_5b_nft.yaml"]

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(autouse=True)
def _diffusers():
    pytest.importorskip("diffusers", reason="the diffusers family needs mmrl[diffusion]")


@pytest.mark.parametrize("name", REAL_SIZE)
def test_real_size_recipe_fits_one_80gib_gpu(name, capsys):
    from mmrl.experiment import load_experiment

    cfg = load_experiment(ROOT / "configs" / name)
    p = cfg.policy
    assert (p.dtype, p.gradient_checkpointing, p.finetune, cfg.trainer.engine.precision) == (
        "bfloat16", True, "lora", "bf16",
    )  # fmt: skip
    assert not p.kl_reference or p.finetune == "lora"  # a reference, if any, is the adapter switched off
    code = main(["estimate", str(ROOT / "configs" / name), "--gpu-memory", "80GiB", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["fits"] and plan["total"] <= 80 * 1024**3
    assert plan["backend"] == "torch" and plan["world_size"] == 1  # one GPU, no sharding
    assert not any("fp32 as loaded" in n for n in plan["notes"])


def test_train_refuses_a_real_size_recipe_on_a_small_device(tmp_path, capsys):
    """The SD3.5 recipe needs about 21 GiB: a 16 GiB budget is refused in one line naming the largest
    term and a fix, before the run folder, the CUDA check or any download."""
    out = tmp_path / "runs"
    code = main(["train", str(ROOT / "configs/sd35_medium_nft.yaml"), f"run.output_dir={out}", "--gpu-memory", "16GiB"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: the memory plan does not fit") and "against 16.00 GiB" in err[0]
    assert "largest term" in err[0] and "try " in err[0]
    assert not out.exists()


def test_the_wan_world_model_recipe_fits_one_80gib_gpu(capsys):
    """The Wan 2.2 TI2V-5B world model is planned from its published architecture (no download): LoRA,
    bf16 pipeline, checkpointing; rows of its warm start (it has no RL), frames of 3 x 64 tokens."""
    from mmrl.experiment import load_experiment

    path = ROOT / "configs" / "wan22_ti2v_5b_world_model.yaml"
    p = load_experiment(path).policy
    assert (p.type, p.dtype, p.gradient_checkpointing, p.finetune) == ("wan_world_model", "bfloat16", True, "lora")
    code = main(["estimate", str(path), "--gpu-memory", "80GiB", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["fits"] and plan["total"] <= 80 * 1024**3
    assert plan["terms"]["rollout"] == 0 and plan["terms"]["activations"] > 0
    assert any("192 latent tokens per row" in n for n in plan["notes"])
    full = main(["estimate", str(path), "policy.finetune=full", "--gpu-memory", "80GiB", "--json"])
    assert full == 1 and "policy.finetune=lora" in capsys.readouterr().out  # the knob that makes it fit
