"""A transformers vision-language model as the prefix encoder of a flow-matching VLA (pi0-style).

`HFImageTextBackbone` wraps any ``AutoModelForImageTextToText`` checkpoint and its ``AutoProcessor``
(SmolVLM / Idefics3, PaliGemma, Qwen2-VL / Qwen2.5-VL, Gemma 3, ...). Per sample it builds one
prompt holding an image placeholder per camera plus the instruction, runs the VLM once and returns
its hidden states as the policy prefix:

    images uint8 [B, H, W, 3] or [B, V, H, W, 3], instructions list[str]
      -> prefix float32 [B, L, out_dim], mask bool [B, L] (True = real token; padding is on the right)

Prompt format: the processor's chat template when it has one (a single user turn: V images, then
the instruction; ``add_generation_prompt`` appends the assistant header), otherwise the
processor's plain format ``<image> * V + instruction`` (PaliGemma's processor then adds BOS and
the trailing newline itself). Each instruction is cut to ``max_length`` tokens before the prompt is
built, so image tokens are never truncated.

The model runs through its base model (``model.base_model``, no LM head: the logits would be
thrown away); ``use_last_hidden=False`` takes the penultimate layer instead of the final (normed)
one. ``freeze=True`` gives a frozen VLM prefix: no parameter requires grad, the model stays in eval
mode whatever ``.train()`` says, and the forward runs under ``torch.no_grad``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from mmrl.policies.base import HFModel
from mmrl.utils.compat import patch_torchvision

# from_pretrained kwargs that also apply to the processor
_SHARED_LOAD_KWARGS = ("revision", "trust_remote_code", "cache_dir", "local_files_only", "token", "subfolder")


def images_to_pil(images: torch.Tensor) -> list[list[Image.Image]]:
    """uint8 [B, H, W, 3] or [B, V, H, W, 3] -> per sample, a list of V RGB PIL images."""
    if images.dtype != torch.uint8:
        raise TypeError(
            f"images must be uint8 [B, (V,) H, W, 3], got dtype {images.dtype}. "
            "Fix: pass raw camera frames (0-255); the processor normalises them"
        )
    if images.dim() == 4:
        images = images.unsqueeze(1)
    if images.dim() != 5 or images.shape[-1] != 3:
        raise ValueError(f"images must be [B, H, W, 3] or [B, V, H, W, 3], got {tuple(images.shape)}")
    arr = np.ascontiguousarray(images.detach().cpu().numpy())
    return [[Image.fromarray(view) for view in sample] for sample in arr]


class HFImageTextBackbone(nn.Module):
    """Prefix encoder around a transformers image-text-to-text model; see the module docstring."""

    uses_images = True

    def __init__(
        self,
        model: HFModel,
        processor,
        *,
        freeze: bool = False,
        max_length: int = 64,
        use_last_hidden: bool = True,
        add_generation_prompt: bool = True,
    ):
        super().__init__()
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", None)
        self.max_length = max_length
        self.use_last_hidden = use_last_hidden
        self.add_generation_prompt = add_generation_prompt
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.out_dim: int = int(text_config.hidden_size)
        self.frozen = freeze
        if freeze:
            self.model.requires_grad_(False)
            self.model.eval()
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        if head is not None and head.weight is not embed.weight:
            head.requires_grad_(False)  # never run (`forward` reads hidden states): nothing to train

    @classmethod
    def from_pretrained(
        cls,
        model_id_or_path: str | Path,
        torch_dtype: torch.dtype | str | None = None,
        freeze: bool = False,
        max_length: int = 64,
        use_last_hidden: bool = True,
        processor_kwargs: dict | None = None,
        add_generation_prompt: bool = True,
        **kw,
    ) -> HFImageTextBackbone:
        """Load model + processor by hub id (``"HuggingFaceTB/SmolVLM-256M-Instruct"``) or local path.

        ``torch_dtype`` (e.g. ``torch.bfloat16`` or ``"auto"``) sets the weights' dtype; other ``kw``
        go to ``AutoModelForImageTextToText.from_pretrained`` (``device_map``,
        ``attn_implementation``, ``revision``, ...), the loading ones among them to the processor too.
        """
        patch_torchvision()  # a broken torchvision install would otherwise break transformers imports
        from transformers import AutoModelForImageTextToText, AutoProcessor

        path = str(model_id_or_path)
        proc_kw = {k: kw[k] for k in _SHARED_LOAD_KWARGS if k in kw}
        proc_kw.update(processor_kwargs or {})
        if torch_dtype is not None:
            kw["dtype"] = torch_dtype
        model = AutoModelForImageTextToText.from_pretrained(path, **kw)
        processor = AutoProcessor.from_pretrained(path, **proc_kw)
        return cls(
            model,
            processor,
            freeze=freeze,
            max_length=max_length,
            use_last_hidden=use_last_hidden,
            add_generation_prompt=add_generation_prompt,
        )

    # -- modes -----------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> HFImageTextBackbone:
        super().train(mode)
        if self.frozen:
            self.model.eval()
        return self

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    # -- prompts ---------------------------------------------------------------------------------
    def _truncate(self, instruction: str) -> str:
        if self.tokenizer is None or self.max_length is None:
            return instruction
        ids = self.tokenizer(instruction, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.max_length:
            return instruction
        return self.tokenizer.decode(ids[: self.max_length])

    def build_prompt(self, instruction: str, num_images: int) -> str:
        """The text for one sample: ``num_images`` image placeholders, then the instruction."""
        instruction = self._truncate(instruction)
        if getattr(self.processor, "chat_template", None):
            content = [{"type": "image"} for _ in range(num_images)] + [{"type": "text", "text": instruction}]
            return self.processor.apply_chat_template(
                [{"role": "user", "content": content}],
                add_generation_prompt=self.add_generation_prompt,
                tokenize=False,
            )
        token = getattr(self.processor, "image_token", None) or "<image>"
        return token * num_images + instruction

    def encode_inputs(self, images: torch.Tensor, instructions: list[str]) -> dict[str, torch.Tensor]:
        """Run the processor; returns model inputs on the model's device (floats in its dtype)."""
        pil = images_to_pil(images)
        if len(instructions) != len(pil):
            raise ValueError(f"{len(pil)} image samples but {len(instructions)} instructions")
        prompts = [self.build_prompt(text, len(views)) for text, views in zip(instructions, pil)]
        enc = self.processor(text=prompts, images=pil, return_tensors="pt", padding=True, padding_side="right")
        device, dtype = self.device, self.dtype
        out = {}
        for key, value in enc.items():
            if isinstance(value, torch.Tensor):
                value = value.to(device, dtype=dtype if value.is_floating_point() else None)
            out[key] = value
        return out

    # -- forward ---------------------------------------------------------------------------------
    def forward(
        self, images: torch.Tensor, instructions: list[str], state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """images uint8 [B, H, W, 3] / [B, V, H, W, 3] -> (prefix [B, L, out_dim] f32, mask [B, L] bool).

        ``state`` (proprioception) is not used here: the policy embeds it itself.
        """
        inputs = self.encode_inputs(images, list(instructions))
        encoder: HFModel = getattr(self.model, "base_model", self.model)
        grad = contextlib.nullcontext() if not self.frozen else torch.no_grad()
        with grad:
            out = encoder(**inputs, output_hidden_states=not self.use_last_hidden, return_dict=True)
        hidden = getattr(out, "last_hidden_state", None)
        if not self.use_last_hidden or hidden is None:
            states = out.hidden_states
            hidden = states[-1] if self.use_last_hidden else states[-2]
        mask = inputs["attention_mask"].bool()
        return hidden.float(), mask


__all__ = ["HFImageTextBackbone", "images_to_pil"]
