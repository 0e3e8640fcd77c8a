"""An action-conditioned world model on Wan's video transformer: the built-in world model's
conditioning (`mmrl.policies.world_model`) on diffusers' ``WanTransformer3DModel`` and its VAE.

``policy.type: wan_world_model`` (`WanWorldModelConfig`, ``pretrained:`` a ``WanPipeline`` hub id or
folder). Same data, warm start, interface and simulator as ``policy.type: world_model``: it learns
from decision records (`mmrl.episodes`), given the ``context`` frames a policy saw up to a decision
(newest last), the instruction, the state and the executed action chunk, the frame and the state
that followed; `predict` is what `simulators.world_model`, `imagine_records` and `rollout_error`
call. It subclasses `WorldModelPolicy`, so `warm_start_batch`, `capabilities` (it does not act),
`configure` (one square camera) and the refusing `rollout` / `evaluate` are the same code.

How a frame is conditioned, following Wan 2.2 TI2V's own image conditioning (diffusers'
``WanImageToVideoPipeline`` with ``expand_timesteps``: the first latent frame is the clean image's
latent at timestep 0, every other token is noised and has the sampling time):

- Each frame is encoded **alone** by the frozen Wan VAE (``AutoencoderKLWan``; its causal encoder
  encodes a video's first frame alone, so one frame is one latent frame), normalised per channel
  with ``latents_mean`` / ``latents_std`` (`WanGenerator.encode_images`).
- The ``K`` context latents and the noised next-frame latent are stacked on the latent time axis,
  ``[B, C, K + 1, h, w]``, and the transformer runs with **one timestep per token** (a 2-D timestep
  ``[B, tokens]``, which diffusers' ``WanTransformer3DModel.forward`` accepts for Wan 2.2 TI2V: per
  token time embeddings and modulation): 0 on the context tokens, ``1000 t`` (float32) on the target
  frame's. Its 3-D rotary embedding places the target after the context in time.
- Rectified flow as Wan's (`mmrl.policies.wan`): ``x_t = t eps + (1 - t) x0``, the transformer's
  output is the velocity ``eps - x0``. The loss is the squared velocity error on the **target frame's
  latent only** (the output at the context tokens is discarded), plus ``state_weight`` times the
  next state's squared error. Training times are ``u ~ U(0, 1)`` mapped by the ``shift`` of the
  sampling grid (``shift u / (1 + (shift - 1) u)``).
- The text cross-attention reads the instruction's UMT5 embeddings (`WanGenerator.encode`, Wan's own
  prompt encoding and padding; cached per distinct instruction, ``prompt_cache``) followed by extra
  tokens of width ``text_dim``: one from the action chunk (flattened) and, with a state, one from the
  current and the next state (the recorded next state while training, the predicted one while
  imagining, as the built-in model). Their MLPs end in a zero layer: untrained, they are zero rows,
  what the padding of the prompt already gives the pretrained model.
- The next state: ``state + MLP(state, chunk)`` (zero-initialised last layer), by regression.
- `predict` samples the target latent with ``sample_steps`` Euler steps on ``time_grid(K, shift)``
  from noise drawn on the caller's generator and decodes it with the VAE (undoing the per-channel
  normalisation, `WanGenerator.decode`).

Trained: the transformer (``finetune: full``) or LoRA adapters on its attention (``lora``, the
shared diffusers code, `mmrl.policies.diffusers_base`), and the new embeddings and state head; the
VAE and UMT5 are frozen. Exported as mmrl's safetensors and ``mmrl_policy.json`` (the default
`Policy.export_pretrained`: the transformer's and the heads' weights), which `mmrl.load_policy`
rebuilds from ``pretrained`` (VAE, UMT5, tokenizer) plus those weights.

Limits: a target latent is a single frame encoded alone, as TI2V's conditioning frame, while TI2V
generates later latent frames as 4-frame chunks, so the pretrained model has not seen a clean-image
latent at a later position; an imagined frame is decoded and encoded again on the next step (the
VAE's round trip adds its error). Not run on a GPU yet: tests/policies/test_wan_world_model.py
trains and plays it on the tiny random-weight Wan pipeline (`mmrl.tiny.tiny_wan`) only.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Literal, cast

import torch
from torch import nn

from mmrl.batch import Batch
from mmrl.config import ConfigError, check_range
from mmrl.flow import time_grid
from mmrl.policies.base import Policy, PolicyConfig, decode_text
from mmrl.policies.tiny_world_model import mlp, unit_to_frames
from mmrl.policies.wan import WanGenerator
from mmrl.policies.world_model import WorldModelPolicy

if importlib.util.find_spec("diffusers") is None:  # the registry names the fix: pip install 'mmrl[diffusion]'
    raise ImportError("the Wan world model needs diffusers", name="diffusers")


@dataclass
class WanWorldModelConfig(PolicyConfig):
    """Configuration of `WanWorldModelPolicy` (the ``policy`` section of a Wan world-model run)."""

    type: str = "wan_world_model"  # the policy family (`mmrl list`): an action-conditioned world model on Wan
    # the diffusers WanPipeline it starts from: a hub id (Wan-AI/Wan2.2-TI2V-5B-Diffusers) or a local folder
    pretrained: str | None = None
    # frame side; None = the simulator's (square, one camera; a multiple of the VAE's factor x the patch:
    # 32 for Wan 2.2 TI2V, 16 for Wan 2.1)
    image_size: int | None = None
    chunk_size: int = 1  # actions per prediction (1: the world-model simulator steps one action at a time)
    context: int = 1  # past frames each prediction sees (newest last; repeated at an episode's start)
    sample_steps: int = 8  # Euler steps of the flow ODE per imagined frame
    shift: float = 1.0  # time shift of the sampling grid and of the training times (SD3's; 1: none)
    state_weight: float = 1.0  # weight of the next state's squared error in the warm-start loss
    cond_hidden: int = 256  # hidden width of the MLPs that embed the actions and states as text tokens
    finetune: Literal["full", "lora"] = "full"  # the transformer: every weight, or LoRA on its attention
    lora_rank: int = 32  # LoRA rank of the adapters (finetune: lora)
    lora_alpha: int = 64  # LoRA scale alpha (the update is scaled by alpha / rank)
    # the pipeline's load dtype (VAE, UMT5, the transformer's frozen weights); trained weights stay float32
    dtype: Literal["float32", "bfloat16"] = "float32"
    gradient_checkpointing: bool = False  # recompute each transformer block in the backward
    max_sequence_length: int = 512  # UMT5 tokens of an instruction (Wan's 512; the actions' tokens follow)
    prompt_cache: int = 256  # distinct instructions whose UMT5 embeddings are kept (0: encode every call)

    def validate(self) -> None:
        check_range(
            self,
            {
                "image_size": ">=1",
                "chunk_size": ">=1",
                "context": ">=1",
                "sample_steps": ">=1",
                "cond_hidden": ">=1",
                "lora_rank": ">=1",
                "lora_alpha": ">=1",
                "max_sequence_length": ">=1",
                "shift": ">0",
                "state_weight": ">=0",
                "prompt_cache": ">=0",
            },
        )

    def check_engine(self, engine) -> None:
        if self.dtype == "bfloat16" and engine.precision == "fp16":
            raise ConfigError(
                "policy.dtype = bfloat16 but trainer.engine.precision = fp16 autocasts to float16: set "
                "trainer.engine.precision=bf16"
            )


def condition_heads(text_dim: int, action_width: int, state_dim: int, hidden: int) -> nn.ModuleDict:
    """The new layers: ``action`` (the flattened chunk -> one text token), with a state ``state``
    (current and next state -> one text token) and ``state_head`` (state and chunk -> the state's
    change); each ends in a zero layer. Built by the policy and, on meta, by the memory plan."""
    heads = nn.ModuleDict(
        {"action": nn.Sequential(nn.Linear(action_width, hidden), nn.SiLU(), nn.Linear(hidden, text_dim))}
    )
    if state_dim:
        heads["state"] = nn.Sequential(nn.Linear(2 * state_dim, hidden), nn.SiLU(), nn.Linear(hidden, text_dim))
        heads["state_head"] = mlp(state_dim + action_width, hidden, state_dim)
    for head in heads.values():
        last = cast(nn.Linear, cast(nn.Sequential, head)[-1])
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
    return heads


def load_wan(cfg: WanWorldModelConfig) -> WanGenerator:
    """The pipeline of ``cfg.pretrained`` as a `WanGenerator` of single frames (loading, freezing,
    LoRA, prompt encoding and the VAE are the generator's), checked to fit this use."""
    assert cfg.pretrained is not None and cfg.image_size is not None  # the policy checked them
    try:
        gen = WanGenerator.from_pretrained(
            cfg.pretrained,
            image_size=cfg.image_size,
            num_frames=1,
            finetune=cfg.finetune,
            lora_rank=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            max_sequence_length=cfg.max_sequence_length,
            gradient_checkpointing=cfg.gradient_checkpointing,
            dtype=getattr(torch, cfg.dtype),
        )
    except ValueError as exc:
        if "image_size" not in str(exc):
            raise
        raise ConfigError(
            f"'policy.image_size' = {cfg.image_size}: {exc}: render the simulator's frames at such a size "
            "(sim.kwargs.image_size, and policy.image_size if set)"
        ) from exc
    assert isinstance(gen, WanGenerator)
    tc = gen.transformer.config
    if tc.in_channels != gen.latent_channels or tc.patch_size[0] != 1 or tc.image_dim is not None:
        raise ConfigError(
            f"'policy.pretrained' = {cfg.pretrained!r}: its transformer takes {tc.in_channels} channels (patch "
            f"{tuple(tc.patch_size)}, image embeddings {tc.image_dim}) where the world model feeds the VAE's "
            f"{gen.latent_channels} latent channels per frame: use a Wan text-to-video or TI2V checkpoint "
            "(Wan 2.1 T2V, Wan 2.2 TI2V-5B), not an image-to-video one"
        )
    return gen


def shifted(t: torch.Tensor, shift: float) -> torch.Tensor:
    """The time shift of `mmrl.flow.time_grid`: ``shift t / (1 + (shift - 1) t)``."""
    return shift * t / (1.0 + (shift - 1.0) * t)


class WanWorldModelPolicy(WorldModelPolicy):
    """An action-conditioned world model on Wan's transformer (see the module docstring)."""

    # the shared code (`WorldModelPolicy`) reads the fields both configs have
    config_class = WanWorldModelConfig  # type: ignore[assignment]
    cfg: WanWorldModelConfig  # type: ignore[assignment]

    def __init__(self, cfg: WanWorldModelConfig, action_dim: int, state_dim: int | None = None):
        Policy.__init__(self)  # not WorldModelPolicy's: it builds the built-in network
        if not cfg.pretrained:
            raise ConfigError(
                "'policy.pretrained' is unset: name a diffusers WanPipeline, e.g. "
                "pretrained: Wan-AI/Wan2.2-TI2V-5B-Diffusers, or its local folder"
            )
        if cfg.image_size is None:
            raise ConfigError("'policy.image_size' is unset: build the world model with a simulator or set it")
        self.cfg, self.action_dim, self.state_dim = cfg, int(action_dim), int(state_dim or 0)
        self.gen = load_wan(cfg)
        text_dim = self.gen.transformer.config.text_dim
        self.heads = condition_heads(text_dim, cfg.chunk_size * self.action_dim, self.state_dim, cfg.cond_hidden)
        self._prompts: dict[str, torch.Tensor] = {}  # instruction -> UMT5 embeddings [L, text_dim]

    @property
    def device(self) -> torch.device:
        return self.gen.device

    def update_statistics(self, batch: Batch) -> None:
        """Nothing to fit before the warm start (the built-in model's keypoints have no counterpart)."""

    def rebuilds_frozen_weights(self) -> bool:
        return True  # the pipeline's from_pretrained: checkpoints leave a LoRA run's frozen weights to it

    # ------------------------------------------------------------------ conditioning
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 frames ``[..., H, W, 3]`` -> normalised latents ``[..., C, h, w]``, each frame
        encoded alone (one latent frame: the causal VAE's first frame)."""
        lead, (h, w) = frames.shape[:-3], frames.shape[-3:-1]
        z = self.gen.encode_images(frames.reshape(-1, 1, h, w, 3).to(self.device))  # [N, C, 1, h', w']
        return z[:, :, 0].reshape(*lead, *z.shape[1:2], *z.shape[3:])

    def prompt_embeddings(self, instructions: list[str]) -> torch.Tensor:
        """UMT5 embeddings ``[B, L, text_dim]`` of the instructions (`WanGenerator.encode`), the
        distinct ones cached (the encoder is frozen: an instruction's embedding never changes)."""
        if not self.cfg.prompt_cache:
            return self.gen.encode(instructions)[0]
        missing = sorted({s for s in instructions} - set(self._prompts))
        if missing:
            if len(self._prompts) + len(missing) > self.cfg.prompt_cache:
                self._prompts.clear()
                missing = sorted(set(instructions))
            (embeds,) = self.gen.encode(missing)
            self._prompts.update(zip(missing, embeds, strict=True))
        return torch.stack([self._prompts[s] for s in instructions]).to(self.device)

    def condition(
        self,
        instructions: list[str],
        actions: torch.Tensor,
        state: torch.Tensor | None = None,
        next_state: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """What the cross-attention reads: the instruction's tokens, then the action chunk's token
        and, with a state, the (state, next state) token: ``[B, L + 1 (+ 1), text_dim]`` float32."""
        tokens = [self.heads["action"](actions.flatten(1).float())]
        if self.state_dim:
            if state is None or next_state is None:
                raise ValueError(f"this world model reads a {self.state_dim}-dim state: pass state and next_state")
            tokens.append(self.heads["state"](torch.cat([state, next_state], 1).float()))
        text = self.prompt_embeddings(instructions).float()
        return torch.cat([text, torch.stack(tokens, 1)], 1)

    def next_state(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Predicted state ``[B, D]`` after executing ``actions [B, C, A]`` from ``state [B, D]``."""
        return state + self.heads["state_head"](torch.cat([state, actions.flatten(1)], 1))

    def timesteps(self, t: torch.Tensor, context: int, tokens: int) -> torch.Tensor:
        """Float32 ``[B, (context + 1) tokens]``: 0 on every context token, ``1000 t`` on the target's."""
        b = t.shape[0]
        zeros = torch.zeros(b, context * tokens, device=t.device, dtype=torch.float32)
        return torch.cat([zeros, (1000.0 * t.float())[:, None].expand(b, tokens)], 1)

    def velocity(self, context: torch.Tensor, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """The transformer's velocity ``[B, C, h, w]`` of the target latent ``x`` at flow time ``t [B]``,
        after the clean context latents ``[B, K, C, h, w]`` (timestep 0) on the latent time axis."""
        transformer = self.gen.transformer
        k, (h, w) = context.shape[1], x.shape[-2:]
        _, ph, pw = transformer.config.patch_size
        hidden = torch.cat([context, x[:, None]], 1).transpose(1, 2)  # [B, C, K + 1, h, w]
        dtype = transformer.dtype
        out = transformer(
            hidden_states=hidden.to(dtype),
            timestep=self.timesteps(t, k, (h // ph) * (w // pw)),
            encoder_hidden_states=cond.to(dtype),
            return_dict=False,
        )[0]
        return out[:, :, k].float()  # the target frame's; the context tokens' output is not used

    # ------------------------------------------------------------------ training
    def supervised_loss(self, batch: Batch) -> torch.Tensor:
        """Per example: the flow-matching (velocity) loss of the next frame's latent, plus
        ``state_weight`` times the predicted state's squared error (mean over its dimensions)."""
        dev = self.device
        with torch.no_grad():
            ctx = self.encode_frames(batch["context"])  # [B, K, C, h, w]
            x0 = self.encode_frames(batch["next_image"])  # [B, C, h, w]
        actions = batch["actions"].to(dev).float()
        b = x0.shape[0]
        loss = torch.zeros(b, device=dev)
        state = nxt = None
        if self.state_dim:
            state, nxt = batch["state"].to(dev).float(), batch["next_state"].to(dev).float()
            loss = loss + self.cfg.state_weight * (self.next_state(state, actions) - nxt).pow(2).mean(1)
        cond = self.condition(decode_text(batch["instruction"]), actions, state, nxt)
        t = shifted(torch.rand(b, device=dev), self.cfg.shift)
        eps = torch.randn_like(x0)
        tt = t.view(-1, 1, 1, 1)
        v = self.velocity(ctx, tt * eps + (1 - tt) * x0, t, cond)
        return loss + (v - (eps - x0)).pow(2).flatten(1).mean(1)

    # ------------------------------------------------------------------ imagining
    @torch.no_grad()
    def predict(
        self,
        context: torch.Tensor,
        instructions: list[str],
        actions: torch.Tensor,
        state: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The frame uint8 ``[B, H, W, 3]`` and state ``[B, D]`` (None without one) after executing
        ``actions [B, C, A]`` from ``context`` uint8 ``[B, K, H, W, 3]`` (newest last), sampled with
        ``sample_steps`` Euler steps from noise drawn on ``generator``."""
        dev = self.device
        if context.shape[1] != self.cfg.context:
            raise ValueError(f"context holds {context.shape[1]} frames; this world model reads {self.cfg.context}")
        ctx = self.encode_frames(context)
        actions = actions.to(dev).float()
        nxt = None
        if self.state_dim:
            if state is None:
                raise ValueError(f"this world model reads a {self.state_dim}-dim state: pass state")
            state = state.to(dev).float()
            nxt = self.next_state(state, actions)
        cond = self.condition(instructions, actions, state, nxt)
        b = ctx.shape[0]
        x = torch.randn((b, *ctx.shape[2:]), generator=generator, device=dev)
        grid = time_grid(self.cfg.sample_steps, self.cfg.shift, device=dev)
        for i in range(self.cfg.sample_steps):  # Euler from t = 1 (noise) to 0 along the velocity
            x = x + (grid[i + 1] - grid[i]) * self.velocity(ctx, x, grid[i].expand(b), cond)
        frames = self.gen.decode(x[:, :, None])  # [B, 1, 3, H, W] in [-1, 1]
        return unit_to_frames(frames[:, 0]), nxt
