"""A tiny random-weight SmolVLM2 (real transformers classes), built offline: images and videos.

`tiny_smolvlm2_model` builds ``SmolVLMForConditionalGeneration`` with a ``SmolVLMProcessor`` that
has SmolVLM2's video path: ``SmolVLMVideoProcessor`` and SmolVLM2's chat template (``<video>`` for a
video item). The processor expands each video into its own text, as ``HuggingFaceTB/SmolVLM2-*``
does: "You are provided the following series of <n> frames from a <H:MM:SS> video." then, per
frame, "Frame from <MM:SS>:" and the frame's image tokens, the timestamps taken from the chosen
frames' indices and the source fps (``video_metadata``); ``pixel_values`` holds the frames. Sizes
as `mmrl.tiny.tiny_models.tiny_image_text_model` (32 px tiles of 8 px patches, 4 tokens each), the
tokenizer that of `mmrl.tiny.tiny_lerobot` (SmolVLM's named image tokens). Selected by
``policy.model: tiny-smolvlm2``. Nothing is downloaded. The processor's timestamps need
``num2words`` (in the ``vlm`` extra).
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmrl.tiny.tiny_models import IMAGE_SEQ_LEN, IMAGE_SIZE, idefics3_sizes
from mmrl.utils.compat import patch_torchvision


def tiny_smolvlm2_processor():
    """``SmolVLMProcessor`` with image and video processors at 32 px and SmolVLM2's chat template."""
    patch_torchvision()
    from transformers import SmolVLMProcessor, SmolVLMVideoProcessor
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    from mmrl.tiny.tiny_lerobot import tiny_tokenizer_with_image_tokens

    sizes = dict(size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE})
    image_processor = SmolVLMImageProcessorPil(do_image_splitting=False, **sizes)
    # frames are chosen by mmrl (policy.video_*) before the processor: it must not sample again
    video_processor = SmolVLMVideoProcessor(do_sample_frames=False, **sizes)
    return SmolVLMProcessor(
        image_processor,
        tiny_tokenizer_with_image_tokens(),
        video_processor,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=DEFAULT_CHAT_TEMPLATE,  # SmolVLM2's: "User: <video>...<end_of_utterance>"
    )


def tiny_smolvlm2_model(tmp_dir: str | Path | None = None, seed: int = 0):
    """Build a tiny random-weight ``SmolVLMForConditionalGeneration`` and its processor.

    Returns ``(model, processor)`` (eval mode, float32, CPU); weights are a deterministic function
    of ``seed`` and the global RNG is left untouched. With ``tmp_dir`` both are saved there, so
    ``AutoModelForImageTextToText.from_pretrained(tmp_dir)`` / ``AutoProcessor.from_pretrained``
    load them (``policy.model: <that folder>``).
    """
    patch_torchvision()
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    processor = tiny_smolvlm2_processor()
    config = SmolVLMConfig(**idefics3_sizes(processor.tokenizer, max_position_embeddings=1024))  # frames add up
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmolVLMForConditionalGeneration(config).eval()
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp_dir)
        processor.save_pretrained(tmp_dir)
    return model, processor


__all__ = ["tiny_smolvlm2_model", "tiny_smolvlm2_processor"]
