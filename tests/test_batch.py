"""Batch helpers and the text <-> tensor encoding that lets instructions travel in a Batch."""

import pytest
import torch

from mmrl.batch import Batch, random_indices
from mmrl.policies.base import decode_text, encode_text


def test_flatten_index_and_minibatches_cover_every_row_once():
    b = Batch(x=torch.arange(12).reshape(3, 4), y=torch.arange(24).reshape(3, 4, 2))
    flat = b.flatten()
    assert flat["x"].tolist() == list(range(12)) and flat["y"].shape == (12, 2)
    seen = torch.cat([mb["x"] for mb in flat.minibatches(5, torch.Generator().manual_seed(0))])
    assert sorted(seen.tolist()) == list(range(12))
    assert [mb.size for mb in flat.minibatches(5)] == [5, 5, 2]
    stacked = Batch.stack([flat.index(slice(0, 2)), flat.index(slice(2, 4))])
    assert stacked["x"].tolist() == [[0, 1], [2, 3]]


def test_text_round_trip_and_overflow_error():
    texts = ["reach the red target", "", "déplace le cube bleu"]
    data = encode_text(texts, width=32)
    assert data.dtype == torch.uint8 and data.shape == (3, 32)
    assert decode_text(data) == texts
    assert decode_text(torch.stack([data, data])) == texts * 2  # any leading shape
    with pytest.raises(ValueError, match="exceeds the 8-byte text field"):
        encode_text(["a long instruction"], width=8)


def test_row_indices_are_drawn_on_the_generators_device(monkeypatch):
    """Issue 30's GPU run: the run's generator lives on the run's device, and CUDA refuses it for a
    draw on the CPU, which failed every warm start and PPO shuffle on the GPU. No CUDA here: the
    draws are watched, and each must ask for its generator's device."""
    asked = []
    for name in ("randperm", "randint"):
        real = getattr(torch, name)

        def spy(*args, real=real, **kwargs):
            asked.append((kwargs["generator"].device, kwargs.get("device")))  # None: the CPU
            return real(*args, **kwargs)

        monkeypatch.setattr(torch, name, spy)
    gen = torch.Generator().manual_seed(0)
    perm = random_indices(12, generator=gen)
    draws = random_indices(12, 30, torch.Generator().manual_seed(0))
    list(Batch(x=torch.arange(12)).minibatches(5, gen))
    assert len(asked) == 3 and all(g == d for g, d in asked)
    assert sorted(perm.tolist()) == list(range(12)) and draws.shape == (30,) and draws.max() < 12
    assert perm.device.type == "cpu" and draws.dtype == torch.long


class CudaGeneratorStandIn:
    """What a run on a GPU hands the draws: a generator whose ``device`` is CUDA. The spies below
    record the device each draw asks for, then draw on the CPU generator inside."""

    device = torch.device("cuda", 0)

    def __init__(self, seed: int):
        self.inner = torch.Generator().manual_seed(seed)


def test_index_draws_ask_for_a_cuda_generators_device(monkeypatch):
    """The failure the H200 found, on a machine without CUDA: a draw that does not pass its
    generator's device (or forces the CPU) fails here, as it failed every warm start and PPO
    shuffle there. (The test above passes such a draw: its generator is on the CPU too.)"""
    asked = []
    for name in ("randperm", "randint"):
        real = getattr(torch, name)

        def spy(*args, real=real, **kwargs):
            gen = kwargs["generator"]
            asked.append(torch.device(kwargs.get("device") or "cpu"))
            kwargs.update(generator=gen.inner if isinstance(gen, CudaGeneratorStandIn) else gen, device="cpu")
            return real(*args, **kwargs)

        monkeypatch.setattr(torch, name, spy)
    gen = CudaGeneratorStandIn(0)
    perm = random_indices(12, generator=gen)
    draws = random_indices(12, 30, gen)
    rows = torch.cat([mb["x"] for mb in Batch(x=torch.arange(12)).minibatches(5, gen)])
    assert asked == [CudaGeneratorStandIn.device] * 3, asked
    assert (
        sorted(perm.tolist()) == list(range(12)) and draws.shape == (30,) and sorted(rows.tolist()) == list(range(12))
    )
    assert perm.device.type == "cpu"  # row indices come back on the CPU, which indexes either device
