"""Random-weight checkpoints at the real size of published transformers VLMs, written offline.

Nothing can be downloaded on mmrl's machines, and nothing needs to be to measure memory and speed:
`write_random_checkpoint` builds the model class of a published checkpoint from its architecture
(`mmrl.planning.architectures.ARCHITECTURES`: the fields of its config.json, carried over as facts),
with random weights in ``dtype``, and saves it with a processor in the checkpoint's layout, so
mmrl's real loading code (``AutoModelForImageTextToText.from_pretrained`` + ``AutoProcessor``) loads
it from the folder (``policy.model: <folder>`` or ``policy.backbone: <folder>``).

What differs from the real checkpoint: the weights (random) and the tokenizer (the tiny byte-level
BPE of `mmrl.tiny.tiny_models` with the model's special tokens; its ids are far below the real
vocabulary, whose embedding matrix keeps its real size). The image processor has the real patch
geometry (Qwen2.5-VL: 14 px patches merged 2 x 2; SmolVLM2: 512 px images, 64 tokens each).

    python -m mmrl.planning.random_weights Qwen/Qwen2.5-VL-3B-Instruct runs/real_size/qwen25vl_3b [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from mmrl.planning.architectures import ARCHITECTURES, Arch
from mmrl.utils.compat import patch_torchvision

#: Qwen2.5-VL's rotary sections (temporal, height, width) of its 128-wide heads, from config.json:
#: 16 + 24 + 24 rotary pairs; a narrower head (a scaled-down architecture) keeps the proportions
QWEN_MROPE = [16, 24, 24]


def mrope_sections(head_dim: int) -> list[int]:
    """The (t, h, w) rotary sections of a ``head_dim`` head: Qwen2.5-VL's, scaled to ``head_dim / 2`` pairs."""
    if head_dim % 16:
        raise ValueError(f"Qwen2.5-VL's rotary sections need a head width divisible by 16, got {head_dim}")
    return [n * head_dim // 128 for n in QWEN_MROPE]


def _qwen_processor(min_pixels: int, max_pixels: int):
    from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from mmrl.tiny.tiny_qwen_vl import CHAT_TEMPLATE, tiny_qwen_tokenizer

    sizes = dict(patch_size=14, merge_size=2, temporal_patch_size=2)
    pixels = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    return Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(size=pixels, **sizes),
        tokenizer=tiny_qwen_tokenizer(),
        video_processor=Qwen2VLVideoProcessor(
            size=pixels, do_sample_frames=False, min_frames=1, cap_pixels_per_frame=False, **sizes
        ),
        chat_template=CHAT_TEMPLATE,
    )


def _qwen_config(arch: Arch, processor):
    from transformers import Qwen2_5_VLConfig

    from mmrl.tiny.tiny_qwen_vl import QWEN_TOKENS

    tok = processor.tokenizer
    ids = [tok.convert_tokens_to_ids(t) for t in QWEN_TOKENS[2:]]
    text = dict(arch.fields["text_config"])
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    sections = mrope_sections(head_dim)
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": text.pop("rope_theta"), "mrope_section": sections}
    text.update(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    fields = {k: v for k, v in arch.fields.items() if k != "text_config"}
    return Qwen2_5_VLConfig(
        **fields,
        text_config=text,
        image_token_id=ids[2],
        video_token_id=ids[3],
        vision_start_token_id=ids[0],
        vision_end_token_id=ids[1],
    )


def _smolvlm_processor(image_size: int, image_seq_len: int):
    from transformers import SmolVLMProcessor, SmolVLMVideoProcessor
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil
    from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

    from mmrl.tiny.tiny_lerobot import tiny_tokenizer_with_image_tokens

    sizes = dict(size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size})
    return SmolVLMProcessor(
        SmolVLMImageProcessorPil(do_image_splitting=False, **sizes),
        tiny_tokenizer_with_image_tokens(),
        SmolVLMVideoProcessor(do_sample_frames=False, **sizes),
        image_seq_len=image_seq_len,
        chat_template=DEFAULT_CHAT_TEMPLATE,
    )


