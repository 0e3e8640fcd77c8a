"""A tiny random-weight Idefics3 (SmolVLM) model that vLLM's CPU backend can serve, built offline.

Same model class, processor, tokenizer, chat template and image size as
`mmrl.tiny.tiny_models.tiny_image_text_model`, with one change: the text model has **2 attention
heads of size 32** (and 1 key/value head) instead of 4 heads of size 16. vLLM's CPU paged-attention
kernel only takes head sizes in ``{32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}``
(``vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend.get_supported_head_sizes`` in 0.32); the
head size 16 of the generic tiny model fails at the first forward with ``Unsupported CPU attention
configuration: head_dim=16``. The vision tower (head size 16) does not go through that kernel and is
left as is. Used by ``tests/engines/test_vllm_engine.py``; the trainer's HF path keeps the generic model.

`tiny_vllm_qwen_vl_model` is the same change to the tiny Qwen2.5-VL (`mmrl.tiny.tiny_qwen_vl`: 2 text
heads of size 32, mrope sections 4 + 6 + 6): the model of the multi-turn tool tests on vLLM
(``policy.model: tiny-qwen2.5-vl`` with ``policy.engine: vllm``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmrl.tiny.tiny_models import CHAT_TEMPLATE, IMAGE_SEQ_LEN, IMAGE_SIZE, idefics3_sizes, tiny_tokenizer
from mmrl.utils.compat import patch_torchvision

#: text-model head size; must be one vLLM's CPU attention supports (see the module docstring)
VLLM_HEAD_DIM = 32


def tiny_vllm_image_text_model(tmp_dir: str | Path | None = None, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Build a tiny ``Idefics3ForConditionalGeneration`` + ``Idefics3Processor`` that vLLM (CPU) loads.

    Returns ``(model, processor)`` (eval mode, CPU, ``dtype``); with ``tmp_dir`` both are saved there
    (``save_pretrained``, safetensors, config ``dtype`` = ``dtype``) so ``vllm.LLM(model=tmp_dir)`` and
    ``AutoModelForImageTextToText.from_pretrained(tmp_dir)`` load the same weights. Weights are a
    deterministic function of ``seed``; the global RNG is left untouched.
    """
    patch_torchvision()
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = tiny_tokenizer()
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE)
    heads = 64 // VLLM_HEAD_DIM
    config = Idefics3Config(
        **idefics3_sizes(tokenizer, num_attention_heads=heads, num_key_value_heads=1, head_dim=VLLM_HEAD_DIM)
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # transformers wraps `to` with functools.wraps(nn.Module.to), which typeshed types as unbound
        model = Idefics3ForConditionalGeneration(config).to(dtype).eval()  # type: ignore[arg-type]
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp_dir)
        processor.save_pretrained(tmp_dir)
    return model, processor


def tiny_vllm_qwen_vl_model(tmp_dir: str | Path | None = None, seed: int = 0):
    """`mmrl.tiny.tiny_qwen_vl.tiny_qwen_vl_model` with text heads of `VLLM_HEAD_DIM` (same classes,
    processor and chat template; other weights, since the shapes differ)."""
    from mmrl.tiny.tiny_qwen_vl import tiny_qwen_vl_model

    return tiny_qwen_vl_model(tmp_dir, seed=seed, head_dim=VLLM_HEAD_DIM)


__all__ = ["tiny_vllm_image_text_model", "tiny_vllm_qwen_vl_model", "VLLM_HEAD_DIM"]
