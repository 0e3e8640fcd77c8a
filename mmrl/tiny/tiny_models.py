"""Tiny random-weight instances of real transformers classes, built offline for tests.

`tiny_image_text_model` builds an Idefics3 (SmolVLM) model: ``Idefics3ForConditionalGeneration``
with ``Idefics3Processor`` (PIL image processor, no torchvision needed) and a byte-level BPE
tokenizer trained here on synthetic robot instructions. It has the same architecture, processor,
chat template format and ``save_pretrained`` / ``from_pretrained`` layout as
``HuggingFaceTB/SmolVLM-256M-Instruct``, just with hidden sizes of 32-64 and 32 px images (each
image becomes 4 ``<image>`` tokens). Nothing is downloaded.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path

import torch

from mmrl.utils.compat import patch_torchvision

IMAGE_SIZE = 32
PATCH_SIZE = 8
SCALE_FACTOR = 2  # pixel-shuffle factor of the connector: (32 / 8)**2 / 2**2 = 4 tokens per image
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2

# SmolVLM-Instruct's chat format: "<|im_start|>User:<image>text<end_of_utterance>\nAssistant:"
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
PAD, BOS, EOS = "<|endoftext|>", "<|im_start|>", "<end_of_utterance>"
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>"] + [
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)
]

_VERBS = ["reach", "pick up", "push", "pull", "open", "close", "lift", "stack", "place", "move", "grasp", "touch"]
_COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
_OBJECTS = ["cube", "target", "drawer", "block", "door", "peg", "cup", "bowl", "plate", "ball", "button"]
_PLACES = ["", " on the table", " into the box", " to the left", " to the right", " onto the red plate"]


def synthetic_sentences() -> list[str]:
    """A few hundred robot-instruction sentences (deterministic) to train the tiny tokenizer on."""
    combos = itertools.product(_VERBS, _COLORS, _OBJECTS)
    sents = [f"{v} the {c} {o}{_PLACES[i % len(_PLACES)]}" for i, (v, c, o) in enumerate(combos)]
    return sents + ["User: Assistant: what is in the image?", "Describe the scene."]


@lru_cache(maxsize=1)
def _tokenizer_json(vocab_size: int = 512) -> str:
    """Train a byte-level BPE once per process; returned as JSON so every caller gets a fresh copy."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, *IMAGE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_sentences(), trainer)
    return tok.to_str()


def tiny_tokenizer():
    """A fresh `PreTrainedTokenizerFast` with the special tokens Idefics3Processor needs."""
    patch_torchvision()
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=PAD,
        additional_special_tokens=IMAGE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=512,
    )


def idefics3_sizes(tokenizer, **text) -> dict:
    """The tiny Idefics3 / SmolVLM config's arguments (``Idefics3Config`` / ``SmolVLMConfig``): a 1-layer
    32-wide vision tower on 32 px images of 8 px patches, a 2-layer 64-wide llama text model over
    ``tokenizer``'s vocabulary; ``text`` overrides text-config entries (e.g. head sizes)."""
    pad_id = tokenizer.pad_token_id
    text_config = dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        pad_token_id=pad_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return dict(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=IMAGE_SIZE,
            patch_size=PATCH_SIZE,
        ),
        text_config={**text_config, **text},
        scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=pad_id,
    )


def tiny_image_text_model(tmp_dir: str | Path | None = None, seed: int = 0):
    """Build a tiny random-weight ``Idefics3ForConditionalGeneration`` and its ``Idefics3Processor``.

    Returns ``(model, processor)`` (model in eval mode, float32, CPU). With ``tmp_dir`` both are
    also saved there, so ``AutoModelForImageTextToText.from_pretrained(tmp_dir)`` /
    ``AutoProcessor.from_pretrained(tmp_dir)`` (and `HFImageTextBackbone.from_pretrained`) load them.
    Weights are a deterministic function of ``seed``; the global RNG is left untouched.
    """
    patch_torchvision()
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = tiny_tokenizer()
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,  # one 32 px tile per camera image (SmolVLM splits big images)
        size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE)
    config = Idefics3Config(**idefics3_sizes(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Idefics3ForConditionalGeneration(config).eval()
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp_dir)
        processor.save_pretrained(tmp_dir)
    return model, processor


__all__ = [
    "idefics3_sizes",
    "tiny_image_text_model",
    "tiny_tokenizer",
    "synthetic_sentences",
    "IMAGE_SIZE",
    "IMAGE_SEQ_LEN",
]


# --------------------------------------------------------------------------- tiny CLIP models
# For reward-model tests (rewards/clip_score.py, pickscore.py, aesthetic.py): the real open_clip and
# transformers CLIP classes with hidden sizes of 32 and 32 px images, random weights, nothing downloaded.

TINY_OPEN_CLIP = "mmrl-tiny-clip"
TINY_OPEN_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@lru_cache(maxsize=1)
def register_tiny_open_clip() -> str:
    """Register the tiny open_clip config (once per process) and return its model name.

    ``open_clip.add_model_config`` reads json files from a folder, so the config is written to a
    temporary folder. The tokenizer is open_clip's default BPE tokenizer, shipped in its wheel.
    """
    import json
    import tempfile

    patch_torchvision()
    import open_clip

    folder = Path(tempfile.mkdtemp(prefix="mmrl-open-clip-"))
    (folder / f"{TINY_OPEN_CLIP}.json").write_text(json.dumps(TINY_OPEN_CLIP_CONFIG))
    open_clip.add_model_config(folder)
    return TINY_OPEN_CLIP


def tiny_open_clip(seed: int = 0):
    """A tiny random-weight ``open_clip.model.CLIP`` (eval mode, float32, CPU); global RNG untouched."""
    import logging

    name = register_tiny_open_clip()
    import open_clip

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # open_clip warns "No pretrained weights loaded" on the root logger
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return open_clip.create_model(name, pretrained=None).eval()
    finally:
        root.setLevel(level)


def tiny_clip_tokenizer():
    """A real ``CLIPTokenizer`` with a character-level vocabulary (every byte, with and without the
    ``</w>`` end-of-word suffix, and no merges): any text tokenizes, no training or download needed."""
    patch_torchvision()
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|startoftext|>", "<|endoftext|>"] + alphabet + [c + "</w>" for c in alphabet]
    return CLIPTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=[], model_max_length=77)


def tiny_clip_model(tmp_dir: str | Path | None = None, seed: int = 0):
    """A tiny random-weight transformers ``CLIPModel`` and its ``CLIPProcessor`` (32 px images).

    Same classes and ``save_pretrained`` layout as ``yuvalkirstain/PickScore_v1`` /
    ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``. With ``tmp_dir`` both are saved there.
    Returns ``(model, processor)``; the model is in eval mode; the global RNG is left untouched.
    """
    patch_torchvision()
    from transformers import CLIPConfig, CLIPModel, CLIPProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = tiny_clip_tokenizer()
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)
    ids = dict(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            **ids,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        projection_dim=32,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(config).eval()
    if tmp_dir is not None:
        Path(tmp_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(tmp_dir)
        processor.save_pretrained(tmp_dir)
    return model, processor


__all__ += ["tiny_open_clip", "register_tiny_open_clip", "tiny_clip_tokenizer", "tiny_clip_model", "TINY_OPEN_CLIP"]
