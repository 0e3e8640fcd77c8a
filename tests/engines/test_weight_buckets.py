"""How a weight sync to vLLM is cut into buckets (`layer_buckets`): lazily, whole layers each, a
bucket closed once it holds the byte budget (vLLM packs a layer's q / k / v into one tensor, so a
layer never straddles two reloads)."""

import torch

from mmrl.engines.vllm_engine import layer_buckets, layer_of


def test_buckets_keep_layers_whole_and_close_at_the_budget():
    names = [
        "model.layers.0.q_proj.weight",
        "model.layers.0.k_proj.weight",
        "model.layers.1.q_proj.weight",
        "model.layers.1.k_proj.weight",
        "model.norm.weight",
        "lm_head.weight",
    ]
    assert [layer_of(n) for n in names] == [
        "model.layers.0",
        "model.layers.0",
        "model.layers.1",
        "model.layers.1",
        "model.norm",
        "lm_head",
    ]
    pulled = []

    def stream():
        for n in names:
            pulled.append(n)
            yield n, torch.zeros(4)  # 16 bytes each

    buckets = layer_buckets(stream(), bucket_bytes=20)
    first = next(buckets)
    assert [n for n, _ in first] == names[:2] and pulled == names[:3]  # lazy: one tensor past the bucket
    assert [[n for n, _ in b] for b in buckets] == [names[2:4], names[4:]]  # norm + head: 32 bytes
    assert [len(b) for b in layer_buckets(((n, torch.zeros(4)) for n in names), bucket_bytes=1 << 20)] == [6]
