"""A small built-in action-conditioned video model for the embedded world model (CPU-fast).

It predicts the frame a robot sees after executing an action chunk, given the frames it saw before,
the instruction and the chunk: a flow-matching velocity model ``v(x_t, t | past frames, instruction,
chunk, state)`` in pixel space, and a proprioceptive head that predicts the next state.

- **Sample**: the change of the frame, ``x0 = (next - current) / 2`` in ``[-1, 1]`` (frames in
  ``[-1, 1]``): what does not move is exactly zero, so the model spends its capacity on what the
  action changes (the gripper, a pushed object). `next_frame` turns a sample back into a frame.
- **Inputs** of the U-Net: the noisy sample, the ``context`` past frames (newest last) and two
  coordinate channels (CoordConv: where a pixel is, so a position given as numbers can be drawn),
  stacked as channels.
- **Conditioning**: the flow time, the instruction (hashed word embeddings mixed by one transformer
  layer, as `mmrl.policies.tiny_generator.TinyTextToImage`; mean-pooled into the FiLM vector and
  cross-attended at the coarse level), the action chunk, the current state and the predicted next
  state (MLPs into the FiLM vector of every residual block).
- **State head**: ``next_state = state + MLP(state, chunk)``, trained by regression. A world model
  whose policy reads proprioception must produce it; the frame model is conditioned on it, so the
  gripper is drawn where the state head puts it.

Same blocks as the built-in image generator (`ResBlock`, `timestep_embedding`, `hash_tokenize`).
The U-Net works on ``patch x patch`` pixel blocks (pixel unshuffle in, pixel shuffle out: a 32 px
frame is a 16 x 16 map of 2 x 2 blocks) at two resolutions, the coarse one at half that: the
imagination of one step of 128 environments costs about 0.1 s on two CPU cores, where full-resolution
convolutions took 0.6 s.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from mmrl.policies.flow_vla import timestep_embedding
from mmrl.policies.tiny_generator import ResBlock, add_prompt_encoder, encode_prompts, zero_output


def mlp(inp: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inp, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, out)
    )


def coordinates(h: int, w: int, device) -> torch.Tensor:
    """``[2, h, w]``: each pixel's column and row centre in ``[-1, 1]`` (x right, y down)."""
    ys = (torch.arange(h, device=device, dtype=torch.float32) + 0.5) / h * 2 - 1
    xs = (torch.arange(w, device=device, dtype=torch.float32) + 0.5) / w * 2 - 1
    return torch.stack([xs[None, :].expand(h, w), ys[:, None].expand(h, w)])


