"""Tiny random-weight LeRobot VLAs (SmolVLA, PI0, PI05) of the real classes, built offline.

`tiny_smolvlm_folder` writes what SmolVLA reads from its VLM hub id (``vlm_model_name``): a
``SmolVLMConfig``, a byte-level BPE tokenizer trained here (with SmolVLM's image special tokens) and
its ``SmolVLMProcessor``. SmolVLA then builds its VLM from that config (``load_vlm_weights=False``)
with nothing downloaded. `tiny_lerobot_config` is the LeRobot config of a tiny policy of a family
for given cameras, state and action sizes; `TinyPiVariants` shrinks the PaliGemma / Gemma sizes that
LeRobot's PI0 / PI05 hard-code (``gemma_2b``, ``gemma_300m``, the SigLIP so400m tower) for the
duration of a ``with`` block. It is for tests and the CPU benchmark only: a tiny PI0 is built and
loaded inside that block, a real checkpoint never needs it.

`save_tiny_lerobot_policy` writes a complete checkpoint folder in LeRobot's format (``config.json``,
``model.safetensors``, ``policy_preprocessor.json`` / ``policy_postprocessor.json`` with the
normalisation statistics): what ``lerobot/smolvla_base`` is on the hub, in miniature.

Needs the ``lerobot`` environment (``bash scripts/setup_lerobot.sh``).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import torch

from mmrl.tiny.tiny_models import BOS, EOS, IMAGE_TOKENS, PAD, _tokenizer_json

FAMILIES = ("smolvla", "pi0", "pi05")

#: SmolVLM's image special tokens as SmolVLA reads them (``tokenizer.fake_image_token_id`` ...)
SMOLVLM_EXTRA_TOKENS = {
    "fake_image_token": "<fake_token_around_image>",
    "image_token": "<image>",
    "global_image_token": "<global-img>",
}


def tiny_tokenizer_with_image_tokens():
    """The tiny byte-level BPE tokenizer of `mmrl.tiny.tiny_models` with SmolVLM's named image tokens."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=PAD,
        additional_special_tokens=IMAGE_TOKENS,
        extra_special_tokens=SMOLVLM_EXTRA_TOKENS,
        model_max_length=512,
    )


