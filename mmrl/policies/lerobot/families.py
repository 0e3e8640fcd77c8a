"""The two calls into a LeRobot flow VLA that mmrl's samplers need, per model family.

For every family LeRobot's ``sample_actions`` is: embed the prefix (camera images, language tokens,
and for SmolVLA the state) -> one VLM forward that fills a KV cache -> Euler integration of
``denoise_step(x_t, t)`` from noise at ``t = 1`` to actions at ``t = 0`` (``x <- x + dt v``), the
time convention of `mmrl.flow`. A family here is that sampler cut in two:

- ``prefix(policy, batch) -> Prefix``: the VLM forward over the prefix of a preprocessed LeRobot
  batch (the family's own image / state preparation), keeping the VLM's output (the value head's
  input) and the KV cache;
- ``velocity(policy, prefix, x, t) -> v``: LeRobot's own ``denoise_step`` on that cache;
- ``matching_errors(policy, batch, actions)``: LeRobot's own flow-matching training forward (its
  time and noise draws), per element ``[B, chunk, max_action_dim]``, for the supervised warm start.

mmrl then drives ``velocity`` with any of its samplers (ODE, Flow-SDE, CPS, Flow-Noise), exactly as
LeRobot's Euler loop drives it (``tests/policies/test_lerobot_vla.py`` checks the ODE against
``sample_actions``). Only these functions touch LeRobot internals; they are pinned to LeRobot 0.6.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from lerobot.policies.common.vla_utils import make_att_2d_masks, prepare_attention_masks_4d
from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS


@dataclass
class Prefix:
    """The VLM's pass over one batch of observations."""

    hidden: torch.Tensor  # [B, L, D] the VLM's (normed) output at every prefix position
    pad_masks: torch.Tensor  # [B, L] bool, True at real (not padded) positions
    cache: Any  # the prefix KV cache ``denoise_step`` attends to
    state: torch.Tensor | None = None  # PI0: the padded state, a token of the expert's suffix


def _language(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return batch[OBS_LANGUAGE_TOKENS], batch[OBS_LANGUAGE_ATTENTION_MASK]


class SmolVLA:
    """SmolVLA: SmolVLM prefix (images, language, state token) + cross-attending action expert."""

    name = "smolvla"

    @staticmethod
    def prefix(policy, batch: dict) -> Prefix:
        model = policy.model
        batch = policy._prepare_batch(batch)
        images, img_masks = policy.prepare_images(batch)
        state = policy.prepare_state(batch)
        embs, pad_masks, att_masks = model.embed_prefix(images, img_masks, *_language(batch), state=state)
        att_2d = make_att_2d_masks(pad_masks, att_masks)
        (hidden, _), cache = model.vlm_with_expert.forward(
            attention_mask=att_2d,
            position_ids=torch.cumsum(pad_masks, dim=1) - 1,
            past_key_values=None,
            inputs_embeds=[embs, None],
            use_cache=model.config.use_cache,
        )
        return Prefix(hidden, pad_masks, cache)

    @staticmethod
    def velocity(policy, prefix: Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # denoise_step appends the suffix K/V to the shared cache and crops it back to the prefix
        return policy.model.denoise_step(prefix.pad_masks, prefix.cache, x, t)

    @staticmethod
    def matching_errors(policy, batch: dict, actions: torch.Tensor) -> torch.Tensor:
        batch = policy._prepare_batch(batch)
        images, img_masks = policy.prepare_images(batch)
        return policy.model.forward(images, img_masks, *_language(batch), policy.prepare_state(batch), actions)


class PI0:
    """PI0: PaliGemma prefix (images, language) + Gemma expert whose suffix holds the state token."""

    name = "pi0"
    suffix_state = True

    @classmethod
    def prefix(cls, policy, batch: dict) -> Prefix:
        model = policy.model
        images, img_masks = policy._preprocess_images(batch)
        embs, pad_masks, att_masks = model.embed_prefix(images, img_masks, *_language(batch))
        att_4d = prepare_attention_masks_4d(make_att_2d_masks(pad_masks, att_masks))
        model.paligemma_with_expert.paligemma.model.language_model.config._attn_implementation = "eager"
        (hidden, _), cache = model.paligemma_with_expert.forward(
            attention_mask=att_4d,
            position_ids=torch.cumsum(pad_masks, dim=1) - 1,
            past_key_values=None,
            inputs_embeds=[embs, None],
            use_cache=True,
        )
        state = policy.prepare_state(batch) if cls.suffix_state else None
        return Prefix(hidden, pad_masks, cache, state)

    @staticmethod
    def velocity(policy, prefix: Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # PI0's denoise_step works on a clone of the cache: the prefix cache is never modified
        return policy.model.denoise_step(prefix.state, prefix.pad_masks, prefix.cache, x, t)

    @staticmethod
    def matching_errors(policy, batch: dict, actions: torch.Tensor) -> torch.Tensor:
        images, img_masks = policy._preprocess_images(batch)
        model = policy.model
        noise, time = model.sample_noise(actions.shape, actions.device), model.sample_time(len(actions), actions.device)
        return model.forward(images, img_masks, *_language(batch), policy.prepare_state(batch), actions, noise, time)


class PI05(PI0):
    """PI05: PI0 without the state token (the processor writes the state into the prompt) and with
    the flow time entering the expert through adaptive RMS norms."""

    name = "pi05"
    suffix_state = False

    @staticmethod
    def velocity(policy, prefix: Prefix, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return policy.model.denoise_step(prefix.pad_masks, prefix.cache, x, t)

    @staticmethod
    def matching_errors(policy, batch: dict, actions: torch.Tensor) -> torch.Tensor:
        images, img_masks = policy._preprocess_images(batch)
        model = policy.model
        noise, time = model.sample_noise(actions.shape, actions.device), model.sample_time(len(actions), actions.device)
        return model.forward(images, img_masks, *_language(batch), actions, noise, time)


FAMILIES = {f.name: f for f in (SmolVLA, PI0, PI05)}