class TinyWorldModelNet(nn.Module):
    """``v(x_t, t, cond)`` of the next frame's change and ``next_state(state, chunk)``."""

    def __init__(
        self,
        image_size: int = 32,
        action_dim: int = 2,
        chunk_size: int = 4,
        state_dim: int = 0,
        context: int = 1,
        patch: int = 2,
        ch: int = 16,
        mid_blocks: int = 2,
        keypoints: int = 2,
        dim: int = 64,
        buckets: int = 4096,
        max_words: int = 16,
    ):
        super().__init__()
        if image_size % 2:
            raise ValueError(f"image_size must be even, got {image_size}")
        if context < 1:
            raise ValueError(f"context must be >= 1 past frame, got {context}")
        if patch < 1 or image_size % (2 * patch):
            raise ValueError(f"image_size ({image_size}) must be a multiple of 2 * patch ({patch})")
        self.patch = patch
        self.image_size, self.action_dim, self.chunk_size = image_size, action_dim, chunk_size
        self.state_dim, self.context, self.dim, self.buckets, self.max_words = (
            state_dim,
            context,
            dim,
            buckets,
            max_words,
        )
        add_prompt_encoder(self, dim, buckets, max_words)
        self.time = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.action = mlp(chunk_size * action_dim, dim, dim)
        if state_dim:
            self.state_in = mlp(2 * state_dim, dim, dim)  # current and predicted next state
            self.state_head = mlp(state_dim + chunk_size * action_dim, 2 * dim, state_dim)
            last = cast(nn.Linear, self.state_head[-1])
            nn.init.zeros_(last.weight)
            nn.init.zeros_(last.bias)
        self.keypoints = keypoints if state_dim else 0
        if self.keypoints:  # learned image points of the current and the predicted next state
            self.keypoint = nn.Linear(state_dim, 2 * self.keypoints)
        maps = 6 * self.keypoints  # per point and state: x and y relative to the point, a heat map
        self.inp = nn.Conv2d((3 + 3 * context + 2 + maps) * patch * patch, ch, 3, padding=1)
        self.block0 = ResBlock(ch, dim)
        self.down = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1)
        self.mid = nn.ModuleList([ResBlock(2 * ch, dim) for _ in range(mid_blocks)])
        self.q, self.kv = nn.Linear(2 * ch, dim), nn.Linear(dim, 2 * dim)
        self.attn_out = nn.Linear(dim, 2 * ch)
        self.up = nn.Conv2d(2 * ch, ch, 3, padding=1)
        self.merge = nn.Conv2d(2 * ch, ch, 1)
        self.block1 = ResBlock(ch, dim)
        self.out = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, 3 * patch * patch, 3, padding=1))
        zero_output(self.out)  # the untrained model predicts that nothing moves

    @property
    def device(self) -> torch.device:
        return self.inp.weight.device

    @property
    def sample_shape(self) -> tuple[int, int, int]:
        return (3, self.image_size, self.image_size)

    def encode(self, instructions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Instructions -> (word tokens [B, L+1, D], mask [B, L+1]); token 0 is the null token."""
        return encode_prompts(self, instructions)

    def next_state(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Predicted state ``[B, D]`` after executing ``actions [B, C, A]`` from ``state [B, D]``."""
        return state + self.state_head(torch.cat([state, actions.flatten(1)], 1))

    def condition(
        self,
        instructions: list[str],
        actions: torch.Tensor,
        state: torch.Tensor | None = None,
        next_state: torch.Tensor | None = None,
    ) -> tuple:
        """What a prediction is conditioned on, computed once per decision (every denoising step
        reuses it): (tokens, mask, the FiLM vector [B, D] without the flow time, the keypoint maps
        [B, 6 K, H, W] or None)."""
        tok, mask = self.encode(instructions)
        m = mask.unsqueeze(-1).to(tok.dtype)
        vec = (tok * m).sum(1) / m.sum(1) + self.action(actions.flatten(1))
        if self.state_dim:
            if state is None or next_state is None:
                raise ValueError(f"this world model reads a {self.state_dim}-dim state: pass state and next_state")
            vec = vec + self.state_in(torch.cat([state, next_state], 1))
        maps = None
        if self.keypoints:
            assert state is not None and next_state is not None
            maps = torch.cat([self.keypoint_maps(state), self.keypoint_maps(next_state)], 1)
        return tok, mask, vec, maps

    def keypoint_maps(self, state: torch.Tensor) -> torch.Tensor:
        """``[B, 3 K, H, W]``: for each learned point ``p = W state + b`` (where the state shows in
        the image: the gripper, once learned), each pixel's ``x - p_x``, ``y - p_y`` and a Gaussian
        bump of width 1.5 pixels around it. A frame model told the state only through its FiLM
        vector drew the gripper blurred where it had been (the state is exact, the frame quantised
        to pixels); with these maps it can draw it where the state puts it."""
        b = state.shape[0]
        h = w = self.image_size
        pts = self.keypoint(state).view(b, self.keypoints, 2, 1, 1)
        rel = coordinates(h, w, state.device)[None, None] - pts  # [B, K, 2, H, W]
        sigma = 1.5 * 2.0 / h
        heat = torch.exp(-rel.pow(2).sum(2, keepdim=True) / (2 * sigma * sigma))
        return torch.cat([rel, heat], 2).flatten(1, 2)

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor, cond) -> torch.Tensor:
        """Velocity ``[B, 3, H, W]`` of the change ``x`` at flow time ``t [B]``, given ``context``
        past frames ``[B, K, 3, H, W]`` in ``[-1, 1]`` (newest last) and `condition`'s ``cond``."""
        tok, mask, vec, maps = cond
        b, _, h, w = x.shape
        c = vec + self.time(timestep_embedding(t, self.dim))
        grid = coordinates(h, w, x.device).expand(b, -1, -1, -1)
        planes = [x, context.flatten(1, 2), grid, *([maps] if maps is not None else [])]
        inp = F.pixel_unshuffle(torch.cat(planes, 1), self.patch)
        inp = inp.contiguous(memory_format=torch.channels_last)  # 2x faster convolutions on CPU
        hid = self.block0(self.inp(inp), c)
        skip = hid
        hid = self.down(hid)
        for i, block in enumerate(self.mid):
            hid = block(hid, c)
            if i == 0:  # the instruction, attended to at the coarse level (which disc is the goal)
                bb, ch, hh, ww = hid.shape
                q = self.q(hid.flatten(2).transpose(1, 2))
                k, v = self.kv(tok).chunk(2, -1)
                att = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], attn_mask=mask[:, None, None])[
                    :, 0
                ]
                hid = hid + self.attn_out(att).transpose(1, 2).reshape(bb, ch, hh, ww)
        hid = self.up(F.interpolate(hid, scale_factor=2, mode="nearest"))
        hid = self.block1(self.merge(torch.cat([hid, skip], 1)), c)
        return F.pixel_shuffle(self.out(hid), self.patch)