def tiny_smolvlm_folder(
    path: str | Path,
    *,
    image_size: int = 32,
    patch_size: int = 4,
    scale_factor: int = 2,
    hidden: int = 64,
    layers: int = 4,
    heads: int = 4,
    vision_hidden: int = 32,
    vision_layers: int = 1,
) -> str:
    """Write a tiny SmolVLM (config, tokenizer, processor; no weights) to ``path`` for SmolVLA's
    ``vlm_model_name``. Each camera image becomes ``(image_size / patch_size / scale_factor)**2``
    tokens. Returns the folder."""
    from transformers import SmolVLMConfig, SmolVLMProcessor, SmolVLMVideoProcessor
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer_with_image_tokens()
    seq_len = (image_size // patch_size) ** 2 // scale_factor**2
    image_processor = SmolVLMImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size}
    )
    SmolVLMProcessor(image_processor, tokenizer, SmolVLMVideoProcessor(), image_seq_len=seq_len).save_pretrained(path)
    SmolVLMConfig(
        vision_config=dict(
            hidden_size=vision_hidden,
            intermediate_size=2 * vision_hidden,
            num_hidden_layers=vision_layers,
            num_attention_heads=2,
            image_size=image_size,
            patch_size=patch_size,
        ),
        text_config=dict(
            model_type="llama",
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads // 2,
            head_dim=hidden // heads,
            vocab_size=len(tokenizer),
            max_position_embeddings=512,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        scale_factor=scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tiny_gemma_tokenizer_folder(path: str | Path) -> str:
    """A tiny tokenizer standing in for PI0 / PI05's (gated) PaliGemma one, saved to ``path``."""
    tok = tiny_tokenizer_with_image_tokens()
    tok.save_pretrained(path)
    return str(path)


class TinyPiVariants(contextlib.AbstractContextManager):
    """Shrinks LeRobot's hard-coded PI0 / PI05 sizes while active (tests and benchmarks only).

    LeRobot 0.6.1 builds PaliGemma (SigLIP so400m + ``gemma_2b``) and the ``gemma_300m`` expert from
    variant names and fixes the vision projection to 2048 wide: no config makes them small. Inside
    this block ``get_gemma_config`` of both modules returns a 2-layer, 64-wide Gemma for any variant
    (8 heads: the joint training forward hard-codes 8),
    and PaliGemma is built with a 1-layer 32-wide SigLIP of ``patch_size`` patches whose projection
    matches the tiny Gemma; new PI0 / PI05 processors tokenize with ``tokenizer`` (a local folder)
    instead of the gated ``google/paligemma-3b-pt-224``. Build *and* load a tiny PI0 inside the block.
    """

    def __init__(
        self,
        tokenizer: str,
        width: int = 64,
        depth: int = 2,
        heads: int = 8,
        head_dim: int = 8,
        patch_size: int = 8,
        vision_hidden: int = 32,
    ):
        self.tokenizer = tokenizer
        self.width, self.depth, self.heads, self.head_dim = width, depth, heads, head_dim
        self.patch_size, self.vision_hidden = patch_size, vision_hidden
        self._saved: list = []

    def __enter__(self):
        from lerobot.policies.pi0 import modeling_pi0
        from lerobot.policies.pi05 import modeling_pi05

        def gemma_config(variant):
            return modeling_pi0.GemmaConfig(
                width=self.width,
                depth=self.depth,
                mlp_dim=2 * self.width,
                num_heads=self.heads,
                num_kv_heads=1,
                head_dim=self.head_dim,
            )

        real_paligemma = modeling_pi0.PaliGemmaForConditionalGenerationWithPiGemma

        def tiny_paligemma(config):
            vc = config.vision_config
            vc.hidden_size, vc.intermediate_size = self.vision_hidden, 2 * self.vision_hidden
            vc.num_hidden_layers, vc.num_attention_heads, vc.patch_size = 1, 2, self.patch_size
            vc.projection_dim = config.text_config.hidden_size
            return real_paligemma(config=config)

        from lerobot.policies.pi0 import processor_pi0
        from lerobot.policies.pi05 import processor_pi05
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer)
        step = processor_pi0.TokenizerProcessorStep
        for module in (processor_pi0, processor_pi05):
            self._saved.append((module, "TokenizerProcessorStep", step))
            module.TokenizerProcessorStep = functools.partial(step, tokenizer=tokenizer)
        for module in (modeling_pi0, modeling_pi05):
            self._saved.append((module, "get_gemma_config", module.get_gemma_config))
            module.get_gemma_config = gemma_config
            if hasattr(module, "PaliGemmaForConditionalGenerationWithPiGemma"):
                self._saved.append(
                    (
                        module,
                        "PaliGemmaForConditionalGenerationWithPiGemma",
                        module.PaliGemmaForConditionalGenerationWithPiGemma,
                    )
                )
                module.PaliGemmaForConditionalGenerationWithPiGemma = tiny_paligemma
        return self

    def __exit__(self, *exc):
        for module, name, value in reversed(self._saved):
            setattr(module, name, value)
        self._saved.clear()
        return False


def tiny_lerobot_config(
    family: str,
    *,
    cameras: int,
    image_size: int,
    state_dim: int | None,
    action_dim: int,
    chunk_size: int,
    n_action_steps: int,
    num_steps: int,
    vlm_folder: str | None = None,
    camera_keys: list[str] | None = None,
    **overrides,
):
    """The LeRobot config of a tiny ``family`` policy (``smolvla``: ``vlm_folder`` from
    `tiny_smolvlm_folder`; ``pi0`` / ``pi05``: build it inside `TinyPiVariants`). Image features
    ``camera_keys`` (default ``observation.images.camera{i}``; 3 x image_size x image_size),
    ``observation.state`` if ``state_dim``, ``action`` of ``action_dim``; padded to LeRobot's default
    32 state / action dims."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature

    if family not in FAMILIES:
        raise ValueError(f"unknown LeRobot VLA family {family!r}; allowed: {FAMILIES}")
    keys = camera_keys or [f"observation.images.camera{i + 1}" for i in range(cameras)]
    inputs = {key: PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size)) for key in keys[:cameras]}
    if state_dim:
        inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (state_dim,))
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (action_dim,))}
    common = dict(
        input_features=inputs,
        output_features=outputs,
        chunk_size=chunk_size,
        n_action_steps=n_action_steps,
        device="cpu",
    )
    if family == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

        if vlm_folder is None:
            raise ValueError("a tiny SmolVLA needs vlm_folder (tiny_smolvlm_folder)")
        return SmolVLAConfig(
            **common,
            vlm_model_name=vlm_folder,
            load_vlm_weights=False,
            num_steps=num_steps,
            resize_imgs_with_padding=(image_size, image_size),
            num_vlm_layers=0,
            tokenizer_max_length=24,
            **overrides,
        )
    norm = {
        "VISUAL": NormalizationMode.IDENTITY,
        "STATE": NormalizationMode.MEAN_STD,
        "ACTION": NormalizationMode.MEAN_STD,
    }
    if family == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Config
    else:
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Config
    return Config(
        **common,
        num_inference_steps=num_steps,
        image_resolution=(image_size, image_size),
        dtype="float32",
        tokenizer_max_length=48 if family == "pi05" else 24,
        normalization_mapping=norm,
        **overrides,
    )


def save_tiny_lerobot_policy(
    family: str, path: str | Path, *, stats: dict | None = None, seed: int = 0, **config_kwargs
) -> str:
    """Build a tiny random-weight ``family`` policy (`tiny_lerobot_config` arguments) and write it
    with LeRobot's own processors (``stats``: ``{feature: {"mean": .., "std": ..}}``) to ``path`` in
    LeRobot's checkpoint format. PI0 / PI05 must be built inside `TinyPiVariants`. Returns the folder."""
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    path = Path(path)
    cfg = tiny_lerobot_config(family, **config_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = get_policy_class(family)(cfg)
    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(path)
    pre.save_pretrained(path)
    post.save_pretrained(path)
    return str(path)
