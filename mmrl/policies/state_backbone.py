"""A state-only encoder for simulators without images (gymnasium control tasks, state-mode robots).

The policy's prefix is built from the (normalised) state vector alone: an MLP turns it into
``tokens`` prefix tokens of width ``dim``, so the action expert attends to it exactly as it attends
to an image-text prefix. No image is read, resized or stored: on a state-only task the image
encoder (and the all-zero images it would see) cost nothing.
"""

from __future__ import annotations

import torch
from torch import nn


class StateBackbone(nn.Module):
    """state ``[B, D]`` -> prefix ``(tokens [B, tokens, dim], mask [B, tokens])``."""

    uses_images = False

    def __init__(self, state_dim: int, dim: int = 64, hidden: int = 64, tokens: int = 1):
        super().__init__()
        if not state_dim:
            raise ValueError(
                "the state backbone needs a simulator with a state vector (state_dim > 0); "
                "this one has none: use policy.backbone=tiny (images)"
            )
        self.out_dim, self.tokens = dim, tokens
        self.net = nn.Sequential(
            nn.Linear(state_dim, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, dim * tokens),
        )
        self.norm = nn.LayerNorm(dim)

    def forward(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.net(state.float()).view(state.shape[0], self.tokens, self.out_dim)
        return self.norm(h), torch.ones(state.shape[0], self.tokens, dtype=torch.bool, device=state.device)


class HashedText(nn.Module):
    """Instructions -> ``[B, dim]``: the mean of hashed word embeddings (`hash_tokenize`: any vocabulary,
    no tokenizer), what a state-only policy needs to tell its tasks apart."""

    def __init__(self, dim: int, buckets: int = 4096, max_words: int = 16):
        super().__init__()
        self.buckets, self.max_words = buckets, max_words
        self.words = nn.EmbeddingBag(buckets, dim, mode="mean", padding_idx=0)

    def forward(self, instructions: list[str]) -> torch.Tensor:
        from mmrl.policies.tiny_backbone import hash_tokenize

        ids = hash_tokenize(instructions, self.buckets, self.max_words).to(self.words.weight.device)
        return self.words(ids)


class StateTextBackbone(nn.Module):
    """``backbone: state_text``: the state MLP's tokens (`StateBackbone`) plus one token of the
    instruction (`HashedText`), for state-only simulators whose episodes run different tasks
    (Meta-World MT10 / MT50 from state): the action expert attends to both."""

    uses_images = False
    uses_instructions = True

    def __init__(self, state_dim: int, dim: int = 64, hidden: int = 64, tokens: int = 1):
        super().__init__()
        self.state = StateBackbone(state_dim, dim, hidden, tokens)
        self.out_dim, self.tokens = dim, tokens + 1
        self.text = HashedText(dim)
        self.text_norm = nn.LayerNorm(dim)

    def forward(self, state: torch.Tensor, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, mask = self.state(state)
        text = self.text_norm(self.text(instructions))[:, None]
        return torch.cat([tokens, text], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
