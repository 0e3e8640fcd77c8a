"""The memory plan's arithmetic (`mmrl.planning.memory`) against hand-computed bytes."""

import dataclasses

import pytest

from mmrl.planning.memory import (
    GIB,
    KVCache,
    Stack,
    Workload,
    as_json,
    block_activation_elements,
    make_plan,
    parse_bytes,
    refusal,
    render,
    terms,
)

# a small example: 1000 parameters, 100 trainable, fp32, one stack of 2 layers
STACK = Stack("lm", layers=2, hidden=8, kv_dim=4, ffn=16, tokens=10)
SMALL = Workload(
    model="hand",
    params=1000,
    trainable=100,
    weight_bytes=4,
    act_bytes=4,
    stacks=(STACK,),
    train_rows=3,
    logits=(5, 50),
    kv_cache=KVCache(rows=2, seq=7, layers=2, kv_heads=1, head_dim=4),
    minibatch=3,
)


def test_parse_bytes():
    assert parse_bytes("80GiB") == 80 * 1024**3
    assert parse_bytes("24GB") == 24 * 1000**3
    assert parse_bytes("512MiB") == 512 * 1024**2
    assert parse_bytes("1.5G") == 1_500_000_000
    assert parse_bytes(1234) == 1234
    with pytest.raises(ValueError, match="80GiB"):
        parse_bytes("lots")


def test_terms_by_hand():
    t = terms(SMALL, device_memory=10**9)
    assert t["weights"] == 1000 * 4
    assert t["gradients"] == 100 * 4
    assert t["optimizer"] == 100 * 2 * 4  # Adam's two moments in the parameter's dtype
    assert t["reference"] == 0
    assert t["rollout"] == 2 * 7 * 2 * 1 * 4 * 2 * 4  # rows seq layers kv_heads head_dim K/V bytes = 896
    # per token: 6 h + 2 kv + 4 ffn = 48 + 8 + 64 = 120 elements; 3 rows x 10 tokens x 2 layers x 4 bytes
    block = 3 * 10 * 120
    assert block_activation_elements(STACK, 3) == block
    logits = 3 * 5 * 50 * 4 * 3  # rows x tokens x vocab x fp32 x (logits, log-softmax, gradient)
    assert t["activations"] == 2 * block * 4 + logits


def test_checkpointing_keeps_layer_inputs_and_one_block():
    t = terms(dataclasses.replace(SMALL, checkpointing=True, logits=None), 10**9)
    assert t["activations"] == (2 * 3 * 10 * 8 + 3 * 10 * 120) * 4


def test_cross_attention_and_plain_mlp():
    s = Stack("dit", layers=1, hidden=8, kv_dim=8, ffn=16, tokens=10, gated=False, context=6)
    # per token 6*8 + 2*8 + 2*16 + 4*8 = 128; plus the context's k and v: rows x 6 x 2 x 8
    assert block_activation_elements(s, 2) == 2 * 10 * 128 + 2 * 6 * 2 * 8


def test_frozen_stack_keeps_nothing():
    frozen = dataclasses.replace(SMALL, stacks=(dataclasses.replace(STACK, trains=False),), logits=None)
    assert terms(frozen, 10**9)["activations"] == 0


def test_sharding():
    fsdp = dataclasses.replace(SMALL, backend="fsdp", world=4)
    t = terms(fsdp, 10**9)
    assert (t["weights"], t["gradients"], t["optimizer"]) == (1000, 100, 200)
    for stage, expect in ((1, (4000, 400, 200)), (2, (4000, 100, 200)), (3, (1000, 100, 200))):
        ds = dataclasses.replace(SMALL, backend="deepspeed", zero_stage=stage, world=4)
        t = terms(ds, 10**9)
        assert (t["weights"], t["gradients"], t["optimizer"]) == expect, stage
    # DeepSpeed with half weights: fp32 moments and master copy, 12 bytes per trainable parameter
    half = dataclasses.replace(SMALL, backend="deepspeed", zero_stage=0, weight_bytes=2)
    assert terms(half, 10**9)["optimizer"] == 100 * 12
    offload = dataclasses.replace(SMALL, backend="deepspeed", zero_stage=1, offload_optimizer=True)
    assert terms(offload, 10**9)["optimizer"] == 0


def test_vllm_reserves_its_share():
    w = dataclasses.replace(SMALL, kv_cache=None, engine_fraction=0.5)
    assert terms(w, 1000)["rollout"] == 500


def test_plan_fits_and_knobs():
    total = sum(terms(SMALL, 10**9).values())
    assert make_plan(SMALL, total).fits
    tight = make_plan(dataclasses.replace(SMALL, keys={"minibatch": "algorithm.minibatch_size"}), total - 1)
    assert not tight.fits and tight.knobs
    assert [k.saves for k in tight.knobs] == sorted((k.saves for k in tight.knobs), reverse=True)
    assert any(k.change.startswith("algorithm.minibatch_size=") for k in tight.knobs)
    assert tight.largest == "activations"
    line = refusal(tight)
    assert "\n" not in line and "largest term activations" in line
    assert "fits no" in render(tight)
    assert as_json(tight)["fits"] is False and as_json(tight)["total"] == total


def test_gib_table():
    big = dataclasses.replace(SMALL, params=GIB // 4)  # 1 GiB of fp32 weights
    assert "weights               1.00" in render(make_plan(big, 2 * GIB))


def test_half_frozen_weights_with_float32_trained_ones():
    """A pipeline loaded in bf16 keeps its trained weights (LoRA) in float32: the frozen part of the
    weights at 2 bytes, the trainable part, its gradients, its Adam moments and its copies at 4; the
    module's buffers as they are, never sharded."""
    w = dataclasses.replace(SMALL, weight_bytes=2, act_bytes=2, train_bytes=4, copies=100, buffer_bytes=100)
    w = dataclasses.replace(w, logits=None)
    t = terms(w, 10**9)
    assert t["weights"] == 900 * 2 + 100 * 4 + 100
    assert (t["gradients"], t["optimizer"], t["reference"]) == (100 * 4, 100 * 2 * 4, 100 * 4)
    fsdp = terms(dataclasses.replace(w, backend="fsdp", world=4), 10**9)
    assert fsdp["weights"] == (900 * 2 + 100 * 4) // 4 + 100


def test_half_weights_knob():
    """A workload whose weights are fp32 and that names the dtype key is offered the half pipeline (the
    frozen weights and encoders at 2 bytes, bf16 activations, the trained weights still fp32)."""
    w = dataclasses.replace(SMALL, outside=1000, keys={"half_weights": "policy.dtype=bfloat16"})
    knobs = {k.change: k.saves for k in make_plan(w, 1).knobs}
    t = terms(w, 10**9)
    half = terms(dataclasses.replace(w, weight_bytes=2, outside_bytes=2, act_bytes=2, train_bytes=4), 10**9)
    assert knobs["policy.dtype=bfloat16"] == sum(t.values()) - sum(half.values())
    assert half["gradients"] == t["gradients"] and half["frozen encoders"] == t["frozen encoders"] // 2
    assert "policy.dtype=bfloat16" not in {k.change for k in make_plan(dataclasses.replace(SMALL), 1).knobs}