def _smolvlm_config(arch: Arch, processor):
    import transformers

    tok = processor.tokenizer
    text = dict(arch.fields["text_config"])
    text.update(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    fields = {k: v for k, v in arch.fields.items() if k != "text_config"}
    return getattr(transformers, arch.config_cls or "SmolVLMConfig")(
        **fields, text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id
    )


def processor_and_config(arch: Arch, min_pixels: int = 56 * 56, max_pixels: int = 448 * 448):
    """The processor (tiny tokenizer, real image geometry) and the transformers config of ``arch``
    with the tokenizer's special-token ids. Qwen2.5-VL images are resized into ``[min_pixels,
    max_pixels]`` (the processor's own bounds; the model card's default max is 12.8M)."""
    patch_torchvision()
    if arch.cls == "Qwen2_5_VLForConditionalGeneration":
        processor = _qwen_processor(min_pixels, max_pixels)
        return processor, _qwen_config(arch, processor)
    if arch.cls in ("SmolVLMForConditionalGeneration", "Idefics3ForConditionalGeneration"):
        vision = arch.fields["vision_config"]
        side = vision["image_size"]
        seq_len = (side // vision["patch_size"]) ** 2 // arch.fields["scale_factor"] ** 2
        processor = _smolvlm_processor(side, seq_len)
        return processor, _smolvlm_config(arch, processor)
    raise ValueError(f"no real-size writer for {arch.cls}: Qwen2.5-VL and SmolVLM / Idefics3 are supported")


SMOKE_VOCAB = 4096  # `one_layer`'s vocabularies: above every tiny tokenizer's ids


def one_layer(arch: Arch) -> Arch:
    """``arch`` with one layer in each stack (text, vision, denoiser) and vocabularies cut to
    `SMOKE_VOCAB` (widths and heads kept): the same classes and loading path at a fraction of the
    size and disk, for smoke tests."""
    import dataclasses

    def cut(fields: dict) -> dict:
        out: dict[str, Any] = {}
        for k, v in fields.items():
            if isinstance(v, dict):
                out[k] = cut(v)
            elif k in ("num_hidden_layers", "depth", "num_layers", "num_single_layers"):
                out[k] = 1
            elif k == "fullatt_block_indexes":
                out[k] = [0]
            elif k == "vocab_size":  # the tiny tokenizers' ids are far below it
                out[k] = min(v, SMOKE_VOCAB)
            else:
                out[k] = v
        return out

    parts = tuple((name, one_layer(sub)) for name, sub in arch.parts)
    return dataclasses.replace(arch, fields=cut(arch.fields), parts=parts)


def write_random_checkpoint(
    name: str | Arch, folder: str | Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0, device: str = "cpu"
) -> Path:
    """Write ``name``'s model (a hub id in `ARCHITECTURES`, or an `Arch`) with random weights in
    ``dtype`` plus its processor to ``folder``; returns the folder. Weights are a function of
    ``seed`` (and of the ``device`` they are drawn on: a GPU initialises a 7B model in seconds); the
    global RNG is left untouched. A folder already holding a finished checkpoint is kept as it is
    (it is written aside and renamed into place last)."""
    import transformers

    arch = ARCHITECTURES[name] if isinstance(name, str) else name
    folder = Path(folder)
    if folder.is_dir():
        return folder
    processor, config = processor_and_config(arch)
    with (
        torch.random.fork_rng(devices=[torch.device(device)] if device.startswith("cuda") else []),
        torch.device(device),
    ):
        torch.manual_seed(seed)
        model = getattr(transformers, arch.cls)._from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(partial)
    model.save_pretrained(partial)
    partial.rename(folder)  # a kill mid-write leaves .partial, never a folder that looks finished
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=[k for k, a in ARCHITECTURES.items() if a.library == "transformers"])
    parser.add_argument("folder")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = write_random_checkpoint(args.name, args.folder, getattr(torch, args.dtype), args.seed)
    print(f"wrote {args.name} ({args.dtype}, random weights) to {out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
