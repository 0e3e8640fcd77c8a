"""A tiny random-weight Qwen2.5-VL (real transformers classes), built offline: images and videos.

`tiny_qwen_vl_model` builds ``Qwen2_5_VLForConditionalGeneration`` with a ``Qwen2_5_VLProcessor``
(``Qwen2VLImageProcessorPil`` for images, ``Qwen2VLVideoProcessor`` for videos) and a byte-level
BPE tokenizer trained offline (`mmrl.tiny.tiny_models`) plus Qwen's special tokens. Same
architecture (windowed vision tower, 3D multimodal rope with ``second_per_grid_ts``), processor,
chat template and ``save_pretrained`` layout as ``Qwen/Qwen2.5-VL-3B-Instruct``, with hidden sizes of
32-64 and 8 px patches: a 32 px image is a 4 x 4 patch grid, merged 2 x 2 into 4 ``<|image_pad|>``
tokens; a video of F 32 px frames is ceil(F / 2) temporal patches of 4 ``<|video_pad|>`` tokens.
Selected by ``policy.model: tiny-qwen2.5-vl``. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mmrl.tiny.tiny_models import _tokenizer_json
from mmrl.utils.compat import patch_torchvision

PATCH_SIZE = 8
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE  # image sides are resized to multiples of 16 px
MIN_PIXELS = 32 * 32  # a 32 px frame: 4 merged tokens per (temporal) patch
MAX_PIXELS = 64 * 64
PAD, EOS = "<|endoftext|>", "<|im_end|>"
#: text head size -> mrope sections (t, h, w): head_dim / 2 rotary pairs in all
MROPE = {16: [2, 3, 3], 32: [4, 6, 6]}
QWEN_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# Qwen2.5-VL-Instruct's chat template (default system prompt, one placeholder per image / video),
# plus the tool parts of Qwen2.5 / Qwen3-VL's: with ``tools=`` the system turn lists their JSON
# schemas in <tools></tools> and asks for <tool_call>{"name", "arguments"}</tool_call>; ``tool``
# messages (text and images) are user turns of <tool_response> blocks, consecutive ones grouped.
# Without tools or tool messages it renders exactly as Qwen2.5-VL-Instruct's.
_CONTENT = (
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
)
_TOOLS = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}"
    "{% if messages[0]['content'] is string %}{{ messages[0]['content'] }}{% else %}"
    "{% for content in messages[0]['content'] %}{% if 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% else %}You are a helpful assistant.{% endif %}"
    "{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}'
)
CHAT_TEMPLATE = (
    _TOOLS + "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"  # rendered in the tools' system turn
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n' }}<tool_response>\n{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}" + _CONTENT + "{% endfor %}{% endif %}{{ '\\n' }}</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}{% if loop.first and message['role'] != 'system' and not tools %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}" + _CONTENT + "{% endfor %}<|im_end|>\n"
    "{% endif %}{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_qwen_tokenizer():
    """A fresh `PreTrainedTokenizerFast`: the tiny byte-level BPE plus Qwen2.5-VL's special tokens."""
    patch_torchvision()
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        eos_token=EOS,
        pad_token=PAD,
        unk_token=PAD,
        additional_special_tokens=QWEN_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )


def tiny_qwen_vl_processor():
    """``Qwen2_5_VLProcessor`` with the tiny tokenizer, 8 px patches and a 32-64 px pixel budget."""
    patch_torchvision()
    from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    sizes = dict(patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE)
    pixels = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    image_processor = Qwen2VLImageProcessorPil(size=pixels, **sizes)
    # frames are chosen by mmrl (policy.video_*) before the processor: it must not sample again
    video_processor = Qwen2VLVideoProcessor(
        size=pixels, do_sample_frames=False, min_frames=1, cap_pixels_per_frame=False, **sizes
    )
    return Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tiny_qwen_tokenizer(),
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )


def tiny_qwen_vl_model(tmp_dir: str | Path | None = None, seed: int = 0, head_dim: int = 16):
    """Build a tiny random-weight ``Qwen2_5_VLForConditionalGeneration`` and its processor.

    Returns ``(model, processor)`` (eval mode, float32, CPU); weights are a deterministic function
    of ``seed`` and the global RNG is left untouched. With ``tmp_dir`` both are saved there, so
    ``AutoModelForImageTextToText.from_pretrained(tmp_dir)`` / ``AutoProcessor.from_pretrained``
    load them (``policy.model: <that folder>``). ``head_dim`` of the text model: 16 (4 heads) or 32
    (2 heads, what vLLM's CPU attention takes: `mmrl.tiny.tiny_vllm.tiny_vllm_qwen_vl_model`).
    """
    patch_torchvision()
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    processor = tiny_qwen_vl_processor()
    tok = processor.tokenizer
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in zip(("start", "end", "image", "video"), QWEN_TOKENS[2:])}
    text_hidden = 64
    if head_dim not in MROPE:
        raise ValueError(f"head_dim must be one of {sorted(MROPE)}, got {head_dim}")
    config = Qwen2_5_VLConfig(
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            patch_size=PATCH_SIZE,
            spatial_merge_size=MERGE_SIZE,
            temporal_patch_size=TEMPORAL_PATCH_SIZE,
            window_size=2 * FACTOR,  # windows of 2 x 2 merged tokens
            fullatt_block_indexes=[1],
            out_hidden_size=text_hidden,
            tokens_per_second=2,
        ),
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=text_hidden,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=text_hidden // head_dim,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE[head_dim]},
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=None,
        ),
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["start"],
        vision_end_token_id=ids["end"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp_dir)
        processor.save_pretrained(tmp_dir)
    return model, processor


__all__ = ["tiny_qwen_vl_model", "tiny_qwen_vl_processor", "tiny_qwen_tokenizer", "QWEN_TOKENS"]
