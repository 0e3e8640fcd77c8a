"""Real model sizes (issue 71): random-weight checkpoints of published architectures load through the
real loading code; the VLM and flow-VLA real-size configs are planned and fit one 80 GB GPU; the plan's
counts and dtypes are those of the models that run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from mmrl.planning import architectures as A
from mmrl.planning.estimate import plan_experiment, workload
from mmrl.planning.memory import GIB, parse_bytes

ROOT = Path(__file__).resolve().parents[2]
QWEN_3B = "Qwen/Qwen2.5-VL-3B-Instruct"
SMOLVLM2 = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"


def small(name: str, text: dict, vision: dict) -> A.Arch:
    """A published `Arch` with small widths and depths (same classes, fields and writer path)."""
    arch = A.ARCHITECTURES[name]
    fields = dict(arch.fields)
    fields["text_config"] = {**fields["text_config"], **text}
    fields["vision_config"] = {**fields["vision_config"], **vision}
    return dataclasses.replace(arch, fields=fields)


TINY_QWEN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, vocab_size=1024)  # fmt: skip
TINY_QWEN_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                        fullatt_block_indexes=[1])  # fmt: skip


def test_random_checkpoint_loads_through_the_policy(tmp_path):
    """The writer's folder loads with the VLM policy's own from_pretrained, in the dtype written, and
    generates; with the widths and depths of the architecture it was given."""
    from mmrl.planning.random_weights import write_random_checkpoint
    from mmrl.policies.vlm import VLMConfig, VLMPolicy

    arch = small(QWEN_3B, TINY_QWEN, TINY_QWEN_VISION)
    folder = write_random_checkpoint(arch, tmp_path / "qwen", dtype=torch.bfloat16)
    policy = VLMPolicy(VLMConfig(model=str(folder), dtype="bfloat16", max_new_tokens=3), action_dim=0)
    text = policy.model.config.text_config
    assert (text.hidden_size, text.num_hidden_layers, text.vocab_size) == (64, 2, 1024)
    assert {p.dtype for p in policy.model.parameters()} == {torch.bfloat16}
    image = torch.zeros(1, 56, 56, 3, dtype=torch.uint8)  # 4 x 4 patches of 14 px, merged 2 x 2: 4 tokens
    inputs = policy.processor(
        text=policy.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
            add_generation_prompt=True,
        ),
        images=[image[0].numpy()],
        return_tensors="pt",
    )
    assert (inputs["input_ids"] == policy.model.config.image_token_id).sum() == 4
    out = policy.model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 3
    again = write_random_checkpoint(arch, tmp_path / "qwen")  # a finished folder is kept as it is
    assert again == folder and not (tmp_path / "qwen.partial").exists()


def test_output_head_reads_a_contiguous_input():
    """The VLM policy hands its output head contiguous hidden states: transformers slices the rows it
    keeps logits for, and torch's CPU bf16 linear on that strided slice is ~400x slower."""
    from mmrl.policies.vlm import VLMConfig, VLMPolicy

    policy = VLMPolicy(VLMConfig(model="tiny-qwen2.5-vl", max_new_tokens=2), action_dim=0)
    seen: list[bool] = []
    policy.model.get_output_embeddings().register_forward_pre_hook(lambda _m, a: seen.append(a[0].is_contiguous()))
    ids = torch.randint(10, 100, (3, 7))
    policy.model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=2)
    assert seen == [True]


def test_lora_adapters_are_fp32_over_bf16_and_priced_so():
    """peft keeps LoRA adapters in fp32 over a bf16 model: the plan prices their gradients and Adam
    moments at 4 bytes (it priced them at 2 and fell short of the measured peak)."""
    from mmrl.experiment import load_experiment
    from mmrl.policies.vlm import VLMConfig, VLMPolicy

    policy = VLMPolicy(VLMConfig(model="tiny-qwen2.5-vl", dtype="bfloat16", finetune="lora"), action_dim=0)
    assert {p.dtype for p in policy.parameters() if p.requires_grad} == {torch.float32}
    cfg = load_experiment(ROOT / "configs/qwen25vl_3b_geo3k_grpo_lora.yaml", [])
    plan = plan_experiment(cfg, 80 * GIB, world=1)
    w = plan.workload
    assert plan.terms["gradients"] == w.trainable * 4
    assert plan.terms["optimizer"] == w.trainable * 8
    assert plan.terms["weights"] == (w.params - w.trainable) * 2 + w.trainable * 4


def test_flow_vla_on_a_vlm_is_counted_as_built(tmp_path):
    """The plan of a flow VLA on a transformers backbone counts what the trainer builds: the frozen
    VLM as a frozen encoder, the expert and heads as the trained policy."""
    from mmrl.experiment import load_experiment
    from mmrl.planning.random_weights import write_random_checkpoint
    from mmrl.policies.flow_vla import FlowVLAPolicy
    from mmrl.registry import SIMULATORS

    arch = small(SMOLVLM2, dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2), dict(hidden_size=32, intermediate_size=64,
                                num_hidden_layers=1, num_attention_heads=2, image_size=64))  # fmt: skip
    folder = write_random_checkpoint(arch, tmp_path / "smolvlm2", dtype=torch.float32)
    cfg = load_experiment(
        ROOT / "configs/libero_spatial_flow_vla_smolvla_size.yaml",
        ["sim.type=reach", "sim.eval_tasks=null", "sim.kwargs={image_size: 32}", f"policy.backbone={folder}",
         "policy.backbone_dtype=float32", "policy.expert_dim=32", "policy.expert_layers=2", "run.device=cpu"],
    )  # fmt: skip
    w = workload(cfg, 1)
    sim = SIMULATORS.build("reach", num_envs=1, image_size=32)
    try:
        policy = FlowVLAPolicy(FlowVLAPolicy.configure(cfg.policy, sim), sim.action_dim, sim.state_dim)
    finally:
        sim.close()
    assert w.outside == A.count(policy.backbone)
    assert w.params == A.count(policy) - A.count(policy.backbone)
    assert w.trainable == A.count(policy, trainable_only=True)


REAL_SIZE_CONFIGS = {
    "qwen25vl_3b_geo3k_grpo_lora.yaml": 1,
    "qwen25vl_7b_geo3k_grpo_lora.yaml": 1,
    "qwen25vl_3b_geo3k_grpo_full.yaml": 8,
    "qwen25vl_7b_geo3k_grpo_full.yaml": 8,
    "libero_spatial_flow_vla_smolvla_size.yaml": 1,
}


@pytest.mark.parametrize("name", sorted(REAL_SIZE_CONFIGS))
def test_real_size_config_fits_one_80gb_gpu(name):
    """Each real-size recipe fits the GPUs its header names (80 GB each), planned before any weight exists."""
    from mmrl.experiment import load_experiment

    cfg = load_experiment(ROOT / "configs" / name, [])
    plan = plan_experiment(cfg, parse_bytes("80GiB"), world=REAL_SIZE_CONFIGS[name])
    assert plan.fits, f"{name}: {plan.total / GIB:.1f} GiB per device"
    assert plan.total > 4 * GIB  # a real size, not a tiny model
