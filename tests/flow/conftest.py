"""Tiny random-weight flow models shared by the mmrl.flow tests."""

import pytest
import torch
from torch import nn

from mmrl.flow import FlowNoiseHead


class TinyFlowNet(nn.Module):
    """MLP velocity model on an element shape E: reads [flatten(x), t], returns (v, std).

    std comes from a FlowNoiseHead on the hidden state (read only by method "noise")."""

    def __init__(self, elem_shape=(4, 3), hidden=32, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.elem_shape = tuple(elem_shape)
        d = 1
        for s in self.elem_shape:
            d *= s
        self.body = nn.Sequential(nn.Linear(d + 1, hidden), nn.Tanh())
        self.v_head = nn.Linear(hidden, d)
        self.noise_head = FlowNoiseHead(hidden, d, min_std=0.05, max_std=0.5)
        nn.init.normal_(self.noise_head.mlp[-1].weight, std=0.5)  # non-constant std
        self.calls = 0

    def forward(self, x, t):
        self.calls += 1
        n = x.shape[0]
        h = self.body(torch.cat([x.reshape(n, -1), t.reshape(n, 1).to(x.dtype)], dim=1))
        v = self.v_head(h).reshape(n, *self.elem_shape)
        std = self.noise_head(h).reshape(n, *self.elem_shape)
        return v, std


@pytest.fixture
def tiny_net():
    return TinyFlowNet()