def fit_keypoint(
    frames: torch.Tensor, next_frames: torch.Tensor, state: torch.Tensor, next_state: torch.Tensor, threshold: int = 24
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The least-squares linear map ``p = W s + b`` from a state to where its change shows in the
    image: for every transition whose frame changed, the centroid (in `coordinates`) of the pixels
    that changed by more than ``threshold`` grey levels in some channel, against the mean of the
    state before and after. ``(W [2, D], b [2])``, or None with fewer changed frames than unknowns.
    It starts the learned keypoints where the data says the state is drawn (a keypoint started at
    random sits far from the gripper, where its 1.5-pixel bump gives no gradient: after 1500 steps
    its weights were still their random ones)."""
    diff = (next_frames.float() - frames.float()).abs().amax(-1) > threshold  # [M, H, W]
    moved = diff.flatten(1).any(1)
    d = state.shape[1]
    if int(moved.sum()) < 2 * (d + 1):
        return None
    h, w = diff.shape[1:]
    grid = coordinates(h, w, frames.device)  # [2, H, W]
    mask = diff[moved].float()
    centroid = (mask[:, None] * grid[None]).flatten(2).sum(2) / mask.flatten(1).sum(1, keepdim=True)  # [m, 2]
    s = ((state[moved] + next_state[moved]) / 2).float()
    x = torch.cat([s, torch.ones(len(s), 1)], 1)
    sol = torch.linalg.lstsq(x, centroid).solution  # [D + 1, 2]
    return sol[:d].t().contiguous(), sol[d].contiguous()


def frames_to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., H, W, 3]`` -> float ``[..., 3, H, W]`` in ``[-1, 1]``."""
    return images.movedim(-1, -3).float().div(127.5).sub(1.0)


def unit_to_frames(x: torch.Tensor) -> torch.Tensor:
    """float ``[..., 3, H, W]`` in ``[-1, 1]`` -> uint8 ``[..., H, W, 3]`` (rounded, clamped)."""
    return x.clamp(-1, 1).add(1.0).mul(127.5).round().to(torch.uint8).movedim(-3, -1)


def next_frame(current: torch.Tensor, change: torch.Tensor) -> torch.Tensor:
    """The predicted frame in ``[-1, 1]`` from the current one and a sampled change (`x0`)."""
    return (current + 2.0 * change).clamp(-1, 1)
